// The base of packers that plan W steps at a time (fixed-length greedy, the MILP solver baseline).
//
// It collects W steps of arrivals, hands the window's documents (carry-over and arrivals, each
// longest first) to PackWindow(), cuts the W*N micro-batches it returns into W steps, and carries
// what PackWindow() left out into the next window. At the end of input, Flush() plans the partial
// window and then one-step windows until nothing is carried. It owns the state blob as well.
#pragma once

#include <algorithm>
#include <vector>

#include "wlb/pack/length_order.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {

class WindowedPacker : public Packer {
 public:
  WindowedPacker(PackerConfig config, DocumentCost cost, int window)
      : Packer(config, std::move(cost)), window_(window) {}

  int window() const { return window_; }

  std::vector<Document> Pending() const final {
    std::vector<Document> pending = carry_.ToVector();
    pending.insert(pending.end(), buffer_.begin(), buffer_.end());
    return pending;
  }
  HeldBack Held() const final { return buffered_ + HeldBack{carry_.size(), carry_.tokens()}; }
  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["window"] = window_;
    return j;
  }
  nlohmann::json StateJson() const final {
    return {{"carry", detail::DocumentsState(carry_.ToVector())},
            {"buffer", detail::DocumentsState(buffer_)},
            {"buffered_steps", buffered_steps_}};
  }

 protected:
  absl::Status LoadStateJson(const nlohmann::json& j) final {
    return detail::LoadStateOrError([&]() -> absl::Status {
      const std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
      std::vector<Document> buffer = detail::DocumentsFromState(j.at("buffer"));
      const int buffered = static_cast<int>(
          detail::StateInteger(j.at("buffered_steps"), 0, window_ - 1, "buffered_steps"));
      carry_ = detail::LengthOrdered(carry);
      buffered_ = {};
      detail::AddHeld(buffer, buffered_);
      buffer_ = std::move(buffer);
      buffered_steps_ = buffered;
      return absl::OkStatus();
    });
  }

  // The buffer holds exactly the arrivals of the last `buffered_steps` pushes; the carry arrived
  // before them; every push before the open window was planned (a window plans a step per push).
  absl::Status ValidateState(int64_t pushes, int64_t next_step) const override {
    if (absl::Status s = CheckHeldPieces(pushes); !s.ok()) return s;
    const int64_t window_start = pushes - buffered_steps_;
    if (window_start < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%d buffered steps but only %d pushes", buffered_steps_, pushes));
    }
    if (next_step < window_start) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "next_step %d is below the %d pushes before the open window: planned steps went "
          "backwards",
          next_step, window_start));
    }
    for (const Document& d : buffer_) {
      if (d.arrival_step < window_start) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "buffered document %d piece %d arrived at step %d, before the window's first step %d",
            d.id, d.piece, d.arrival_step, window_start));
      }
    }
    for (const Document& d : carry_.ToVector()) {
      if (d.arrival_step >= window_start) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "carried document %d piece %d arrived at step %d, inside the open window (from %d)",
            d.id, d.piece, d.arrival_step, window_start));
      }
    }
    return absl::OkStatus();
  }

  // Plans `steps` steps from `carry` (held from the last window, so placing it first bounds the
  // delay) and `fresh` (the window's arrivals), each sorted longest first. Returns steps x N
  // micro-batches in step order and appends every document it did not place to `leftover`.
  virtual std::vector<MicroBatch> PackWindow(const std::vector<Document>& carry,
                                             const std::vector<Document>& fresh, int steps,
                                             std::vector<Document>& leftover) = 0;

  // The same on the held carry, in place: takes what it places out of `carry` and adds the
  // arrivals it does not place. By default through PackWindow() (O(carry) a window); a packer that
  // overrides it can take only what it places.
  virtual std::vector<MicroBatch> PackHeldWindow(detail::LengthOrdered& carry,
                                                 const std::vector<Document>& fresh, int steps) {
    const std::vector<Document> held = carry.ToVector();
    std::vector<Document> leftover;
    std::vector<MicroBatch> micro_batches = PackWindow(held, fresh, steps, leftover);
    carry = detail::LengthOrdered(std::move(leftover));  // a stable longest-first order
    return micro_batches;
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) final {
    detail::AddHeld(arrivals, buffered_);
    buffer_.insert(buffer_.end(), arrivals.begin(), arrivals.end());
    if (++buffered_steps_ < window_) return {};
    return RunWindow(window_);
  }

  std::vector<StepPlan> DoFlush() final {
    std::vector<StepPlan> steps;
    if (buffered_steps_ > 0 || !buffer_.empty()) steps = RunWindow(std::max(buffered_steps_, 1));
    while (!carry_.empty()) {  // PackWindow places at least one piece into empty micro-batches
      for (StepPlan& s : RunWindow(1)) steps.push_back(std::move(s));
    }
    return steps;
  }

 private:
  std::vector<StepPlan> RunWindow(int steps) {
    std::vector<Document> fresh = std::move(buffer_);
    buffer_.clear();
    buffered_ = {};
    buffered_steps_ = 0;
    SortLongestFirst(fresh);
    std::vector<MicroBatch> micro_batches = PackHeldWindow(carry_, fresh, steps);
    std::vector<StepPlan> plans;
    for (int s = 0; s < steps; ++s) {
      auto first = micro_batches.begin() + static_cast<std::ptrdiff_t>(s) * config_.micro_batches;
      plans.push_back(MakeStep({std::make_move_iterator(first),
                                std::make_move_iterator(first + config_.micro_batches)}));
    }
    return plans;
  }

  int window_;
  detail::LengthOrdered carry_;   // not placed in the last window, longest first
  std::vector<Document> buffer_;  // arrivals of the window being collected
  HeldBack buffered_;             // documents and tokens in buffer_
  int buffered_steps_ = 0;
};

}  // namespace wlb
