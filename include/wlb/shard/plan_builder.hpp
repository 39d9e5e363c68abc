// What every CP shard strategy plans with: the checked micro-batch, the per-sequence and
// per-document cuts, and PlanBuilder, which turns segments into a ShardPlan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {

// A strategy's planning input (ShardStrategyInfo::plan): a micro-batch that passed the checks of
// PlanShards, the packed start of every document plus the total (`starts`), and valid options.
struct ShardPlanRequest {
  const MicroBatch& mb;
  const std::vector<int64_t>& starts;
  int cp_size = 1;
  ShardStrategy requested = ShardStrategy("per-seq");  // what the caller asked for
  const KernelModel& model;
  const CpPlanOptions& options;
};

namespace detail {

// The request's memory cap: CpRankTokenCap at its options' memory_cap_percent.
inline int64_t RankTokenCap(const ShardPlanRequest& r) {
  return CpRankTokenCap(r.mb.tokens, r.cp_size, r.options.memory_cap_percent);
}

// Packed start of every document plus the total at the end, after checking the micro-batch.
inline absl::StatusOr<std::vector<int64_t>> CheckMicroBatch(const MicroBatch& mb, int cp_size) {
  if (cp_size < 1 || cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cp_size must be in [1, %d], got %d", kMaxCpSize, cp_size));
  }
  if (static_cast<int64_t>(mb.documents.size()) > kMaxCpDocumentRanks / cp_size) {
    return absl::OutOfRangeError(absl::StrFormat(
        "micro-batch of %d documents at cp_size %d: documents x cp_size is %d, over the limit %d "
        "(kMaxCpDocumentRanks: CP planning weighs every document against every rank); plan "
        "smaller micro-batches or a smaller CP size",
        mb.documents.size(), cp_size, static_cast<int64_t>(mb.documents.size()) * cp_size,
        kMaxCpDocumentRanks));
  }
  std::vector<int64_t> starts(mb.documents.size() + 1, 0);
  absl::flat_hash_set<std::pair<int64_t, int32_t>> seen;
  seen.reserve(mb.documents.size());
  for (size_t i = 0; i < mb.documents.size(); ++i) {
    const Document& d = mb.documents[i];
    if (d.length <= 0 || d.piece < 0 || d.offset < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "micro-batch document %d (id %d): need length > 0, piece >= 0, offset >= 0; got "
          "length %d, piece %d, offset %d",
          i, d.id, d.length, d.piece, d.offset));
    }
    // A piece of a micro-batch is at most a context window, and a micro-batch at most a stream,
    // so every product planning forms fits in int64: causal pairs of a piece (< 2^48), their sum
    // over the micro-batch (< 2^59), rows summed over C holders (< 2^47).
    if (d.length > kMaxContext) {
      return absl::OutOfRangeError(absl::StrFormat(
          "micro-batch document %d (id %d): length %d is above the limit of %d tokens "
          "(kMaxContext: a micro-batch's pieces are at most a context window)",
          i, d.id, d.length, kMaxContext));
    }
    if (starts[i] + d.length > kMaxStreamTokens) {
      return absl::OutOfRangeError(absl::StrFormat(
          "micro-batch document %d (id %d): length %d takes the micro-batch above the limit of %d "
          "tokens (kMaxStreamTokens)",
          i, d.id, d.length, kMaxStreamTokens));
    }
    if (!seen.insert({d.id, d.piece}).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "micro-batch document %d: id %d piece %d appears twice", i, d.id, d.piece));
    }
    starts[i + 1] = starts[i] + d.length;
  }
  if (mb.tokens != starts.back()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("micro-batch tokens is %d but its %d documents sum to %d", mb.tokens,
                        mb.documents.size(), starts.back()));
  }
  return starts;
}

inline int RankOfChunk(int64_t chunk, int cp_size) {
  return static_cast<int>(chunk < cp_size ? chunk : 2 * cp_size - 1 - chunk);
}

// Chunk size of per-sequence sharding: the total padded up to a multiple of 2C, over 2C.
inline int64_t PerSequenceChunk(int64_t tokens, int cp_size) {
  return (tokens + 2 * cp_size - 1) / (2 * cp_size);
}

