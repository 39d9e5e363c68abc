// Fixed-length greedy packing over a window of W steps (the paper's "fixed-length greedy").
//
// Every W steps, the carried documents and the window's arrivals (each group longest first,
// carry-over first so nothing waits forever) go one at a time into the micro-batch with the least
// attention cost W_a that still has room under S; what fits nowhere carries to the next window.
// The W*N micro-batches become W steps. A window reads W-1 steps ahead, so a document can train
// before the step it arrived with: its token delay is negative.
#pragma once

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
    const size_t bins = static_cast<size_t>(steps) * config_.micro_batches;
    std::vector<MicroBatch> micro_batches(bins);
    std::vector<double> attention(bins, 0.0);
    for (const std::vector<Document>* group : {&carry, &fresh}) {
      for (const Document& d : *group) {
        size_t best = bins;
        for (size_t b = 0; b < bins; ++b) {
          if (micro_batches[b].tokens + d.length <= config_.context &&
              (best == bins || attention[b] < attention[best])) {
            best = b;
          }
        }
        if (best == bins) {
          leftover.push_back(d);
          continue;
        }
        Add(micro_batches[best], d);
        attention[best] += cost_.Attention(d.length);
      }
    }
    return micro_batches;
  }
};

}  // namespace wlb
