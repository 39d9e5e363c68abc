// Context-parallel (CP) shard plans: which queries of a micro-batch each of C ranks computes.
//
//   wlb::MicroBatch mb = ...;                               // documents 5, 19, 8 (32 tokens)
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, /*cp_size=*/2,
//                                                         wlb::ShardStrategy::kAdaptive,
//                                                         wlb::KernelModel::Default());
//   for (const wlb::RankShard& r : plan->ranks) {
//     // r.segments, r.cu_seqlens_q / r.cu_seqlens_k, r.max_seqlen_q / r.max_seqlen_k feed a
//     // varlen causal attention kernel on rank r.rank; plan->strategy says what adaptive chose.
//   }
//
// The packed micro-batch is its documents (pieces) concatenated in order, no padding between
// them. A segment is a non-empty query range [q_begin, q_end) of one document piece, counted
// from the piece's first token (0..length; the piece's `offset` inside its whole document does
// not enter: the loader trains each piece as its own sequence). Under causal masking a segment
// attends keys [0, q_end) of its piece, aligned bottom-right, so its key length is q_end. Every
// segment also carries where its tokens sit in the packed micro-batch: queries at
// [q_pos, q_pos + q_end - q_begin), keys at [k_pos, k_pos + q_end).
//
// All strategies cut the work into 2C chunks and give rank r chunks r and 2C-1-r (the zig-zag
// that pairs a cheap early chunk with an expensive late one). A rank's segments are ordered chunk
// r first, then chunk 2C-1-r, each in micro-batch order; cu_seqlens_q is the rank's local query
// buffer layout in that order.
//  - kPerSequence: the packed micro-batch, padded at its end to a multiple of 2C tokens, is cut
//    into 2C equal chunks; each chunk is intersected with the documents. Padding tokens belong to
//    no document and appear in no segment; they only enlarge rank_capacity.
//  - kPerDocument (padding-free): every document is cut into 2C shards whose sizes differ by at
//    most one token; the d mod 2C remainder tokens go one each to shards p, p+1, ... (mod 2C),
//    where the pointer p carries over from document to document. Chunk j = shard j of every
//    document, so chunk sizes differ by at most one and no padding is needed beyond that. A
//    document shorter than 2C tokens leaves some shards empty (no segment).
//  - kPerSequenceOrdered: per-sequence chunking of the documents laid out in another order.
//    Document order inside a micro-batch is free (causal masks are per document), and packers
//    emit longest first, the worst order for head-tail chunks: rank 0 gets the cheap head of the
//    long document, rank C-1 its expensive middle. PerSequenceOrder() picks the order (see
//    there); segments keep their positions in the micro-batch as given (q_pos, k_pos), so the
//    data loader lays tokens out as before and only the chunk boundaries move. Never predicted
//    worse than kPerSequence: the micro-batch order is one of the candidates.
//  - kAdaptive: predicts every rank's latency under kPerSequenceOrdered, kPerDocument and
//    kHybrid with the KernelModel and uses the strategy with the lowest maximum (ties, in this
//    order: kPerSequenceOrdered, fewest segments, then kPerDocument, then kHybrid). The plan
//    records the strategy used. The paper's adaptive (per-sequence in the given order against
//    per-document) is ChooseAdaptive's per_seq_max_ms / per_doc_max_ms.
//  - kHybrid: documents of at least 2C * tile_q tokens (every shard at least one query tile) are
//    sharded per document as above, with the round-robin pointer running over them only;
//    shorter documents stay whole and are dealt, most expensive first, to the rank with the
//    least predicted latency so far (ties: fewer tokens, then lower rank). They follow the
//    sharded part in the rank's segment list, in micro-batch order.
//  - kPerDocumentPadded ("te-zigzag", Transformer Engine's THD context parallelism): every
//    document is padded to a multiple of 2C and cut into 2C equal chunks of ceil(d / 2C) tokens
//    (the padding sits at the document's end, so the last shards are shorter or empty); rank r
//    holds shards r and 2C-1-r of every document, document by document. Padding tokens appear in
//    no segment, but every rank's buffer holds them: rank_capacity = sum of 2 * ceil(d / 2C).
//  - kDocumentDegree ("doc-degree", per-document CP degree, communication-aware): every document
//    is either kept whole on one rank (it exchanges no K/V) or sharded zig-zag over an aligned
//    group of g ranks, g a power of two below C or C itself, ranks [k*g, (k+1)*g): per-document
//    sharding with 2g shards (all non-empty: needs d >= 2g) and a round-robin remainder pointer
//    per g. Documents are placed most expensive first, each with the (g, group) that gives the
//    lowest predicted slowest rank, a rank's time being attention (KernelModel under
//    CpPlanOptions::mix, see MaskedSegmentMs) plus the K/V rows it exchanges (max of sent and
//    received, see ExchangedKvRows) times CommModel bytes per row over the link bandwidth (ties:
//    the lower slowest member, then less added time, smaller g, lower group). The greedy plan is
//    then compared with kPerDocument's, kHybrid's, kPerSequenceOrdered's and (for a mix with
//    non-causal masks) the greedy plan made for all-causal layers, under the same prediction
//    (PredictCp); the fastest is kept (ties keep the greedy plan), recording the strategy used
//    (kDocumentDegree for a greedy plan) as kAdaptive does. So it is never predicted slower than
//    any of them, and mask-aware planning never loses to its mask-blind self. Greedy plans'
//    segments: early shards, late shards, then whole documents, each in micro-batch order;
//    rank_capacity is the largest rank's tokens.
//
// Rules for edge cases:
//  - cp_size must be in [1, kMaxCpSize]; anything else is InvalidArgument.
//  - A micro-batch shorter than 2C tokens is planned, not rejected: per-sequence pads it to 2C
//    (chunks of one token, some all padding), per-document leaves empty shards; ranks without
//    work get an empty segment list and cu_seqlens {0}. An empty micro-batch gives C empty ranks
//    and rank_capacity 0.
//  - The micro-batch must be consistent: every length > 0, piece >= 0, offset >= 0, no (id,
//    piece) twice, and `tokens` equal to the sum of lengths; cu_seqlens must fit int32 (what
//    varlen kernels take). Violations are InvalidArgument / OutOfRange naming the value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/cost/attention_mask.hpp"
#include "wlb/shard/kernel_model.hpp"

