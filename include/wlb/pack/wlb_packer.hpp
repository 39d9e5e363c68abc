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
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/length_order.hpp"
#include "wlb/pack/outlier_queues.hpp"
#include "wlb/pack/packer.hpp"
#include "wlb/pack/refine.hpp"

namespace wlb {

namespace detail {

// One step of Algorithm 1's placement: `released` outliers, then `carry`, then `fresh` arrivals go,
// each longest first, to the micro-batch with the least W if it fits under S_max, else to the one
// with the fewest tokens if it fits; what fits nowhere stays in `carry`, in the order a stable
// longest-first sort of the three groups would give (released, carry, fresh among equal lengths).
// `fresh_sorted` says `fresh` is already longest first (stable), which saves sorting it again.
// Time: O((placed + released + fresh) log) for a step, plus one merge of the carry when the step
// leaves documents over (not in a drain): a carried document that does not fit the emptiest
// micro-batch is never looked at.
//
// From this many micro-batches, PackUnderCap copies the arrivals into the micro-batches after
// placing them all, one micro-batch after another (below it, each as it is placed). Measured with
// BM_Scaling/wlb against appending as placed: about 10% slower at N = 256, 15% faster at N = 1,024
// and 20% at N = 4,096.
inline constexpr size_t kGroupedCopyMicroBatches = 1024;

inline std::vector<MicroBatch> PackUnderCap(std::vector<Document> released, LengthOrdered& carry,
                                            std::span<const Document> fresh,
                                            const PackerConfig& config, const DocumentCost& cost,
                                            bool fresh_sorted = false) {
  SortLongestFirst(released);
  const size_t n = static_cast<size_t>(config.micro_batches);
  std::vector<MicroBatch> mbs(n);
  // The least-W micro-batch, and the fewest-tokens one for a document that does not fit there
  // (it fits in the lightest, so in the emptiest too, whenever it fits anywhere), each from a
  // tournament tree over the micro-batches: O(log N) per document at every N, where a scan for
  // the emptiest and a heap rebuild after placing there made cap-full steps O(N) per document.
  // The emptiest is needed only for a document that does not fit the lightest, so its tree is
  // brought up to date only then: the micro-batches changed since go in `stale`, and are updated
  // one by one, or all at once when there are many.
  ArgminTree<double> lightest(n, 0.0);
  ArgminTree<int64_t> emptiest(n, 0);
  std::vector<uint32_t> stale;
  std::vector<char> is_stale(n, 0);
  auto find_emptiest = [&] {
    if (stale.size() > n / 16) {
      for (uint32_t b : stale) emptiest.SetLeaf(b, mbs[b].tokens);
      emptiest.Rebuild();
    } else {
      for (uint32_t b : stale) emptiest.Set(b, mbs[b].tokens);
    }
    for (uint32_t b : stale) is_stale[b] = 0;
    stale.clear();
    return emptiest.Min();
  };
  // The micro-batch a document of `length` tokens goes to, or kNowhere when not even the emptiest
  // has room; its tokens and W are added there.
  constexpr uint32_t kNowhere = std::numeric_limits<uint32_t>::max();
  auto place = [&](int64_t length) -> uint32_t {
    size_t target = lightest.Min();
    MicroBatch* mb = &mbs[target];
    if (mb->tokens + length > config.max_tokens) {
      target = find_emptiest();
      mb = &mbs[target];
      if (mb->tokens + length > config.max_tokens) return kNowhere;
    }
    mb->tokens += length;
    mb->cost += cost(length);
    lightest.Set(target, mb->cost);
    if (!is_stale[target]) {
      is_stale[target] = 1;
      stale.push_back(static_cast<uint32_t>(target));
    }
    return static_cast<uint32_t>(target);
  };
  // Small steps append each document to its micro-batch as it is placed. Steps of many
  // micro-batches record each arrival's micro-batch and copy the arrivals in afterwards, one
  // micro-batch after another (`grouped`): at N = 4,096 a step's documents are 5 MB, and appending
  // them in longest-first order to 4,096 micro-batches missed the cache twice per document (the
  // appends were a quarter of wlb's time), while below a few hundred micro-batches the extra
  // passes cost more than they save.
  const bool grouped = n >= kGroupedCopyMicroBatches;
  if (!grouped) {
    // Room for a fair share of what the step can take and some more up front: growing every
    // micro-batch's vector one doubling at a time was a tenth of the packing time at N = 64. The
    // share is scaled down when the step holds more than N x S_max tokens, so a carry of millions
    // of documents does not reserve millions of slots per micro-batch.
    int64_t step_tokens = carry.tokens();
    for (const Document& d : released) step_tokens += d.length;
    for (const Document& d : fresh) step_tokens += d.length;
    const int64_t capacity = config.max_tokens * config.micro_batches;
    const size_t count = released.size() + static_cast<size_t>(carry.size()) + fresh.size();
    size_t share = count / n;
    if (step_tokens > capacity) {
      share = static_cast<size_t>(static_cast<double>(share) * static_cast<double>(capacity) /
                                  static_cast<double>(step_tokens));
    }
    for (MicroBatch& mb : mbs) mb.documents.reserve(share + share / 4 + 4);
  }
  std::vector<Document> released_left;
  for (const Document& d : released) {
    if (const uint32_t b = place(d.length); b != kNowhere) {
      mbs[b].documents.push_back(d);
    } else {
      released_left.push_back(d);  // not even the emptiest micro-batch has room
    }
  }
  // The carried documents in order that fit the emptiest micro-batch are exactly the ones a scan
  // of the carry would place; the others stay where they are.
  while (std::optional<Document> d =
             carry.TakeFirstAtMost(config.max_tokens - mbs[find_emptiest()].tokens)) {
    mbs[place(d->length)].documents.push_back(*d);  // it fits the emptiest, so it is placed
  }
  std::vector<Document> fresh_left;
  if (!grouped) {
    auto place_fresh = [&](const Document& d) {
      if (const uint32_t b = place(d.length); b != kNowhere) {
        mbs[b].documents.push_back(d);
      } else {
        fresh_left.push_back(d);
      }
    };
    // Unsorted arrivals are placed through their longest-first order, not sorted into a copy
    // first: at N = 4,096 that copy of a step's documents was 14% of wlb's time.
    if (fresh_sorted) {
      for (const Document& d : fresh) place_fresh(d);
    } else {
      ForEachInOrder(fresh, LongestFirstOrder(fresh), place_fresh);
    }
  } else {
    // Arrivals in longest-first order, their lengths from the sort's keys (not read from the
    // documents in a permuted order); each one's micro-batch, and how many go to each.
    std::vector<int64_t> lengths;
    std::vector<size_t> order;
    if (!fresh_sorted) order = LongestFirstOrder(fresh, &lengths);
    std::vector<uint32_t> fresh_mb(fresh.size());
    std::vector<size_t> first(n + 1, 0);  // arrivals per micro-batch, then where each run starts
    for (size_t i = 0; i < fresh.size(); ++i) {
      const size_t position = fresh_sorted ? i : order[i];
      fresh_mb[i] = place(fresh_sorted ? fresh[i].length : lengths[i]);
      if (fresh_mb[i] == kNowhere) {
        fresh_left.push_back(fresh[position]);
      } else {
        ++first[fresh_mb[i] + 1];
      }
    }
    for (size_t b = 0; b < n; ++b) {
      mbs[b].documents.reserve(mbs[b].documents.size() + first[b + 1]);
      first[b + 1] += first[b];
    }
    // The placed arrivals' positions grouped by micro-batch, placement order kept (a stable
    // counting sort), then read once each in that order, micro-batch after micro-batch.
    std::vector<size_t> by_mb(first[n]);
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (fresh_mb[i] != kNowhere) by_mb[first[fresh_mb[i]]++] = fresh_sorted ? i : order[i];
    }
    size_t b = 0, copied = 0;  // first[b] is now the end of micro-batch b's run
    ForEachInOrder(fresh, by_mb, [&](const Document& d) {
      while (copied == first[b]) ++b;
      mbs[b].documents.push_back(d);
      ++copied;
    });
  }
  carry.Merge(released_left, fresh_left);
  return mbs;
}

// Leaves no micro-batch of a step empty while documents are held: each empty micro-batch takes
// the oldest queued outlier, or else the carry-over's longest document (any held piece fits an
// empty micro-batch: it is at most S <= S_max tokens). Placement leaves a micro-batch empty only
// when the step has fewer pieces to place than micro-batches, which happens when the arrivals are
// mostly queued (small S, or thresholds low for the stream) or held back; an empty micro-batch
// idles its pipeline stages and DP ranks for the whole step, and a model given a 0-token input
// raises. A step cut from the stream has at least N pieces, so only a drain or a partial last step
// can still end with one.
inline void FillEmptyMicroBatches(std::vector<MicroBatch>& mbs, OutlierQueues<Document>& queues,
                                  LengthOrdered& carry, const PackerConfig& config,
                                  const DocumentCost& cost) {
  std::vector<Document> taken;
  for (MicroBatch& mb : mbs) {
    if (!mb.documents.empty()) continue;
    std::optional<Document> d;
    if (queues.ReleaseOldest(taken)) {
      d = taken.back();
    } else {
      d = carry.TakeFirstAtMost(config.max_tokens);
    }
    if (!d) return;  // nothing held
    mb.documents.push_back(*d);
    mb.tokens = d->length;
    mb.cost = cost(d->length);
  }
}

}  // namespace detail

