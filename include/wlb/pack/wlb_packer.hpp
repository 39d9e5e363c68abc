// WLB-LLM variable-length packing with multi-level outlier queues (the paper's Algorithm 1), and
// wlb's refined variant.
//
// Thresholds L_1 < ... < L_n define n outlier queues: a document with L_i <= d < L_{i+1}
// (L_{n+1} = infinity) waits in queue i. A queue holding >= N documents releases its N oldest into
// the current step, so every micro-batch of that step gets one outlier of similar size instead of
// one micro-batch getting all of them. The step's documents (released outliers, then carry-over,
// then new arrivals, each group longest first) go to the micro-batch with the least W if it fits
// under S_max, else to the one with the fewest tokens if it fits, else carry to the next step.
//
// "wlb-refine" runs the same algorithm (same queues, same carry-over, so the same token delay) and
// then RefineMicroBatches() on each step, which moves and swaps documents from the heaviest
// micro-batch to lighter ones under S_max.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_join.h"
#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/packer.hpp"
#include "wlb/pack/refine.hpp"

namespace wlb {

// Checks outlier thresholds: at most kMaxOutlierQueues, strictly increasing, each in [1, S].
inline absl::Status ValidateThresholds(const std::vector<int64_t>& thresholds, int64_t context) {
  if (thresholds.size() > static_cast<size_t>(kMaxOutlierQueues)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d outlier thresholds, at most %d are allowed", thresholds.size(), kMaxOutlierQueues));
  }
  for (size_t i = 0; i < thresholds.size(); ++i) {
    if (thresholds[i] < 1 || thresholds[i] > context) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "outlier threshold %d is outside [1, %d] (the context window)", thresholds[i], context));
    }
    if (i > 0 && thresholds[i] <= thresholds[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("outlier thresholds must be strictly increasing, got %s",
                          absl::StrJoin(thresholds, ",")));
    }
  }
  return absl::OkStatus();
}

namespace detail {

// One step of Algorithm 1's placement: `released` outliers, then `carry` (already longest first),
// then `fresh` arrivals go, each longest first, to the micro-batch with the least W if it fits
// under S_max, else to the one with the fewest tokens if it fits; what fits nowhere is appended to
// `carry_out`, longest first (the order a stable sort of the three groups would give).
// `fresh_sorted` says `fresh` is already longest first (stable), which saves sorting it again.
inline std::vector<MicroBatch> PackUnderCap(std::vector<Document> released,
                                            const std::vector<Document>& carry,
                                            std::vector<Document> fresh, const PackerConfig& config,
                                            const DocumentCost& cost,
                                            std::vector<Document>& carry_out,
                                            bool fresh_sorted = false) {
  SortLongestFirst(released);
  if (!fresh_sorted) SortLongestFirst(fresh);
  std::vector<MicroBatch> mbs(config.micro_batches);
  // Room for a fair share and some more up front: growing every micro-batch's vector one
  // doubling at a time was a tenth of the packing time at N = 64.
  const size_t share = (released.size() + carry.size() + fresh.size()) / mbs.size();
  for (MicroBatch& mb : mbs) mb.documents.reserve(share + share / 4 + 4);
  // The least-W micro-batch, and the fewest-tokens one for a document that does not fit there
  // (it fits in the lightest, so in the emptiest too, whenever it fits anywhere), each from a
  // tournament tree over the micro-batches: O(log N) per document at every N, where a scan for
  // the emptiest and a heap rebuild after placing there made cap-full steps O(N) per document.
  // The emptiest is needed only for a document that does not fit the lightest, so its tree is
  // brought up to date only then: the micro-batches changed since go in `stale`, and are updated
  // one by one, or all at once when there are many.
  ArgminTree<double> lightest(mbs.size(), 0.0);
  ArgminTree<int64_t> emptiest(mbs.size(), 0);
  std::vector<size_t> stale;
  std::vector<char> is_stale(mbs.size(), 0);
  auto find_emptiest = [&] {
    if (stale.size() > mbs.size() / 16) {
      for (size_t b : stale) emptiest.SetLeaf(b, mbs[b].tokens);
      emptiest.Rebuild();
    } else {
      for (size_t b : stale) emptiest.Set(b, mbs[b].tokens);
    }
    for (size_t b : stale) is_stale[b] = 0;
    stale.clear();
    return emptiest.Min();
  };
  const size_t first_carried = carry_out.size();
  size_t carried_runs[3] = {0, 0, 0};
  int run = 0;
  const std::vector<Document>* groups[] = {&released, &carry, &fresh};
  for (const std::vector<Document>* group : groups) {
    for (const Document& d : *group) {
      size_t target = lightest.Min();
      if (mbs[target].tokens + d.length > config.max_tokens) {
        target = find_emptiest();
        if (mbs[target].tokens + d.length > config.max_tokens) {
          carry_out.push_back(d);  // not even the emptiest micro-batch has room
          continue;
        }
      }
      MicroBatch& mb = mbs[target];
      mb.documents.push_back(d);
      mb.tokens += d.length;
      mb.cost += cost(d.length);
      lightest.Set(target, mb.cost);
      if (!is_stale[target]) {
        is_stale[target] = 1;
        stale.push_back(target);
      }
    }
    carried_runs[run++] = carry_out.size();
  }
  // The carried documents form three runs, each longest first; merging keeps them sorted.
  const auto begin = carry_out.begin() + static_cast<std::ptrdiff_t>(first_carried);
  std::inplace_merge(begin, carry_out.begin() + carried_runs[0],
                     carry_out.begin() + carried_runs[1], LongerFirst);
  std::inplace_merge(begin, carry_out.begin() + carried_runs[1], carry_out.end(), LongerFirst);
  return mbs;
}

}  // namespace detail

