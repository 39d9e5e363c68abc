// Token index maps of a shard plan under one layer's attention mask: which rows of the packed
// micro-batch each CP rank holds, where each rank's keys sit after an all-gather of every rank's
// local rows, and the varlen attention problem that applies the mask to them exactly.
//
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, 4, wlb::ShardStrategy("adaptive"),
//                                                         wlb::KernelModel::Default());
//   absl::StatusOr<wlb::ShardMaps> maps = wlb::BuildShardMaps(*plan, mask);  // mask: causal
//   // rank r: q_local = packed[maps->ranks[r].local_to_packed]       (its query/K/V rows)
//   //         gathered = all_gather(q_local padded to rank_capacity)  (C * rank_capacity rows)
//   //         k_rank = gathered[maps->ranks[r].key_rows]              (maps' cu_seqlens_k layout)
//
// Layout (Llama-3 style CP, as backends/cuda executes it): rank r holds its segments' queries in
// plan order, rows [0, tokens), then padding up to rank_capacity. The all-gather concatenates the
// ranks' buffers rank-major, so local row i of rank r is gathered row r * rank_capacity + i.
//
// The mask (the layer's; the plan is the same for every layer of a mix) decides the key rows. A
// rank's attention is a list of kernel segments in local-row order, each a run of queries
// [q0, q1) of one piece with the keys [key_begin, q1) of that piece (packed rows
// [k_pos + key_begin, k_pos + q1)), aligned bottom-right, key_begin = mask.KeyBegin(q0):
//  - causal: one kernel segment per plan segment, key_begin 0 (the keys [0, q_end); the maps are
//    what they were before masks: cu_seqlens_q/k equal the RankShard's);
//  - window w: one kernel segment per plan segment, key_begin = max(0, q_begin - w + 1); query
//    row i of the segment sees the last w keys up to its own (FlashAttention's window_size
//    (w - 1, 0)), i.e. exactly the piece keys [max(0, p - w + 1), p] of its position p;
//  - chunk c: a plan segment is cut where it crosses a multiple of c, each part with the keys of
//    its own chunk, key_begin = floor(q0 / c) * c; plain bottom-right causal inside every kernel
//    segment then gives query p exactly the keys [floor(p / c) * c, p].
// So an executor runs bottom-right causal attention over the kernel segments, limited to the
// last w keys per query row under a sliding window (KernelWindow), and gathers only those keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/cost/attention_mask.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace wlb {

// One rank's rows and its attention problem under the maps' mask (the file comment). Indices are
// int32, as varlen kernels and gathers take them.
struct RankMaps {
  std::vector<int32_t> local_to_packed;  // local query row -> packed micro-batch row (tokens)
  std::vector<int32_t> key_rows;         // rank key row -> gathered row (cu_seqlens_k.back())
  std::vector<int32_t> cu_seqlens_q;     // kernel segments + 1 prefix sums of query rows, from 0
  std::vector<int32_t> cu_seqlens_k;     // kernel segments + 1 prefix sums of key rows, from 0
  std::vector<int64_t> key_begin;        // per kernel segment: piece position of its first key
  std::vector<int32_t> segment;          // per kernel segment: its plan segment (index in rank)
  int64_t max_seqlen_q = 0;              // longest kernel segment's queries (0 without any)
  int64_t max_seqlen_k = 0;              // longest kernel segment's keys
};

// Every rank's rows for one plan under one mask.
struct ShardMaps {
  AttentionMask mask;                       // the mask the key rows are for
  std::vector<int32_t> packed_to_gathered;  // packed row -> gathered row (plan.tokens)
  std::vector<RankMaps> ranks;              // ranks[r] for plan.ranks[r]
};

// Keys per query row an executor keeps of a kernel segment, the last ones up to the row's own:
// the window w under a sliding window, 0 for no limit (causal, and chunked-local, whose kernel
// segments already end at chunk boundaries).
inline int64_t KernelWindow(const AttentionMask& mask) {
  return mask.kind() == MaskKind::kSlidingWindow ? mask.size() : 0;
}

// Calls fn(q0, q1, key_begin) for the kernel segments of queries [q_begin, q_end) of one piece
// under `mask` (the file comment): one, or under a chunked mask one per chunk they touch.
template <typename Fn>
void ForEachKernelSegment(const AttentionMask& mask, int64_t q_begin, int64_t q_end, Fn&& fn) {
  if (mask.kind() != MaskKind::kChunkedLocal) {
    fn(q_begin, q_end, mask.KeyBegin(q_begin));
    return;
  }
  for (int64_t a = q_begin; a < q_end;) {
    const int64_t k0 = mask.KeyBegin(a);
    const int64_t b = std::min(q_end, k0 + mask.size());
    fn(a, b, k0);
    a = b;
  }
}

// Builds the maps under `mask`. InvalidArgument when the plan is inconsistent (a segment outside
// the micro-batch, a packed token held by two ranks or by none, a rank over rank_capacity);
// OutOfRange when the gathered rows (cp_size * rank_capacity) or a rank's keys exceed int32.
inline absl::StatusOr<ShardMaps> BuildShardMaps(const ShardPlan& plan,
                                                const AttentionMask& mask = {}) {
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
  // A segment's kernel segments together take the keys [KeyBegin(q_begin), q_end) (a chunked
  // mask's parts tile that range): under causal masks about C x tokens rows under per-document
  // sharding. Refused before anything is allocated beyond kMaxShardMapRows.
  int64_t rows = 2 * plan.tokens;  // packed_to_gathered and the local rows
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) {
      const int64_t q_end = std::clamp<int64_t>(s.q_end, 0, kInt32Max);
      rows += q_end - mask.KeyBegin(std::clamp<int64_t>(s.q_begin, 0, q_end));
    }
    if (rows > kMaxShardMapRows) {
      return absl::OutOfRangeError(absl::StrFormat(
          "shard plan of %d tokens over %d ranks: its index maps need more than %d rows (the limit "
          "kMaxShardMapRows; per-document sharding gathers about C x tokens key rows); plan a "
          "smaller micro-batch or CP size, or use the plan's segments and cu_seqlens directly",
          plan.tokens, plan.cp_size, kMaxShardMapRows));
    }
  }
  ShardMaps maps;
  maps.mask = mask;
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
      keys += s.q_end - mask.KeyBegin(s.q_begin);
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
  // Pass 2: kernel segments and key rows, now that every packed row's gathered row is known.
  // Pass 1 bounded every rank's keys by int32, rank_capacity its queries.
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    RankMaps& m = maps.ranks[r];
    m.cu_seqlens_q = {0};
    m.cu_seqlens_k = {0};
    const std::vector<Segment>& segments = plan.ranks[r].segments;
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      ForEachKernelSegment(mask, s.q_begin, s.q_end, [&](int64_t q0, int64_t q1, int64_t k0) {
        for (int64_t j = k0; j < q1; ++j) {
          m.key_rows.push_back(maps.packed_to_gathered[static_cast<size_t>(s.k_pos + j)]);
        }
        m.cu_seqlens_q.push_back(static_cast<int32_t>(m.cu_seqlens_q.back() + (q1 - q0)));
        m.cu_seqlens_k.push_back(static_cast<int32_t>(m.key_rows.size()));
        m.key_begin.push_back(k0);
        m.segment.push_back(static_cast<int32_t>(i));
        m.max_seqlen_q = std::max(m.max_seqlen_q, q1 - q0);
        m.max_seqlen_k = std::max(m.max_seqlen_k, q1 - k0);
      });
    }
  }
  return maps;
}

}  // namespace wlb