class WlbPacker final : public Packer {
 public:
  // `thresholds` must pass ValidateThresholds (MakePacker checks); refine_rounds = 0 is plain WLB.
  // `attention_range` (refinement only) must pass ValidateAttentionRange.
  WlbPacker(PackerConfig config, DocumentCost cost, std::vector<int64_t> thresholds,
            int refine_rounds, AttentionRange attention_range = {})
      : Packer(config, std::move(cost)),
        queues_(std::move(thresholds), config.context),
        refine_rounds_(refine_rounds),
        attention_range_(attention_range) {}

  std::string_view name() const override { return refine_rounds_ > 0 ? "wlb-refine" : "wlb"; }
  const std::vector<int64_t>& thresholds() const { return queues_.thresholds(); }

  std::vector<Document> Pending() const override {
    std::vector<Document> pending;
    queues_.AppendTo(pending);
    carry_.AppendTo(pending);
    return pending;
  }

  HeldBack Held() const override {
    return queues_.held() + HeldBack{carry_.size(), carry_.tokens()};
  }

  nlohmann::json ConfigJson() const override {
    nlohmann::json j = Packer::ConfigJson();
    j["thresholds"] = queues_.thresholds();
    j["refine_rounds"] = refine_rounds_;
    // No attention_range: like the cost, it only steers later choices (every held document is
    // valid under any range), so a state restores into a packer planning with another range or
    // cost (the sampler's online calibration swaps a FLOP cost for a fitted one mid-run).
    return j;
  }
  nlohmann::json StateJson() const override {
    return {{"queues", queues_.StateJson()}, {"carry", detail::DocumentsState(carry_.ToVector())}};
  }

