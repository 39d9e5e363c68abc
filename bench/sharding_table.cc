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
// + max(sent, received) K/V rows x 16 KiB / --cp_link_gbps per rank): slowest rank in ms, its
// attention alone, K/V bytes received over all ranks (a selective exchange), and what an
// all-gather of every rank's padded buffer moves (the backends' executors), per layer, means over
// micro-batches.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "cli_help.h"
#include "wlb/shard/kernel_model.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "document lengths file; empty samples the embedded default distribution");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the embedded distribution");
ABSL_FLAG(int64_t, steps, 50, "steps of input per context window (>= 1)");
ABSL_FLAG(int32_t, micro_batches, 4, "micro-batches per step N");
ABSL_FLAG(std::string, packer, "wlb", "packer whose micro-batches are sharded");
ABSL_FLAG(std::string, csv, "",
          "also write S,C,strategy,pair_imbalance_mean,model_imbalance_mean,max_rank_ms_mean");
ABSL_FLAG(double, cp_link_gbps, wlb::kDefaultCpLinkGbps,
          "K/V link bandwidth per rank and direction (GB/s) of the exchange table");
ABSL_FLAG(bool, exchange_only, false, "print only the exchange table (S = 128K, C = 2, 4, 8)");

namespace {

constexpr wlb::ShardStrategy kStrategies[] = {
    wlb::ShardStrategy::kPerSequence, wlb::ShardStrategy::kPerSequenceOrdered,
    wlb::ShardStrategy::kPerDocument, wlb::ShardStrategy::kAdaptive, wlb::ShardStrategy::kHybrid};

// The --packer plan of `steps` steps of `base` (lengths scaled from 128K to `context`).
absl::StatusOr<wlb::PackRun> PackSteps(const wlb::Lengths& base, int64_t context, int32_t n,
                                       int64_t steps, const wlb::CostModel& cost) {
  absl::StatusOr<wlb::Input> input =
      wlb::CutSteps(base, context, n, {.max_steps = steps, .scale_from = 131072});
  if (!input.ok()) return input.status();
  const wlb::PackerConfig config{
      .context = context, .max_tokens = wlb::DefaultMaxTokens(context), .micro_batches = n};
  absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
      wlb::MakePacker(absl::GetFlag(FLAGS_packer), config, cost,
                      {.thresholds = wlb::DefaultThresholds(context, 2)});
  if (!packer.ok()) return packer.status();
  return wlb::RunPacker(**packer, input->steps);
}

// The exchange table (see the file comment).
absl::Status ExchangeTable(const wlb::Lengths& base, int64_t steps, int32_t n,
                           const wlb::CostModel& cost, const wlb::KernelModel& kernel) {
  const wlb::CpPlanOptions options{.comm = {.link_gbps = absl::GetFlag(FLAGS_cp_link_gbps)}};
  if (absl::Status s = wlb::ValidateCpPlanOptions(options); !s.ok()) return s;
  absl::StatusOr<wlb::PackRun> run = PackSteps(base, 131072, n, steps, cost);
  if (!run.ok()) return run.status();
  std::printf(
      "K/V exchange of CP shard plans: %s micro-batches (S = 128K, N = %d) from %s, %d steps; "
      "link %g GB/s per direction, 16 KiB K/V per token and layer (LLaMA-2-7B, bf16). Cells: "
      "predicted slowest rank (attention + exchange) ms / its attention alone ms / K/V received "
      "over all ranks MB (selective) / all-gather MB, per layer, means over micro-batches.\n\n",
      absl::GetFlag(FLAGS_packer).c_str(), n, base.name.c_str(), steps, options.comm.link_gbps);
  const wlb::ShardStrategy strategies[] = {
      wlb::ShardStrategy::kPerDocument, wlb::ShardStrategy::kHybrid,
      wlb::ShardStrategy::kPerDocumentPadded, wlb::ShardStrategy::kAdaptive,
      wlb::ShardStrategy::kDocumentDegree};
  constexpr size_t kCount = std::size(strategies);
  std::printf(
      "| C | per-doc | hybrid | te-zigzag | adaptive | doc-degree | doc-degree vs per-doc / "
      "te-zigzag / adaptive | doc-degree's own (greedy) plan |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
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
          if (plan->strategy == wlb::ShardStrategy::kDocumentDegree) ++greedy;
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
    std::printf("%s | %.1f%% / %.1f%% / %.1f%% faster | %d of %d |\n", line.c_str(), faster(0),
                faster(2), faster(3), greedy, planned);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int32_t n = absl::GetFlag(FLAGS_micro_batches);
  if (steps < 1 || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps (got %d) and --micro_batches (got %d) must be >= 1", steps, n));
  }
  // Enough for the smallest scale (S = 32K keeps a quarter of the tokens).
  absl::StatusOr<wlb::Lengths> base =
      wlb::LoadLengths({.docs = absl::GetFlag(FLAGS_docs), .seed = absl::GetFlag(FLAGS_seed)},
                       (steps + 2) * n * int64_t{131072});
  if (!base.ok()) return base.status();
  const std::string source = base->name;
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  const wlb::KernelModel kernel = wlb::KernelModel::Default();

  if (absl::GetFlag(FLAGS_exchange_only)) return ExchangeTable(*base, steps, n, cost, kernel);
  std::printf(
      "CP sharding of %s micro-batches (N = %d, S_max = 1.25 S) from %s, %d steps per "
      "context; predicted with wlb::KernelModel::Default() (one LLaMA-2-7B attention "
      "layer forward, 32 heads x 128). Cells: CP imbalance (max / mean rank latency) and "
      "max-rank latency in ms, means over micro-batches.\n\n",
      absl::GetFlag(FLAGS_packer).c_str(), n, source.c_str(), steps);
  std::printf(
      "| S | C | per-seq | per-seq-ordered | per-doc | adaptive | hybrid | ordering closes of "
      "the per-seq -> per-doc imbalance gap | adaptive picks ordered / per-doc / hybrid |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> csv;
  for (int64_t k : {32, 64, 128, 160}) {
    const int64_t context = k * 1024;
    absl::StatusOr<wlb::PackRun> run = PackSteps(*base, context, n, steps, cost);
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
        if (strategy == wlb::ShardStrategy::kAdaptive) adaptive = summary;
        if (strategy == wlb::ShardStrategy::kPerSequence)
          imbalance[0] = summary.model_imbalance_mean;
        if (strategy == wlb::ShardStrategy::kPerSequenceOrdered) {
          imbalance[1] = summary.model_imbalance_mean;
        }
        if (strategy == wlb::ShardStrategy::kPerDocument)
          imbalance[2] = summary.model_imbalance_mean;
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
                          adaptive.count(wlb::ShardStrategy::kPerSequenceOrdered),
                          adaptive.count(wlb::ShardStrategy::kPerDocument),
                          adaptive.count(wlb::ShardStrategy::kHybrid), adaptive.micro_batches)
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
  return ExchangeTable(*base, steps, n, cost, kernel);
}

}  // namespace

int main(int argc, char** argv) {
  wlb::cli::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage("Compares CP shard strategies by CP size and context window.");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "sharding_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