namespace wlb {

// How a micro-batch is split across CP ranks (see the file comment).
enum class ShardStrategy {
  kPerSequence,
  kPerDocument,
  kAdaptive,
  kHybrid,
  kPerSequenceOrdered,
  kPerDocumentPadded,
  kDocumentDegree
};

// "per-seq", "per-doc", "adaptive", "hybrid", "per-seq-ordered", "te-zigzag" or "doc-degree".
inline std::string_view ShardStrategyName(ShardStrategy s) {
  switch (s) {
    case ShardStrategy::kPerSequence:
      return "per-seq";
    case ShardStrategy::kPerDocument:
      return "per-doc";
    case ShardStrategy::kAdaptive:
      return "adaptive";
    case ShardStrategy::kHybrid:
      return "hybrid";
    case ShardStrategy::kPerSequenceOrdered:
      return "per-seq-ordered";
    case ShardStrategy::kPerDocumentPadded:
      return "te-zigzag";
    case ShardStrategy::kDocumentDegree:
      return "doc-degree";
  }
  return "unknown";
}

// Accepts exactly the names ShardStrategyName returns.
inline absl::StatusOr<ShardStrategy> ParseShardStrategy(std::string_view name) {
  for (ShardStrategy s :
       {ShardStrategy::kPerSequence, ShardStrategy::kPerDocument, ShardStrategy::kAdaptive,
        ShardStrategy::kHybrid, ShardStrategy::kPerSequenceOrdered,
        ShardStrategy::kPerDocumentPadded, ShardStrategy::kDocumentDegree}) {
    if (name == ShardStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown sharding %s; expected one of per-seq, per-seq-ordered, per-doc, "
                      "adaptive, hybrid, te-zigzag, doc-degree",
                      QuoteForMessage(name)));
}

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
  ShardStrategy strategy = ShardStrategy::kPerSequence;   // the one used; never kAdaptive
  ShardStrategy requested = ShardStrategy::kPerSequence;  // what the caller asked for
  int cp_size = 1;
  int64_t tokens = 0;         // micro-batch tokens
  int64_t rank_capacity = 0;  // tokens per rank buffer, padding included (what each rank gathers)
  std::vector<RankShard> ranks;  // ranks[r].rank == r

  // Padding tokens over all ranks.
  int64_t padding_tokens() const { return cp_size * rank_capacity - tokens; }
  friend bool operator==(const ShardPlan&, const ShardPlan&) = default;
};

// (query, key) pairs that queries [q_begin, q_end) attend under a causal mask: query i sees i+1
// keys.
inline int64_t CausalPairs(int64_t q_begin, int64_t q_end) {
  return (q_end * (q_end + 1) - q_begin * (q_begin + 1)) / 2;
}

// Documents at least this long are sharded per document by kHybrid (every shard >= tile_q).
inline int64_t HybridMinLength(int cp_size, const KernelModel& model) {
  return 2 * static_cast<int64_t>(cp_size) * model.tile_q();
}

// NVLink-class default of --cp-link-gbps: an H100 SXM's NVLink 4 gives 900 GB/s per GPU in both
// directions together, 450 GB/s each way; a rank sends and receives at the same time.
inline constexpr double kDefaultCpLinkGbps = 450.0;

// What exchanging K/V rows between CP ranks costs: one token's K and V rows of one layer
// (kv_row_bytes) over a link of link_gbps GB/s (1e9 bytes) per direction.
struct CommModel {
  double link_gbps = kDefaultCpLinkGbps;
  // 0: 2 (K and V) x heads x head_dim x 2 bytes (bf16) of the kernel model's shape, i.e. 16 KiB
  // for the default 32 x 128 (multi-head; pass kv_heads x head_dim x 4 for grouped-query).
  int64_t kv_row_bytes = 0;

  int64_t RowBytes(const KernelModel& model) const {
    return kv_row_bytes > 0 ? kv_row_bytes : 4 * model.shape().heads * model.shape().head_dim;
  }
  // Milliseconds to move one row one way.
  double RowMs(const KernelModel& model) const {
    return static_cast<double>(RowBytes(model)) / (link_gbps * 1e9) * 1e3;
  }
};

// InvalidArgument naming the bad value: link_gbps must be in (0, 1e6], kv_row_bytes in
// [0, 2^30].
inline absl::Status ValidateCommModel(const CommModel& c) {
  if (!(c.link_gbps > 0.0) || !(c.link_gbps <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CP link bandwidth must be in (0, 1e6] GB/s, got %g", c.link_gbps));
  }
  if (c.kv_row_bytes < 0 || c.kv_row_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("K/V bytes per row must be in [0, 2^30], got %d", c.kv_row_bytes));
  }
  return absl::OkStatus();
}

// Planner inputs beyond the kernel model: the link, and the layers' attention masks. Only
// kDocumentDegree plans with them (the other strategies keep their causal plans).
struct CpPlanOptions {
  CommModel comm;
  LayerMix mix = LayerMix::Causal();
};