// Calls fn(doc_index, q_begin, q_end) for every document piece of the packed tokens [lo, hi)
// (documents laid out from `starts`, hi <= starts.back()), in order; nothing when lo >= hi. `k`:
// a document at or before the one holding lo, advanced to it (runs visited in order reuse it).
template <typename Fn>
void ForEachPieceOfRun(const std::vector<int64_t>& starts, int64_t lo, int64_t hi, int64_t& k,
                       Fn&& fn) {
  if (lo >= hi) return;
  const int64_t docs = static_cast<int64_t>(starts.size()) - 1;
  while (starts[k + 1] <= lo) ++k;
  for (int64_t i = k; i < docs && starts[i] < hi; ++i) {
    fn(i, std::max(lo, starts[i]) - starts[i], std::min(hi, starts[i + 1]) - starts[i]);
  }
}

// Calls fn(rank, doc_index, q_begin, q_end) for every per-sequence segment, chunks in order.
template <typename Fn>
void ForEachPerSequenceSegment(const std::vector<int64_t>& starts, int cp_size, Fn&& fn) {
  const int64_t total = starts.back();
  const int64_t chunk = PerSequenceChunk(total, cp_size);
  int64_t k = 0;
  for (int64_t j = 0; j < 2 * cp_size; ++j) {
    const int64_t lo = j * chunk;
    if (lo >= total) break;  // this and later chunks are all padding
    const int rank = RankOfChunk(j, cp_size);
    ForEachPieceOfRun(starts, lo, std::min(lo + chunk, total), k,
                      [&](int64_t i, int64_t qb, int64_t qe) { fn(rank, i, qb, qe); });
  }
}

// Shard j of n of a document of `length` tokens cut padding-free: sizes length / n, the
// length mod n remainder tokens going one each to shards pointer, pointer + 1, ... (mod n).
// Returns [begin, end) (empty for a shard without tokens).
inline std::pair<int64_t, int64_t> PerDocumentShard(int64_t length, int64_t n, int64_t pointer,
                                                    int64_t j) {
  auto overlap = [](int64_t lo1, int64_t hi1, int64_t lo2, int64_t hi2) {
    return std::max<int64_t>(0, std::min(hi1, hi2) - std::max(lo1, lo2));
  };
  const int64_t base = length / n;
  const int64_t rem = length % n;
  // Shards receiving a remainder token: the cyclic range [pointer, pointer + rem) mod n.
  const int64_t extra_before =
      overlap(0, j, pointer, pointer + rem) + overlap(0, j, pointer - n, pointer + rem - n);
  const int64_t size = base + ((j - pointer + n) % n < rem ? 1 : 0);
  const int64_t begin = j * base + extra_before;
  return {begin, begin + size};
}

// A document's zig-zag cut into n shards in whole query tiles: its length / tile whole tiles are
// the units PerDocumentShard deals (the round-robin pointer counting units), and the length mod
// tile rest leads shard 0. A varlen kernel tiles a segment from its first query and a partial
// last tile costs a full one over all its keys (KernelModel::PaddedFlops), so only shard 0, over
// the document's fewest keys, pays one. A document of fewer than n tiles is cut token by token
// (units of one token, no rest), as PerDocumentShard cuts it.
struct WholeTileCut {
  int64_t units = 0, unit = 1, rest = 0;

  WholeTileCut(int64_t length, int64_t n, int64_t tile) {
    const bool tiled = length / tile >= n;
    unit = tiled ? tile : 1;
    units = length / unit;
    rest = length % unit;
  }
  // Shard j as [begin, end) of the document, pointer as PerDocumentShard's.
  std::pair<int64_t, int64_t> Shard(int64_t n, int64_t pointer, int64_t j) const {
    const auto [begin, end] = PerDocumentShard(units, n, pointer, j);
    return {j == 0 ? 0 : begin * unit + rest, end * unit + rest};
  }
  // How far the pointer moves past this document.
  int64_t PointerStep(int64_t n) const { return units % n; }
};

