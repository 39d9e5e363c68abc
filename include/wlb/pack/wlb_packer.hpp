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
#include <deque>
#include <functional>
#include <optional>
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

// One step of Algorithm 1's placement: `released` outliers, then `carry`, then `fresh` arrivals go,
// each longest first, to the micro-batch with the least W if it fits under S_max, else to the one
// with the fewest tokens if it fits; what fits nowhere stays in `carry`, in the order a stable
// longest-first sort of the three groups would give (released, carry, fresh among equal lengths).
// `fresh_sorted` says `fresh` is already longest first (stable), which saves sorting it again.
// Time: O((placed + released + fresh) log) for a step, plus one merge of the carry when the step
// leaves documents over (not in a drain): a carried document that does not fit the emptiest
// micro-batch is never looked at.
inline std::vector<MicroBatch> PackUnderCap(std::vector<Document> released, LengthOrdered& carry,
                                            std::vector<Document> fresh, const PackerConfig& config,
                                            const DocumentCost& cost, bool fresh_sorted = false) {
  SortLongestFirst(released);
  if (!fresh_sorted) SortLongestFirst(fresh);
  std::vector<MicroBatch> mbs(config.micro_batches);
  // Room for a fair share of what the step can take and some more up front: growing every
  // micro-batch's vector one doubling at a time was a tenth of the packing time at N = 64. The
  // share is scaled down when the step holds more than N x S_max tokens, so a carry of millions
  // of documents does not reserve millions of slots per micro-batch.
  int64_t tokens = carry.tokens();
  for (const Document& d : released) tokens += d.length;
  for (const Document& d : fresh) tokens += d.length;
  const int64_t capacity = config.max_tokens * config.micro_batches;
  const size_t count = released.size() + static_cast<size_t>(carry.size()) + fresh.size();
  size_t share = count / mbs.size();
  if (tokens > capacity) {
    share = static_cast<size_t>(static_cast<double>(share) * static_cast<double>(capacity) /
                                static_cast<double>(tokens));
  }
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
  auto place = [&](const Document& d) {
    size_t target = lightest.Min();
    if (mbs[target].tokens + d.length > config.max_tokens) {
      target = find_emptiest();
      if (mbs[target].tokens + d.length > config.max_tokens) return false;
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
    return true;
  };
  std::vector<Document> released_left;
  for (const Document& d : released) {
    if (!place(d)) released_left.push_back(d);  // not even the emptiest micro-batch has room
  }
  // The carried documents in order that fit the emptiest micro-batch are exactly the ones a scan
  // of the carry would place; the others stay where they are.
  while (std::optional<Document> d =
             carry.TakeFirstAtMost(config.max_tokens - mbs[find_emptiest()].tokens)) {
    place(*d);  // it fits the emptiest, so it is placed
  }
  std::vector<Document> fresh_left;
  for (const Document& d : fresh) {
    if (!place(d)) fresh_left.push_back(d);
  }
  carry.Merge(released_left, fresh_left);
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
    carry_.AppendTo(pending);
    return pending;
  }

  HeldBack Held() const override { return queued_ + HeldBack{carry_.size(), carry_.tokens()}; }

  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["thresholds"] = thresholds_;
    j["refine_rounds"] = refine_rounds_;
    return j;
  }
  nlohmann::json StateJson() const override {
    nlohmann::json queues = nlohmann::json::array();
    for (const auto& q : queues_) queues.push_back(detail::DocumentsState(q));
    return {{"queues", queues}, {"carry", detail::DocumentsState(carry_.ToVector())}};
  }
  void LoadStateJson(const nlohmann::json& j) override {
    const nlohmann::json& qs = j.at("queues");
    if (!qs.is_array() || qs.size() != queues_.size()) {
      throw nlohmann::json::out_of_range::create(401, "queue count does not match thresholds", &j);
    }
    std::vector<std::deque<Document>> queues;
    HeldBack queued;
    for (const nlohmann::json& q : qs) {
      std::vector<Document> docs = detail::DocumentsFromState(q);
      detail::AddHeld(docs, queued);
      queues.emplace_back(docs.begin(), docs.end());
    }
    const std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
    // PackUnderCap keeps the carry longest first; a carry in another order is not a saved one.
    if (!std::is_sorted(carry.begin(), carry.end(), LongerFirst)) {
      throw nlohmann::json::out_of_range::create(401, "carry-over is not ordered longest first",
                                                 &j);
    }
    queues_ = std::move(queues);
    queued_ = queued;
    carry_ = detail::LengthOrdered(carry);
  }

 protected:
  // Queue i holds only lengths of level i, oldest first; every push planned a step.
  absl::Status ValidateState(int64_t pushes, int64_t next_step) const override {
    if (next_step < pushes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "next_step %d is below the %d pushes: every push plans a step, so planned steps went "
          "backwards",
          next_step, pushes));
    }
    for (size_t i = 0; i < queues_.size(); ++i) {
      for (size_t k = 1; k < queues_[i].size(); ++k) {
        if (queues_[i][k].arrival_step < queues_[i][k - 1].arrival_step) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "outlier queue %d: document %d (arrival step %d) is queued after document %d "
              "(arrival step %d), but queues are first in, first out",
              i, queues_[i][k - 1].id, queues_[i][k - 1].arrival_step, queues_[i][k].id,
              queues_[i][k].arrival_step));
        }
      }
      for (const Document& d : queues_[i]) {
        if (QueueLevel(d.length) != static_cast<int>(i)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "document %d piece %d of %d tokens is in outlier queue %d, not its queue %d", d.id,
              d.piece, d.length, i, QueueLevel(d.length)));
        }
      }
    }
    return absl::OkStatus();
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    std::vector<Document> fresh;
    fresh.reserve(arrivals.size());
    for (const Document& d : arrivals) {
      const int level = QueueLevel(d.length);
      if (level < 0) {
        fresh.push_back(d);
        continue;
      }
      queues_[level].push_back(d);
      queued_ = queued_ + HeldBack{1, d.length};
    }
    std::vector<Document> released;
    const size_t n = static_cast<size_t>(config_.micro_batches);
    for (auto& q : queues_) {
      if (q.size() < n) continue;
      released.insert(released.end(), q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
      q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));  // a deque: O(n)
    }
    queued_ = queued_ - HeldBack{static_cast<int64_t>(released.size()), TotalTokens(released)};
    std::vector<StepPlan> steps;
    steps.push_back(PackStep(std::move(released), std::move(fresh)));
    return steps;
  }

  // End of input: every queue releases everything, and steps are planned until nothing is held.
  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    while (Held().documents > 0) {  // each step places at least one piece, so this ends
      std::vector<Document> released;
      for (auto& q : queues_) {
        released.insert(released.end(), q.begin(), q.end());
        q.clear();
      }
      queued_ = {};
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
    std::vector<MicroBatch> mbs =
        detail::PackUnderCap(std::move(released), carry_, std::move(fresh), config_, cost_);
    if (refine_rounds_ > 0) RefineMicroBatches(mbs, config_.max_tokens, cost_, refine_rounds_);
    return MakeStep(std::move(mbs));
  }

  std::vector<int64_t> thresholds_;
  std::vector<std::deque<Document>> queues_;  // FIFO per level
  HeldBack queued_;                           // documents and tokens in queues_
  detail::LengthOrdered carry_;               // did not fit in the last step
  int refine_rounds_;
};

}  // namespace wlb
