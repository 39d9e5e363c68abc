// adaptive (the default): per micro-batch the fastest predicted plan within the memory cap
// (CpRankTokenCap: by default no rank holds more than 1.01 x T / C tokens; a larger
// CpPlanOptions::memory_cap_percent lets it trade memory for time) of per-seq-ordered, per-doc,
// hybrid, doc-degree's greedy plan, per-seq, balanced-chunks and contiguous (see
// shard_plan.hpp), K/V exchange included.
//
//   absl::StatusOr<AdaptiveChoice> c = ChooseAdaptive(mb, /*cp_size=*/4, KernelModel::Default(),
//                                                     CpPlanOptions{.comm = {.link_gbps = 25}});
//   // c->chosen; c->per_doc_max_ms, ...: each candidate's predicted slowest rank
//
// Ranking. Every candidate's plan is built (the candidates plan with SegmentMs as always) and
// priced with the exchange the CP executors run for it (ChooseExchange: row-exact or the
// all-gather fallback, bytes over CpPlanOptions::comm's link plus its per-collective latency):
//  - a model without a packed-call fit: PredictCp(plan, model, options).max_ms, the mix mean of
//    each layer kind's slowest rank of attention (MaskedSegmentMs under CpPlanOptions::mix) +
//    that exchange (+ the copy of its gathered key rows when CommModel::gather_gbps > 0), one
//    forward pass;
//  - a model with one (KernelModel::WithPackedCalls): the slowest rank of CallMs (its segments as
//    one packed call, forward + backward when the fit has backward) + P x that rank's exchange
//    (PredictCp's rank_exchange_ms, mix mean; + its key rows' copy, rank_gather_ms, when
//    CommModel::gather_gbps prices it), P = 2 when the fit has backward, else 1. The
//    exchange is counted once per pass because each pass moves the same rows: forward receives
//    the K/V rows, backward sends their dK/dV back to the owners (the all-gather's reduce-scatter
//    moves as much as its gather), each one collective with its latency. The fit itself prices
//    causal attention; the mix enters through the exchange only.
// A candidate over the memory cap (hybrid, whose whole documents follow cost, not tokens) is
// priced and reported but not chosen. Ties keep the earlier candidate in the order above.
// Planning neither prices nor, where a lower bound tells without the plan, builds a candidate
// that cannot beat the best so far (ChooseAdaptiveChecked); the pick is the same.
//
// Why doc-degree's greedy plan is a candidate (issue 57): keeping documents whole or zig-zagged
// over small groups saves most of the K/V exchange, and under the cap its plans are memory
// balanced; without it adaptive traded balance for traffic and trailed the best peer's plans
// by 5-10% at C = 4-8. Why per-seq: it is cheap to build and sometimes moves fewer rows than the
// ordered or padding-free cuts, so the default is never slower than a memory-balanced strategy.
// Why contiguous: where the exchange outweighs attention (a slow link, small micro-batches) it
// cuts at most C - 1 documents, so few rows move (strategies/contiguous.hpp).
//
// What the default CommModel (450 GB/s per direction, 10 us per collective) does: on long
// micro-batches (128K at C = 2..8, a 16 KiB K/V row) the exchange adds a few ms per layer to
// plans that cut documents and adaptive moves towards plans that keep them whole; on tiny
// micro-batches (a few thousand tokens) the 10 us latency and the exchange are of the order of
// attention itself or larger, so there the exchange decides the pick (a plan moving no rows
// pays no latency). A slow link (--cp-link-gbps 25) makes the exchange dominate at every size;
// a very fast one (1e6 GB/s, latency 0) gives back the kernel-time-only ranking but for near
// ties. Measured: docs/results/cp/balance.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/per_seq_order.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/balanced_chunks.hpp"
#include "wlb/shard/strategies/contiguous.hpp"
#include "wlb/shard/strategies/doc_degree.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"