inline absl::Status ValidateCpPlanOptions(const CpPlanOptions& o) {
  if (absl::Status s = ValidateCommModel(o.comm); !s.ok()) return s;
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

// Predicted latency (ms) of queries [q_begin, q_end) of one document under `mask`, with the keys
// the mask lets them see, [mask.KeyBegin(q_begin), q_end), as the kernel's key range. Causal is
// exactly model.SegmentMs(q_end - q_begin, q_end). Otherwise the tiled kernel's blocks are
// counted query tile by query tile (tiles start at q_begin, key tiles at the key range's start):
// tile queries [a, b) visit the key tiles from KeyBegin(a) to b - 1.
inline double MaskedSegmentMs(const KernelModel& model, const AttentionMask& mask, int64_t q_begin,
                              int64_t q_end) {
  if (q_end <= q_begin) return 0.0;
  if (mask.causal()) return model.SegmentMs(q_end - q_begin, q_end);
  const int64_t tq = model.tile_q();
  const int64_t tk = model.tile_k();
  const int64_t k0 = mask.KeyBegin(q_begin);
  int64_t blocks = 0;
  for (int64_t a = q_begin; a < q_end; a += tq) {
    const int64_t b = std::min(a + tq, q_end);
    blocks += (b - 1 - k0) / tk - (mask.KeyBegin(a) - k0) / tk + 1;
  }
  const double flops = 4.0 * static_cast<double>(model.shape().head_dim * model.shape().heads) *
                       static_cast<double>(tq * tk) * static_cast<double>(blocks);
  return flops / model.FlopsPerMs(q_end - q_begin, q_end - k0) + model.segment_overhead_ms();
}

// One shard of one document in an exchange computation: queries [q_begin, q_end) on `rank`.
struct DocShard {
  int rank = 0;
  int64_t q_begin = 0;
  int64_t q_end = 0;
};

// For the shards of ONE document (exact coverage), calls fn(receiver, sender, rows) for every
// pair of ranks where `receiver` needs `rows` > 0 key rows that `sender` holds: a rank needs the
// union over its shards of the keys [mask.KeyBegin(q_begin), q_end), less its own rows.
template <typename Fn>
void ForEachDocExchange(std::span<const DocShard> shards, const AttentionMask& mask, Fn&& fn) {
  if (mask.causal()) {
    // Every key range starts at 0, so a rank's need is the one interval [0, its largest q_end):
    // the general path's result and call order, without its interval list.
    for (size_t i = 0; i < shards.size(); ++i) {
      const int r = shards[i].rank;
      bool first = true;
      for (size_t j = 0; j < i; ++j) first = first && shards[j].rank != r;
      if (!first) continue;
      int64_t hi = 0;
      for (const DocShard& s : shards) {
        if (s.rank == r) hi = std::max(hi, s.q_end);
      }
      for (const DocShard& s : shards) {
        if (s.rank == r) continue;
        const int64_t rows =
            std::max<int64_t>(0, std::min(hi, s.q_end) - std::max<int64_t>(0, s.q_begin));
        if (rows > 0) fn(r, s.rank, rows);
      }
    }
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> need;
  for (size_t i = 0; i < shards.size(); ++i) {
    const int r = shards[i].rank;
    bool first = true;  // handle each rank once, at its first shard
    for (size_t j = 0; j < i; ++j) first = first && shards[j].rank != r;
    if (!first) continue;
    need.clear();
    for (const DocShard& s : shards) {
      if (s.rank == r) need.push_back({mask.KeyBegin(s.q_begin), s.q_end});
    }
    std::sort(need.begin(), need.end());
    size_t merged = 0;
    for (size_t k = 1; k < need.size(); ++k) {
      if (need[k].first <= need[merged].second) {
        need[merged].second = std::max(need[merged].second, need[k].second);
      } else {
        need[++merged] = need[k];
      }
    }
    need.resize(merged + 1);
    for (const DocShard& s : shards) {
      if (s.rank == r) continue;
      int64_t rows = 0;
      for (const auto& [lo, hi] : need) {
        rows += std::max<int64_t>(0, std::min(hi, s.q_end) - std::max(lo, s.q_begin));
      }
      if (rows > 0) fn(r, s.rank, rows);
    }
  }
}

namespace detail {

// Packed start of every document plus the total at the end, after checking the micro-batch.
inline absl::StatusOr<std::vector<int64_t>> CheckMicroBatch(const MicroBatch& mb, int cp_size) {
  if (cp_size < 1 || cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cp_size must be in [1, %d], got %d", kMaxCpSize, cp_size));
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
    if (starts[i] > std::numeric_limits<int64_t>::max() / 4 - d.length) {
      return absl::OutOfRangeError(
          absl::StrFormat("micro-batch document %d (id %d): length %d overflows the token count", i,
                          d.id, d.length));
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

// Calls fn(rank, doc_index, q_begin, q_end) for every per-sequence segment, chunks in order.
template <typename Fn>
void ForEachPerSequenceSegment(const std::vector<int64_t>& starts, int cp_size, Fn&& fn) {
  const int64_t total = starts.back();
  const int64_t chunk = PerSequenceChunk(total, cp_size);
  const int64_t docs = static_cast<int64_t>(starts.size()) - 1;
  int64_t k = 0;
  for (int64_t j = 0; j < 2 * cp_size; ++j) {
    const int64_t lo = j * chunk;
    const int64_t hi = std::min(lo + chunk, total);
    if (lo >= hi) break;  // this and later chunks are all padding
    while (starts[k + 1] <= lo) ++k;
    for (int64_t i = k; i < docs && starts[i] < hi; ++i) {
      fn(RankOfChunk(j, cp_size), i, std::max(lo, starts[i]) - starts[i],
         std::min(hi, starts[i + 1]) - starts[i]);
    }
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
      r.cu_seqlens_q.assign(1, 0);
      r.cu_seqlens_k.assign(1, 0);
      r.cu_seqlens_q.reserve(r.segments.size() + 1);
      r.cu_seqlens_k.reserve(r.segments.size() + 1);
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

// Predicted latency of every rank under per-sequence or per-document sharding, without
// building the plan.
inline std::vector<double> PredictFixed(const MicroBatch& mb, const std::vector<int64_t>& starts,
                                        int cp_size, ShardStrategy strategy,
                                        const KernelModel& model) {
  std::vector<double> ms(static_cast<size_t>(cp_size), 0.0);
  auto add = [&](int rank, int64_t, int64_t q_begin, int64_t q_end) {
    ms[static_cast<size_t>(rank)] += model.SegmentMs(q_end - q_begin, q_end);
  };
  if (strategy == ShardStrategy::kPerSequence) {
    ForEachPerSequenceSegment(starts, cp_size, add);
  } else {
    ForEachPerDocumentSegment(
        mb, cp_size, [](size_t) { return true; }, add);
  }
  return ms;
}

inline double MaxOf(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// Predicted latency (ms) of every rank of a plan.
inline std::vector<double> PredictRankMsOf(const ShardPlan& plan, const KernelModel& model) {
  std::vector<double> ms;
  ms.reserve(plan.ranks.size());
  for (const RankShard& r : plan.ranks) {
    double total = 0.0;
    for (const Segment& s : r.segments) total += model.SegmentMs(s.q_len(), s.q_end);
    ms.push_back(total);
  }
  return ms;
}

// kHybrid's placement: calls on_shard(rank, doc_index, q_begin, q_end) for every per-document
// shard of the long documents (ForEachPerDocumentSegment order), then deals the short ones and
// returns each document's owner (-1: sharded). sharded_ms gets every rank's predicted ms of its
// shards (summed in that order), whole_ms[i] a short document's SegmentMs(d, d).
template <typename Fn>
std::vector<int> PlaceHybrid(const MicroBatch& mb, int cp_size, const KernelModel& model,
                             std::vector<double>& sharded_ms, std::vector<double>& whole_ms,
                             Fn&& on_shard) {
  const size_t docs = mb.documents.size();
  const int64_t min_length = HybridMinLength(cp_size, model);
  auto is_long = [&](size_t i) { return mb.documents[i].length >= min_length; };
  std::vector<double> load(static_cast<size_t>(cp_size), 0.0);
  std::vector<int64_t> held(static_cast<size_t>(cp_size), 0);
  ForEachPerDocumentSegment(mb, cp_size, is_long, [&](int r, int64_t i, int64_t qb, int64_t qe) {
    on_shard(r, i, qb, qe);
    load[r] += model.SegmentMs(qe - qb, qe);
    held[r] += qe - qb;
  });
  sharded_ms = load;
  whole_ms.assign(docs, 0.0);
  std::vector<std::pair<double, size_t>> whole;  // (predicted ms, doc index)
  for (size_t i = 0; i < docs; ++i) {
    const int64_t d = mb.documents[i].length;
    if (!is_long(i)) {
      whole_ms[i] = model.SegmentMs(d, d);
      whole.push_back({whole_ms[i], i});
    }
  }
  std::sort(whole.begin(), whole.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  std::vector<int> owner(docs, -1);
  for (const auto& [ms, i] : whole) {
    int best = 0;
    for (int r = 1; r < cp_size; ++r) {
      if (load[r] < load[best] || (load[r] == load[best] && held[r] < held[best])) best = r;
    }
    owner[i] = best;
    load[best] += ms;
    held[best] += mb.documents[i].length;
  }
  return owner;
}

// Predicted slowest-rank latency of kHybrid's plan without building it: every rank's shards,
// then its whole documents in micro-batch order (its segment order, so the sums are
// PredictRankMsOf's exactly).
inline double HybridMaxMs(const MicroBatch& mb, int cp_size, const KernelModel& model) {
  std::vector<double> ms, whole_ms;
  const std::vector<int> owner =
      PlaceHybrid(mb, cp_size, model, ms, whole_ms, [](int, int64_t, int64_t, int64_t) {});
  for (size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] >= 0) ms[static_cast<size_t>(owner[i])] += whole_ms[i];
  }
  return MaxOf(ms);
}

// Predicted slowest-rank latency of per-sequence chunks over a micro-batch's documents laid out
// in a given order.
inline double PerSequenceMaxMs(const MicroBatch& mb, const std::vector<int64_t>& order, int cp_size,
                               const KernelModel& model) {
  std::vector<int64_t> starts(order.size() + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    starts[i + 1] = starts[i] + mb.documents[static_cast<size_t>(order[i])].length;
  }
  std::vector<double> ms(static_cast<size_t>(cp_size), 0.0);
  ForEachPerSequenceSegment(starts, cp_size, [&](int r, int64_t, int64_t qb, int64_t qe) {
    ms[static_cast<size_t>(r)] += model.SegmentMs(qe - qb, qe);
  });
  return MaxOf(ms);
}

// The order search's objective: the largest per-rank count of causal (query, key) pairs under
// per-sequence chunks, with integer arithmetic (the kernel model is about 10x slower per segment;
// the search's result is checked against it). Load(order) computes it in O(documents + C) and
// keeps the order's layout; SwapMaxPairs(i, j) then gives the objective of that order with
// positions i and j swapped in O(C + chunk boundaries between them), exactly (only the chunk
// boundaries inside the swapped span see different documents).
class PerSequencePairEvaluator {
 public:
  PerSequencePairEvaluator(const MicroBatch& mb, int cp_size)
      : mb_(mb),
        cp_size_(cp_size),
        starts_(mb.documents.size() + 1, 0),
        pairs_before_(mb.documents.size() + 1, 0),
        length_(mb.documents.size(), 0),
        bound_(2 * static_cast<size_t>(cp_size), 0),
        bound_pairs_(2 * static_cast<size_t>(cp_size), 0),
        rank_pairs_(static_cast<size_t>(cp_size), 0),
        scratch_(static_cast<size_t>(cp_size), 0),
        first_bound_(mb.documents.size() + 1, 0),
        rank_of_chunk_(2 * static_cast<size_t>(cp_size), 0),
        bound_doc_(2 * static_cast<size_t>(cp_size), 0) {
    for (size_t t = 0; t < rank_of_chunk_.size(); ++t) {
      rank_of_chunk_[t] = static_cast<size_t>(RankOfChunk(static_cast<int64_t>(t), cp_size));
    }
  }

  // The objective of `order`, which becomes the loaded order.
  int64_t Load(const std::vector<int64_t>& order) {
    const size_t n = order.size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = mb_.documents[static_cast<size_t>(order[i])].length;
      length_[i] = len;
      starts_[i + 1] = starts_[i] + len;
      pairs_before_[i + 1] = pairs_before_[i] + CausalPairs(0, len);
    }
    const int64_t total = starts_[n];
    chunk_ = PerSequenceChunk(total, cp_size_);
    std::fill(rank_pairs_.begin(), rank_pairs_.end(), 0);
    size_t k = 0;  // document holding position x (boundaries only grow)
    auto pairs_up_to = [&](int64_t x) {
      while (k < n && starts_[k + 1] <= x) ++k;
      return k < n ? pairs_before_[k] + CausalPairs(0, x - starts_[k]) : pairs_before_[n];
    };
    int64_t previous = 0;
    for (size_t j = 0; j < bound_.size(); ++j) {
      bound_[j] = std::min((static_cast<int64_t>(j) + 1) * chunk_, total);
      bound_pairs_[j] = pairs_up_to(bound_[j]);
      bound_doc_[j] = std::min(k, n - 1);
      rank_pairs_[static_cast<size_t>(RankOfChunk(static_cast<int64_t>(j), cp_size_))] +=
          bound_pairs_[j] - previous;
      previous = bound_pairs_[j];
    }
    size_t t = 0;  // first_bound_[i]: the first boundary at or after document i's start
    for (size_t i = 0; i <= n; ++i) {
      while (t < bound_.size() && bound_[t] < starts_[i]) ++t;
      first_bound_[i] = t;
    }
    max_ = *std::max_element(rank_pairs_.begin(), rank_pairs_.end());
    max_ranks_.clear();
    for (int r = 0; r < cp_size_; ++r) {
      if (rank_pairs_[static_cast<size_t>(r)] == max_) max_ranks_.push_back(r);
    }
    return max_;
  }

  // The objective of the loaded order with positions i < j swapped (the loaded order stays), or,
  // when that is not below `below`, possibly only some value >= below (a swap that moves no
  // chunk of a rank holding the loaded maximum >= below cannot bring the maximum below it).
  int64_t SwapMaxPairs(size_t i, size_t j, int64_t below = std::numeric_limits<int64_t>::max()) {
    // Boundaries first_bound_[i] .. first_bound_[j + 1] - 1 can move, so chunks
    // first_bound_[i] .. first_bound_[j + 1] can change.
    const size_t c0 = first_bound_[i], c1 = first_bound_[j + 1];
    if (c0 == c1) return max_;
    const int64_t a = starts_[i], e = starts_[j + 1];
    const int64_t li = length_[i], lj = length_[j];
    const int64_t delta = lj - li;                                  // shift of documents i+1..j-1
    const int64_t shift = CausalPairs(0, lj) - CausalPairs(0, li);  // and of their pairs before
    const int64_t last_start = e - li;                              // where document i lands
    const int64_t last_before = pairs_before_[j + 1] - CausalPairs(0, li);
    // Pairs before boundary t after the swap, less before it (0 outside c0 .. c1 - 1).
    auto moved = [&](int64_t t) -> int64_t {
      if (t < static_cast<int64_t>(c0) || t >= static_cast<int64_t>(c1)) return 0;
      const int64_t x = bound_[static_cast<size_t>(t)];
      int64_t p;
      if (x < a + lj) {
        p = pairs_before_[i] + CausalPairs(0, x - a);
      } else if (x >= last_start) {
        p = last_before + CausalPairs(0, x - last_start);
      } else {  // a middle document, at its old position y
        const int64_t y = x - delta;
        // From the document holding x before the swap, step to the one holding y.
        size_t k = std::clamp(bound_doc_[static_cast<size_t>(t)], i + 1, j - 1);
        while (starts_[k] > y) --k;
        while (starts_[k + 1] <= y) ++k;
        p = pairs_before_[k] + shift + CausalPairs(0, y - starts_[k]);
      }
      return p - bound_pairs_[static_cast<size_t>(t)];
    };
    const int64_t last = 2 * static_cast<int64_t>(cp_size_) - 1;
    if (max_ >= below) {
      // A rank holding the maximum that stays at or above `below` decides it. Rank r's chunks
      // are r and 2C-1-r; chunk t gains moved(t) - moved(t - 1).
      for (const int r : max_ranks_) {
        const int64_t late = last - r;
        const int64_t after = max_ + moved(r) - moved(r - 1) + moved(late) - moved(late - 1);
        if (after >= below) return max_;
      }
    }
    std::copy(rank_pairs_.begin(), rank_pairs_.end(), scratch_.begin());
    int64_t previous = 0;  // moved(t - 1)
    for (int64_t t = static_cast<int64_t>(c0); t <= static_cast<int64_t>(c1); ++t) {
      const int64_t m = moved(t);
      scratch_[rank_of_chunk_[static_cast<size_t>(t)]] += m - previous;
      previous = m;
    }
    return *std::max_element(scratch_.begin(), scratch_.end());
  }

 private:
  const MicroBatch& mb_;
  int cp_size_;
  int64_t chunk_ = 0;
  std::vector<int64_t> starts_;        // of the loaded order
  std::vector<int64_t> pairs_before_;  // causal pairs of the documents before each position
  std::vector<int64_t> length_;        // document length at each position
  std::vector<int64_t> bound_;         // end of chunk t
  std::vector<int64_t> bound_pairs_;   // causal pairs before bound_[t]
  std::vector<int64_t> rank_pairs_;
  std::vector<int64_t> scratch_;
  std::vector<size_t> first_bound_;  // first boundary >= starts_[i]
  int64_t max_ = 0;                  // the loaded order's objective
  std::vector<int> max_ranks_;       // ranks holding it
  std::vector<size_t> rank_of_chunk_;
  std::vector<size_t> bound_doc_;  // document holding bound_[t] (the last one for the total)
};

// Bounds on the swap search of PerSequenceOrder: at most kOrderSearchEvaluationsPerDocument
// orders per document, and at most kOrderSearchWorkBudget (documents + 2C) units in all, which
// keeps a 128K micro-batch of ~40 documents near ten microseconds (swaps are evaluated
// incrementally, see PerSequencePairEvaluator).
inline constexpr int64_t kOrderSearchEvaluationsPerDocument = 12;
inline constexpr int64_t kOrderSearchWorkBudget = int64_t{1} << 16;

// An order for kPerSequenceOrdered and its predicted slowest-rank latency.
struct OrderResult {
  std::vector<int64_t> order;  // document indices in packing order
  double max_ms = 0.0;
  double given_max_ms = 0.0;  // the micro-batch order's (plain kPerSequence)
};

// The search's first candidate, the "organ pipe": longest in the middle, the next ones
// alternately left and right of it (to the side with fewer tokens), shortest at the ends, so
// documents of similar length sit at mirrored positions, whose chunks the head-tail pairing gives
// to the same rank.
inline std::vector<int64_t> OrganPipeOrder(const MicroBatch& mb) {
  std::vector<int64_t> by_length(mb.documents.size());
  std::iota(by_length.begin(), by_length.end(), int64_t{0});
  std::stable_sort(by_length.begin(), by_length.end(), [&](int64_t a, int64_t b) {
    return mb.documents[static_cast<size_t>(a)].length >
           mb.documents[static_cast<size_t>(b)].length;
  });
  std::vector<int64_t> left, right;  // left is built outward (reversed at the end)
  int64_t left_tokens = 0, right_tokens = 0;
  for (int64_t i : by_length) {
    const int64_t len = mb.documents[static_cast<size_t>(i)].length;
    if (left_tokens <= right_tokens) {
      left.push_back(i);
      left_tokens += len;
    } else {
      right.push_back(i);
      right_tokens += len;
    }
  }
  std::vector<int64_t> pipe(left.rbegin(), left.rend());
  pipe.insert(pipe.end(), right.begin(), right.end());
  return pipe;
}

// The search behind PerSequenceOrder (inputs already checked).
inline OrderResult SearchPerSequenceOrder(const MicroBatch& mb, int cp_size,
                                          const KernelModel& model) {
  const int64_t n = static_cast<int64_t>(mb.documents.size());
  OrderResult given;
  given.order.resize(static_cast<size_t>(n));
  std::iota(given.order.begin(), given.order.end(), int64_t{0});
  given.max_ms = PerSequenceMaxMs(mb, given.order, cp_size, model);
  given.given_max_ms = given.max_ms;
  const auto [shortest, longest] =
      std::minmax_element(mb.documents.begin(), mb.documents.end(),
                          [](const Document& a, const Document& b) { return a.length < b.length; });
  if (n < 2 || cp_size < 2 || shortest->length == longest->length) return given;  // nothing to gain
  PerSequencePairEvaluator eval(mb, cp_size);
  std::vector<int64_t> best = given.order;
  int64_t best_pairs = eval.Load(best);
  const std::vector<int64_t> pipe = OrganPipeOrder(mb);
  if (const int64_t p = eval.Load(pipe); p < best_pairs) {
    best = pipe;
    best_pairs = p;
  }
  eval.Load(best);
  // Improve it by first-improvement swaps of documents of different lengths, within a bounded
  // number of evaluations.
  int64_t budget = std::min(kOrderSearchEvaluationsPerDocument * n,
                            kOrderSearchWorkBudget / (n + 2 * int64_t{cp_size}));
  std::vector<int64_t> order = best;
  for (bool improved = true; improved && budget > 0;) {
    improved = false;
    for (int64_t i = 0; i < n && budget > 0; ++i) {
      for (int64_t j = i + 1; j < n && budget > 0; ++j) {
        if (mb.documents[static_cast<size_t>(order[i])].length ==
            mb.documents[static_cast<size_t>(order[j])].length) {
          continue;
        }
        --budget;
        if (const int64_t p =
                eval.SwapMaxPairs(static_cast<size_t>(i), static_cast<size_t>(j), best_pairs);
            p < best_pairs) {
          std::swap(order[i], order[j]);
          eval.Load(order);
          best = order;
          best_pairs = p;
          improved = true;
        }
      }
    }
  }
  // The kernel model decides between the search's order and the given one, so ordering is never
  // predicted worse than plain per-sequence sharding.
  const double best_ms = PerSequenceMaxMs(mb, best, cp_size, model);
  if (best_ms < given.max_ms) return {std::move(best), best_ms, given.max_ms};
  return given;
}

// Builds the plan of a resolved strategy (anything but kAdaptive). `order` is used by
// kPerSequenceOrdered only: the packing order, or empty to search for one.
inline absl::StatusOr<ShardPlan> PlanResolved(const MicroBatch& mb,
                                              const std::vector<int64_t>& starts, int cp_size,
                                              ShardStrategy strategy, ShardStrategy requested,
                                              const KernelModel& model, std::vector<int64_t> order,
                                              const CpPlanOptions& options = {});

// InvalidArgument with a checked format (a FormatSpec parameter keeps the format a compile-time
// constant for every compiler, which a forwarding lambda does not).
template <typename... Args>
absl::Status PlanError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrFormat(format, args...));
}
}  // namespace detail

// The packing order (document indices) that kPerSequenceOrdered uses for this micro-batch: the
// micro-batch order, the organ-pipe order (longest in the middle, shorter ones alternately
// outward) or a swap-search improvement of the better of the two, whichever the kernel model
// predicts to have the fastest slowest rank. Errors as PlanShards.
inline absl::StatusOr<std::vector<int64_t>> PerSequenceOrder(const MicroBatch& mb, int cp_size,
                                                             const KernelModel& model) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  return detail::SearchPerSequenceOrder(mb, cp_size, model).order;
}

// Predicted max-rank latency (ms) of the fixed strategies and adaptive's pick.
struct AdaptiveChoice {
  ShardStrategy chosen = ShardStrategy::kPerSequenceOrdered;
  double per_seq_max_ms = 0.0;  // micro-batch order (the paper's per-sequence sharding)
  double per_seq_ordered_max_ms = 0.0;
  double per_doc_max_ms = 0.0;
  double hybrid_max_ms = 0.0;
};

namespace detail {

// ChooseAdaptive on a checked micro-batch; also returns the ordered search's order.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptiveChecked(const MicroBatch& mb,
                                                            const std::vector<int64_t>& starts,
                                                            int cp_size, const KernelModel& model,
                                                            std::vector<int64_t>* order) {
  AdaptiveChoice c;
  OrderResult ordered = SearchPerSequenceOrder(mb, cp_size, model);
  c.per_seq_max_ms = ordered.given_max_ms;  // PredictFixed's kPerSequence maximum, same sums
  c.per_seq_ordered_max_ms = ordered.max_ms;
  c.per_doc_max_ms = MaxOf(PredictFixed(mb, starts, cp_size, ShardStrategy::kPerDocument, model));
  c.hybrid_max_ms = HybridMaxMs(mb, cp_size, model);
  c.chosen = ShardStrategy::kPerSequenceOrdered;
  double best = c.per_seq_ordered_max_ms;
  if (c.per_doc_max_ms < best) {
    c.chosen = ShardStrategy::kPerDocument;
    best = c.per_doc_max_ms;
  }
  if (c.hybrid_max_ms < best) c.chosen = ShardStrategy::kHybrid;
  if (order != nullptr) *order = std::move(ordered.order);
  return c;
}

}  // namespace detail

// What kAdaptive would choose for this micro-batch; errors as PlanShards.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptive(const MicroBatch& mb, int cp_size,
                                                     const KernelModel& model) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  return detail::ChooseAdaptiveChecked(mb, *starts, cp_size, model, nullptr);
}

