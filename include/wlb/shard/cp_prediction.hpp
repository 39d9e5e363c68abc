// Predicting shard plans: kernel time per rank (PredictRankMs), time under attention masks
// (MaskedSegmentMs), the K/V rows ranks exchange (ExchangedKvRows), the exchange a CP executor
// runs for them (ChooseExchange: row-exact or all-gather) and the predicted CP time of a layer mix
// with that exchange over a link (PredictCp).
//
//   const std::vector<RankExchange> x = ExchangedKvRows(plan, mask);
//   const ExchangeChoice c = ChooseExchange(x, plan.rank_capacity, /*row_bytes=*/16384, comm);
//   if (c.kind == ExchangeKind::kRowExact) { /* all-to-all-v of x's rows */ }
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "wlb/cost/attention_mask.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {

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
// union over its shards of the keys [mask.KeyBegin(q_begin), q_end), less its own rows. O(S^2)
// for S shards: the definition, which tests check DocExchangeRows against.
template <typename Fn>
void ForEachDocExchange(std::span<const DocShard> shards, const AttentionMask& mask, Fn&& fn) {
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

// Sorted values (non-negative) and their prefix sums: RowsBetween(b, e) is the sum over the
// values v of min(v, e) - min(v, b), the rows of [b, e) below each v, in O(log n). The values are
// ends within one document (at most kMaxContext, CheckMicroBatch) and n at most C, so every sum
// stays below 2^37.
class SortedSums {
 public:
  // Keeps a sorted copy of `values` (its memory is reused by the next Assign).
  void Assign(std::span<const int64_t> values) {
    values_.assign(values.begin(), values.end());
    std::sort(values_.begin(), values_.end());
    prefix_.assign(values_.size() + 1, 0);
    for (size_t i = 0; i < values_.size(); ++i) prefix_[i + 1] = prefix_[i] + values_[i];
  }
  int64_t RowsBetween(int64_t b, int64_t e) const { return SumOfMin(e) - SumOfMin(b); }

 private:
  int64_t SumOfMin(int64_t x) const {
    const size_t below =
        static_cast<size_t>(std::lower_bound(values_.begin(), values_.end(), x) - values_.begin());
    return prefix_[below] + x * static_cast<int64_t>(values_.size() - below);
  }
  std::vector<int64_t> values_, prefix_;
};

// DocExchangeRows' scratch, kept across documents (a vector per call costs more than the sums).
struct DocExchangeScratch {
  std::vector<DocShard> by_rank;
  std::vector<int64_t> largest;  // per holder, in rank order: its largest end
  SortedSums holder_end_sums;
};

}  // namespace detail

// ForEachDocExchange's rows summed per rank: calls fn(rank, received, sent) with what `rank`
// receives and sends for this document (causal: once per rank holding a shard, none when one
// rank holds it all; other masks possibly more than once; the sums are what ForEachDocExchange's
// calls add up to). Causal masks in O(S log S) for S shards: the shards cover [0, length) once,
// so a rank with largest end h receives h less its own rows, and a shard [b, e) sends, to each
// other holder with largest end x, min(x, e) - min(x, b) rows, summed over the holders' sorted
// ends. Per-document plans cut a document into 2C shards, where the pairwise count made
// PredictCp O(C^2) per document (95% of doc-degree's planning at C = 1024). Other masks:
// ForEachDocExchange.
template <typename Fn>
void DocExchangeRows(std::span<const DocShard> shards, const AttentionMask& mask,
                     detail::DocExchangeScratch& scratch, Fn&& fn) {
  if (!mask.causal()) {
    ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
      fn(to, rows, int64_t{0});
      fn(from, int64_t{0}, rows);
    });
    return;
  }
  if (shards.size() < 2) return;  // a whole document moves no rows
  auto& [by_rank, largest, holder_end_sums] = scratch;
  // Shards grouped by rank: a plan's come so (ShardsByDocument), others are sorted.
  auto rank_less = [](const DocShard& a, const DocShard& b) { return a.rank < b.rank; };
  std::span<const DocShard> grouped = shards;
  if (!std::is_sorted(shards.begin(), shards.end(), rank_less)) {
    by_rank.assign(shards.begin(), shards.end());
    std::sort(by_rank.begin(), by_rank.end(), rank_less);
    grouped = by_rank;
  }
  largest.clear();
  for (size_t i = 0; i < grouped.size(); ++i) {
    if (i == 0 || grouped[i].rank != grouped[i - 1].rank) largest.push_back(grouped[i].q_end);
    largest.back() = std::max(largest.back(), grouped[i].q_end);
  }
  if (largest.size() < 2) return;  // one holder
  holder_end_sums.Assign(largest);
  size_t holder = 0;
  for (size_t i = 0; i < grouped.size(); ++holder) {
    const int rank = grouped[i].rank;
    int64_t own = 0, sent = 0;
    for (; i < grouped.size() && grouped[i].rank == rank; ++i) {
      const int64_t b = grouped[i].q_begin, e = grouped[i].q_end;
      own += e - b;
      // Its rows below every holder's largest end, less its own holder's (all of them).
      sent += holder_end_sums.RowsBetween(b, e) - (e - b);
    }
    fn(rank, largest[holder] - own, sent);
  }
}