class WlbPacker final : public Packer {
 public:
  // `thresholds` must pass ValidateThresholds (MakePacker checks); refine_rounds = 0 is plain WLB.
  WlbPacker(PackerConfig config, DocumentCost cost, std::vector<int64_t> thresholds,
            int refine_rounds)
      : Packer(config, std::move(cost)),
        thresholds_(std::move(thresholds)),
        queues_(thresholds_.size()),
        refine_rounds_(refine_rounds) {}

  std::string_view name() const override { return refine_rounds_ > 0 ? "wlb-refine" : "wlb"; }
  const std::vector<int64_t>& thresholds() const { return thresholds_; }

  std::vector<Document> Pending() const override {
    std::vector<Document> pending;
    for (const auto& q : queues_) pending.insert(pending.end(), q.begin(), q.end());
    pending.insert(pending.end(), carry_.begin(), carry_.end());
    return pending;
  }

  HeldBack Held() const override {
    HeldBack held;
    for (const auto& q : queues_) detail::AddHeld(q, held);
    detail::AddHeld(carry_, held);
    return held;
  }

  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["thresholds"] = thresholds_;
    j["refine_rounds"] = refine_rounds_;
    return j;
  }
  nlohmann::json StateJson() const override {
    nlohmann::json queues = nlohmann::json::array();
    for (const auto& q : queues_) queues.push_back(detail::DocumentsState(q));
    return {{"queues", queues}, {"carry", detail::DocumentsState(carry_)}};
  }
  void LoadStateJson(const nlohmann::json& j) override {
    const nlohmann::json& qs = j.at("queues");
    if (!qs.is_array() || qs.size() != queues_.size()) {
      throw nlohmann::json::out_of_range::create(401, "queue count does not match thresholds", &j);
    }
    std::vector<std::vector<Document>> queues;
    for (const nlohmann::json& q : qs) queues.push_back(detail::DocumentsFromState(q));
    std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
    queues_ = std::move(queues);
    carry_ = std::move(carry);
  }

 protected:
  // Queue i holds only lengths of level i, and the carry is longest first (PackStep merges it).
  absl::Status ValidateState(int64_t) const override {
    for (size_t i = 0; i < queues_.size(); ++i) {
      for (const Document& d : queues_[i]) {
        if (QueueLevel(d.length) != static_cast<int>(i)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "document %d piece %d of %d tokens is in outlier queue %d, not its queue %d", d.id,
              d.piece, d.length, i, QueueLevel(d.length)));
        }
      }
    }
    if (!std::is_sorted(carry_.begin(), carry_.end(), LongerFirst)) {
      return absl::InvalidArgumentError("carry-over is not ordered longest first");
    }
    return absl::OkStatus();
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    std::vector<Document> fresh;
    fresh.reserve(arrivals.size());
    for (const Document& d : arrivals) {
      const int level = QueueLevel(d.length);
      (level < 0 ? fresh : queues_[level]).push_back(d);
    }
    std::vector<Document> released;
    const size_t n = static_cast<size_t>(config_.micro_batches);
    for (auto& q : queues_) {
      if (q.size() < n) continue;
      released.insert(released.end(), q.begin(), q.begin() + n);
      q.erase(q.begin(), q.begin() + n);
    }
    std::vector<StepPlan> steps;
    steps.push_back(PackStep(std::move(released), std::move(fresh)));
    return steps;
  }

  // End of input: every queue releases everything, and steps are planned until nothing is held.
  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    while (!Pending().empty()) {  // each step places at least one piece, so this ends
      std::vector<Document> released;
      for (auto& q : queues_) {
        released.insert(released.end(), q.begin(), q.end());
        q.clear();
      }
      steps.push_back(PackStep(std::move(released), {}));
    }
    return steps;
  }

 private:
  int QueueLevel(int64_t length) const {
    int level = -1;
    for (size_t i = 0; i < thresholds_.size() && length >= thresholds_[i]; ++i) {
      level = static_cast<int>(i);
    }
    return level;
  }

  StepPlan PackStep(std::vector<Document> released, std::vector<Document> fresh) {
    std::vector<Document> carry = std::move(carry_);
    carry_.clear();
    std::vector<MicroBatch> mbs =
        detail::PackUnderCap(std::move(released), carry, std::move(fresh), config_, cost_, carry_);
    if (refine_rounds_ > 0) RefineMicroBatches(mbs, config_.max_tokens, cost_, refine_rounds_);
    return MakeStep(std::move(mbs));
  }

  std::vector<int64_t> thresholds_;
  std::vector<std::vector<Document>> queues_;  // FIFO per level
  std::vector<Document> carry_;                // did not fit in the last step
  int refine_rounds_;
};

}  // namespace wlb