// Plans one micro-batch for CP size cp_size (see the file comment for strategies and rules).
// `model` is used by kPerSequenceOrdered, kAdaptive, kHybrid and kDocumentDegree only; `options`
// (link and layer masks) by kDocumentDegree only. Bad options are InvalidArgument naming the
// value.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model,
                                            const CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  if (absl::Status s = ValidateCpPlanOptions(options); !s.ok()) return s;
  if (strategy != ShardStrategy::kAdaptive) {
    return detail::PlanResolved(mb, *starts, cp_size, strategy, strategy, model, {}, options);
  }
  std::vector<int64_t> order;
  absl::StatusOr<AdaptiveChoice> c =
      detail::ChooseAdaptiveChecked(mb, *starts, cp_size, model, &order);
  if (!c.ok()) return c.status();
  return detail::PlanResolved(mb, *starts, cp_size, c->chosen, strategy, model, std::move(order));
}

// PlanShards with the default options: a 450 GB/s link and one causal layer.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model) {
  return PlanShards(mb, cp_size, strategy, model, CpPlanOptions{});
}

// K/V rows one rank receives from and sends to the other ranks of a plan under one mask (a
// selective exchange: a rank gets exactly the rows its queries see and it does not hold).
struct RankExchange {
  int64_t recv_rows = 0;
  int64_t send_rows = 0;
};

