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
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
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

namespace {

constexpr wlb::ShardStrategy kStrategies[] = {
    wlb::ShardStrategy::kPerSequence, wlb::ShardStrategy::kPerDocument,
    wlb::ShardStrategy::kAdaptive, wlb::ShardStrategy::kHybrid};

absl::Status Run() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int32_t n = absl::GetFlag(FLAGS_micro_batches);
  if (steps < 1 || n < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--steps (got %d) and --micro_batches (got %d) must be >= 1", steps, n));
  }
  std::string source = absl::GetFlag(FLAGS_docs);
  std::vector<int64_t> base;
  if (source.empty()) {
    // Enough for the smallest scale (S = 32K keeps a quarter of the tokens).
    base = wlb::SampleDefaultLengths((steps + 2) * n * int64_t{131072}, absl::GetFlag(FLAGS_seed));
    source = absl::StrFormat("embedded default distribution, seed %d", absl::GetFlag(FLAGS_seed));
  } else {
    absl::StatusOr<std::vector<int64_t>> read = wlb::ReadLengthsFile(source);
    if (!read.ok()) return read.status();
    base = *std::move(read);
  }
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  const wlb::KernelModel kernel = wlb::KernelModel::Default();

  std::printf("CP sharding of %s micro-batches (N = %d, S_max = 1.25 S) from %s, %d steps per "
              "context; predicted with wlb::KernelModel::Default() (one LLaMA-2-7B attention "
              "layer forward, 32 heads x 128). Cells: CP imbalance (max / mean rank latency) and "
              "max-rank latency in ms, means over micro-batches.\n\n",
              absl::GetFlag(FLAGS_packer).c_str(), n, source.c_str(), steps);
  std::printf("| S | C | per-seq | per-doc | adaptive | hybrid | adaptive picks per-doc |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::vector<std::string> csv;
  for (int64_t k : {32, 64, 128, 160}) {
    const int64_t context = k * 1024;
    std::vector<int64_t> lengths = base;
    for (int64_t& l : lengths) l = std::max<int64_t>(1, l * context / 131072);
    absl::StatusOr<std::vector<wlb::Document>> pieces = wlb::MakeDocuments(lengths, context);
    if (!pieces.ok()) return pieces.status();
    absl::StatusOr<std::vector<std::vector<wlb::Document>>> split =
        wlb::SplitIntoSteps(*pieces, context * n);
    if (!split.ok()) return split.status();
    std::vector<std::vector<wlb::Document>> arrivals = *std::move(split);
    if (static_cast<int64_t>(arrivals.size()) > steps) arrivals.resize(steps);
    const wlb::PackerConfig config{
        .context = context, .max_tokens = wlb::DefaultMaxTokens(context), .micro_batches = n};
    absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
        wlb::MakePacker(absl::GetFlag(FLAGS_packer), config, cost,
                        {.thresholds = wlb::DefaultThresholds(context, 2)});
    if (!packer.ok()) return packer.status();
    absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, arrivals);
    if (!run.ok()) return run.status();
    for (int c : {2, 4, 8, 16}) {
      std::fprintf(stderr, "sharding_table: S = %dK, C = %d\n", k, c);
      std::string line = absl::StrFormat("| %dK | %d", k, c);
      int64_t adaptive_per_doc = 0, adaptive_total = 0;
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
        const double max_ms = summary.micro_batches > 0
                                  ? summary.max_rank_ms_total / summary.micro_batches
                                  : 0.0;
        line += absl::StrFormat(" | %.3f / %.2f ms", summary.model_imbalance_mean, max_ms);
        if (strategy == wlb::ShardStrategy::kAdaptive) {
          adaptive_per_doc = summary.per_doc;
          adaptive_total = summary.micro_batches;
        }
        csv.push_back(absl::StrFormat("%d,%d,%s,%.6f,%.6f,%.6g", context, c,
                                      wlb::ShardStrategyName(strategy),
                                      summary.pair_imbalance_mean, summary.model_imbalance_mean,
                                      max_ms));
      }
      std::printf("%s | %d / %d |\n", line.c_str(), adaptive_per_doc, adaptive_total);
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --csv '%s'", path));
    out << "S,C,strategy,pair_imbalance_mean,model_imbalance_mean,max_rank_ms_mean\n";
    for (const std::string& line : csv) out << line << "\n";
    if (!out) return absl::DataLossError(absl::StrFormat("error writing --csv '%s'", path));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Compares CP shard strategies by CP size and context window.");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "sharding_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