 protected:
  absl::Status LoadStateJson(const nlohmann::json& j) override {
    return detail::LoadStateOrError([&]() -> absl::Status {
      OutlierQueues<Document> queues = queues_;
      if (absl::Status s = queues.LoadStateJson(j.at("queues")); !s.ok()) return s;
      const std::vector<Document> carry = detail::DocumentsFromState(j.at("carry"));
      // PackUnderCap keeps the carry longest first; a carry in another order is not a saved one.
      if (!std::is_sorted(carry.begin(), carry.end(), LongerFirst)) {
        throw nlohmann::json::out_of_range::create(401, "carry-over is not ordered longest first",
                                                   &j);
      }
      queues_ = std::move(queues);
      carry_ = detail::LengthOrdered(carry);
      return absl::OkStatus();
    });
  }

  // The held pieces (CheckHeldPieces), every push planned a step, and each outlier queue holds
  // only lengths of its level, oldest first (OutlierQueues::Validate).
  absl::Status ValidateState(int64_t pushes, int64_t next_step) const override {
    if (absl::Status s = CheckHeldPieces(pushes); !s.ok()) return s;
    if (next_step < pushes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "next_step %d is below the %d pushes: every push plans a step, so planned steps went "
          "backwards",
          next_step, pushes));
    }
    return queues_.Validate(pushes);
  }

  std::vector<StepPlan> DoPush(std::vector<Document> arrivals) override {
    // The arrivals no queue takes stay at the front, in order (not copied into a new vector).
    size_t fresh = 0;
    for (const Document& d : arrivals) {
      if (!queues_.Enqueue(d)) arrivals[fresh++] = d;
    }
    arrivals.resize(fresh);
    std::vector<Document> released;
    queues_.ReleaseFull(static_cast<size_t>(config_.micro_batches), released);
    std::vector<StepPlan> steps;
    steps.push_back(PackStep(std::move(released), std::move(arrivals)));
    return steps;
  }

  // End of input: every queue releases everything, and steps are planned until nothing is held.
  std::vector<StepPlan> DoFlush() override {
    std::vector<StepPlan> steps;
    while (Held().documents > 0) {  // each step places at least one piece, so this ends
      std::vector<Document> released;
      queues_.ReleaseAll(released);
      steps.push_back(PackStep(std::move(released), {}));
    }
    return steps;
  }

 private:
  StepPlan PackStep(std::vector<Document> released, std::vector<Document> fresh) {
    std::vector<MicroBatch> mbs =
        detail::PackUnderCap(std::move(released), carry_, fresh, config_, cost_);
    detail::FillEmptyMicroBatches(mbs, queues_, carry_, config_, cost_);
    if (refine_rounds_ > 0) {
      RefineMicroBatches(mbs, config_.max_tokens, cost_, refine_rounds_, attention_range_);
    }
    return MakeStep(std::move(mbs));
  }

  OutlierQueues<Document> queues_;  // Algorithm 1's outlier queues, first in, first out
  detail::LengthOrdered carry_;     // did not fit in the last step
  int refine_rounds_;
  AttentionRange attention_range_;  // refinement's changes must not worsen these costs
};

}  // namespace wlb