namespace detail {

// The plan's segments grouped by document, as DocShards.
inline std::vector<std::vector<DocShard>> ShardsByDocument(const ShardPlan& plan) {
  std::vector<std::vector<DocShard>> by_doc;
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) {
      const size_t i = static_cast<size_t>(s.doc_index);
      if (i >= by_doc.size()) by_doc.resize(i + 1);
      by_doc[i].push_back({r.rank, s.q_begin, s.q_end});
    }
  }
  return by_doc;
}

inline std::vector<RankExchange> ExchangeOf(const std::vector<std::vector<DocShard>>& by_doc,
                                            size_t ranks, const AttentionMask& mask) {
  std::vector<RankExchange> x(ranks);
  for (const std::vector<DocShard>& shards : by_doc) {
    ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
      x[static_cast<size_t>(to)].recv_rows += rows;
      x[static_cast<size_t>(from)].send_rows += rows;
    });
  }
  return x;
}

}  // namespace detail

// Per rank: K/V rows exchanged under `mask` (plan segments must have valid doc_index values, as
// every plan PlanShards returns has).
inline std::vector<RankExchange> ExchangedKvRows(const ShardPlan& plan,
                                                 const AttentionMask& mask = {}) {
  return detail::ExchangeOf(detail::ShardsByDocument(plan), plan.ranks.size(), mask);
}

