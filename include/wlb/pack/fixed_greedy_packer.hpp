// Fixed-length greedy packing over a window of W steps (the paper's "fixed-length greedy").
//
// Every W steps, the carried documents and the window's arrivals (each group longest first,
// carry-over first so nothing waits forever) go one at a time into the micro-batch with the least
// attention cost W_a that still has room under S; what fits nowhere carries to the next window.
// The W*N micro-batches become W steps. A window reads W-1 steps ahead, so a document can train
// before the step it arrived with: its token delay is negative.
#pragma once

#include <algorithm>
#include <optional>
#include <vector>

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
  // never looked at, so a window costs O(placed x bins + arrivals) however much is carried.
  std::vector<MicroBatch> PackHeldWindow(detail::LengthOrdered& carry,
                                         const std::vector<Document>& fresh, int steps) override {
    const size_t bins = static_cast<size_t>(steps) * config_.micro_batches;
    std::vector<MicroBatch> micro_batches(bins);
    std::vector<double> attention(bins, 0.0);
    int64_t most_room = config_.context;  // of any bin
    auto least_attention = [&](int64_t length) {
      size_t best = bins;
      for (size_t b = 0; b < bins; ++b) {
        if (micro_batches[b].tokens + length <= config_.context &&
            (best == bins || attention[b] < attention[best])) {
          best = b;
        }
      }
      return best;
    };
    auto place = [&](const Document& d, size_t b) {
      const bool roomiest = config_.context - micro_batches[b].tokens == most_room;
      Add(micro_batches[b], d);
      attention[b] += cost_.Attention(d.length);
      if (!roomiest) return;
      most_room = 0;
      for (const MicroBatch& mb : micro_batches) {
        most_room = std::max(most_room, config_.context - mb.tokens);
      }
    };
    while (std::optional<Document> d = carry.TakeFirstAtMost(most_room)) {
      place(*d, least_attention(d->length));  // it fits the roomiest bin
    }
    std::vector<Document> left;
    for (const Document& d : fresh) {
      const size_t best = d.length > most_room ? bins : least_attention(d.length);
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
