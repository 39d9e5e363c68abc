// Fixed-length greedy packing over a window of W steps (the paper's "fixed-length greedy").
//
// Every W steps, the carried documents and the window's arrivals (each group longest first,
// carry-over first so nothing waits forever) go one at a time into the micro-batch with the least
// attention cost W_a that still has room under S; what fits nowhere carries to the next window.
// The W*N micro-batches become W steps. A window reads W-1 steps ahead, so a document can train
// before the step it arrived with: its token delay is negative.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/windowed_packer.hpp"

namespace wlb {

class FixedGreedyPacker final : public WindowedPacker {
 public:
  using WindowedPacker::WindowedPacker;
  std::string_view name() const override { return "fixed-greedy"; }

 protected:
  std::vector<MicroBatch> PackWindow(const std::vector<Document>& carry,
                                     const std::vector<Document>& fresh, int steps,
                                     std::vector<Document>& leftover) override {
    const size_t bins = static_cast<size_t>(steps) * config_.micro_batches;
    std::vector<MicroBatch> micro_batches(bins);
    // The least-attention micro-batch with room for the document, from a tournament tree over the
    // micro-batches where one without room for the current document counts as the heaviest there is
    // (O(log N) per document where a scan was O(N)). Documents come longest first, so a
    // micro-batch without room regains it only for shorter ones: those wait in a max-heap of
    // (room, index) and come back as the documents get short enough. When a group starts again
    // from a longer document, everything is recomputed.
    constexpr double kFull = std::numeric_limits<double>::max();  // ArgminTree's largest key
    std::vector<double> attention(bins, 0.0);
    detail::ArgminTree<double> lightest(bins, 0.0);
    std::vector<std::pair<int64_t, size_t>> waiting;  // max-heap of (room, index), no room now
    int64_t previous = INT64_MAX;
    for (const std::vector<Document>* group : {&carry, &fresh}) {
      for (const Document& d : *group) {
        if (d.length > previous) {
          waiting.clear();
          for (size_t b = 0; b < bins; ++b) {
            const int64_t room = config_.context - micro_batches[b].tokens;
            lightest.Set(b, room >= d.length ? attention[b] : kFull);
            if (room < d.length) waiting.push_back({room, b});
          }
          std::make_heap(waiting.begin(), waiting.end());
        }
        previous = d.length;
        while (!waiting.empty() && waiting.front().first >= d.length) {
          lightest.Set(waiting.front().second, attention[waiting.front().second]);
          std::pop_heap(waiting.begin(), waiting.end());
          waiting.pop_back();
        }
        const size_t best = lightest.Min();
        if (lightest.key(best) == kFull) {
          leftover.push_back(d);
          continue;
        }
        Add(micro_batches[best], d);
        attention[best] += cost_.Attention(d.length);
        const int64_t room = config_.context - micro_batches[best].tokens;
        if (room >= d.length) {
          lightest.Set(best, attention[best]);
        } else {
          lightest.Set(best, kFull);
          waiting.push_back({room, best});
          std::push_heap(waiting.begin(), waiting.end());
        }
      }
    }
    return micro_batches;
  }
};

}  // namespace wlb
