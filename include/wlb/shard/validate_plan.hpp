// Checking a shard plan against its micro-batch (ValidateShardPlan).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/core/document.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {

// Checks that `plan` is a complete, consistent plan of `mb`: ranks 0..C-1, every token of every
// document held by exactly one segment, keys exactly the piece's prefix, positions, cu_seqlens,
// max lengths, token and pair counts matching the segments, rank tokens within rank_capacity.
// Returns InvalidArgument naming the first inconsistency.
inline absl::Status ValidateShardPlan(const ShardPlan& plan, const MicroBatch& mb) {
  absl::StatusOr<std::vector<int64_t>> starts_or = detail::CheckMicroBatch(mb, plan.cp_size);
  if (!starts_or.ok()) return starts_or.status();
  const std::vector<int64_t>& starts = *starts_or;
  if (plan.strategy == ShardStrategy("adaptive"))
    return detail::PlanError("plan strategy is unresolved adaptive");
  if (plan.ranks.size() != static_cast<size_t>(plan.cp_size)) {
    return detail::PlanError("plan has %d ranks for cp_size %d", plan.ranks.size(), plan.cp_size);
  }
  if (plan.tokens != starts.back()) {
    return detail::PlanError("plan tokens %d, micro-batch tokens %d", plan.tokens, starts.back());
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> held(mb.documents.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankShard& rs = plan.ranks[r];
    if (rs.rank != static_cast<int>(r))
      return detail::PlanError("ranks[%d] has rank %d", r, rs.rank);
    const size_t n = rs.segments.size();
    if (rs.cu_seqlens_q.size() != n + 1 || rs.cu_seqlens_k.size() != n + 1 ||
        rs.cu_seqlens_q[0] != 0 || rs.cu_seqlens_k[0] != 0) {
      return detail::PlanError("rank %d: cu_seqlens must have %d entries starting at 0", r, n + 1);
    }
    int64_t tokens = 0, pairs = 0, max_q = 0, max_k = 0;
    for (size_t i = 0; i < n; ++i) {
      const Segment& s = rs.segments[i];
      if (s.doc_index < 0 || s.doc_index >= static_cast<int64_t>(mb.documents.size())) {
        return detail::PlanError("rank %d segment %d: doc_index %d out of range", r, i,
                                 s.doc_index);
      }
      const Document& d = mb.documents[static_cast<size_t>(s.doc_index)];
      if (s.id != d.id || s.piece != d.piece) {
        return detail::PlanError(
            "rank %d segment %d: id %d piece %d, document %d is id %d piece %d", r, i, s.id,
            s.piece, s.doc_index, d.id, d.piece);
      }
      if (!(0 <= s.q_begin && s.q_begin < s.q_end && s.q_end <= d.length)) {
        return detail::PlanError(
            "rank %d segment %d: queries [%d, %d) not a non-empty range of [0, %d)", r, i,
            s.q_begin, s.q_end, d.length);
      }
      const int64_t start = starts[static_cast<size_t>(s.doc_index)];
      if (s.q_pos != start + s.q_begin || s.k_pos != start) {
        return detail::PlanError("rank %d segment %d: q_pos %d / k_pos %d, expected %d / %d", r, i,
                                 s.q_pos, s.k_pos, start + s.q_begin, start);
      }
      if (rs.cu_seqlens_q[i + 1] - rs.cu_seqlens_q[i] != s.q_len() ||
          rs.cu_seqlens_k[i + 1] - rs.cu_seqlens_k[i] != s.q_end) {
        return detail::PlanError(
            "rank %d segment %d: cu_seqlens give %d queries / %d keys, segment has %d / %d", r, i,
            rs.cu_seqlens_q[i + 1] - rs.cu_seqlens_q[i],
            rs.cu_seqlens_k[i + 1] - rs.cu_seqlens_k[i], s.q_len(), s.q_end);
      }
      tokens += s.q_len();
      pairs += CausalPairs(s.q_begin, s.q_end);
      max_q = std::max(max_q, s.q_len());
      max_k = std::max(max_k, s.q_end);
      held[static_cast<size_t>(s.doc_index)].push_back({s.q_begin, s.q_end});
    }
    if (rs.tokens != tokens || rs.causal_pairs != pairs || rs.max_seqlen_q != max_q ||
        rs.max_seqlen_k != max_k) {
      return detail::PlanError(
          "rank %d: tokens/pairs/max_seqlen_q/max_seqlen_k %d/%d/%d/%d, segments give "
          "%d/%d/%d/%d",
          r, rs.tokens, rs.causal_pairs, rs.max_seqlen_q, rs.max_seqlen_k, tokens, pairs, max_q,
          max_k);
    }
    if (tokens > plan.rank_capacity) {
      return detail::PlanError("rank %d holds %d tokens, rank_capacity is %d", r, tokens,
                               plan.rank_capacity);
    }
  }
  for (size_t i = 0; i < held.size(); ++i) {
    std::sort(held[i].begin(), held[i].end());
    int64_t next = 0;
    for (const auto& [b, e] : held[i]) {
      if (b != next) {
        return detail::PlanError("document %d (id %d): token %d held %s", i, mb.documents[i].id,
                                 std::min(b, next), b > next ? "by no rank" : "twice");
      }
      next = e;
    }
    if (next != mb.documents[i].length) {
      return detail::PlanError("document %d (id %d): token %d held by no rank", i,
                               mb.documents[i].id, next);
    }
  }
  return absl::OkStatus();
}

}  // namespace wlb
