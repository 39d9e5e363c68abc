// Fixed-length greedy packing over a window of W steps (the paper's "fixed-length greedy").
//
// Every W steps, the carried documents and the window's arrivals (each group longest first,
// carry-over first so nothing waits forever) go one at a time into the micro-batch with the least
// attention cost W_a that still has room under S; what fits nowhere carries to the next window.
// The W*N micro-batches become W steps. A window reads W-1 steps ahead, so a document can train
// before the step it arrived with: its token delay is negative.
#pragma once

#include <vector>

#include "wlb/pack/packer.hpp"

namespace wlb {

class FixedGreedyPacker final : public Packer {
 public:
  FixedGreedyPacker(PackerConfig config, CostModel cost, int window)
      : Packer(config, std::move(cost)), window_(window) {}
  std::string_view name() const override { return "fixed-greedy"; }

  std::vector<Document> Pending() const override {
    std::vector<Document> pending = carry_;
    pending.insert(pending.end(), buffer_.begin(), buffer_.end());
    return pending;
  }

  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["window"] = window_;
    return j;
  }
  nlohmann::json StateJson() const override {
    return {{"carry", detail::DocumentsState(carry_)},
            {"buffer", detail::DocumentsState(buffer_)},
            {"buffered_steps", buffered_steps_}};
  }
  void LoadStateJson(const nlohmann::json& j) override {
    std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
    std::vector<Document> buffer = detail::DocumentsFromState(j.at("buffer"));
    const int buffered = j.at("buffered_steps").get<int>();
    if (buffered < 0 || buffered >= window_) {
      throw nlohmann::json::out_of_range::create(401, "buffered_steps out of range", &j);
    }
    carry_ = std::move(carry);
    buffer_ = std::move(buffer);
    buffered_steps_ = buffered;
  }

 protected:
  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    buffer_.insert(buffer_.end(), arrivals.begin(), arrivals.end());
    if (++buffered_steps_ < window_) return {};
    return PackWindow(window_);
  }

  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    if (buffered_steps_ > 0 || !buffer_.empty()) steps = PackWindow(std::max(buffered_steps_, 1));
    while (!carry_.empty()) {  // every piece fits an empty micro-batch, so this ends
      for (StepPlan& s : PackWindow(1)) steps.push_back(std::move(s));
    }
    return steps;
  }

 private:
  std::vector<StepPlan> PackWindow(int steps) {
    std::vector<Document> carry = std::move(carry_);
    std::vector<Document> fresh = std::move(buffer_);
    carry_.clear();
    buffer_.clear();
    buffered_steps_ = 0;
    SortLongestFirst(carry);
    SortLongestFirst(fresh);
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
          carry_.push_back(d);
          continue;
        }
        Add(micro_batches[best], d);
        attention[best] += cost_.Attention(d.length);
      }
    }
    std::vector<StepPlan> plans;
    for (int s = 0; s < steps; ++s) {
      auto first = micro_batches.begin() + static_cast<std::ptrdiff_t>(s) * config_.micro_batches;
      plans.push_back(MakeStep({std::make_move_iterator(first),
                                std::make_move_iterator(first + config_.micro_batches)}));
    }
    return plans;
  }

  int window_;
  std::vector<Document> carry_;   // did not fit in the last window
  std::vector<Document> buffer_;  // arrivals of the window being collected
  int buffered_steps_ = 0;
};

}  // namespace wlb
