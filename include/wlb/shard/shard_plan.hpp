// Context-parallel (CP) shard plans: which queries of a micro-batch each of C ranks computes.
//
//   wlb::MicroBatch mb = ...;                               // documents 5, 19, 8 (32 tokens)
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, /*cp_size=*/2,
//                                                         wlb::ShardStrategy("adaptive"),
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
//  - per-seq: the packed micro-batch, padded at its end to a multiple of 2C tokens, is cut
//    into 2C equal chunks; each chunk is intersected with the documents. Padding tokens belong to
//    no document and appear in no segment; they only enlarge rank_capacity.
//  - per-doc (padding-free): every document is cut into 2C shards whose sizes differ by at
//    most one token; the d mod 2C remainder tokens go one each to shards p, p+1, ... (mod 2C),
//    where the pointer p carries over from document to document. Chunk j = shard j of every
//    document, so chunk sizes differ by at most one and no padding is needed beyond that. A
//    document shorter than 2C tokens leaves some shards empty (no segment).
//  - per-seq-ordered: per-sequence chunking of the documents laid out in another order.
//    Document order inside a micro-batch is free (causal masks are per document), and packers
//    emit longest first, the worst order for head-tail chunks: rank 0 gets the cheap head of the
//    long document, rank C-1 its expensive middle. PerSequenceOrder() picks the order (see
//    there); segments keep their positions in the micro-batch as given (q_pos, k_pos), so the
//    data loader lays tokens out as before and only the chunk boundaries move. Never predicted
//    worse than per-seq: the micro-batch order is one of the candidates.
//  - adaptive (the default): plans per-seq-ordered, per-doc, hybrid, doc-degree's greedy plan,
//    per-seq, balanced-chunks and contiguous and uses the one predicted fastest with its K/V
//    exchange among those within the memory cap (CpRankTokenCap: by default no rank above
//    1.01 x T / C tokens, CpPlanOptions::memory_cap_percent; hybrid, whose whole documents follow
//    cost, is often over the default): PredictCp under CpPlanOptions
//    (each layer kind's slowest rank of attention + the exchange the CP executors run,
//    ChooseExchange: row-exact or the all-gather fallback, bytes over the link plus a latency per
//    collective); with a packed-call fit in the KernelModel, the slowest rank of its CallMs + its
//    exchange once per pass (forward, and backward's dK/dV when the fit has backward). Ties keep
//    the earlier candidate in that order. The plan records the strategy used. The default link (450
//    GB/s, 10 us) steers long micro-batches towards plans that keep documents whole, and on tiny
//    micro-batches the exchange is of the order of attention or above and decides the pick (see
//    strategies/adaptive.hpp). The paper's adaptive (per-sequence in the given order against
//    per-document) is ChooseAdaptive's per_seq_max_ms / per_doc_max_ms.
//  - hybrid: documents of at least 2C * tile_q tokens (every shard at least one query tile) are
//    sharded per document as above, with the round-robin pointer running over them only;
//    shorter documents stay whole and are dealt, most expensive first, to the rank with the
//    least predicted latency so far (ties: fewer tokens, then lower rank). They follow the
//    sharded part in the rank's segment list, in micro-batch order.
//  - te-zigzag (Transformer Engine's THD context parallelism): every
//    document is padded to a multiple of 2C and cut into 2C equal chunks of ceil(d / 2C) tokens
//    (the padding sits at the document's end, so the last shards are shorter or empty); rank r
//    holds shards r and 2C-1-r of every document, document by document. Padding tokens appear in
//    no segment, but every rank's buffer holds them: rank_capacity = sum of 2 * ceil(d / 2C).
//  - doc-degree (per-document CP degree, communication-aware): every document
//    is either kept whole on one rank (it exchanges no K/V) or sharded zig-zag over an aligned
//    group of g ranks, g a power of two below C or C itself, ranks [k*g, (k+1)*g): per-document
//    sharding with 2g shards (all non-empty: needs d >= 2g) and a round-robin remainder pointer
//    per g, in whole query tiles when the document has at least 2g (WholeTileCut: the
//    d mod tile rest leads shard 0, so no other shard pays a partial tile). Documents are placed
//    most expensive first, each with the (g, group) that keeps every member within the memory cap
//    (CpRankTokenCap) and gives the lowest predicted slowest rank of the plan built so far as the
//    executors would run it: a rank's time is attention (KernelModel under CpPlanOptions::mix, see
//    MaskedSegmentMs) plus, per layer kind, the exchange ChooseExchange picks for that plan:
//    row-exact, the K/V rows the rank exchanges (max of sent and received, see ExchangedKvRows)
//    times CommModel bytes per row over the link, plus CommModel::latency_us on every rank once any
//    rank moves rows; or the all-gather fallback, (C - 1) x rank_capacity rows plus the latency on
//    every rank (exact for one mask; with several, see strategies/doc_degree.hpp) (ties: the lower
//    slowest member, then less added time, smaller g, lower group); a document no placement fits is
//    cut into contiguous pieces over the ranks with the most room (SpillShards). The greedy plan is
//    then compared with per-doc's, hybrid's (when within the cap), per-seq-ordered's and (for a mix
//    with non-causal masks) the greedy plan made for all-causal layers, under PredictCp, which
//    prices every plan with the exchange the executor runs (ChooseExchange: row-exact, or the
//    all-gather when it moves no more rows, plus CommModel::latency_us); the fastest is kept (ties
//    keep the greedy plan), recording the strategy used (doc-degree for a greedy plan) as adaptive
//    does. So it is never predicted slower than
//    any of them, and mask-aware planning never loses to its mask-blind self. Greedy plans'
//    segments: early shards, late shards, then whole documents, each in micro-batch order;
//    rank_capacity is the largest rank's tokens.
//  - balanced-chunks: documents of at most ceil(T / 8C) tokens (rounded up to the query tile)
//    whole, longer ones in contiguous chunks of that many tokens counted from the document's end
//    (the first chunk holds the rest, so only it pays a partial tile); each rank priced as
//    attention + max(K/V rows sent, received) x CommModel::RowMs (causal row-exact); costliest
//    first, each to the rank among those with room under the memory cap that leaves the slowest
//    rank fastest (spilled over the roomiest ranks when none has room); the same for coarse cuts
//    of 2 and 4 times the unit where they differ, and for a fine cut (longer documents in about 4
//    chunks) where it differs and is small enough, each deal then up to two rounds of the best
//    move or swap between the slowest and fastest rank; the deal priced fastest is the plan; a
//    rank's adjacent chunks of one document are one segment (see strategies/balanced_chunks.hpp).
//  - contiguous (ring-flash-attention's llama3 split): rank q holds the micro-batch's tokens
//    [bound[q], bound[q + 1]) in document order, each boundary at q x T / C moved to the nearest
//    document start that keeps every run within the memory cap, where there is one: at most C - 1
//    documents cut, so few K/V rows move (see strategies/contiguous.hpp).
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
//
// The planning API is split by concept; this header includes all of it:
//  - strategy_table.hpp: kShardStrategyTable, the registry (one row per strategy), and
//    ShardStrategy, the key that names a row.
//  - shard_types.hpp: Segment, RankShard, ShardPlan, CommModel, CpPlanOptions and their
//    validation.
//  - shard_strategies.hpp: reading the registry (ShardStrategies(), ShardStrategyRow,
//    ShardStrategyName, ParseShardStrategy) and PlanShards.
//  - strategies/*.hpp: one planning file per strategy; plan_builder.hpp: what they share
//    (micro-batch checks, per-sequence and per-document cuts, PlanBuilder).
//  - per_seq_order.hpp: per-seq-ordered's order search (PerSequenceOrder).
//  - cp_prediction.hpp: PredictRankMs, MaskedSegmentMs, ExchangedKvRows, ChooseExchange,
//    PredictCp.
//  - validate_plan.hpp: ValidateShardPlan.
#pragma once

#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/per_seq_order.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_strategies.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/adaptive.hpp"
#include "wlb/shard/strategies/doc_degree.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"
#include "wlb/shard/strategies/te_zigzag.hpp"
#include "wlb/shard/strategy_table.hpp"
#include "wlb/shard/validate_plan.hpp"
