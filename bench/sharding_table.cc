// sharding_table: CP shard strategies compared on packed micro-batches, by CP size and context.
//
//   build/bench/sharding_table --docs ../shared/data/doc_lengths_wlbllm_like.json
//
// For every context window S and CP size C, the document stream (lengths scaled by S / 128K so the
// distribution keeps its shape) is packed by --packer, and every micro-batch is shard-planned
// with per-sequence, per-document, adaptive and hybrid sharding (wlb/shard/shard_plan.hpp). Per
// strategy: the predicted CP imbalance (max / mean rank latency under wlb::KernelModel::Default(),
// mean over micro-batches) and the predicted max-rank latency of one attention layer forward (ms,
// mean over micro-batches). Adaptive's column also says how often it picked per-document.
//
// A second table compares the K/V exchange at S = 128K, C = 2, 4, 8: per-doc, hybrid,
// te-zigzag (Transformer Engine's 2C zig-zag, every document padded to 2C), adaptive and doc-degree
// (per-document CP degree, communication-aware), each predicted with wlb::PredictCp (attention
// + the exchange wlb::ChooseExchange picks, as wlb.torch.cp_attention runs it: max(sent,
// received) K/V rows x 16 KiB / --cp_link_gbps per rank and a collective's latency): slowest rank
// in ms, its attention alone, K/V bytes received over all ranks by that exchange, and what an
// all-gather of every rank's padded buffer moves, per layer, means over micro-batches.
// --balance (issue 57): every registered strategy and a peer's chunk dispatch (chunks of 512,
// 1024, 2048 and 4096 tokens) on a stream of each registered distribution (wlb::kDistributions:
// default, heavy-tail, rare-long, bimodal, pile-like, prolong-like), --docs when given, a
// synthetic one-long-document set and a synthetic set of small micro-batches (8K-32K tokens), at
// S = 128K, C = 2, 4, 8 and 450 / 25 GB/s: slowest rank (attention under --kernel_profile +
// the exchange), against the fastest plan per micro-batch, pair imbalance, tokens and buffer of
// the fullest rank, K/V received (docs/results/cp/balance.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_plan_flags.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/placement.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/wlb.hpp"

// Shared flags (bench_plan_flags.hpp): --docs, --distribution, --seed, --packer (whose
// micro-batches are sharded), --micro_batches, --cp_link_gbps (the exchange table's link),
// --cp_memory_cap_percent (the memory cap every table plans with and the balance table's "x
// capped" scores within).
ABSL_FLAG(int64_t, steps, 50, "steps of input per context window (>= 1)");
ABSL_FLAG(std::string, csv, "",
          "also write S,C,strategy,pair_imbalance_mean,model_imbalance_mean,max_rank_ms_mean");
ABSL_FLAG(bool, exchange_only, false, "print only the exchange table (S = 128K, C = 2, 4, 8)");
ABSL_FLAG(bool, balance, false,
          "print only the balance table: every strategy on every registered distribution's "
          "stream, --docs when given, a synthetic one-long-document set and a synthetic set of "
          "small micro-batches, at S = 128K, C = 2, 4, 8 and links of 450 and 25 GB/s");
ABSL_FLAG(std::string, kernel_profile, "",
          "balance table: score every plan with this kernel profile CSV (forward ms) instead of "
          "wlb::KernelModel::Default(), e.g. docs/results/gpu/h100_kernel_profile_flash.csv");
ABSL_FLAG(std::string, packed_profile, "",
          "balance table: score (and plan) with the packed-call fit of this packed-call profile "
          "(e.g. docs/results/gpu/h100_packed_calls_flash.csv) added to --kernel_profile's model: "
          "a rank's segments as one call, forward + backward, plus its exchange once per pass");
ABSL_FLAG(double, gather_gbps, 0.0,
          "balance table: wlb::CommModel::gather_gbps for planning and scoring (> 0: each rank "
          "also pays the copy of its gathered key rows, cu_seqlens_k.back() rows of K/V read and "
          "written once at this memory bandwidth, GB/s, e.g. 3350, an H100 SXM's HBM3 peak; 0: "
          "not priced)");
ABSL_FLAG(bool, split_what_if, false,
          "balance table: add a what-if row, not a plan wlb makes: adaptive's plan with each "
          "segment cut into the whole-tile pieces the planning model prices fastest (how much of "
          "a gap to the peer's short chunks is the model pricing short query segments below long "
          "ones, and the key rows it would cost); scored, never the best");
ABSL_FLAG(bool, finer_cut_what_if, false,
          "balance table: add a what-if row, not a plan wlb makes: adaptive's plan, or where the "
          "planning model prices it faster, balanced-chunks' deal of a cut twice as fine as its "
          "finest (16 chunks' worth per rank): what adaptive would pick were that one of "
          "balanced-chunks' deals, and the key rows it gathers; scored, never the best");
ABSL_FLAG(std::string, plan_with, "",
          "balance table: plan with another kernel model than the scoring one: 'default' "
          "(wlb::KernelModel::Default()), 'analytic' (wlb::KernelModel::DefaultAnalytic(), the "
          "uncalibrated analytic curve) or a kernel profile CSV");