// Predicted CP attention time of a plan, per layer: every layer kind of the mix is weighted by
// its share of the layers. Within one layer kind a rank takes attention (MaskedSegmentMs of its
// segments) + max(sent, received) K/V rows x CommModel::RowMs; the layer ends with its slowest
// rank.
struct CpPrediction {
  double max_ms = 0.0;            // mix mean of max over ranks of attention + exchange
  double attention_max_ms = 0.0;  // mix mean of max over ranks of attention alone
  double exchanged_bytes = 0.0;   // mix mean of K/V bytes received, summed over ranks
  double max_rank_bytes = 0.0;    // mix mean of max over ranks of max(sent, received) bytes
  double allgather_bytes = 0.0;   // C x (C-1) x rank_capacity rows: what an all-gather of every
                                  // rank's padded buffer (the backends' executors) moves
  std::vector<double> rank_ms;    // per rank: mix mean of attention + exchange
  // Per rank: (query, key) pairs summed over the mix's layers, each under its own mask (one
  // causal layer: RankShard::causal_pairs). At most 2^49 per layer (S_max x S / 2) x 4096 layers.
  std::vector<int64_t> rank_pairs;
};

inline CpPrediction PredictCp(const ShardPlan& plan, const KernelModel& model,
                              const CpPlanOptions& options = {}) {
  CpPrediction p;
  const size_t ranks = plan.ranks.size();
  p.rank_ms.assign(ranks, 0.0);
  p.rank_pairs.assign(ranks, 0);
  const std::vector<std::vector<DocShard>> by_doc = detail::ShardsByDocument(plan);
  const double row_ms = options.comm.RowMs(model);
  const double row_bytes = static_cast<double>(options.comm.RowBytes(model));
  const double total = static_cast<double>(std::max<int64_t>(1, options.mix.total_layers()));
  for (const auto& [mask, count] : options.mix.layers) {
    const double w = static_cast<double>(count) / total;
    const std::vector<RankExchange> x = detail::ExchangeOf(by_doc, ranks, mask);
    double worst = 0.0, worst_attention = 0.0, worst_rows = 0.0, received = 0.0;
    for (size_t r = 0; r < ranks; ++r) {
      double attention = 0.0;
      for (const Segment& s : plan.ranks[r].segments) {
        attention += MaskedSegmentMs(model, mask, s.q_begin, s.q_end);
        p.rank_pairs[r] += count * mask.Pairs(s.q_begin, s.q_end);
      }
      const double rows = static_cast<double>(std::max(x[r].recv_rows, x[r].send_rows));
      const double t = attention + rows * row_ms;
      p.rank_ms[r] += w * t;
      worst = std::max(worst, t);
      worst_attention = std::max(worst_attention, attention);
      worst_rows = std::max(worst_rows, rows);
      received += static_cast<double>(x[r].recv_rows);
    }
    p.max_ms += w * worst;
    p.attention_max_ms += w * worst_attention;
    p.max_rank_bytes += w * worst_rows * row_bytes;
    p.exchanged_bytes += w * received * row_bytes;
  }
  const double c = static_cast<double>(plan.cp_size);
  p.allgather_bytes = c * (c - 1.0) * static_cast<double>(plan.rank_capacity) * row_bytes;
  return p;
}