// K/V rows one rank receives from and sends to the other ranks of a plan under one mask (a
// selective exchange: a rank gets exactly the rows its queries see and it does not hold).
struct RankExchange {
  int64_t recv_rows = 0;
  int64_t send_rows = 0;
};

// How a CP executor moves one layer's K/V rows (wlb.torch.cp_attention runs exactly this):
//  - kRowExact: every rank receives exactly the rows its keys need and it does not hold, and in
//    backward sends those rows' dK/dV back to their owners: one all-to-all-v each way (none at
//    all when no rank needs another's rows).
//  - kAllGather: every rank gathers every rank's buffer padded to rank_capacity ((C - 1) x
//    rank_capacity rows in and out per rank), and reduce-scatters the gradients back.
enum class ExchangeKind { kRowExact, kAllGather };

inline const char* ExchangeKindName(ExchangeKind k) {
  return k == ExchangeKind::kRowExact ? "row-exact" : "all-gather";
}

// ChooseExchange's decision and the predicted (one-way) exchange time of both candidates.
struct ExchangeChoice {
  ExchangeKind kind = ExchangeKind::kRowExact;
  int64_t row_exact_rows = 0;  // max over ranks of max(rows sent, rows received)
  int64_t allgather_rows = 0;  // (C - 1) x rank_capacity
  double row_exact_ms = 0.0;   // row_exact_rows x row bytes / link + latency (0 without rows)
  double allgather_ms = 0.0;   // allgather_rows x row bytes / link + latency (0 for C = 1)
};

// The executors' exchange rule for one plan and mask, from its per-rank rows `x`
// (ExchangedKvRows): each candidate is one collective, priced at its slowest rank's bytes over
// comm.link_gbps plus comm.latency_us; row-exact when no rank needs another's rows (no collective
// at all) or when it is predicted strictly faster than the all-gather, else the all-gather (on a
// tie the all-gather, which needs no packing of rows). Every rank of a plan makes the same choice.
//
// ChooseExchangeOf is the same rule from the slowest rank's rows (max over ranks of max(sent,
// received)) and the number of ranks, for planners that track those without a RankExchange list.
inline ExchangeChoice ChooseExchangeOf(int64_t max_rank_rows, int64_t ranks, int64_t rank_capacity,
                                       int64_t row_bytes, const CommModel& comm) {
  ExchangeChoice c;
  c.row_exact_rows = max_rank_rows;
  const int64_t others = std::max<int64_t>(0, ranks - 1);
  c.allgather_rows = others * rank_capacity;
  const double row_ms = static_cast<double>(row_bytes) / (comm.link_gbps * 1e9) * 1e3;
  c.row_exact_ms = c.row_exact_rows > 0
                       ? static_cast<double>(c.row_exact_rows) * row_ms + comm.LatencyMs()
                       : 0.0;
  c.allgather_ms =
      others > 0 ? static_cast<double>(c.allgather_rows) * row_ms + comm.LatencyMs() : 0.0;
  c.kind = c.row_exact_rows == 0 || c.row_exact_ms < c.allgather_ms ? ExchangeKind::kRowExact
                                                                    : ExchangeKind::kAllGather;
  return c;
}

inline ExchangeChoice ChooseExchange(std::span<const RankExchange> x, int64_t rank_capacity,
                                     int64_t row_bytes, const CommModel& comm) {
  int64_t rows = 0;
  for (const RankExchange& r : x) rows = std::max({rows, r.recv_rows, r.send_rows});
  return ChooseExchangeOf(rows, static_cast<int64_t>(x.size()), rank_capacity, row_bytes, comm);
}

