// mask_table: mask-blind against mask-aware planning for models that mix attention masks.
//
//   build/bench/mask_table --docs ../shared/data/doc_lengths_wlbllm_like.json
//
// For every masked model preset (wlb/cost/attention_mask.hpp: LLaMA-2-7B with Gemma-3-style
// 27 sliding-window-4096 : 5 global layers, or Llama-4-style 24 chunked-8192 : 8 global layers)
// the document stream at S = 128K is packed twice by --packer: mask-blind (the all-causal FLOP
// cost of llama2-7b, what wlb did before masks) and mask-aware (MaskedModel::MakeCost, pairs
// counted under every layer's mask). Both are measured under the true mixed cost: imbalance =
// max / mean micro-batch FLOPs per step, mean and max over steady steps, with the cap-aware
// lower bound.
//
// CP: the mask-aware packing's micro-batches are shard-planned at C = 4 and 8 by per-doc, hybrid,
// adaptive and doc-degree, the last two each planned mask-blind (all layers causal) and
// mask-aware (the true layer mix: a rank under a window needs only the keys within w of its
// queries, so its gathered rows and its pairs change), each measured with wlb::PredictCp under the
// true mix (attention by layer kind + K/V exchange at --cp_link_gbps): CP imbalance (max / mean
// rank time, mean over micro-batches), slowest rank ms per layer and K/V MB received per layer.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench_plan_flags.hpp"
#include "wlb/wlb.hpp"

// Shared flags (bench_plan_flags.hpp): --docs, --distribution, --seed, --packer (both runs),
// --micro_batches, --cp_link_gbps.
ABSL_FLAG(int64_t, steps, 50, "steps of input (>= 1)");
ABSL_FLAG(std::string, models, "llama2-7b-swa4k,llama2-7b-chunk8k",
          "masked model presets, comma separated");

namespace {

// The CP columns: registry strategies, planned mask-blind (every layer causal) or, where
// `mask_aware`, for the model's true layer mix.
struct CpColumn {
  wlb::ShardStrategy strategy;
  const char* label_suffix;
  bool mask_aware;
};
constexpr CpColumn kCpColumns[] = {{wlb::ShardStrategy("per-doc"), "", false},
                                   {wlb::ShardStrategy("hybrid"), "", false},
                                   {wlb::ShardStrategy("adaptive"), ", mask-blind", false},
                                   {wlb::ShardStrategy("adaptive"), ", mask-aware", true},
                                   {wlb::ShardStrategy("doc-degree"), ", mask-blind", false},
                                   {wlb::ShardStrategy("doc-degree"), ", mask-aware", true}};

// The steps with every micro-batch's cost recomputed under `cost`.
std::vector<wlb::StepPlan> Recost(std::vector<wlb::StepPlan> steps, const wlb::DocumentCost& cost) {
  for (wlb::StepPlan& s : steps) {
    for (wlb::MicroBatch& mb : s.micro_batches) {
      mb.cost = 0.0;
      for (const wlb::Document& d : mb.documents) mb.cost += cost(d.length);
    }
  }
  return steps;
}

absl::Status Run() {
  // S = 128K, S_max = S + S/4 and 2 default queues: the spec's defaults.
  absl::StatusOr<wlb::bench::BenchPlan> shared = wlb::bench::PlanFromFlags();
  if (!shared.ok()) return shared.status();
  absl::StatusOr<wlb::PlanSettings> settings = shared->spec.Validate();
  if (!settings.ok()) return settings.status();
  const wlb::PackerConfig& config = settings->config;
  const int64_t context = config.context;
  const int32_t n = config.micro_batches;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--steps must be >= 1, got %d", steps));
  }
  absl::StatusOr<wlb::Lengths> base = wlb::LoadLengths(shared->input, (steps + 2) * n * context);
  if (!base.ok()) return base.status();
  absl::StatusOr<wlb::Input> input =
      wlb::CutSteps(*base, context, n, {.max_steps = steps, .scale_from = context});
  if (!input.ok()) return input.status();
  const std::string& packer_name = settings->packer;
  auto pack = [&](const wlb::DocumentCost& cost) -> absl::StatusOr<wlb::PackRun> {
    absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
        wlb::MakePacker(packer_name, config, cost, settings->options);
    if (!packer.ok()) return packer.status();
    return wlb::RunPacker(**packer, input->steps);
  };
  const wlb::DocumentCost blind = *wlb::CostModelFromPreset("llama2-7b");
  const wlb::KernelModel kernel = wlb::KernelModel::Default();
  std::printf(
      "Mask-blind vs mask-aware planning, %s packing of %s (S = 128K, S_max = 160K, N = %d, "
      "%d steps), measured under each model's true layer mix.\n\n",
      packer_name.c_str(), base->name.c_str(), n, steps);
  std::vector<std::string> cp_lines;
  std::printf(
      "| model (layer mix) | mask-blind packing: imbalance mean / max | mask-aware packing: "
      "mean / max | cap-aware bound (mean) |\n|---|---|---|---|\n");
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    absl::StatusOr<wlb::MaskedModel> model = wlb::FindMaskedModel(std::string(name));
    if (!model.ok()) return model.status();
    absl::StatusOr<wlb::DocumentCost> truth = model->MakeCost();
    if (!truth.ok()) return truth.status();
    absl::StatusOr<wlb::PackRun> blind_run = pack(blind);
    if (!blind_run.ok()) return blind_run.status();
    absl::StatusOr<wlb::PackRun> aware_run = pack(*truth);
    if (!aware_run.ok()) return aware_run.status();
    const std::vector<wlb::StepPlan> blind_steps = Recost(blind_run->steps, *truth);
    const wlb::StreamSummary b = wlb::Summarize(blind_steps, *truth, config.max_tokens);
    const wlb::StreamSummary a = wlb::Summarize(aware_run->steps, *truth, config.max_tokens);
    std::printf("| %s (%s) | %.3f / %.3f | %.3f / %.3f | %.3f |\n", model->name.c_str(),
                model->mix.Name().c_str(), b.imbalance_mean, b.imbalance_max, a.imbalance_mean,
                a.imbalance_max, a.cap_lower_bound_mean);

