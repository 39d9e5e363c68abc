// te-zigzag (Transformer Engine's THD context parallelism): every document
// padded to a multiple of 2C and cut into 2C equal chunks (see shard_plan.hpp).
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

inline absl::StatusOr<ShardPlan> PlanPerDocumentPadded(const ShardPlanRequest& r) {
  const MicroBatch& mb = r.mb;
  const size_t docs = mb.documents.size();
  const int64_t n = 2 * static_cast<int64_t>(r.cp_size);
  PlanBuilder b(mb, r.starts, r.cp_size, docs * static_cast<size_t>(n));
  int64_t capacity = 0;  // every rank's buffer: two padded chunks of every document
  for (size_t i = 0; i < docs; ++i) {
    const int64_t d = mb.documents[i].length;
    const int64_t chunk = (d + n - 1) / n;
    capacity += 2 * chunk;
    for (int rank = 0; rank < r.cp_size; ++rank) {
      for (const int64_t j : {int64_t{rank}, n - 1 - rank}) {
        const int64_t lo = std::min(j * chunk, d);
        const int64_t hi = std::min((j + 1) * chunk, d);
        if (lo < hi) b.Add(rank, static_cast<int64_t>(i), lo, hi);
      }
    }
  }
  return b.Finish(ShardStrategy("te-zigzag"), r.requested, r.cp_size, capacity);
}

}  // namespace detail
}  // namespace wlb