namespace wlb {

// The candidates adaptive weighs, in its tie order (doc-degree: its greedy plan,
// GreedyDocumentDegree).
inline constexpr ShardStrategy kAdaptiveCandidates[] = {
    ShardStrategy("per-seq-ordered"), ShardStrategy("per-doc"), ShardStrategy("hybrid"),
    ShardStrategy("doc-degree"),      ShardStrategy("per-seq"), ShardStrategy("balanced-chunks"),
    ShardStrategy("contiguous")};

// Predicted slowest rank (ms) of the fixed strategies' plans and adaptive's pick, K/V exchange
// included (see the file comment): PredictCp's max_ms, or with a packed-call fit in the model the
// slowest rank's CallMs + its exchange per pass (packed_calls says which).
struct AdaptiveChoice {
  ShardStrategy chosen = ShardStrategy("per-seq-ordered");
  double per_seq_max_ms = 0.0;  // micro-batch order (the paper's per-sequence sharding)
  double per_seq_ordered_max_ms = 0.0;
  double per_doc_max_ms = 0.0;
  double hybrid_max_ms = 0.0;
  double doc_degree_max_ms = 0.0;  // doc-degree's greedy plan (GreedyDocumentDegree)
  double balanced_chunks_max_ms = 0.0;
  double contiguous_max_ms = 0.0;
  bool packed_calls = false;  // the maxima are the packed-call fit's CallMs + exchange per pass
};

namespace detail {

// Whether a plan that cuts the documents with sharded(i) into ForEachPerDocumentSegment's shards
// (per-doc: all of them; hybrid: the long ones) and places the others whole, anywhere, is known
// to be slower than `ms` under an all-causal mix, without building it: CausalCpLowerBound rank by
// rank from the cut documents alone (whole documents add attention, never rows), with the plan's
// capacity taken as T / C (its largest rank holds at least that). False for any other mix.
template <typename Pred>
bool PerDocumentCutsSlowerThan(const MicroBatch& mb, int cp_size, Pred&& sharded,
                               const KernelModel& model, const CpPlanOptions& options, double ms) {
  if (!options.mix.all_causal() || ms == INFINITY) return false;
  const int64_t n = 2 * static_cast<int64_t>(cp_size);
  CausalCpLowerBound bound(model, options, cp_size, (mb.tokens + cp_size - 1) / cp_size);
  for (int64_t r = 0; r < cp_size; ++r) {
    double attention = 0.0;
    int64_t received = 0;
    int64_t pointer = 0;  // as ForEachPerDocumentSegment's
    for (size_t i = 0; i < mb.documents.size(); ++i) {
      if (!sharded(i)) continue;
      const int64_t length = mb.documents[i].length;
      int64_t hi = 0, own = 0;  // the rank needs keys [0, hi) and holds `own` of them
      for (const int64_t j : {r, n - 1 - r}) {
        const auto [b, e] = PerDocumentShard(length, n, pointer, j);
        if (b == e) continue;
        attention += bound.SegmentMs(e - b, e);
        hi = std::max(hi, e);
        own += e - b;
      }
      received += hi - own;
      pointer = (pointer + length % n) % n;
    }
    bound.AddRank(attention, received);
    if (bound.Exceeds(ms)) return true;
  }
  return false;
}

// Whether the per-sequence plan of documents laid out from `starts` (ForEachPerSequenceSegment's
// cuts; per-seq and per-seq-ordered) is known to be slower than `ms` under an all-causal mix,
// without building it: CausalCpLowerBound of its ranks. False for any other mix.
inline bool PerSequenceCutsSlowerThan(const std::vector<int64_t>& starts, int cp_size,
                                      const KernelModel& model, const CpPlanOptions& options,
                                      double ms) {
  if (!options.mix.all_causal() || ms == INFINITY) return false;
  struct RankSoFar {
    double attention = 0.0;
    int64_t received = 0;
    int64_t doc = -1, end = 0;  // its last segment's document and end
  };
  std::vector<RankSoFar> ranks(static_cast<size_t>(cp_size));
  CausalCpLowerBound bound(model, options, cp_size, 2 * PerSequenceChunk(starts.back(), cp_size));
  // A rank holds at most two segments of a document, one per chunk, in this call order, so it
  // needs keys [0, the later one's end) and receives the gaps below its segments.
  ForEachPerSequenceSegment(starts, cp_size, [&](int rank, int64_t i, int64_t qb, int64_t qe) {
    RankSoFar& s = ranks[static_cast<size_t>(rank)];
    s.attention += bound.SegmentMs(qe - qb, qe);
    s.received += qb - (s.doc == i ? s.end : 0);
    s.doc = i;
    s.end = qe;
  });
  for (const RankSoFar& s : ranks) {
    bound.AddRank(s.attention, s.received);
    if (bound.Exceeds(ms)) return true;
  }
  return false;
}

// ChooseAdaptive on a checked request (r.requested is what the plans record). With
// `chosen_plan` (planning) it gets the chosen candidate's plan, and candidates over the memory
// cap are not priced (their *_max_ms stay 0).
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptiveChecked(const ShardPlanRequest& r,
                                                            ShardPlan* chosen_plan) {
  AdaptiveChoice c;
  c.packed_calls = r.model.has_packed_calls();
  double* out[] = {&c.per_seq_ordered_max_ms, &c.per_doc_max_ms, &c.hybrid_max_ms,
                   &c.doc_degree_max_ms,      &c.per_seq_max_ms, &c.balanced_chunks_max_ms,
                   &c.contiguous_max_ms};
  const int64_t cap = RankTokenCap(r);
  auto price = [&](const ShardPlan& plan) { return AdaptivePriceMs(plan, r.model, r.options); };
  // Planning prices the usual winners first (balanced-chunks, doc-degree) and skips a candidate
  // known to be slower than the best so far (CausalCpSlowerThan); the pick is the same.
  // contiguous goes last: it seldom wins where the exchange is cheap, and there its bound rules
  // it out before pricing (measured: 3-4 µs of adaptive at C = 8 against pricing it third).
  constexpr size_t kPlanningOrder[] = {5, 3, 0, 4, 1, 2, 6};
  constexpr size_t kReportOrder[] = {0, 1, 2, 3, 4, 5, 6};
  static_assert(std::size(kPlanningOrder) == std::size(kAdaptiveCandidates) &&
                std::size(kReportOrder) == std::size(kAdaptiveCandidates));
  const bool planning = chosen_plan != nullptr;
  const bool bounded = planning && !c.packed_calls;
  // Under an all-causal mix planning knows that of per-doc and hybrid from their cuts alone and
  // of doc-degree part way through its placement, so it does not build those plans. An unbuilt
  // plan cannot report PlanBuilder's error (over 2^31 keys on a rank), which no such plan of at
  // most 2^30 tokens has: a rank holds at most two pieces of each document.
  const bool skip_unbuilt = bounded && r.options.mix.all_causal() &&
                            2 * r.mb.tokens <= std::numeric_limits<int32_t>::max();
  size_t best = std::size(kAdaptiveCandidates);
  double best_ms = 0.0;
  auto beats = [&](double ms, size_t k) {
    return best == std::size(kAdaptiveCandidates) || ms < best_ms || (ms == best_ms && k < best);
  };
  // Candidate k's plan, or nullopt when it is known to be slower than `slower_than` ms;
  // *priced_ms >= 0 when planning it already priced it (balanced-chunks picks its deal by price).
  auto candidate_plan = [&](size_t k, double slower_than,
                            double* priced_ms) -> std::optional<absl::StatusOr<ShardPlan>> {
    switch (k) {
      case 0: {
        std::vector<int64_t> order = SearchPerSequenceOrder(r.mb, r.cp_size, r.model).order;
        if (PerSequenceCutsSlowerThan(OrderedStarts(r.mb, order), r.cp_size, r.model, r.options,
                                      slower_than)) {
          return std::nullopt;
        }
        return PlanPerSequenceOrdered(r, std::move(order));
      }
      case 1:
        if (PerDocumentCutsSlowerThan(
                r.mb, r.cp_size, [](size_t) { return true; }, r.model, r.options, slower_than)) {
          return std::nullopt;
        }
        return PlanPerDocument(r);
      case 2: {
        const int64_t min_length = HybridMinLength(r.cp_size, r.model);
        auto is_long = [&](size_t i) { return r.mb.documents[i].length >= min_length; };
        if (PerDocumentCutsSlowerThan(r.mb, r.cp_size, is_long, r.model, r.options, slower_than)) {
          return std::nullopt;
        }
        return PlanHybrid(r);
      }
      case 3: {
        DocumentDegreePlacement placement;
        if (!PlaceDocumentDegrees(r.mb, r.cp_size, r.model, r.options, slower_than, placement)) {
          return std::nullopt;
        }
        return DocumentDegreePlan(r.mb, r.starts, r.cp_size, r.requested, placement);
      }
      case 4:
        if (PerSequenceCutsSlowerThan(r.starts, r.cp_size, r.model, r.options, slower_than)) {
          return std::nullopt;
        }
        return PlanPerSequence(r);
      case 5:
        return PlanBalancedChunksPriced(r, priced_ms);
      default:
        return PlanContiguous(r);
    }
  };
  ShardPlan best_plan;
  for (const size_t k : planning ? kPlanningOrder : kReportOrder) {
    const bool known = skip_unbuilt && best < std::size(kAdaptiveCandidates);
    double priced_ms = -1.0;
    std::optional<absl::StatusOr<ShardPlan>> plan =
        candidate_plan(k, known ? best_ms : INFINITY, &priced_ms);
    if (!plan.has_value()) continue;  // slower than the best so far
    if (!plan->ok()) return plan->status();
    // per-seq-ordered (k = 0) is always within the cap; a plan over it is never chosen, so it is
    // priced only to be reported.
    const bool within = (*plan)->rank_capacity <= cap;
    if (!within && planning) continue;
    if (bounded && within && best < std::size(kAdaptiveCandidates) &&
        CausalCpSlowerThan(**plan, r.model, r.options, best_ms)) {
      continue;
    }
    *out[k] = priced_ms >= 0.0 ? priced_ms : price(**plan);
    if (within && beats(*out[k], k)) {
      best = k;
      best_ms = *out[k];
      if (planning) best_plan = **std::move(plan);
    }
  }
  c.chosen = kAdaptiveCandidates[best];
  if (chosen_plan != nullptr) *chosen_plan = std::move(best_plan);
  return c;
}

}  // namespace detail

// What adaptive would choose for this micro-batch under `options` (link and layer mix); errors
// as PlanShards.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptive(const MicroBatch& mb, int cp_size,
                                                     const KernelModel& model,
                                                     const CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  if (absl::Status s = ValidateCpPlanOptions(options); !s.ok()) return s;
  return detail::ChooseAdaptiveChecked(ShardPlanRequest{.mb = mb,
                                                        .starts = *starts,
                                                        .cp_size = cp_size,
                                                        .requested = ShardStrategy("adaptive"),
                                                        .model = model,
                                                        .options = options},
                                       nullptr);
}

// ChooseAdaptive with the default options (a 450 GB/s link, 10 us per collective, one causal
// layer), as PlanShards without options.
inline absl::StatusOr<AdaptiveChoice> ChooseAdaptive(const MicroBatch& mb, int cp_size,
                                                     const KernelModel& model) {
  return ChooseAdaptive(mb, cp_size, model, CpPlanOptions{});
}

namespace detail {

// Plans what ChooseAdaptive picks (the plan records it; requested stays adaptive).
inline absl::StatusOr<ShardPlan> PlanAdaptive(const ShardPlanRequest& r) {
  ShardPlan plan;
  absl::StatusOr<AdaptiveChoice> c = ChooseAdaptiveChecked(r, &plan);
  if (!c.ok()) return c.status();
  return plan;
}

}  // namespace detail
}  // namespace wlb
