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
#include <optional>
#include <utility>
#include <vector>

#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/length_order.hpp"
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
    detail::LengthOrdered held(carry);
    std::vector<MicroBatch> micro_batches = PackHeldWindow(held, fresh, steps);
    held.AppendTo(leftover);
    return micro_batches;
  }

  // Carried documents (longest first), then arrivals, each into the micro-batch with the least
  // W_a that has room. A carried document longer than the most room left fits nowhere and is
  // never looked at, so a window costs O((placed + arrivals) log bins) however much is carried.
  std::vector<MicroBatch> PackHeldWindow(detail::LengthOrdered& carry,
                                         const std::vector<Document>& fresh, int steps) override {
    const size_t bins = static_cast<size_t>(steps) * config_.micro_batches;
    std::vector<MicroBatch> micro_batches(bins);
    // The least-attention micro-batch with room for the document, from a tournament tree over the
    // micro-batches where one without room for the current document counts as the heaviest there is
    // (O(log N) per document where a scan was O(N)). Documents come longest first, so a
    // micro-batch without room regains it only for shorter ones: those wait in a max-heap of
    // (room, index) and come back as the documents get short enough. When a longer document
    // comes (the arrivals after the carried ones), everything is recomputed. The most room left
    // in any micro-batch is the fewest tokens, from a second tree.
    constexpr double kFull = std::numeric_limits<double>::max();  // ArgminTree's largest key
    std::vector<double> attention(bins, 0.0);
    detail::ArgminTree<double> lightest(bins, 0.0);
    detail::ArgminTree<int64_t> emptiest(bins, 0);
    std::vector<std::pair<int64_t, size_t>> waiting;  // max-heap of (room, index), no room now
    int64_t previous = INT64_MAX;
    auto most_room = [&] { return config_.context - micro_batches[emptiest.Min()].tokens; };
    auto least_attention = [&](int64_t length) {  // bins when no micro-batch has room
      if (length > previous) {
        waiting.clear();
        for (size_t b = 0; b < bins; ++b) {
          const int64_t room = config_.context - micro_batches[b].tokens;
          lightest.Set(b, room >= length ? attention[b] : kFull);
          if (room < length) waiting.push_back({room, b});
        }
        std::make_heap(waiting.begin(), waiting.end());
      }
      previous = length;
      while (!waiting.empty() && waiting.front().first >= length) {
        lightest.Set(waiting.front().second, attention[waiting.front().second]);
        std::pop_heap(waiting.begin(), waiting.end());
        waiting.pop_back();
      }
      const size_t best = lightest.Min();
      return lightest.key(best) == kFull ? bins : best;
    };
    auto place = [&](const Document& d, size_t b) {
      Add(micro_batches[b], d);
      attention[b] += cost_.Attention(d.length);
      emptiest.Set(b, micro_batches[b].tokens);
      const int64_t room = config_.context - micro_batches[b].tokens;
      if (room >= d.length) {
        lightest.Set(b, attention[b]);
      } else {
        lightest.Set(b, kFull);
        waiting.push_back({room, b});
        std::push_heap(waiting.begin(), waiting.end());
      }
    };
    while (std::optional<Document> d = carry.TakeFirstAtMost(most_room())) {
      place(*d, least_attention(d->length));  // it fits the roomiest micro-batch
    }
    std::vector<Document> left;
    for (const Document& d : fresh) {
      const size_t best = d.length > most_room() ? bins : least_attention(d.length);
      if (best == bins) {
        left.push_back(d);
        continue;
      }
      place(d, best);
    }
    carry.Merge({}, left);  // after the carried documents of each length
    return micro_batches;
  }
};

}  // namespace wlb
