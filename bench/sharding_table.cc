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
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench_plan_flags.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/wlb.hpp"

// Shared flags (bench_plan_flags.hpp): --docs, --distribution, --seed, --packer (whose
// micro-batches are sharded), --micro_batches, --cp_link_gbps (the exchange table's link).
ABSL_FLAG(int64_t, steps, 50, "steps of input per context window (>= 1)");
ABSL_FLAG(std::string, csv, "",
          "also write S,C,strategy,pair_imbalance_mean,model_imbalance_mean,max_rank_ms_mean");
ABSL_FLAG(bool, exchange_only, false, "print only the exchange table (S = 128K, C = 2, 4, 8)");

namespace {

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
      "K/V exchange of CP shard plans: %s micro-batches (S = 128K, N = %d) from %s, %d steps; "
      "link %g GB/s per direction and %g us per collective, 16 KiB K/V per token and layer "
      "(LLaMA-2-7B, bf16). Cells: predicted slowest rank (attention + exchange) ms / its "
      "attention alone ms / K/V received "
      "over all ranks MB (row-exact or all-gather, as wlb::ChooseExchange picks) / all-gather MB, "
      "per layer, means over micro-batches.\n\n",
      shared.spec.packer.c_str(), n, base.name.c_str(), steps, options.comm.link_gbps,
      options.comm.latency_us);
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
          if (plan->strategy == wlb::ShardStrategy("doc-degree")) ++greedy;
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
    std::printf("%s | %.1f%% / %.1f%% / %.1f%% faster | %d of %d |\n", line.c_str(),
                faster(kVersus[0]), faster(kVersus[1]), faster(kVersus[2]), greedy, planned);
  }
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

  if (absl::GetFlag(FLAGS_exchange_only)) return ExchangeTable(*shared, *base, steps, cost, kernel);
  std::printf(
      "CP sharding of %s micro-batches (N = %d, S_max = 1.25 S) from %s, %d steps per "
      "context; predicted with wlb::KernelModel::Default() (one LLaMA-2-7B attention "
      "layer forward, 32 heads x 128). Cells: CP imbalance (max / mean rank latency) and "
      "max-rank latency in ms, means over micro-batches.\n\n",
      shared->spec.packer.c_str(), n, source.c_str(), steps);
  std::printf(
      "| S | C%s | ordering closes of the per-seq -> per-doc imbalance gap | adaptive picks "
      "ordered / per-doc / hybrid |\n%s\n",
      HeaderCells(kStrategies).c_str(), Rule(2 + std::size(kStrategies) + 2).c_str());
  std::vector<std::string> csv;
  for (int64_t k : {32, 64, 128, 160}) {
    const int64_t context = k * 1024;
    absl::StatusOr<wlb::PackRun> run = PackSteps(shared->spec, *base, context, steps, cost);
    if (!run.ok()) return run.status();
    for (int c : {2, 4, 8, 16}) {
      std::fprintf(stderr, "sharding_table: S = %dK, C = %d\n", k, c);
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
      std::printf(
          "%s | %s |\n", line.c_str(),
          absl::StrFormat("%s | %d / %d / %d of %d", closed,
                          adaptive.count(wlb::ShardStrategy("per-seq-ordered")),
                          adaptive.count(wlb::ShardStrategy("per-doc")),
                          adaptive.count(wlb::ShardStrategy("hybrid")), adaptive.micro_batches)
              .c_str());
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
                         {"packer", "micro_batches", "cp_link_gbps"});
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "sharding_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
