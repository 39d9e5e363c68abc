// kAdaptive ("adaptive"): per micro-batch, the fastest predicted of kPerSequenceOrdered,
// kPerDocument and kHybrid (see shard_plan.hpp).
//
// Ranking: a model without a packed-call fit predicts each rank as the sum of its segments'
// SegmentMs (forward). A model with one (KernelModel::WithPackedCalls) predicts each rank of each
// candidate's plan as one packed call, KernelModel::CallMs: forward + backward when the fit has
// backward. Either way the candidate plans themselves are planned with SegmentMs as before, so a
// packed-call fit changes adaptive's pick only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/per_seq_order.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"

namespace wlb {

// Predicted max-rank latency (ms) of the fixed strategies and adaptive's pick: summed SegmentMs
// (forward), or with a packed-call fit in the model, its CallMs of each rank (forward + backward
// when the fit has backward; packed_calls says which).
struct AdaptiveChoice {
  ShardStrategy chosen = ShardStrategy("per-seq-ordered");
  double per_seq_max_ms = 0.0;  // micro-batch order (the paper's per-sequence sharding)
  double per_seq_ordered_max_ms = 0.0;
  double per_doc_max_ms = 0.0;
  double hybrid_max_ms = 0.0;
  bool packed_calls = false;  // the maxima are the packed-call fit's CallMs
};

// The largest KernelModel::CallMs over a plan's ranks (each rank's segments as one call).
inline double MaxRankCallMs(const ShardPlan& plan, const KernelModel& model) {
  double worst = 0.0;
  std::vector<CallSegment> call;
  for (const RankShard& r : plan.ranks) {
    call.clear();
    for (const Segment& s : r.segments) call.push_back({s.q_len(), s.q_end});
    worst = std::max(worst, model.CallMs(call));
  }
  return worst;
}

namespace detail {

// Predicted latency of every rank under per-sequence or per-document sharding, without
// building the plan.
inline std::vector<double> PredictFixed(const MicroBatch& mb, const std::vector<int64_t>& starts,
                                        int cp_size, ShardStrategy strategy,
                                        const KernelModel& model) {
  std::vector<double> ms(static_cast<size_t>(cp_size), 0.0);
  auto add = [&](int rank, int64_t, int64_t q_begin, int64_t q_end) {
    ms[static_cast<size_t>(rank)] += model.SegmentMs(q_end - q_begin, q_end);
  };
  if (strategy == ShardStrategy("per-seq")) {
    ForEachPerSequenceSegment(starts, cp_size, add);
  } else {
    ForEachPerDocumentSegment(
        mb, cp_size, [](size_t) { return true; }, add);
  }
  return ms;
}

// ChooseAdaptive on a checked micro-batch; also returns the ordered search's order.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptiveChecked(const MicroBatch& mb,
                                                            const std::vector<int64_t>& starts,
                                                            int cp_size, const KernelModel& model,
                                                            const CpPlanOptions& options,
                                                            std::vector<int64_t>* order) {
  AdaptiveChoice c;
  OrderResult ordered = SearchPerSequenceOrder(mb, cp_size, model);
  if (model.has_packed_calls()) {
    // Every candidate's plan, each rank one packed call.
    c.packed_calls = true;
    const ShardPlanRequest r{.mb = mb,
                             .starts = starts,
                             .cp_size = cp_size,
                             .requested = ShardStrategy("adaptive"),
                             .model = model,
                             .options = options};
    double* out[] = {&c.per_seq_max_ms, &c.per_seq_ordered_max_ms, &c.per_doc_max_ms,
                     &c.hybrid_max_ms};
    absl::StatusOr<ShardPlan> plans[] = {PlanPerSequence(r),
                                         PlanPerSequenceOrdered(r, ordered.order),
                                         PlanPerDocument(r), PlanHybrid(r)};
    for (size_t k = 0; k < 4; ++k) {
      if (!plans[k].ok()) return plans[k].status();
      *out[k] = MaxRankCallMs(*plans[k], model);
    }
  } else {
    c.per_seq_max_ms = ordered.given_max_ms;  // PredictFixed's kPerSequence maximum, same sums
    c.per_seq_ordered_max_ms = ordered.max_ms;
    c.per_doc_max_ms = MaxOf(PredictFixed(mb, starts, cp_size, ShardStrategy("per-doc"), model));
    c.hybrid_max_ms = HybridMaxMs(mb, cp_size, model);
  }
  c.chosen = ShardStrategy("per-seq-ordered");
  double best = c.per_seq_ordered_max_ms;
  if (c.per_doc_max_ms < best) {
    c.chosen = ShardStrategy("per-doc");
    best = c.per_doc_max_ms;
  }
  if (c.hybrid_max_ms < best) c.chosen = ShardStrategy("hybrid");
  if (order != nullptr) *order = std::move(ordered.order);
  return c;
}

}  // namespace detail

// What kAdaptive would choose for this micro-batch; errors as PlanShards.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptive(const MicroBatch& mb, int cp_size,
                                                     const KernelModel& model) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  return detail::ChooseAdaptiveChecked(mb, *starts, cp_size, model, CpPlanOptions{}, nullptr);
}

namespace detail {

// Plans what ChooseAdaptive picks (the plan records it; requested stays kAdaptive).
inline absl::StatusOr<ShardPlan> PlanAdaptive(const ShardPlanRequest& r) {
  std::vector<int64_t> order;
  absl::StatusOr<AdaptiveChoice> c =
      ChooseAdaptiveChecked(r.mb, r.starts, r.cp_size, r.model, r.options, &order);
  if (!c.ok()) return c.status();
  if (c->chosen == ShardStrategy("per-doc")) return PlanPerDocument(r);
  if (c->chosen == ShardStrategy("hybrid")) return PlanHybrid(r);
  return PlanPerSequenceOrdered(r, std::move(order));
}

}  // namespace detail
}  // namespace wlb
