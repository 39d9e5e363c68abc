// The types of CP shard plans (see shard_plan.hpp for the strategies and rules): segments, rank
// shards, plans, and the planner options with their validation. ShardStrategy, the key of a
// strategy, is a row of kShardStrategyTable (strategy_table.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/attention_mask.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/strategy_table.hpp"

namespace wlb {

// Queries [q_begin, q_end) of one document piece on one rank; keys are [0, q_end) of the piece.
struct Segment {
  int64_t id = 0;         // Document::id
  int32_t piece = 0;      // Document::piece
  int64_t q_begin = 0;    // first query, counted from the piece's first token
  int64_t q_end = 0;      // one past the last query; also the key length
  int64_t doc_index = 0;  // position of the piece in MicroBatch::documents
  int64_t q_pos = 0;      // packed micro-batch index of query q_begin
  int64_t k_pos = 0;      // packed micro-batch index of key 0 (the piece's first token)

  int64_t q_len() const { return q_end - q_begin; }
  friend bool operator==(const Segment&, const Segment&) = default;
};

// One CP rank's share of a micro-batch and the arrays a varlen attention kernel takes.
struct RankShard {
  int rank = 0;
  std::vector<Segment> segments;      // chunk r's segments, then chunk 2C-1-r's
  std::vector<int32_t> cu_seqlens_q;  // segments + 1 prefix sums of query lengths, from 0
  std::vector<int32_t> cu_seqlens_k;  // segments + 1 prefix sums of key lengths (q_end), from 0
  int64_t max_seqlen_q = 0;           // longest query range (0 without segments)
  int64_t max_seqlen_k = 0;           // longest key range
  int64_t tokens = 0;                 // queries held, padding excluded
  int64_t causal_pairs = 0;           // (query, key) pairs its queries attend

  friend bool operator==(const RankShard&, const RankShard&) = default;
};

// The shard plan of one micro-batch for CP size C.
struct ShardPlan {
  ShardStrategy strategy = ShardStrategy("per-seq");   // the one used; never adaptive
  ShardStrategy requested = ShardStrategy("per-seq");  // what the caller asked for
  int cp_size = 1;
  int64_t tokens = 0;         // micro-batch tokens
  int64_t rank_capacity = 0;  // tokens per rank buffer, padding included (what each rank gathers)
  std::vector<RankShard> ranks;  // ranks[r].rank == r

  // Padding tokens over all ranks.
  int64_t padding_tokens() const { return cp_size * rank_capacity - tokens; }
  friend bool operator==(const ShardPlan&, const ShardPlan&) = default;
};

// The default memory cap (CpPlanOptions::memory_cap_percent): a rank holds at most 101% of the
// mean T / C tokens (issue 57's 1.01 x T / C).
inline constexpr int64_t kDefaultCpMemoryCapPercent = 101;
// The largest memory cap a plan accepts: 100 x (C + 1) percent of T / C is over T for every C up
// to kMaxCpSize, i.e. no cap.
inline constexpr int64_t kMaxCpMemoryCapPercent = 100 * (int64_t{kMaxCpSize} + 1);

// The memory cap of the memory-balanced strategies (adaptive, doc-degree, balanced-chunks,
// contiguous): the most tokens one rank may hold, cap_percent percent of the mean T / C (the
// part over 100% rounded down), and never below 2 ceil(T / 2C), what per-seq's and per-doc's
// equal chunks give a rank. Every rank buffer is sized to the largest rank (rank_capacity), so a
// plan within the default cap allocates at most 1.01 x T / C rows per rank on micro-batches of
// more than 200 C tokens. cap_percent in [100, kMaxCpMemoryCapPercent] (ValidateCpPlanOptions):
// the product stays below 2^35 x 2^19.
inline int64_t CpRankTokenCap(int64_t tokens, int cp_size,
                              int64_t cap_percent = kDefaultCpMemoryCapPercent) {
  const int64_t c = std::max(1, cp_size);
  const int64_t mean = tokens / c;
  return std::max(2 * ((tokens + 2 * c - 1) / (2 * c)), mean + mean * (cap_percent - 100) / 100);
}

// (query, key) pairs that queries [q_begin, q_end) attend under a causal mask: query i sees i+1
// keys.
inline int64_t CausalPairs(int64_t q_begin, int64_t q_end) {
  return (q_end * (q_end + 1) - q_begin * (q_begin + 1)) / 2;
}

// NVLink-class default of --cp-link-gbps: an H100 SXM's NVLink 4 gives 900 GB/s per GPU in both
// directions together, 450 GB/s each way; a rank sends and receives at the same time.
inline constexpr double kDefaultCpLinkGbps = 450.0;

// Default CommModel::latency_us: the fixed cost of one exchange collective (an all-gather or an
// all-to-all-v) before its bytes flow. An assumption of the order of NCCL's small-message
// collective times within one NVLink node (nccl-tests report about 10-20 us for 8 ranks), not a
// measurement of this project's; it only decides between exchanges whose bytes nearly tie.
inline constexpr double kDefaultCpLatencyUs = 10.0;

// What exchanging K/V rows between CP ranks costs: one token's K and V rows of one layer
// (kv_row_bytes) over a link of link_gbps GB/s (1e9 bytes) per direction, plus latency_us per
// collective an exchange issues (see ChooseExchange in cp_prediction.hpp).
//
// gather_gbps prices what a varlen kernel needs on the rank itself: flash-style varlen calls take
// each segment's keys as one contiguous range (cu_seqlens_k), so an executor copies every
// segment's keys [0, q_end) out of its local + received rows (wlb.torch.cp_attention's
// index_select, the CUDA executor's row gather), and in backward sums their dK/dV back. Two
// segments of one document on a rank copy the shared prefix twice: the copy grows with the
// number of segments, not the tokens. With gather_gbps > 0 PredictCp adds, per rank, its key rows
// (RankShard::cu_seqlens_k's last entry under a causal mask) read and written once at that rate
// (adaptive with a packed-call fit counts it once per pass, like the exchange); 0 (the default)
// prices no copy, as for a kernel that reads keys in place (MagiAttention's FFA) and as issue 57's
// scoring does. No default rate yet: the copy's cost per key row on an H100 is what
// wlb_cuda_cp_bench's "key rows' copies" line measures.
struct CommModel {
  double link_gbps = kDefaultCpLinkGbps;
  double latency_us = kDefaultCpLatencyUs;
  // 0: 2 (K and V) x heads x head_dim x 2 bytes (bf16) of the kernel model's shape, i.e. 16 KiB
  // for the default 32 x 128 (multi-head; pass kv_heads x head_dim x 4 for grouped-query).
  int64_t kv_row_bytes = 0;
  double gather_gbps = 0.0;  // 0: the gathered key rows' copy is not priced (see above)

