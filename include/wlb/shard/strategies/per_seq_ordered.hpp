// per-seq-ordered: per-sequence chunks of the documents laid out in the
// order PerSequenceOrder picks (see shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/shard/per_seq_order.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {
namespace detail {

// `order`: the packing order (document indices), or empty to search for one.
inline absl::StatusOr<ShardPlan> PlanPerSequenceOrdered(const ShardPlanRequest& r,
                                                        std::vector<int64_t> order) {
  const MicroBatch& mb = r.mb;
  const size_t docs = mb.documents.size();
  if (order.empty()) order = SearchPerSequenceOrder(mb, r.cp_size, r.model).order;
  const std::vector<int64_t> ordered_starts = OrderedStarts(mb, order);
  PlanBuilder b(mb, r.starts, r.cp_size, docs + 2 * static_cast<size_t>(r.cp_size));
  ForEachPerSequenceSegment(ordered_starts, r.cp_size,
                            [&](int rank, int64_t i, int64_t qb, int64_t qe) {
                              b.Add(rank, order[static_cast<size_t>(i)], qb, qe);
                            });
  return b.Finish(ShardStrategy("per-seq-ordered"), r.requested, r.cp_size,
                  2 * PerSequenceChunk(r.starts.back(), r.cp_size));
}

// The registry's entry (strategy_table.hpp): the order searched for.
inline absl::StatusOr<ShardPlan> PlanPerSequenceOrdered(const ShardPlanRequest& r) {
  return PlanPerSequenceOrdered(r, {});
}

}  // namespace detail
}  // namespace wlb