// Calls fn(rank, doc_index, q_begin, q_end) for every non-empty per-document shard of the
// documents i with sharded(i), chunks 0..C-1 first and then C..2C-1, so appending to the rank
// gives chunk r before chunk 2C-1-r.
template <typename Pred, typename Fn>
void ForEachPerDocumentSegment(const MicroBatch& mb, int cp_size, Pred&& sharded, Fn&& fn) {
  const int64_t n = 2 * static_cast<int64_t>(cp_size);
  for (int half = 0; half < 2; ++half) {
    int64_t pointer = 0;  // next shard to receive a remainder token
    for (size_t i = 0; i < mb.documents.size(); ++i) {
      if (!sharded(i)) continue;
      const int64_t length = mb.documents[i].length;
      for (int64_t j = half * cp_size; j < (half + 1) * cp_size; ++j) {
        const auto [begin, end] = PerDocumentShard(length, n, pointer, j);
        if (begin == end) continue;
        fn(RankOfChunk(j, cp_size), static_cast<int64_t>(i), begin, end);
      }
      pointer = (pointer + length % n) % n;
    }
  }
}

// Collects segments per rank and finishes them into a ShardPlan.
class PlanBuilder {
 public:
  PlanBuilder(const MicroBatch& mb, const std::vector<int64_t>& starts, int cp_size,
              size_t expected_segments)
      : mb_(mb), starts_(starts), ranks_(static_cast<size_t>(cp_size)) {
    for (int r = 0; r < cp_size; ++r) {
      ranks_[r].rank = r;
      ranks_[r].segments.reserve(expected_segments / static_cast<size_t>(cp_size) + 2);
    }
  }

  void Add(int rank, int64_t doc_index, int64_t q_begin, int64_t q_end) {
    const Document& d = mb_.documents[static_cast<size_t>(doc_index)];
    ranks_[static_cast<size_t>(rank)].segments.push_back(Segment{
        .id = d.id,
        .piece = d.piece,
        .q_begin = q_begin,
        .q_end = q_end,
        .doc_index = doc_index,
        .q_pos = starts_[static_cast<size_t>(doc_index)] + q_begin,
        .k_pos = starts_[static_cast<size_t>(doc_index)],
    });
  }

  // rank_capacity < 0 means: the largest rank's token count.
  absl::StatusOr<ShardPlan> Finish(ShardStrategy strategy, ShardStrategy requested, int cp_size,
                                   int64_t rank_capacity) {
    ShardPlan plan;
    plan.strategy = strategy;
    plan.requested = requested;
    plan.cp_size = cp_size;
    plan.tokens = starts_.back();
    int64_t largest = 0;
    for (RankShard& r : ranks_) {
      // Reserved before the leading 0 goes in: one allocation each, not two.
      r.cu_seqlens_q.reserve(r.segments.size() + 1);
      r.cu_seqlens_k.reserve(r.segments.size() + 1);
      r.cu_seqlens_q.assign(1, 0);
      r.cu_seqlens_k.assign(1, 0);
      int64_t total_k = 0;
      for (const Segment& s : r.segments) {
        r.tokens += s.q_len();
        total_k += s.q_end;
        r.max_seqlen_q = std::max(r.max_seqlen_q, s.q_len());
        r.max_seqlen_k = std::max(r.max_seqlen_k, s.q_end);
        r.causal_pairs += CausalPairs(s.q_begin, s.q_end);
        if (total_k > std::numeric_limits<int32_t>::max()) {
          return absl::OutOfRangeError(absl::StrFormat(
              "rank %d: %d gathered keys exceed the int32 cu_seqlens_k of varlen kernels "
              "(max %d); use a smaller micro-batch",
              r.rank, total_k, std::numeric_limits<int32_t>::max()));
        }
        r.cu_seqlens_q.push_back(static_cast<int32_t>(r.tokens));
        r.cu_seqlens_k.push_back(static_cast<int32_t>(total_k));
      }
      largest = std::max(largest, r.tokens);
    }
    plan.rank_capacity = rank_capacity < 0 ? largest : rank_capacity;
    plan.ranks = std::move(ranks_);
    return plan;
  }

 private:
  const MicroBatch& mb_;
  const std::vector<int64_t>& starts_;
  std::vector<RankShard> ranks_;
};

inline double MaxOf(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// InvalidArgument with a checked format (a FormatSpec parameter keeps the format a compile-time
// constant for every compiler, which a forwarding lambda does not).
template <typename... Args>
absl::Status PlanError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrFormat(format, args...));
}
}  // namespace detail

}  // namespace wlb