namespace {

// "12 doc-degree, 3 per-seq-ordered": how many plans recorded each strategy, count(strategy).
template <typename Count>
std::string PickList(const Count& count) {
  std::string picks;
  for (wlb::ShardStrategy p : wlb::ShardStrategy::All()) {
    if (count(p) == 0) continue;
    picks +=
        absl::StrFormat("%s%d %s", picks.empty() ? "" : ", ", count(p), wlb::ShardStrategyName(p));
  }
  return picks;
}

// The columns of the table by S and C, and of the exchange table (registry strategies; the
// headers print their registry names).
constexpr wlb::ShardStrategy kStrategies[] = {
    wlb::ShardStrategy("per-seq"), wlb::ShardStrategy("per-seq-ordered"),
    wlb::ShardStrategy("per-doc"), wlb::ShardStrategy("adaptive"), wlb::ShardStrategy("hybrid")};
constexpr wlb::ShardStrategy kExchangeStrategies[] = {
    wlb::ShardStrategy("per-doc"), wlb::ShardStrategy("hybrid"), wlb::ShardStrategy("te-zigzag"),
    wlb::ShardStrategy("adaptive"), wlb::ShardStrategy("doc-degree")};

// " | per-seq | per-doc ...": header cells of `strategies`.
std::string HeaderCells(std::span<const wlb::ShardStrategy> strategies) {
  std::string cells;
  for (wlb::ShardStrategy s : strategies) cells += " | " + std::string(wlb::ShardStrategyName(s));
  return cells;
}

// "|---|---|...|": the Markdown rule under a header of `columns` columns.
std::string Rule(size_t columns) {
  std::string rule;
  for (size_t i = 0; i < columns; ++i) rule += "|---";
  return rule + "|";
}

// The --packer plan of `steps` steps of `base` at S = `context` (lengths scaled from 128K), with
// the spec's other settings (S_max = S + S/4, 2 default queues unless given).
absl::StatusOr<wlb::PackRun> PackSteps(const wlb::PlanSpec& spec, const wlb::Lengths& base,
                                       int64_t context, int64_t steps, const wlb::CostModel& cost) {
  wlb::PlanSpec at_context = spec;
  at_context.context = context;
  absl::StatusOr<wlb::PlanSettings> settings = at_context.Validate();
  if (!settings.ok()) return settings.status();
  absl::StatusOr<wlb::Input> input = wlb::CutSteps(base, context, settings->config.micro_batches,
                                                   {.max_steps = steps, .scale_from = 131072});
  if (!input.ok()) return input.status();
  absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
      wlb::MakePacker(settings->packer, settings->config, cost, settings->options);
  if (!packer.ok()) return packer.status();
  return wlb::RunPacker(**packer, input->steps);
}

// The exchange table (see the file comment).
absl::Status ExchangeTable(const wlb::bench::BenchPlan& shared, const wlb::Lengths& base,
                           int64_t steps, const wlb::CostModel& cost,
                           const wlb::KernelModel& kernel) {
  const wlb::CpPlanOptions& options = shared.cp;
  const int32_t n = shared.spec.micro_batches;
  absl::StatusOr<wlb::PackRun> run = PackSteps(shared.spec, base, 131072, steps, cost);
  if (!run.ok()) return run.status();
  std::printf(
      "K/V exchange of CP shard plans: %s micro-batches (S = 128K, N = %d) from %s, %lld steps; "
      "link %g GB/s per direction and %g us per collective, 16 KiB K/V per token and layer "
      "(LLaMA-2-7B, bf16). Cells: predicted slowest rank (attention + exchange) ms / its "
      "attention alone ms / K/V received "
      "over all ranks MB (row-exact or all-gather, as wlb::ChooseExchange picks) / all-gather MB, "
      "per layer, means over micro-batches.\n\n",
      shared.spec.packer.c_str(), n, base.name.c_str(), static_cast<long long>(steps),
      options.comm.link_gbps, options.comm.latency_us);
  const auto& strategies = kExchangeStrategies;
  constexpr size_t kCount = std::size(kExchangeStrategies);
  static_assert(kExchangeStrategies[kCount - 1] == wlb::ShardStrategy("doc-degree"),
                "the last column is doc-degree, compared with the others");
  // doc-degree against the columns it is compared with.
  constexpr size_t kVersus[] = {0, 2, 3};
  std::string versus;
  for (size_t k : kVersus) {
    versus += (versus.empty() ? "" : " / ") + std::string(wlb::ShardStrategyName(strategies[k]));
  }
  const std::string_view last = wlb::ShardStrategyName(strategies[kCount - 1]);
  std::printf("| C%s | %s vs %s | %s's own (greedy) plan |\n", HeaderCells(strategies).c_str(),
              std::string(last).c_str(), versus.c_str(), std::string(last).c_str());
  std::printf("%s\n", Rule(1 + kCount + 2).c_str());
  for (int c : {2, 4, 8}) {
    std::string line = absl::StrFormat("| %d", c);
    double max_ms[kCount] = {};
    int64_t greedy = 0, planned = 0;  // doc-degree plans that are its greedy degree plan
    for (size_t k = 0; k < kCount; ++k) {
      double total_ms = 0, attention_ms = 0, received = 0, gathered = 0;
      int64_t count = 0;
      for (const wlb::StepPlan& step : run->steps) {
        for (const wlb::MicroBatch& mb : step.micro_batches) {
          if (mb.documents.empty()) continue;
          absl::StatusOr<wlb::ShardPlan> plan =
              wlb::PlanShards(mb, c, strategies[k], kernel, options);
          if (!plan.ok()) return plan.status();
          const wlb::CpPrediction p = wlb::PredictCp(*plan, kernel, options);
          if (strategies[k] == wlb::ShardStrategy("doc-degree") &&
              plan->strategy == wlb::ShardStrategy("doc-degree")) {
            ++greedy;
          }
          total_ms += p.max_ms;
          attention_ms += p.attention_max_ms;
          received += p.exchanged_bytes;
          gathered += p.allgather_bytes;
          ++count;
        }
      }
      const double m = static_cast<double>(std::max<int64_t>(1, count));
      max_ms[k] = total_ms / m;
      planned = count;
      line += absl::StrFormat(" | %.2f / %.2f ms / %.0f / %.0f MB", total_ms / m, attention_ms / m,
                              received / m / 1e6, gathered / m / 1e6);
    }
    auto faster = [&](size_t k) { return 100.0 * (1.0 - max_ms[kCount - 1] / max_ms[k]); };
    std::printf("%s | %.1f%% / %.1f%% / %.1f%% faster | %lld of %lld |\n", line.c_str(),
                faster(kVersus[0]), faster(kVersus[1]), faster(kVersus[2]),
                static_cast<long long>(greedy), static_cast<long long>(planned));
  }
  return absl::OkStatus();
}

// `count` synthetic micro-batches: each of tokens(rng) tokens, filled with documents of
// length(rng, tokens, k) for its k-th document, the last one cut to fit (the next length is drawn
// after each document, the last one's included).
template <typename Tokens, typename Length>
std::vector<wlb::MicroBatch> SyntheticMicroBatches(int64_t count, uint64_t seed, Tokens tokens,
                                                   Length length) {
  std::mt19937_64 rng(seed);
  std::vector<wlb::MicroBatch> out;
  int64_t id = 0;
  for (int64_t m = 0; m < count; ++m) {
    wlb::MicroBatch mb;
    const int64_t total = tokens(rng);
    int64_t next = length(rng, total, 0);
    for (int64_t k = 1; mb.tokens < total; ++k) {
      const int64_t d = std::min(next, total - mb.tokens);
      mb.documents.push_back(wlb::Document{.id = id++, .length = d});
      mb.tokens += d;
      next = length(rng, total, k);
    }
    out.push_back(std::move(mb));
  }
  return out;
}

// One long document per micro-batch (16K..112K tokens) and short ones (64..2048) filling it to
// exactly 128K: the case where a rank holding the long document's tail cannot also hold many
// short documents without running over the memory cap.
std::vector<wlb::MicroBatch> OneLongDocument(int64_t count, uint64_t seed) {
  return SyntheticMicroBatches(
      count, seed, [](std::mt19937_64&) { return int64_t{131072}; },
      [](std::mt19937_64& rng, int64_t, int64_t k) {
        return k == 0 ? 16384 + static_cast<int64_t>(rng() % 98305)
                      : 64 + static_cast<int64_t>(rng() % 1985);
      });
}

// Small micro-batches: T of 8K..32K tokens, documents of 64..T/2 filling it exactly: where the
// exchange and the kernel's per-segment floor weigh most against attention (a packer's last
// micro-batches, short-context training with CP).
std::vector<wlb::MicroBatch> SmallMicroBatches(int64_t count, uint64_t seed) {
  return SyntheticMicroBatches(
      count, seed, [](std::mt19937_64& rng) { return 8192 + static_cast<int64_t>(rng() % 24577); },
      [](std::mt19937_64& rng, int64_t tokens, int64_t) {
        return 64 + static_cast<int64_t>(rng() % static_cast<uint64_t>(tokens / 2 - 63));
      });
}

// A peer's plan for comparison, not a wlb strategy: MagiAttention's default dispatch as its
// paper and code describe it (read, not copied): the packed micro-batch cut into chunks of
// `chunk` tokens, each weighed by its causal (query, key) pairs, dealt largest first to the rank
// with the least weight among those holding fewer than ceil(chunks / C) chunks (equal tokens per
// rank); a rank's adjacent chunks of one document form one segment.
absl::StatusOr<wlb::ShardPlan> PeerChunkDispatch(const wlb::MicroBatch& mb, int cp_size,
                                                 int64_t chunk) {
  absl::StatusOr<std::vector<int64_t>> checked = wlb::detail::CheckMicroBatch(mb, cp_size);
  if (!checked.ok()) return checked.status();
  const std::vector<int64_t>& starts = *checked;
  const int64_t total = starts.back();
  const int64_t chunks = (total + chunk - 1) / chunk;
  // Pairs of chunk j: every document piece in [j chunk, (j + 1) chunk).
  std::vector<std::pair<int64_t, int64_t>> order;  // (-pairs, chunk)
  for (int64_t j = 0, d = 0; j < chunks; ++j) {
    const int64_t lo = j * chunk;
    int64_t pairs = 0;
    wlb::detail::ForEachPieceOfRun(
        starts, lo, std::min(total, lo + chunk), d,
        [&](int64_t, int64_t qb, int64_t qe) { pairs += wlb::CausalPairs(qb, qe); });
    order.push_back({-pairs, j});
  }
  std::sort(order.begin(), order.end());
  const int64_t limit = (chunks + cp_size - 1) / cp_size;
  std::vector<double> load(static_cast<size_t>(cp_size), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(cp_size), 0);
  std::vector<int> owner(static_cast<size_t>(chunks), 0);
  for (const auto& [neg, j] : order) {
    int best = -1;
    for (int r = 0; r < cp_size; ++r) {
      if (count[r] < limit && (best < 0 || load[r] < load[best])) best = r;
    }
    owner[j] = best;
    load[best] += static_cast<double>(-neg);
    ++count[best];
  }
  std::vector<int64_t> token_owner(static_cast<size_t>(total));
  for (int64_t t = 0; t < total; ++t) token_owner[static_cast<size_t>(t)] = owner[t / chunk];
  return wlb::detail::PlanOfPlacement(mb, starts, cp_size, token_owner);
}

// The --split_what_if row: `plan` with each segment [a, b) cut into pieces ending at b - j tiles
// (pieces of 1, 2, 4, ... 64 tiles, or the rest down to a) chosen by dynamic programming to
// minimize the sum of `model`'s SegmentCallMs plus, when priced, each piece's key copy
// (copy_row_ms per key row, once per pass as adaptive prices it: a piece gathers keys [0, its
// end) of its document). Queries, tokens and the K/V a rank needs are unchanged; its segments
// and gathered key rows are not.
absl::StatusOr<wlb::ShardPlan> SplitWhereCheaper(const wlb::MicroBatch& mb,
                                                 const wlb::ShardPlan& plan,
                                                 const wlb::KernelModel& model,
                                                 double copy_row_ms) {
  absl::StatusOr<std::vector<int64_t>> starts = wlb::detail::CheckMicroBatch(mb, plan.cp_size);
  if (!starts.ok()) return starts.status();
  const int64_t tile = std::max<int64_t>(1, model.tile_q());
  wlb::detail::PlanBuilder b(mb, *starts, plan.cp_size, 0);
  std::vector<int64_t> ends;  // piece ends, ascending, from the segment's start
  std::vector<double> best;   // fastest pieces from ends[i] to the segment's end
  std::vector<size_t> next;   // the end of the first of those pieces
  for (const wlb::RankShard& r : plan.ranks) {
    for (const wlb::Segment& s : r.segments) {
      ends.clear();
      for (int64_t x = s.q_end; x > s.q_begin; x -= tile) ends.push_back(x);
      ends.push_back(s.q_begin);
      std::reverse(ends.begin(), ends.end());
      const size_t n = ends.size();
      best.assign(n, INFINITY);
      next.assign(n, n - 1);
      best[n - 1] = 0.0;
      for (size_t i = n - 1; i-- > 0;) {
        auto consider = [&](size_t j) {
          const double ms = model.SegmentCallMs(ends[j] - ends[i], ends[j]) +
                            copy_row_ms * static_cast<double>(ends[j]) + best[j];
          if (ms < best[i]) {
            best[i] = ms;
            next[i] = j;
          }
        };
        consider(n - 1);
        for (size_t tiles = 1; tiles <= 64; tiles *= 2) {
          if (i + tiles < n - 1) consider(i + tiles);
        }
      }
      for (size_t i = 0; i + 1 < n; i = next[i]) b.Add(r.rank, s.doc_index, ends[i], ends[next[i]]);
    }
  }
  return b.Finish(plan.strategy, plan.requested, plan.cp_size, plan.rank_capacity);
}

// The --finer_cut_what_if row: `adaptive`'s plan, or balanced-chunks' deal of its finer cut
// (kFinerCut: 2 x kChunksPerRank chunks' worth per rank, T / 16C tokens a chunk) where
// `model` prices that deal faster (AdaptivePriceMs, adaptive's ranking): the plan adaptive would
// choose were this cut one of balanced-chunks' deals, under the fine cut's budget (chunks x C at
// most kFineCutMaxChunkRanks: C = 2 and some C = 4 micro-batches of 128K, so adaptive's planning
// at C = 8 would not change). Within the memory cap like every deal; a rank's non-adjacent chunks
// of one document are segments of their own, each gathering keys [0, its end).
absl::StatusOr<wlb::ShardPlan> FinerCutWhereFaster(const wlb::MicroBatch& mb,
                                                   const wlb::ShardPlan& adaptive,
                                                   const wlb::KernelModel& model,
                                                   const wlb::CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = wlb::detail::CheckMicroBatch(mb, adaptive.cp_size);
  if (!starts.ok()) return starts.status();
  const wlb::ShardPlanRequest r{.mb = mb,
                                .starts = *starts,
                                .cp_size = adaptive.cp_size,
                                .requested = adaptive.requested,
                                .model = model,
                                .options = options};
  const size_t chunks = wlb::detail::ChunkCount(r, wlb::detail::kFinerCut);
  if (chunks * static_cast<size_t>(r.cp_size) > wlb::detail::kFineCutMaxChunkRanks) return adaptive;
  absl::StatusOr<wlb::ShardPlan> plan = wlb::detail::BalancedChunksPlan(
      r, wlb::detail::PlaceBalancedChunks(r, wlb::detail::kFinerCut));
  if (!plan.ok()) return plan.status();
  if (wlb::AdaptivePriceMs(*plan, model, options) <
      wlb::AdaptivePriceMs(adaptive, model, options)) {
    return plan;
  }
  return adaptive;
}

// Per strategy over a set of micro-batches (see BalanceTable).
struct BalanceRow {
  double max_ms = 0, received = 0, pair_imbalance = 0;
  double worst_vs_best = 0, worst_vs_wlb = 0, worst_vs_capped = 0, mean_vs_best = 0;
  double worst_pair_imbalance = 0, worst_tokens = 0, worst_buffer = 0;
  double key_rows = 0, worst_key_rows = 0;       // the fullest rank's gathered key rows over T / C
  int64_t picks[wlb::kShardStrategyCount] = {};  // the strategy each plan records
};

// The balance table (--balance): per stream, C and link, every strategy's slowest rank
// (PredictCp: attention under the scoring model + the exchange ChooseExchange picks), against
// the fastest plan any strategy gives that micro-batch and the fastest within the memory cap.
absl::Status BalanceTable(const wlb::bench::BenchPlan& shared, int64_t steps,
                          const wlb::CostModel& cost) {
  wlb::KernelModel score = wlb::KernelModel::Default();
  std::string model_name = "wlb::KernelModel::Default()";
  if (const std::string path = absl::GetFlag(FLAGS_kernel_profile); !path.empty()) {
    absl::StatusOr<wlb::KernelModel> table = wlb::ReadKernelProfileCsv(path);
    if (!table.ok()) return table.status();
    score = *table;
    model_name = path;
  }
  if (const std::string path = absl::GetFlag(FLAGS_packed_profile); !path.empty()) {
    absl::StatusOr<wlb::KernelModel> packed = wlb::WithPackedCallProfile(score, path);
    if (!packed.ok()) return packed.status();
    score = *packed;
    model_name += " with the packed-call fit of " + path;
  }
  const double gather_gbps = absl::GetFlag(FLAGS_gather_gbps);
  if (absl::Status st = wlb::ValidateCommModel({.gather_gbps = gather_gbps}); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("--gather_gbps: %s", st.message()));
  }
  std::string extra_price;  // what the slowest rank adds to attention + exchange
  if (gather_gbps > 0.0) {
    extra_price = absl::StrFormat(
        " + the copy of its gathered key rows, read and written once at %g GB/s "
        "(wlb::CommModel::gather_gbps)",
        gather_gbps);
  }
  if (score.has_packed_calls()) extra_price = absl::StrCat(extra_price, ", once per pass");
  wlb::KernelModel plan_model = score;
  std::string plan_name = "the same model";
  if (const std::string with = absl::GetFlag(FLAGS_plan_with); with == "default") {
    plan_model = wlb::KernelModel::Default();
    plan_name = "wlb::KernelModel::Default()";
  } else if (with == "analytic") {
    plan_model = wlb::KernelModel::DefaultAnalytic();
    plan_name = "wlb::KernelModel::DefaultAnalytic()";
  } else if (!with.empty()) {
    absl::StatusOr<wlb::KernelModel> table = wlb::ReadKernelProfileCsv(with);
    if (!table.ok()) return table.status();
    plan_model = *table;
    plan_name = with;
  }
  std::printf(
      "CP shard strategies at S = 128K, per layer, 16 KiB K/V per token; slowest rank = "
      "wlb::AdaptivePriceMs under %s: %s + the exchange wlb::ChooseExchange picks over the link + "
      "10 us per collective%s; planned with %s. Per micro-batch: a strategy's slowest rank over "
      "the fastest plan of all rows (x best), of the wlb strategies only (x best wlb) and of the "
      "rows within the memory cap of %.2f x T / C (x capped); tokens and buffer (rank_capacity) of "
      "the fullest rank over T / C; key rows: the most key rows a rank gathers for its varlen "
      "call (the sum of its segments' key lengths, cu_seqlens_k's last entry) over T / C. Means "
      "and worst over micro-batches.\n\n",
      model_name.c_str(),
      score.has_packed_calls() ? "each rank's segments as one call, forward + backward"
                               : "attention forward",
      extra_price.c_str(), plan_name.c_str(),
      static_cast<double>(shared.cp.memory_cap_percent) / 100.0);
  std::printf(
      "| stream | C | GB/s | strategy | slowest ms (mean) | x best mean / worst | x best wlb worst "
      "| "
      "x capped worst "
      "| pair imbalance mean / worst | tokens worst | buffer worst | key rows mean / worst "
      "| received MB (mean) | plans |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct Stream {
    std::string name;
    std::vector<wlb::MicroBatch> mbs;
  };
  std::vector<Stream> streams;
  // Every registered distribution (wlb::kDistributions), then --docs when given.
  std::vector<std::pair<std::string, std::string>> sources;
  for (const wlb::NamedDistribution& d : wlb::kDistributions)
    sources.push_back({std::string(d.name), ""});
  if (!shared.input.docs.empty()) sources.push_back({"", shared.input.docs});
  for (const auto& [distribution, docs] : sources) {
    wlb::InputOptions in = shared.input;
    in.docs = docs;
    if (!distribution.empty()) in.distribution = distribution;
    absl::StatusOr<wlb::Lengths> base =
        wlb::LoadLengths(in, (steps + 2) * shared.spec.micro_batches * int64_t{131072});
    if (!base.ok()) return base.status();
    absl::StatusOr<wlb::PackRun> run = PackSteps(shared.spec, *base, 131072, steps, cost);
    if (!run.ok()) return run.status();
    Stream st{.name = base->name};
    for (const wlb::StepPlan& step : run->steps) {
      for (const wlb::MicroBatch& mb : step.micro_batches) {
        if (!mb.documents.empty()) st.mbs.push_back(mb);
      }
    }
    streams.push_back(std::move(st));
  }
  streams.push_back({"one long document + short ones (synthetic)",
                     OneLongDocument(steps * shared.spec.micro_batches, shared.input.seed)});
  streams.push_back({"small micro-batches, 8K-32K tokens (synthetic)",
                     SmallMicroBatches(steps * shared.spec.micro_batches, shared.input.seed)});
  // Rows: the registry's strategies, then the peer's dispatch at each chunk size (a user's
  // choice in MagiAttention; every power of two from 512 to 4096, since 1024 and 4096 each beat
  // every wlb plan where 512 and 2048 did not: docs/results/cp/balance.md).
  const std::vector<int64_t> peer_chunks = {512, 1024, 2048, 4096};
  const size_t strategies = wlb::kShardStrategyCount;
  const size_t count = strategies + peer_chunks.size();  // the rows a best is taken over
  // What-if rows, last: from adaptive's plan of the micro-batch, under the planning model.
  struct WhatIf {
    std::string name;
    std::function<absl::StatusOr<wlb::ShardPlan>(const wlb::MicroBatch&, const wlb::ShardPlan&,
                                                 const wlb::CpPlanOptions&)>
        plan;
  };
  std::vector<WhatIf> what_ifs;
  if (absl::GetFlag(FLAGS_split_what_if)) {
    what_ifs.push_back({"what-if: adaptive, segments split where cheaper",
                        [&](const wlb::MicroBatch& mb, const wlb::ShardPlan& adaptive,
                            const wlb::CpPlanOptions& options) {
                          return SplitWhereCheaper(
                              mb, adaptive, plan_model,
                              options.comm.GatherRowMs(plan_model) * plan_model.passes());
                        }});
  }
  if (absl::GetFlag(FLAGS_finer_cut_what_if)) {
    what_ifs.push_back({"what-if: adaptive, or a finer balanced-chunks cut where faster",
                        [&](const wlb::MicroBatch& mb, const wlb::ShardPlan& adaptive,
                            const wlb::CpPlanOptions& options) {
                          return FinerCutWhereFaster(mb, adaptive, plan_model, options);
                        }});
  }
  const size_t printed = count + what_ifs.size();
  auto row_name = [&](size_t k) {
    if (k >= count) return what_ifs[k - count].name;
    return k < strategies
               ? std::string(wlb::ShardStrategyName(wlb::ShardStrategy::All()[k]))
               : absl::StrFormat("peer: chunk dispatch (%d)", peer_chunks[k - strategies]);
  };
  int64_t peer_fastest = 0, scored = 0;  // micro-batch cells (stream, C, link, micro-batch)
  double adaptive_vs_capped_wlb = 0;     // worst: adaptive over the fastest capped wlb plan
  const size_t adaptive_row = wlb::ShardStrategy("adaptive").row();
  for (const Stream& st : streams) {
    for (int c : {2, 4, 8}) {
      for (double gbps : {450.0, 25.0}) {
        std::fprintf(stderr, "sharding_table --balance: %s, C = %d, %g GB/s\n", st.name.c_str(), c,
                     gbps);
        wlb::CpPlanOptions options = shared.cp;
        options.comm.link_gbps = gbps;
        options.comm.gather_gbps = gather_gbps;
        std::vector<BalanceRow> rows(printed);
        std::vector<double> ms(printed);
        std::vector<char> capped(printed);
        wlb::ShardPlan adaptive_plan;  // what the what-if rows start from
        for (const wlb::MicroBatch& mb : st.mbs) {
          const double mean_tokens = static_cast<double>(mb.tokens) / c;
          const int64_t cap = wlb::CpRankTokenCap(mb.tokens, c, options.memory_cap_percent);
          for (size_t k = 0; k < printed; ++k) {
            absl::StatusOr<wlb::ShardPlan> plan =
                k < strategies
                    ? wlb::PlanShards(mb, c, wlb::ShardStrategy::All()[k], plan_model, options)
                : k < count
                    ? PeerChunkDispatch(mb, c, peer_chunks[k - strategies])
                    : what_ifs[k - count].plan(mb, adaptive_plan, options);
            if (!plan.ok()) return plan.status();
            if (!what_ifs.empty() && k == adaptive_row) adaptive_plan = *plan;
            const wlb::CpPrediction p = wlb::PredictCp(*plan, score, options);
            const wlb::CpBalance b = wlb::MeasureCpBalance(*plan, score);
            int64_t most = 0;
            for (const wlb::RankShard& r : plan->ranks) most = std::max(most, r.tokens);
            BalanceRow& row = rows[k];
            ms[k] = wlb::AdaptivePriceMs(*plan, score, p);
            if (k < strategies) ++row.picks[plan->strategy.row()];
            capped[k] = plan->rank_capacity <= cap;
            row.max_ms += ms[k];
            row.received += p.exchanged_bytes;
            row.pair_imbalance += b.pair_imbalance;
            row.worst_pair_imbalance = std::max(row.worst_pair_imbalance, b.pair_imbalance);
            row.worst_tokens = std::max(row.worst_tokens, static_cast<double>(most) / mean_tokens);
            row.worst_buffer =
                std::max(row.worst_buffer, static_cast<double>(plan->rank_capacity) / mean_tokens);
            int64_t keys = 0;
            for (const wlb::RankShard& r : plan->ranks) {
              keys = std::max<int64_t>(keys, r.cu_seqlens_k.back());
            }
            row.key_rows += static_cast<double>(keys) / mean_tokens;
            row.worst_key_rows =
                std::max(row.worst_key_rows, static_cast<double>(keys) / mean_tokens);
          }
          double best = INFINITY, best_wlb = INFINITY, best_capped = INFINITY,
                 best_capped_wlb = INFINITY;
          for (size_t k = 0; k < count; ++k) {
            best = std::min(best, ms[k]);
            if (k < strategies) best_wlb = std::min(best_wlb, ms[k]);
            if (capped[k]) best_capped = std::min(best_capped, ms[k]);
            if (k < strategies && capped[k]) best_capped_wlb = std::min(best_capped_wlb, ms[k]);
          }
          peer_fastest += best < best_wlb;
          adaptive_vs_capped_wlb =
              std::max(adaptive_vs_capped_wlb, ms[adaptive_row] / best_capped_wlb);
          ++scored;
          for (size_t k = 0; k < printed; ++k) {
            rows[k].mean_vs_best += ms[k] / best;
            rows[k].worst_vs_best = std::max(rows[k].worst_vs_best, ms[k] / best);
            rows[k].worst_vs_wlb = std::max(rows[k].worst_vs_wlb, ms[k] / best_wlb);
            rows[k].worst_vs_capped = std::max(rows[k].worst_vs_capped, ms[k] / best_capped);
          }
        }
        const double n = static_cast<double>(std::max<size_t>(1, st.mbs.size()));
        for (size_t k = 0; k < printed; ++k) {
          const BalanceRow& row = rows[k];
          // What the plans recorded (a peer's rows record nothing).
          const std::string picks =
              PickList([&](wlb::ShardStrategy p) { return row.picks[p.row()]; });
          std::printf(
              "| %s | %d | %g | %s | %.3f | %.4f / %.4f | %.4f | %.4f | %.3f / %.3f | %.4f | %.4f "
              "| %.2f / %.2f | %.0f | %s |\n",
              st.name.c_str(), c, gbps, row_name(k).c_str(), row.max_ms / n, row.mean_vs_best / n,
              row.worst_vs_best, row.worst_vs_wlb, row.worst_vs_capped, row.pair_imbalance / n,
              row.worst_pair_imbalance, row.worst_tokens, row.worst_buffer, row.key_rows / n,
              row.worst_key_rows, row.received / n / 1e6, picks.c_str());
        }
      }
    }
  }
  std::printf("\nA peer's plan is faster than every wlb plan on %lld of %lld micro-batch cells.\n",
              static_cast<long long>(peer_fastest), static_cast<long long>(scored));
  std::printf(
      "adaptive's slowest rank over the fastest wlb plan within the memory cap, worst micro-batch "
      "cell: %.4f\n",
      adaptive_vs_capped_wlb);
  return absl::OkStatus();
}

