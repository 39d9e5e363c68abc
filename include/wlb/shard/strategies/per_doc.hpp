// per-doc: every document cut into 2C shards, padding-free (see shard_plan.hpp).
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

inline absl::StatusOr<ShardPlan> PlanPerDocument(const ShardPlanRequest& r) {
  PlanBuilder b(r.mb, r.starts, r.cp_size,
                r.mb.documents.size() * 2 * static_cast<size_t>(r.cp_size));
  ForEachPerDocumentSegment(
      r.mb, r.cp_size, [](size_t) { return true; },
      [&](int rank, int64_t i, int64_t qb, int64_t qe) { b.Add(rank, i, qb, qe); });
  return b.Finish(ShardStrategy("per-doc"), r.requested, r.cp_size, -1);
}

}  // namespace detail
}  // namespace wlb