namespace detail {

// The plan's segments grouped by document, as DocShards: document i's are
// shards[offsets[i], offsets[i + 1]) (one flat array: a vector per document costs more to
// allocate than the exchange costs to count).
struct ShardsOfDocuments {
  std::vector<DocShard> shards;
  std::vector<size_t> offsets;
  std::span<const DocShard> of(size_t i) const {
    return std::span<const DocShard>(shards).subspan(offsets[i], offsets[i + 1] - offsets[i]);
  }
  size_t documents() const { return offsets.size() - 1; }
};

inline ShardsOfDocuments ShardsByDocument(const ShardPlan& plan) {
  ShardsOfDocuments by_doc;
  size_t docs = 0, total = 0;
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) docs = std::max(docs, static_cast<size_t>(s.doc_index) + 1);
    total += r.segments.size();
  }
  by_doc.offsets.assign(docs + 1, 0);
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) ++by_doc.offsets[static_cast<size_t>(s.doc_index) + 1];
  }
  for (size_t i = 0; i < docs; ++i) by_doc.offsets[i + 1] += by_doc.offsets[i];
  by_doc.shards.resize(total);
  std::vector<size_t> next(by_doc.offsets.begin(), by_doc.offsets.end() - 1);
  for (const RankShard& r : plan.ranks) {  // rank order within a document, as before
    for (const Segment& s : r.segments) {
      by_doc.shards[next[static_cast<size_t>(s.doc_index)]++] = {r.rank, s.q_begin, s.q_end};
    }
  }
  return by_doc;
}

inline std::vector<RankExchange> ExchangeOf(const ShardsOfDocuments& by_doc, size_t ranks,
                                            const AttentionMask& mask) {
  std::vector<RankExchange> x(ranks);
  DocExchangeScratch scratch;
  for (size_t i = 0; i < by_doc.documents(); ++i) {
    DocExchangeRows(by_doc.of(i), mask, scratch, [&](int rank, int64_t received, int64_t sent) {
      x[static_cast<size_t>(rank)].recv_rows += received;
      x[static_cast<size_t>(rank)].send_rows += sent;
    });
  }
  return x;
}

}  // namespace detail

// Per rank: K/V rows exchanged under `mask` (plan segments must have valid doc_index values and
// cover each document once, as every plan PlanShards returns does: ValidateShardPlan).
inline std::vector<RankExchange> ExchangedKvRows(const ShardPlan& plan,
                                                 const AttentionMask& mask = {}) {
  return detail::ExchangeOf(detail::ShardsByDocument(plan), plan.ranks.size(), mask);
}

// Predicted CP attention time of a plan, per layer: every layer kind of the mix is weighted by
// its share of the layers. Within one layer kind the exchange is the one ChooseExchange picks
// (the executor's rule); a rank takes attention (MaskedSegmentMs of its segments) + its exchange:
// row-exact, max(sent, received) K/V rows x CommModel::RowMs + the latency when any rank moves
// rows; all-gather, the all-gather's time; + with CommModel::gather_gbps > 0 the copy of its
// gathered key rows (every segment's key range, [mask.KeyBegin(q_begin), q_end)) x GatherRowMs.
// The layer ends with its slowest rank.
struct CpPrediction {
  double max_ms = 0.0;            // mix mean of max over ranks of attention + exchange (+ copy)
  double attention_max_ms = 0.0;  // mix mean of max over ranks of attention alone
  double exchanged_bytes = 0.0;   // mix mean of K/V bytes received, summed over ranks, by the
                                  // exchange ChooseExchange picks
  double max_rank_bytes = 0.0;    // mix mean of max over ranks of max(sent, received) bytes
  double allgather_bytes = 0.0;   // C x (C-1) x rank_capacity rows: what an all-gather of every
                                  // rank's padded buffer moves (received, summed over ranks)
  double allgather_share = 0.0;   // share of the mix's layers whose exchange is the all-gather
  std::vector<ExchangeKind> exchange;    // per layer kind of the mix, in its order
  std::vector<double> rank_ms;           // per rank: mix mean of attention + exchange (+ copy)
  std::vector<double> rank_exchange_ms;  // per rank: mix mean of its (one-way) exchange alone
  std::vector<double> rank_gather_ms;    // per rank: mix mean of its key rows' copy (0 unpriced)
  // Per rank: (query, key) pairs summed over the mix's layers, each under its own mask (one
  // causal layer: RankShard::causal_pairs). At most 2^49 per layer (S_max x S / 2) x 4096 layers.
  std::vector<int64_t> rank_pairs;
};