    // CP on the mask-aware packing's micro-batches.
    const wlb::CpPlanOptions truth_cp{.comm = shared->cp.comm, .mix = model->mix};
    if (absl::Status s = wlb::ValidateCpPlanOptions(truth_cp); !s.ok()) return s;
    const wlb::CpPlanOptions blind_cp{.comm = truth_cp.comm};
    for (int c : {4, 8}) {
      std::string line = absl::StrFormat("| %s | %d", model->name, c);
      for (const CpColumn& p : kCpColumns) {
        double imbalance = 0, max_ms = 0, received = 0;
        int64_t count = 0;
        for (const wlb::StepPlan& step : aware_run->steps) {
          for (const wlb::MicroBatch& mb : step.micro_batches) {
            if (mb.documents.empty()) continue;
            absl::StatusOr<wlb::ShardPlan> plan =
                wlb::PlanShards(mb, c, p.strategy, kernel, p.mask_aware ? truth_cp : blind_cp);
            if (!plan.ok()) return plan.status();
            const wlb::CpPrediction pred = wlb::PredictCp(*plan, kernel, truth_cp);
            imbalance += wlb::MaxOverMean(pred.rank_ms);
            max_ms += pred.max_ms;
            received += pred.exchanged_bytes;
            ++count;
          }
        }
        const double m = static_cast<double>(count > 0 ? count : 1);
        line += absl::StrFormat(" | %.3f / %.2f ms / %.0f MB", imbalance / m, max_ms / m,
                                received / m / 1e6);
      }
      cp_lines.push_back(line + " |");
    }
  }
  std::printf(
      "\nCP shard plans of the mask-aware packing, measured under the true mix (PredictCp: "
      "attention per layer kind + K/V exchange at %g GB/s). Cells: CP imbalance (max / mean "
      "rank time) / slowest rank ms per layer / K/V MB received per layer, means over "
      "micro-batches.\n\n",
      shared->cp.comm.link_gbps);
  std::string header = "| model | C", rule = "|---|---";
  for (const CpColumn& p : kCpColumns) {
    header += " | " + std::string(wlb::ShardStrategyName(p.strategy)) + p.label_suffix;
    rule += "|---";
  }
  std::printf("%s |\n%s|\n", header.c_str(), rule.c_str());
  for (const std::string& line : cp_lines) std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  wlb::bench::ParseFlags(argc, argv, "Mask-blind vs mask-aware packing and CP sharding.",
                         {"packer", "micro_batches", "cp_link_gbps"});
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "mask_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