namespace detail {

// kDocumentDegree's greedy placement (see the file comment), inputs checked.
inline absl::StatusOr<ShardPlan> GreedyDocumentDegree(const MicroBatch& mb,
                                                      const std::vector<int64_t>& starts,
                                                      int cp_size, ShardStrategy requested,
                                                      const KernelModel& model,
                                                      const CpPlanOptions& options) {
  const size_t docs = mb.documents.size();
  const size_t ranks = static_cast<size_t>(cp_size);
  const LayerMix& mix = options.mix;
  const size_t kinds = mix.layers.size();
  const double row_ms = options.comm.RowMs(model);
  std::vector<double> weight(kinds);
  for (size_t k = 0; k < kinds; ++k) {
    weight[k] = static_cast<double>(mix.layers[k].second) / static_cast<double>(mix.total_layers());
  }
  std::vector<int> degrees;  // 1, 2, 4, ... below C, then C
  for (int g = 1; g < cp_size; g *= 2) degrees.push_back(g);
  degrees.push_back(cp_size);
  // Per rank and layer kind: attention ms, rows sent, rows received.
  std::vector<double> attention(ranks * kinds, 0.0), sent(ranks * kinds, 0.0),
      received(ranks * kinds, 0.0);
  auto rank_time = [&](size_t r, const double* da, const double* ds, const double* dr) {
    double t = 0.0;
    for (size_t k = 0; k < kinds; ++k) {
      const size_t x = r * kinds + k;
      t += weight[k] *
           (attention[x] + (da ? da[k] : 0.0) +
            std::max(sent[x] + (ds ? ds[k] : 0.0), received[x] + (dr ? dr[k] : 0.0)) * row_ms);
    }
    return t;
  };
  auto whole_ms = [&](int64_t length) {
    double t = 0.0;
    for (size_t k = 0; k < kinds; ++k) {
      t += weight[k] * MaskedSegmentMs(model, mix.layers[k].first, 0, length);
    }
    return t;
  };
  std::vector<std::pair<double, size_t>> order;  // (whole-document ms, index), costliest first
  order.reserve(docs);
  for (size_t i = 0; i < docs; ++i) order.push_back({whole_ms(mb.documents[i].length), i});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  struct Placement {
    int degree = 1;
    int first_rank = 0;
    int64_t pointer = 0;
  };
  std::vector<Placement> placed(docs);
  std::vector<int64_t> pointer(degrees.size(), 0);
  std::vector<double> time(ranks), prefix_max(ranks + 1), suffix_max(ranks + 1);
  // Per member of a group and layer kind: added attention, sent and received rows.
  std::vector<double> da(ranks * kinds), ds(ranks * kinds), dr(ranks * kinds);
  std::vector<DocShard> shards;
  for (const auto& [whole, i] : order) {
    const int64_t length = mb.documents[i].length;
    for (size_t r = 0; r < ranks; ++r) time[r] = rank_time(r, nullptr, nullptr, nullptr);
    prefix_max[0] = 0.0;
    for (size_t r = 0; r < ranks; ++r) prefix_max[r + 1] = std::max(prefix_max[r], time[r]);
    suffix_max[ranks] = 0.0;
    for (size_t r = ranks; r-- > 0;) suffix_max[r] = std::max(suffix_max[r + 1], time[r]);
    // Best (slowest rank, slowest member, added time, degree, group) so far.
    std::tuple<double, double, double, int, int> best{INFINITY, INFINITY, INFINITY, 0, 0};
    size_t best_degree = 0;
    for (size_t di = 0; di < degrees.size(); ++di) {
      const int g = degrees[di];
      if (g > 1 && length < 2 * static_cast<int64_t>(g)) continue;  // every shard non-empty
      const int64_t n = 2 * static_cast<int64_t>(g);
      std::fill(da.begin(), da.end(), 0.0);
      std::fill(ds.begin(), ds.end(), 0.0);
      std::fill(dr.begin(), dr.end(), 0.0);
      if (g == 1) {
        for (size_t k = 0; k < kinds; ++k) {
          da[k] = MaskedSegmentMs(model, mix.layers[k].first, 0, length);
        }
      } else {
        shards.clear();
        for (int m = 0; m < g; ++m) {
          for (const int64_t j : {int64_t{m}, n - 1 - m}) {
            const auto [b, e] = PerDocumentShard(length, n, pointer[di], j);
            shards.push_back({m, b, e});
          }
        }
        for (size_t k = 0; k < kinds; ++k) {
          const AttentionMask& mask = mix.layers[k].first;
          for (const DocShard& sh : shards) {
            da[static_cast<size_t>(sh.rank) * kinds + k] +=
                MaskedSegmentMs(model, mask, sh.q_begin, sh.q_end);
          }
          ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
            dr[static_cast<size_t>(to) * kinds + k] += static_cast<double>(rows);
            ds[static_cast<size_t>(from) * kinds + k] += static_cast<double>(rows);
          });
        }
      }
      for (int first = 0; first + g <= cp_size; first += g) {
        double member_max = 0.0, added = 0.0;
        for (int m = 0; m < g; ++m) {
          const size_t r = static_cast<size_t>(first + m);
          const size_t x = static_cast<size_t>(m) * kinds;
          const double t = rank_time(r, &da[x], &ds[x], &dr[x]);
          member_max = std::max(member_max, t);
          added += t - time[r];
        }
        const double slowest = std::max({member_max, prefix_max[static_cast<size_t>(first)],
                                         suffix_max[static_cast<size_t>(first + g)]});
        const std::tuple<double, double, double, int, int> key{slowest, member_max, added, g,
                                                               first};
        if (key < best) {
          best = key;
          best_degree = di;
        }
      }
    }
    // Apply the best placement.
    const int g = std::get<3>(best);
    const int first = std::get<4>(best);
    placed[i] = {g, first, pointer[best_degree]};
    const int64_t n = 2 * static_cast<int64_t>(g);
    for (size_t k = 0; k < kinds; ++k) {
      const AttentionMask& mask = mix.layers[k].first;
      if (g == 1) {
        attention[static_cast<size_t>(first) * kinds + k] +=
            MaskedSegmentMs(model, mask, 0, length);
        continue;
      }
      shards.clear();
      for (int m = 0; m < g; ++m) {
        for (const int64_t j : {int64_t{m}, n - 1 - m}) {
          const auto [b, e] = PerDocumentShard(length, n, pointer[best_degree], j);
          shards.push_back({first + m, b, e});
          attention[static_cast<size_t>(first + m) * kinds + k] +=
              MaskedSegmentMs(model, mask, b, e);
        }
      }
      ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
        received[static_cast<size_t>(to) * kinds + k] += static_cast<double>(rows);
        sent[static_cast<size_t>(from) * kinds + k] += static_cast<double>(rows);
      });
    }
    if (g > 1) pointer[best_degree] = (pointer[best_degree] + length % n) % n;
  }
  PlanBuilder b(mb, starts, cp_size, docs * 2);
  for (int half = 0; half < 3; ++half) {  // early shards, late shards, whole documents
    for (size_t i = 0; i < docs; ++i) {
      const Placement& p = placed[i];
      const int64_t length = mb.documents[i].length;
      if (p.degree == 1) {
        if (half == 2) b.Add(p.first_rank, static_cast<int64_t>(i), 0, length);
        continue;
      }
      if (half == 2) continue;
      const int64_t n = 2 * static_cast<int64_t>(p.degree);
      for (int m = 0; m < p.degree; ++m) {
        const auto [lo, hi] = PerDocumentShard(length, n, p.pointer, half == 0 ? m : n - 1 - m);
        if (lo < hi) b.Add(p.first_rank + m, static_cast<int64_t>(i), lo, hi);
      }
    }
  }
  return b.Finish(ShardStrategy::kDocumentDegree, requested, cp_size, -1);
}