  int64_t RowBytes(const KernelModel& model) const {
    return kv_row_bytes > 0 ? kv_row_bytes : 4 * model.shape().heads * model.shape().head_dim;
  }
  // Milliseconds to move one row one way.
  double RowMs(const KernelModel& model) const {
    return static_cast<double>(RowBytes(model)) / (link_gbps * 1e9) * 1e3;
  }
  double LatencyMs() const { return latency_us * 1e-3; }
  // Milliseconds to copy one gathered key row (read and written once); 0 when not priced.
  double GatherRowMs(const KernelModel& model) const {
    return gather_gbps > 0.0
               ? 2.0 * static_cast<double>(RowBytes(model)) / (gather_gbps * 1e9) * 1e3
               : 0.0;
  }
};

// InvalidArgument naming the bad value: link_gbps must be in (0, 1e6], latency_us in [0, 1e6],
// kv_row_bytes in [0, 2^30], gather_gbps in [0, 1e6].
inline absl::Status ValidateCommModel(const CommModel& c) {
  if (!(c.link_gbps > 0.0) || !(c.link_gbps <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CP link bandwidth must be in (0, 1e6] GB/s, got %g", c.link_gbps));
  }
  if (!(c.latency_us >= 0.0) || !(c.latency_us <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CP collective latency must be in [0, 1e6] us, got %g", c.latency_us));
  }
  if (c.kv_row_bytes < 0 || c.kv_row_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("K/V bytes per row must be in [0, 2^30], got %d", c.kv_row_bytes));
  }
  if (!(c.gather_gbps >= 0.0) || !(c.gather_gbps <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CP key gather bandwidth must be in [0, 1e6] GB/s (0: not priced), got %g", c.gather_gbps));
  }
  return absl::OkStatus();
}

// Planner inputs beyond the kernel model: the link, the layers' attention masks and the memory
// cap. adaptive ranks its candidates with the first two and doc-degree plans with them (the
// other strategies keep their causal plans); the memory-balanced strategies (adaptive,
// doc-degree, balanced-chunks, contiguous) keep every rank within the cap.
struct CpPlanOptions {
  CommModel comm;
  LayerMix mix = LayerMix::Causal();
  // The most tokens one rank may hold, in percent of T / C (CpRankTokenCap). Above the default a
  // plan may trade memory for time: where short documents kept whole would save K/V traffic
  // (a slow link, a few long documents among many short ones) adaptive can then choose them.
  int64_t memory_cap_percent = kDefaultCpMemoryCapPercent;
};

inline absl::Status ValidateCpPlanOptions(const CpPlanOptions& o) {
  if (absl::Status s = ValidateCommModel(o.comm); !s.ok()) return s;
  if (o.memory_cap_percent < 100 || o.memory_cap_percent > kMaxCpMemoryCapPercent) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CP memory cap must be in [100, %d] percent of T / C (%d: 1.01 x T / C), got %d",
        kMaxCpMemoryCapPercent, kDefaultCpMemoryCapPercent, o.memory_cap_percent));
  }
  if (o.mix.layers.empty()) return absl::InvalidArgumentError("CP layer mix has no layers");
  for (const auto& [mask, count] : o.mix.layers) {
    if (count < 1 || o.mix.total_layers() > kMaxMixLayers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CP layer mix %s: every count must be >= 1 and the total <= %d",
                          o.mix.Name(), kMaxMixLayers));
    }
  }
  return absl::OkStatus();
}

}  // namespace wlb