inline CpPrediction PredictCp(const ShardPlan& plan, const KernelModel& model,
                              const CpPlanOptions& options = {}) {
  CpPrediction p;
  const size_t ranks = plan.ranks.size();
  p.rank_ms.assign(ranks, 0.0);
  p.rank_exchange_ms.assign(ranks, 0.0);
  p.rank_gather_ms.assign(ranks, 0.0);
  p.rank_pairs.assign(ranks, 0);
  const detail::ShardsOfDocuments by_doc = detail::ShardsByDocument(plan);
  const double row_ms = options.comm.RowMs(model);
  const double gather_row_ms = options.comm.GatherRowMs(model);
  const int64_t row_bytes_int = options.comm.RowBytes(model);
  const double row_bytes = static_cast<double>(row_bytes_int);
  const double total = static_cast<double>(std::max<int64_t>(1, options.mix.total_layers()));
  for (const auto& [mask, count] : options.mix.layers) {
    const double w = static_cast<double>(count) / total;
    const std::vector<RankExchange> x = detail::ExchangeOf(by_doc, ranks, mask);
    const ExchangeChoice choice =
        ChooseExchange(x, plan.rank_capacity, row_bytes_int, options.comm);
    const bool gather = choice.kind == ExchangeKind::kAllGather;
    p.exchange.push_back(choice.kind);
    if (gather) p.allgather_share += w;
    const double latency = gather || choice.row_exact_rows > 0 ? options.comm.LatencyMs() : 0.0;
    double worst = 0.0, worst_attention = 0.0, worst_rows = 0.0, received = 0.0;
    for (size_t r = 0; r < ranks; ++r) {
      double attention = 0.0;
      int64_t keys = 0;
      for (const Segment& s : plan.ranks[r].segments) {
        attention += MaskedSegmentMs(model, mask, s.q_begin, s.q_end);
        p.rank_pairs[r] += count * mask.Pairs(s.q_begin, s.q_end);
        keys += s.q_end - mask.KeyBegin(s.q_begin);
      }
      const double rows = static_cast<double>(gather ? choice.allgather_rows
                                                     : std::max(x[r].recv_rows, x[r].send_rows));
      const double exchange = rows * row_ms + latency;
      const double copy = static_cast<double>(keys) * gather_row_ms;
      const double t = attention + exchange + copy;
      p.rank_ms[r] += w * t;
      p.rank_exchange_ms[r] += w * exchange;
      p.rank_gather_ms[r] += w * copy;
      worst = std::max(worst, t);
      worst_attention = std::max(worst_attention, attention);
      worst_rows = std::max(worst_rows, rows);
      received +=
          gather ? static_cast<double>(choice.allgather_rows) : static_cast<double>(x[r].recv_rows);
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

// The largest KernelModel::CallMs over a plan's ranks (each rank's segments as one call), with
// add_ms[r] added to rank r when given (one value per rank).
inline double MaxRankCallMs(const ShardPlan& plan, const KernelModel& model,
                            std::span<const double> add_ms = {}) {
  double worst = 0.0;
  std::vector<CallSegment> call;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    call.clear();
    for (const Segment& s : plan.ranks[r].segments) call.push_back({s.q_len(), s.q_end});
    worst = std::max(worst, model.CallMs(call) + (add_ms.empty() ? 0.0 : add_ms[r]));
  }
  return worst;
}

// The price adaptive ranks a plan by (strategies/adaptive.hpp's comment), from the plan's PredictCp
// `p` under the ranking's options: with a packed-call fit in the model its slowest rank's CallMs +
// passes x (that rank's exchange + its key rows' copy, when priced), else p.max_ms.
inline double AdaptivePriceMs(const ShardPlan& plan, const KernelModel& model,
                              const CpPrediction& p) {
  if (!model.has_packed_calls()) return p.max_ms;
  std::vector<double> per_pass = p.rank_exchange_ms;
  for (size_t r = 0; r < per_pass.size(); ++r) {
    per_pass[r] = (per_pass[r] + p.rank_gather_ms[r]) * model.passes();
  }
  return MaxRankCallMs(plan, model, per_pass);
}

inline double AdaptivePriceMs(const ShardPlan& plan, const KernelModel& model,
                              const CpPlanOptions& options) {
  return AdaptivePriceMs(plan, model, PredictCp(plan, model, options));
}

// A lower bound on PredictCp's max_ms under an all-causal mix, fed one rank at a time: a rank
// takes at least its attention (SegmentMs of its causal segments: with the copy of their keys
// when CommModel::gather_gbps prices it) plus, once any rank moves rows, the cheaper of its own
// rows (row-exact) and the all-gather of `rank_capacity` tokens per rank, each with the latency.
// It never decreases as ranks are added, so a caller can stop once it exceeds what it compares
// with. Valid with fewer rows than the plan moves and a capacity below the plan's (both only
// lower it).
class CausalCpLowerBound {
 public:
  CausalCpLowerBound(const KernelModel& model, const CpPlanOptions& options, int64_t ranks,
                     int64_t rank_capacity)
      : model_(&model),
        copy_row_ms_(options.comm.GatherRowMs(model)),
        row_ms_(options.comm.RowMs(model)),
        latency_ms_(options.comm.LatencyMs()),
        gather_ms_(
            ChooseExchangeOf(1, ranks, rank_capacity, options.comm.RowBytes(model), options.comm)
                .allgather_ms) {}

  // What one causal segment (queries [q_end - q_len, q_end), keys [0, q_end)) adds to a rank:
  // its attention and, when priced, the copy of its keys.
  double SegmentMs(int64_t q_len, int64_t q_end) const {
    return model_->SegmentMs(q_len, q_end) + static_cast<double>(q_end) * copy_row_ms_;
  }

  // One more rank: its attention (ms) and rows it receives or sends (any of them, at most its
  // max(sent, received)).
  void AddRank(double attention_ms, int64_t rows) {
    attention_max_ = std::max(attention_max_, attention_ms);
    row_exact_max_ = std::max(row_exact_max_, attention_ms + static_cast<double>(rows) * row_ms_);
    moves_ = moves_ || rows > 0;
  }

  double ms() const {
    return moves_ ? std::min(row_exact_max_ + latency_ms_, attention_max_ + gather_ms_)
                  : attention_max_;
  }

  // Whether the bound exceeds `ms`; the margin covers PredictCp's other order of summation.
  bool Exceeds(double ms) const { return this->ms() > ms * (1.0 + 1e-9); }

 private:
  const KernelModel* model_;
  double copy_row_ms_, row_ms_, latency_ms_, gather_ms_;
  double attention_max_ = 0.0, row_exact_max_ = 0.0;
  bool moves_ = false;
};

// Whether PredictCp(plan, model, options).max_ms is known to exceed `ms`, from a lower bound
// that costs one pass over the segments and stops once it exceeds `ms`; false for a mix with any
// layer that is not causal. Under a causal mask a rank receives, of every document it holds, keys
// [0, its largest end) less its own rows, so the row-exact exchange moves at least that many
// rows, and the all-gather moves a fixed number (CausalCpLowerBound). Planners use it to skip
// pricing a plan that cannot win.
inline bool CausalCpSlowerThan(const ShardPlan& plan, const KernelModel& model,
                               const CpPlanOptions& options, double ms) {
  if (!options.mix.all_causal()) return false;
  size_t docs = 0;
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) docs = std::max(docs, static_cast<size_t>(s.doc_index) + 1);
  }
  std::vector<int64_t> hi(docs, 0), own(docs, 0);
  CausalCpLowerBound bound(model, options, static_cast<int64_t>(plan.ranks.size()),
                           plan.rank_capacity);
  for (const RankShard& r : plan.ranks) {
    double attention = 0.0;
    int64_t received = 0;
    for (const Segment& s : r.segments) {
      attention += bound.SegmentMs(s.q_len(), s.q_end);
      const size_t i = static_cast<size_t>(s.doc_index);
      received -= hi[i] - own[i];
      hi[i] = std::max(hi[i], s.q_end);
      own[i] += s.q_len();
      received += hi[i] - own[i];
    }
    for (const Segment& s : r.segments) {
      hi[static_cast<size_t>(s.doc_index)] = own[static_cast<size_t>(s.doc_index)] = 0;
    }
    bound.AddRank(attention, received);
    if (bound.Exceeds(ms)) return true;
  }
  return false;
}

namespace detail {

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

}  // namespace detail

// Predicted latency (ms) of every rank of a plan under `model`.
inline std::vector<double> PredictRankMs(const ShardPlan& plan, const KernelModel& model) {
  return detail::PredictRankMsOf(plan, model);
}

}  // namespace wlb