absl::Status Run() {
  absl::StatusOr<wlb::bench::BenchPlan> shared = wlb::bench::PlanFromFlags();
  if (!shared.ok()) return shared.status();
  if (absl::StatusOr<wlb::PlanSettings> s = shared->spec.Validate(); !s.ok()) return s.status();
  const int32_t n = shared->spec.micro_batches;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--steps must be >= 1, got %d", steps));
  }
  // Enough for the smallest scale (S = 32K keeps a quarter of the tokens).
  absl::StatusOr<wlb::Lengths> base =
      wlb::LoadLengths(shared->input, (steps + 2) * n * int64_t{131072});
  if (!base.ok()) return base.status();
  const std::string source = base->name;
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  const wlb::KernelModel kernel = wlb::KernelModel::Default();

  if (absl::GetFlag(FLAGS_balance)) return BalanceTable(*shared, steps, cost);
  if (absl::GetFlag(FLAGS_exchange_only)) return ExchangeTable(*shared, *base, steps, cost, kernel);
  std::printf(
      "CP sharding of %s micro-batches (N = %d, S_max = 1.25 S) from %s, %lld steps per "
      "context; predicted with wlb::KernelModel::Default() (one LLaMA-2-7B attention "
      "layer forward, 32 heads x 128). Cells: CP imbalance (max / mean rank latency) and "
      "max-rank latency in ms, means over micro-batches.\n\n",
      shared->spec.packer.c_str(), n, source.c_str(), static_cast<long long>(steps));
  std::printf(
      "| S | C%s | ordering closes of the per-seq -> per-doc imbalance gap | adaptive's plans "
      "|\n%s\n",
      HeaderCells(kStrategies).c_str(), Rule(2 + std::size(kStrategies) + 2).c_str());
  std::vector<std::string> csv;
  for (int64_t k : {32, 64, 128, 160}) {
    const int64_t context = k * 1024;
    absl::StatusOr<wlb::PackRun> run = PackSteps(shared->spec, *base, context, steps, cost);
    if (!run.ok()) return run.status();
    for (int c : {2, 4, 8, 16}) {
      std::fprintf(stderr, "sharding_table: S = %lldK, C = %d\n", static_cast<long long>(k), c);
      std::string line = absl::StrFormat("| %dK | %d", k, c);
      wlb::CpSummary adaptive;
      double imbalance[3] = {0, 0, 0};  // per-seq, per-seq-ordered, per-doc
      for (wlb::ShardStrategy strategy : kStrategies) {
        wlb::CpSummary summary;
        for (const wlb::StepPlan& step : run->steps) {
          for (const wlb::MicroBatch& mb : step.micro_batches) {
            if (mb.documents.empty()) continue;
            absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, c, strategy, kernel);
            if (!plan.ok()) return plan.status();
            summary.Add(*plan, wlb::MeasureCpBalance(*plan, kernel));
          }
        }
        const double max_ms =
            summary.micro_batches > 0 ? summary.max_rank_ms_total / summary.micro_batches : 0.0;
        line += absl::StrFormat(" | %.3f / %.2f ms", summary.model_imbalance_mean, max_ms);
        if (strategy == wlb::ShardStrategy("adaptive")) adaptive = summary;
        if (strategy == wlb::ShardStrategy("per-seq")) imbalance[0] = summary.model_imbalance_mean;
        if (strategy == wlb::ShardStrategy("per-seq-ordered")) {
          imbalance[1] = summary.model_imbalance_mean;
        }
        if (strategy == wlb::ShardStrategy("per-doc")) imbalance[2] = summary.model_imbalance_mean;
        csv.push_back(absl::StrFormat("%d,%d,%s,%.6f,%.6f,%.6g", context, c,
                                      wlb::ShardStrategyName(strategy), summary.pair_imbalance_mean,
                                      summary.model_imbalance_mean, max_ms));
      }
      // Share of per-seq's excess imbalance over per-doc that ordering removes.
      const double gap = imbalance[0] - imbalance[2];
      const std::string closed =
          gap > 0 ? absl::StrFormat("%.0f%%", 100.0 * (imbalance[0] - imbalance[1]) / gap) : "-";
      const std::string picks = PickList([&](wlb::ShardStrategy p) { return adaptive.count(p); });
      std::printf("%s | %s | %s of %d |\n", line.c_str(), closed.c_str(), picks.c_str(),
                  adaptive.micro_batches);
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --csv '%s'", path));
    out << "S,C,strategy,pair_imbalance_mean,model_imbalance_mean,max_rank_ms_mean\n";
    for (const std::string& line : csv) out << line << "\n";
    if (!out) return absl::DataLossError(absl::StrFormat("error writing --csv '%s'", path));
  }
  std::printf("\n");
  return ExchangeTable(*shared, *base, steps, cost, kernel);
}

}  // namespace

int main(int argc, char** argv) {
  wlb::bench::ParseFlags(argc, argv, "Compares CP shard strategies by CP size and context window.",
                         {"packer", "micro_batches", "cp_link_gbps", "cp_memory_cap_percent"});
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "sharding_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