// kDocumentDegree: the greedy plan, or the greedy plan for all-causal layers (when the mix has
// other masks), kPerDocument's, kHybrid's or kPerSequenceOrdered's, whichever PredictCp under
// `options` finds fastest (a fixed strategy's plan keeps its strategy; requested says
// kDocumentDegree).
inline absl::StatusOr<ShardPlan> PlanDocumentDegree(const MicroBatch& mb,
                                                    const std::vector<int64_t>& starts, int cp_size,
                                                    ShardStrategy requested,
                                                    const KernelModel& model,
                                                    const CpPlanOptions& options) {
  absl::StatusOr<ShardPlan> greedy =
      GreedyDocumentDegree(mb, starts, cp_size, requested, model, options);
  if (!greedy.ok()) return greedy.status();
  double best_ms = PredictCp(*greedy, model, options).max_ms;
  ShardPlan chosen = *std::move(greedy);
  auto consider = [&](absl::StatusOr<ShardPlan> plan) -> absl::Status {
    if (!plan.ok()) return plan.status();
    if (const double ms = PredictCp(*plan, model, options).max_ms; ms < best_ms) {
      best_ms = ms;
      chosen = *std::move(plan);
    }
    return absl::OkStatus();
  };
  if (!options.mix.all_causal()) {
    CpPlanOptions causal = options;
    causal.mix = LayerMix::Causal();
    absl::Status s = consider(GreedyDocumentDegree(mb, starts, cp_size, requested, model, causal));
    if (!s.ok()) return s;
  }
  for (ShardStrategy other :
       {ShardStrategy::kPerDocument, ShardStrategy::kHybrid, ShardStrategy::kPerSequenceOrdered}) {
    absl::Status s =
        consider(PlanResolved(mb, starts, cp_size, other, requested, model, {}, options));
    if (!s.ok()) return s;
  }
  return chosen;
}

}  // namespace detail

namespace detail {

inline absl::StatusOr<ShardPlan> PlanResolved(const MicroBatch& mb,
                                              const std::vector<int64_t>& starts, int cp_size,
                                              ShardStrategy strategy, ShardStrategy requested,
                                              const KernelModel& model, std::vector<int64_t> order,
                                              const CpPlanOptions& options) {
  const size_t docs = mb.documents.size();
  switch (strategy) {
    case ShardStrategy::kPerSequence: {
      detail::PlanBuilder b(mb, starts, cp_size, docs + 2 * static_cast<size_t>(cp_size));
      detail::ForEachPerSequenceSegment(
          starts, cp_size, [&](int r, int64_t i, int64_t qb, int64_t qe) { b.Add(r, i, qb, qe); });
      return b.Finish(strategy, requested, cp_size,
                      2 * detail::PerSequenceChunk(starts.back(), cp_size));
    }
    case ShardStrategy::kPerSequenceOrdered: {
      if (order.empty()) order = SearchPerSequenceOrder(mb, cp_size, model).order;
      std::vector<int64_t> ordered_starts(docs + 1, 0);
      for (size_t i = 0; i < docs; ++i) {
        ordered_starts[i + 1] =
            ordered_starts[i] + mb.documents[static_cast<size_t>(order[i])].length;
      }
      detail::PlanBuilder b(mb, starts, cp_size, docs + 2 * static_cast<size_t>(cp_size));
      detail::ForEachPerSequenceSegment(ordered_starts, cp_size,
                                        [&](int r, int64_t i, int64_t qb, int64_t qe) {
                                          b.Add(r, order[static_cast<size_t>(i)], qb, qe);
                                        });
      return b.Finish(strategy, requested, cp_size,
                      2 * detail::PerSequenceChunk(starts.back(), cp_size));
    }
    case ShardStrategy::kPerDocument: {
      detail::PlanBuilder b(mb, starts, cp_size, docs * 2 * static_cast<size_t>(cp_size));
      detail::ForEachPerDocumentSegment(
          mb, cp_size, [](size_t) { return true; },
          [&](int r, int64_t i, int64_t qb, int64_t qe) { b.Add(r, i, qb, qe); });
      return b.Finish(strategy, requested, cp_size, -1);
    }
    case ShardStrategy::kHybrid: {
      detail::PlanBuilder b(mb, starts, cp_size, docs * 2 * static_cast<size_t>(cp_size));
      std::vector<double> sharded_ms, whole_ms;
      const std::vector<int> owner =
          PlaceHybrid(mb, cp_size, model, sharded_ms, whole_ms,
                      [&](int r, int64_t i, int64_t qb, int64_t qe) { b.Add(r, i, qb, qe); });
      for (size_t i = 0; i < docs; ++i) {
        if (owner[i] >= 0) b.Add(owner[i], static_cast<int64_t>(i), 0, mb.documents[i].length);
      }
      return b.Finish(strategy, requested, cp_size, -1);
    }
    case ShardStrategy::kPerDocumentPadded: {
      const int64_t n = 2 * static_cast<int64_t>(cp_size);
      detail::PlanBuilder b(mb, starts, cp_size, docs * static_cast<size_t>(n));
      int64_t capacity = 0;  // every rank's buffer: two padded chunks of every document
      for (size_t i = 0; i < docs; ++i) {
        const int64_t d = mb.documents[i].length;
        const int64_t chunk = (d + n - 1) / n;
        capacity += 2 * chunk;
        for (int r = 0; r < cp_size; ++r) {
          for (const int64_t j : {int64_t{r}, n - 1 - r}) {
            const int64_t lo = std::min(j * chunk, d);
            const int64_t hi = std::min((j + 1) * chunk, d);
            if (lo < hi) b.Add(r, static_cast<int64_t>(i), lo, hi);
          }
        }
      }
      return b.Finish(strategy, requested, cp_size, capacity);
    }
    case ShardStrategy::kDocumentDegree:
      return PlanDocumentDegree(mb, starts, cp_size, requested, model, options);
    case ShardStrategy::kAdaptive:
      break;  // resolved by the caller
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown shard strategy value %d", static_cast<int>(strategy)));
}

}  // namespace detail

// Predicted latency (ms) of every rank of a plan under `model`.
inline std::vector<double> PredictRankMs(const ShardPlan& plan, const KernelModel& model) {
  return detail::PredictRankMsOf(plan, model);
}

// Checks that `plan` is a complete, consistent plan of `mb`: ranks 0..C-1, every token of every
// document held by exactly one segment, keys exactly the piece's prefix, positions, cu_seqlens,
// max lengths, token and pair counts matching the segments, rank tokens within rank_capacity.
// Returns InvalidArgument naming the first inconsistency.
inline absl::Status ValidateShardPlan(const ShardPlan& plan, const MicroBatch& mb) {
  absl::StatusOr<std::vector<int64_t>> starts_or = detail::CheckMicroBatch(mb, plan.cp_size);
  if (!starts_or.ok()) return starts_or.status();
  const std::vector<int64_t>& starts = *starts_or;
  if (plan.strategy == ShardStrategy::kAdaptive)
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
