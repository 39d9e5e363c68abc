// Token index maps of a shard plan: which rows of the packed micro-batch each CP rank holds, and
// where each rank's keys sit after an all-gather of every rank's local rows.
//
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, 4, wlb::ShardStrategy::kAdaptive,
//                                                         wlb::KernelModel::Default());
//   absl::StatusOr<wlb::ShardMaps> maps = wlb::BuildShardMaps(*plan);
//   // rank r: q_local = packed[maps->ranks[r].local_to_packed]       (its query/K/V rows)
//   //         gathered = all_gather(q_local padded to rank_capacity)  (C * rank_capacity rows)
//   //         k_rank = gathered[maps->ranks[r].key_rows]              (cu_seqlens_k layout)
//
// Layout (Llama-3 style CP, as backends/cuda executes it): rank r holds its segments' queries in
// plan order, rows [0, tokens), then padding up to rank_capacity. The all-gather concatenates the
// ranks' buffers rank-major, so local row i of rank r is gathered row r * rank_capacity + i. A
// rank's key rows are, per segment in order, the keys [0, q_end) of the segment's piece, i.e. the
// packed rows [k_pos, k_pos + q_end), matching the rank's cu_seqlens_k.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/shard/shard_plan.hpp"

namespace wlb {

// One rank's rows. Indices are int32, as varlen kernels and gathers take them.
struct RankMaps {
  std::vector<int32_t> local_to_packed;  // local query row -> packed micro-batch row (tokens)
  std::vector<int32_t> key_rows;         // rank key row -> gathered row (cu_seqlens_k.back())
};

// Every rank's rows for one plan.
struct ShardMaps {
  std::vector<int32_t> packed_to_gathered;  // packed row -> gathered row (plan.tokens)
  std::vector<RankMaps> ranks;              // ranks[r] for plan.ranks[r]
};

// Builds the maps. InvalidArgument when the plan is inconsistent (a segment outside the
// micro-batch, a packed token held by two ranks or by none, a rank over rank_capacity);
// OutOfRange when the gathered rows (cp_size * rank_capacity) or a rank's keys exceed int32.
inline absl::StatusOr<ShardMaps> BuildShardMaps(const ShardPlan& plan) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (plan.cp_size < 1 || plan.ranks.size() != static_cast<size_t>(plan.cp_size)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shard plan has cp_size %d and %d ranks; need cp_size >= 1 ranks",
                        plan.cp_size, plan.ranks.size()));
  }
  if (plan.tokens < 0 || plan.rank_capacity < 0 || plan.tokens > kInt32Max ||
      plan.rank_capacity > kInt32Max / plan.cp_size) {
    return absl::OutOfRangeError(absl::StrFormat(
        "shard plan: %d tokens, %d ranks x rank_capacity %d; gathered rows must fit int32 (%d)",
        plan.tokens, plan.cp_size, plan.rank_capacity, kInt32Max));
  }
  // Every rank gathers the keys [0, q_end) of each of its segments: about C x tokens rows under
  // per-document sharding. Refused before anything is allocated beyond kMaxShardMapRows.
  int64_t rows = 2 * plan.tokens;  // packed_to_gathered and the local rows
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) rows += std::clamp<int64_t>(s.q_end, 0, kInt32Max);
    if (rows > kMaxShardMapRows) {
      return absl::OutOfRangeError(absl::StrFormat(
          "shard plan of %d tokens over %d ranks: its index maps need more than %d rows (the limit "
          "kMaxShardMapRows; per-document sharding gathers about C x tokens key rows); plan a "
          "smaller micro-batch or CP size, or use the plan's segments and cu_seqlens directly",
          plan.tokens, plan.cp_size, kMaxShardMapRows));
    }
  }
  ShardMaps maps;
  maps.packed_to_gathered.assign(static_cast<size_t>(plan.tokens), -1);
  maps.ranks.resize(plan.ranks.size());
  // Pass 1: local rows, and where every packed row lands after the all-gather.
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    RankMaps& m = maps.ranks[r];
    int64_t keys = 0;
    for (const Segment& s : plan.ranks[r].segments) {
      if (s.q_begin < 0 || s.q_begin >= s.q_end || s.k_pos < 0 || s.q_pos != s.k_pos + s.q_begin ||
          s.k_pos + s.q_end > plan.tokens) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d segment of document %d: queries [%d, %d) at packed %d, keys at packed %d "
            "do not lie in the %d-token micro-batch",
            r, s.doc_index, s.q_begin, s.q_end, s.q_pos, s.k_pos, plan.tokens));
      }
      const int64_t local = static_cast<int64_t>(m.local_to_packed.size());
      if (local + s.q_len() > plan.rank_capacity) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d: segments hold more than rank_capacity %d tokens", r, plan.rank_capacity));
      }
      keys += s.q_end;
      if (keys > kInt32Max) {
        return absl::OutOfRangeError(
            absl::StrFormat("rank %d: %d gathered keys exceed int32", r, keys));
      }
      for (int64_t i = 0; i < s.q_len(); ++i) {
        int32_t& slot = maps.packed_to_gathered[static_cast<size_t>(s.q_pos + i)];
        if (slot >= 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "packed token %d is held by rank %d and by gathered row %d", s.q_pos + i, r, slot));
        }
        slot = static_cast<int32_t>(static_cast<int64_t>(r) * plan.rank_capacity + local + i);
        m.local_to_packed.push_back(static_cast<int32_t>(s.q_pos + i));
      }
    }
  }
  for (size_t p = 0; p < maps.packed_to_gathered.size(); ++p) {
    if (maps.packed_to_gathered[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("packed token %d of %d is held by no rank", p, plan.tokens));
    }
  }
  // Pass 2: key rows, now that every packed row's gathered row is known.
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    RankMaps& m = maps.ranks[r];
    for (const Segment& s : plan.ranks[r].segments) {
      for (int64_t j = 0; j < s.q_end; ++j) {
        m.key_rows.push_back(maps.packed_to_gathered[static_cast<size_t>(s.k_pos + j)]);
      }
    }
  }
  return maps;
}

}  // namespace wlb
