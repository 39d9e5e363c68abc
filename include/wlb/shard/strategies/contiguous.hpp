// contiguous: the packed micro-batch in C contiguous runs of about T / C tokens (see
// shard_plan.hpp).
//
// Rank q holds tokens [bound[q], bound[q + 1]) of the micro-batch in its document order (as
// ring-flash-attention's llama3 split does), so at most C - 1 documents are cut and each cut
// document's later ranks receive only its rows before their run. Each boundary starts at
// q x T / C and moves to the nearest document start that keeps every run within the memory cap
// (CpRankTokenCap), where one is: that boundary then cuts no document and moves no rows.
//
// Why (issue 57): where the exchange outweighs attention (a slow link, or micro-batches of a few
// thousand tokens per rank, whose many short chunks each pay the kernel's per-segment floor)
// a plan that moves few rows wins, and no chunked plan reached this one: on seeded random
// micro-batches of 8K-32K tokens at 25 GB/s adaptive was up to 2.0x slower than this split
// before it became one of adaptive's candidates (docs/results/cp/balance.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {
namespace detail {

// The C + 1 run boundaries of the contiguous split of a micro-batch with document starts
// `starts` (starts.back() = T): bound[0] = 0, bound[C] = T, nondecreasing, every run at most
// `cap` tokens (the memory cap, CpRankTokenCap(T, C, ...)).
inline std::vector<int64_t> ContiguousBounds(const std::vector<int64_t>& starts, int cp_size,
                                             int64_t cap) {
  const int64_t total = starts.back();
  const int64_t c = std::max(1, cp_size);
  std::vector<int64_t> bound(static_cast<size_t>(c) + 1, 0);
  bound[static_cast<size_t>(c)] = total;
  for (int64_t q = 1; q < c; ++q) {
    const int64_t prev = bound[static_cast<size_t>(q - 1)];
    // Runs q..C-1 must hold the rest within the cap, and run q - 1 at most the cap.
    const int64_t lo = std::max(prev, total - (c - q) * cap);
    const int64_t hi = std::min(total, prev + cap);
    const int64_t ideal = std::clamp(total / c * q + total % c * q / c, lo, hi);
    int64_t at = ideal;
    // The nearest document start in [lo, hi] past the previous boundary, if any.
    const auto next = std::lower_bound(starts.begin(), starts.end(), ideal);
    int64_t nearest = -1;
    if (next != starts.end() && *next <= hi && *next > prev) nearest = *next;
    if (next != starts.begin()) {
      const int64_t before = *(next - 1);
      if (before >= lo && before > prev && (nearest < 0 || ideal - before < nearest - ideal)) {
        nearest = before;
      }
    }
    if (nearest >= 0) at = nearest;
    bound[static_cast<size_t>(q)] = at;
  }
  return bound;
}

inline absl::StatusOr<ShardPlan> PlanContiguous(const ShardPlanRequest& r) {
  const std::vector<int64_t> bound = ContiguousBounds(r.starts, r.cp_size, RankTokenCap(r));
  PlanBuilder b(r.mb, r.starts, r.cp_size, r.mb.documents.size() + static_cast<size_t>(r.cp_size));
  int64_t k = 0;
  for (int q = 0; q < r.cp_size; ++q) {
    ForEachPieceOfRun(r.starts, bound[static_cast<size_t>(q)], bound[static_cast<size_t>(q) + 1], k,
                      [&](int64_t i, int64_t qb, int64_t qe) { b.Add(q, i, qb, qe); });
  }
  return b.Finish(ShardStrategy("contiguous"), r.requested, r.cp_size, -1);
}

}  // namespace detail
}  // namespace wlb
