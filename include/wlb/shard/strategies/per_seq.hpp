// per-seq: the packed micro-batch cut into 2C equal chunks (see shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {
namespace detail {

inline absl::StatusOr<ShardPlan> PlanPerSequence(const ShardPlanRequest& r) {
  PlanBuilder b(r.mb, r.starts, r.cp_size,
                r.mb.documents.size() + 2 * static_cast<size_t>(r.cp_size));
  ForEachPerSequenceSegment(r.starts, r.cp_size, [&](int rank, int64_t i, int64_t qb, int64_t qe) {
    b.Add(rank, i, qb, qe);
  });
  return b.Finish(ShardStrategy("per-seq"), r.requested, r.cp_size,
                  2 * PerSequenceChunk(r.starts.back(), r.cp_size));
}

}  // namespace detail
}  // namespace wlb
