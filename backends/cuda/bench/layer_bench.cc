// layer_bench: the paper's Table 2 and the WLB speedup from measured layer latency. Plans a
// document stream with each packer, runs every micro-batch of K steps through one decoder layer
// (LayerRunner: the per-GPU TP slice of a preset) forward and backward, and writes per
// micro-batch tokens, documents, FLOP-model cost and measured ms; then (layer_analysis.h) Table 2
// with measured imbalance beside the FLOP model's, both models' prediction errors, a cost profile
// fitted to single-document timings that `wlb-plan --cost` reads, the measured times through the
// 1F1B step-time model (WLB vs Plain-4D) beside the model-only estimate, and the same
// micro-batches under CP (per-rank layer time, measured CP imbalance, adaptive vs the oracle) and
// the 1F1B speedup from those CP layer times (original per-seq vs wlb adaptive, --cp_steps steps).
//
//   wlb_cuda_layer_bench --out=DIR [--preset=llama2-7b] [--tp=8] [--context=131072]
//       [--pp=4] [--dp=1] [--cp_job=2] [--docs=PATH] [--seed=1] [--steps=3] [--skip=2]
//       [--packers=original,fixed-greedy-w1,fixed-greedy-w8,wlb,wlb-refine,wlb-lookahead]
//       [--kernel=flash] [--warmup=1] [--iters=3] [--sweep=1] [--cp=2,4] [--cp_steps=1]
//
// The paper's 7B-128K job is the default ((TP,CP,PP,DP) = (8,2,4,1): 4 query / 4 KV heads of
// 128, ffn 1376 per GPU); 550M-64K is --preset=wlb-550m --tp=2 --context=65536 --pp=4 --dp=2
// (head_dim 96: the cudnn engine, --kernel=cudnn). A packer label NAME@COST plans with COST
// (anything `wlb-plan --cost` takes: a preset such as h100-flash-llama2-7b-tp8, a profile or a
// micro-batch measurement CSV) instead of the preset's FLOP model, e.g. --packers=wlb,
// wlb@h100-flash-llama2-7b-tp8 measures both plans in one run; the FLOP-model column of Table 2
// always prices every plan with the FLOP model, so the rows compare. Lengths are scaled by S /
// 128K, as speedup_table does. Each time is the median of --iters runs after --warmup. The layer
// runs the whole micro-batch on one GPU (no CP split); the CP section shards the same
// micro-batches' attention over C emulated ranks (LocalCommunicator, ranks isolated) and charges
// each rank the layer's measured non-attention time / C. Files in --out: measurements.csv,
// layer_profile.csv (the fitted profile's points), predictions.csv (per micro-batch measured and
// predicted forward ms, for backends/cuda/scripts/plot_layer.py), cp.csv, summary.md (everything
// printed). measurements.csv and cp.csv get each row as it is measured (flushed, like the
// line-buffered stdout), so a run killed by `timeout` keeps every measurement it finished. With
// --kernel=cudnn the summary ends with how many cuDNN graphs were built and the seconds that took.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/cp_bench_util.h"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cp_packed_run.h"
#include "wlb/cuda/layer_analysis.h"
#include "wlb/cuda/layer_reference.h"
#include "wlb/cuda/layer_runner.h"
#include "wlb/io/input.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/sim/step_time.hpp"

namespace {

using namespace wlb::cuda;  // NOLINT: a small program

std::string summary_text;
void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  summary_text += line + "\n";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// A packer label: a MakePacker name, "fixed-greedy-wW" for a window of W steps, optionally
// followed by "@COST" to plan with that cost instead of the FLOP model.
struct PackerSpec {
  std::string label, name;
  wlb::PackerOptions options;
  std::optional<wlb::CostModel> cost;  // nullopt: the preset's FLOP model
};

absl::StatusOr<PackerSpec> ParsePacker(const std::string& label, int64_t context) {
  PackerSpec p{.label = label, .name = label};
  if (const size_t at = label.find('@'); at != std::string::npos) {
    p.name = label.substr(0, at);
    absl::StatusOr<wlb::ProfileFit> fit = wlb::ResolveCostModel(label.substr(at + 1));
    if (!fit.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("packer '%s': %s", label, fit.status().message()));
    }
    p.cost = fit->model;
  }
  const std::string greedy = "fixed-greedy-w";
  if (p.name.rfind(greedy, 0) == 0) {
    if (!absl::SimpleAtoi(p.name.substr(greedy.size()), &p.options.window)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("packer '%s': the window after -w is not an integer", label));
    }
    p.name = "fixed-greedy";
  }
  if (p.name.rfind("wlb", 0) == 0) p.options.thresholds = wlb::DefaultThresholds(context, 2);
  return p;
}

// Median times of the planned micro-batch over `iters` runs after `warmup`.
absl::StatusOr<LayerTimes> TimeLayer(LayerRunner& layer, bool backward, int warmup, int iters) {
  std::vector<double> f, af, b, ab;
  for (int i = 0; i < warmup + iters; ++i) {
    if (absl::Status s = layer.Forward(); !s.ok()) return s;
    if (backward) {
      if (absl::Status s = layer.Backward(); !s.ok()) return s;
    }
    absl::StatusOr<LayerTimes> t = layer.Times();
    if (!t.ok()) return t.status();
    if (i < warmup) continue;
    f.push_back(t->forward_ms);
    af.push_back(t->attention_forward_ms);
    b.push_back(t->backward_ms);
    ab.push_back(t->attention_backward_ms);
  }
  return LayerTimes{Median(f), Median(af), Median(b), Median(ab)};
}

std::vector<int64_t> LengthsOf(const wlb::MicroBatch& mb) {
  std::vector<int64_t> l;
  for (const wlb::Document& d : mb.documents) l.push_back(d.length);
  return l;
}

// The FLOP model's cost of a micro-batch, whatever cost planned it (Table 2's model column).
double FlopCost(const wlb::CostModel& flops, const wlb::MicroBatch& mb) {
  double cost = 0.0;
  for (const wlb::Document& d : mb.documents) cost += flops(d.length);
  return cost;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "layer_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Flags flags(argc, argv);
  std::string out_dir,
      preset = "llama2-7b", docs,
      packers_flag = "original,fixed-greedy-w1,fixed-greedy-w8,wlb,wlb-refine,wlb-lookahead",
      kernel_name = "flash", cp_flag = "2,4";
  int64_t tp = 8, context = 131072, pp = 4, dp = 1, cp_job = 2, seed = 1, steps = 3, skip = 2,
          warmup = 1, iters = 3, sweep = 1, cp_steps = 1, backward = 1;
  const bool ok =
      flags.Str("out", &out_dir) && flags.Str("preset", &preset) && flags.Int("tp", &tp) &&
      flags.Int("context", &context) && flags.Int("pp", &pp) && flags.Int("dp", &dp) &&
      flags.Int("cp_job", &cp_job) && flags.Str("docs", &docs) && flags.Int("seed", &seed) &&
      flags.Int("steps", &steps) && flags.Int("skip", &skip) &&
      flags.Str("packers", &packers_flag) && flags.Str("kernel", &kernel_name) &&
      flags.Int("warmup", &warmup) && flags.Int("iters", &iters) && flags.Int("sweep", &sweep) &&
      flags.Str("cp", &cp_flag) && flags.Int("cp_steps", &cp_steps) &&
      flags.Int("backward", &backward) && flags.AllUsed();
  if (!ok || out_dir.empty() || steps < 1 || skip < 0 || iters < 1 || warmup < 0 || pp < 1 ||
      dp < 1 || cp_job < 1 || cp_steps < 0) {
    std::fprintf(stderr,
                 "usage: see the comment at the top of layer_bench.cc (--out is required; "
                 "--steps, --iters, --pp, --dp, --cp_job >= 1; --skip, --warmup, --cp_steps "
                 ">= 0)\n");
    return 2;
  }
  absl::StatusOr<AttentionKernel> kernel = ParseAttentionKernel(kernel_name);
  if (!kernel.ok()) return Fail(kernel.status());
  absl::StatusOr<LayerShape> shape = LayerShapeFromPreset(preset, static_cast<int>(tp));
  if (!shape.ok()) return Fail(shape.status());
  absl::StatusOr<wlb::TransformerShape> model_shape = wlb::FindTransformerShape(preset);
  absl::StatusOr<wlb::CostModel> flops = wlb::CostModelFromShape(*model_shape);
  if (!flops.ok()) return Fail(flops.status());
  std::vector<int> cp_sizes;
  for (absl::string_view c : absl::StrSplit(cp_flag, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(c, &v) || v < 2 || v > 64) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--cp: '%s' is not a CP size in [2, 64]", std::string(c))));
    }
    cp_sizes.push_back(v);
  }
  std::vector<PackerSpec> packers;
  for (absl::string_view label : absl::StrSplit(packers_flag, ',', absl::SkipEmpty())) {
    absl::StatusOr<PackerSpec> p = ParsePacker(std::string(label), context);
    if (!p.ok()) return Fail(p.status());
    packers.push_back(*p);
  }
  const wlb::PackerConfig config{.context = context,
                                 .max_tokens = wlb::DefaultMaxTokens(context),
                                 .micro_batches = static_cast<int32_t>(pp * dp)};
  // Arrivals: enough steps for the skipped, the measured and a window of 8 to fill.
  const int64_t arrival_steps = skip + steps + 8;
  absl::StatusOr<wlb::Lengths> lengths =
      wlb::LoadLengths({.docs = docs, .seed = static_cast<uint64_t>(seed)},
                       (arrival_steps + 1) * config.micro_batches * int64_t{131072});
  if (!lengths.ok()) return Fail(lengths.status());
  absl::StatusOr<wlb::Input> input = wlb::CutSteps(
      *lengths, context, config.micro_batches, {.max_steps = arrival_steps, .scale_from = 131072});
  if (!input.ok()) return Fail(input.status());
  // Plan every packer's steps on the host first (a bad input fails here, before any device).
  std::map<std::string, std::vector<wlb::StepPlan>> plans;
  for (const PackerSpec& p : packers) {
    absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
        wlb::MakePacker(p.name, config, p.cost.value_or(*flops), p.options);
    if (!packer.ok()) return Fail(packer.status());
    absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, input->steps, /*flush=*/false);
    if (!run.ok()) return Fail(run.status());
    if (static_cast<int64_t>(run->steps.size()) < skip + steps) {
      return Fail(absl::OutOfRangeError(
          absl::StrFormat("packer %s planned %d steps from %d arrival steps; --skip + --steps = %d",
                          p.label, run->steps.size(), arrival_steps, skip + steps)));
    }
    plans[p.label].assign(run->steps.begin() + skip, run->steps.begin() + skip + steps);
    std::printf("planned %s: steps %ld..%ld, planning-cost imbalance of step %ld %.3f\n",
                p.label.c_str(), long(skip), long(skip + steps - 1), long(skip),
                wlb::ImbalanceDegree(plans[p.label][0].micro_batches));
  }
  if (!bench::RequireDevice(argv[0])) return 3;
  std::filesystem::create_directories(out_dir);

  LayerRunnerOptions options;
  options.attention.kernel = *kernel;
  options.backward = backward != 0;
  absl::StatusOr<std::unique_ptr<LayerRunner>> layer = LayerRunner::Create(
      *shape, RandomLayerParams(*shape, static_cast<uint64_t>(seed)), config.max_tokens, options);
  if (!layer.ok()) return Fail(layer.status());
  const std::string provenance = absl::StrFormat(
      "%s; %s; layer %s (hidden %d, heads %d/%d x %d, ffn %d); engine %s; input %s; S %d, "
      "S_max %d, N %d; command: %s",
      bench::DeviceName(), "measured by wlb_cuda_layer_bench", shape->name, shape->hidden,
      shape->heads, shape->kv_heads, shape->head_dim, shape->ffn, kernel_name, input->name, context,
      config.max_tokens, config.micro_batches, flags.command());
  Say("# layer_bench: " + provenance);

  // ---- per micro-batch measurements, every packer ----
  std::vector<MicroBatchMeasurement> rows;
  std::ofstream measurements_csv(out_dir + "/measurements.csv");
  measurements_csv << MeasurementsCsv({}, provenance) << std::flush;  // the header
  for (const PackerSpec& p : packers) {
    for (size_t k = 0; k < plans[p.label].size(); ++k) {
      const wlb::StepPlan& step = plans[p.label][k];
      const int64_t s = skip + static_cast<int64_t>(k);
      for (size_t i = 0; i < step.micro_batches.size(); ++i) {
        const wlb::MicroBatch& mb = step.micro_batches[i];
        MicroBatchMeasurement m{.method = p.label,
                                .step = s,
                                .index = static_cast<int64_t>(i),
                                .lengths = LengthsOf(mb),
                                .predicted = FlopCost(*flops, mb)};
        if (!m.lengths.empty()) {
          absl::StatusOr<PackedDocuments> packed = PackDocuments(m.lengths);
          if (!packed.ok()) return Fail(packed.status());
          if (absl::Status st = (*layer)->Plan(*packed); !st.ok()) return Fail(st);
          absl::StatusOr<LayerTimes> t = TimeLayer(
              **layer, options.backward, static_cast<int>(warmup), static_cast<int>(iters));
          if (!t.ok()) return Fail(t.status());
          m.forward_ms = t->forward_ms;
          m.backward_ms = t->backward_ms;
          m.attention_forward_ms = t->attention_forward_ms;
          m.attention_backward_ms = t->attention_backward_ms;
        }
        std::printf("%s step %ld mb %zu: %ld tokens, %zu docs, fwd %.3f ms, bwd %.3f ms\n",
                    p.label.c_str(), long(s), i, long(m.tokens()), m.lengths.size(), m.forward_ms,
                    m.backward_ms);
        measurements_csv << MeasurementsCsvRow(m) << std::flush;
        rows.push_back(std::move(m));
      }
    }
  }
  measurements_csv.close();

  // ---- Table 2 ----
  absl::StatusOr<std::vector<ImbalanceRow>> table = ImbalanceTable(rows);
  if (!table.ok()) return Fail(table.status());
  Say(
      absl::StrFormat("\nTable 2, measured (steps %d..%d, %d micro-batches each; paper 7B-128K: "
                      "original 1.44, fixed-greedy w1 1.41 / w8 1.08, WLB 2 queues 1.05):\n",
                      skip, skip + steps - 1, config.micro_batches));
  Say("| packer | FLOP model | measured fwd | measured fwd+bwd |");
  Say("|---|---|---|---|");
  for (const ImbalanceRow& r : *table) {
    Say(absl::StrFormat("| %s | %.3f | %.3f | %.3f |", r.method, r.flop_model, r.measured_forward,
                        r.measured_forward_backward));
  }

  // ---- fitted cost model from single-document timings; prediction errors ----
  std::vector<double> predicted_flop, predicted_fit, measured_fwd;
  absl::StatusOr<wlb::ProfileFit> fit = absl::FailedPreconditionError("--sweep=0");
  if (sweep != 0) {
    std::vector<wlb::ProfilePoint> points;
    for (int64_t d = 128; d <= config.max_tokens; d = std::min(d * 2, config.max_tokens)) {
      absl::StatusOr<PackedDocuments> one = PackDocuments({d});
      if (absl::Status st = (*layer)->Plan(*one); !st.ok()) return Fail(st);
      absl::StatusOr<LayerTimes> t =
          TimeLayer(**layer, false, static_cast<int>(warmup), static_cast<int>(iters));
      if (!t.ok()) return Fail(t.status());
      points.push_back({d, t->forward_ms});
      if (d == config.max_tokens) break;
    }
    fit = wlb::FitCostModel(points);
    if (!fit.ok()) return Fail(fit.status());
    absl::StatusOr<std::string> csv =
        LayerProfileCsv(points, "forward ms of one layer; " + provenance);
    if (!csv.ok()) return Fail(csv.status());
    std::ofstream(out_dir + "/layer_profile.csv") << *csv;
    Say("\nFitted to single-document forward times (layer_profile.csv; wlb-plan --cost reads "
        "it): " +
        fit->model.description);
  }
  for (const MicroBatchMeasurement& m : rows) {
    if (m.lengths.empty()) continue;
    predicted_flop.push_back(m.predicted);
    measured_fwd.push_back(m.forward_ms);
    if (fit.ok()) predicted_fit.push_back(PredictMicroBatch(fit->model, m));
  }
  absl::StatusOr<PredictionError> flop_error =
      ComparePredictions(predicted_flop, measured_fwd, /*fit_scale=*/true);
  if (!flop_error.ok()) return Fail(flop_error.status());
  Say(absl::StrFormat(
      "\nPrediction error of micro-batch forward ms over %d micro-batches: FLOP model (best "
      "scale: %.1f TFLOP/s per GPU on one layer's slice) mean %.1f%%, max %.1f%%",
      flop_error->points, 1e-9 / flop_error->scale / (model_shape->layers * tp),
      100 * flop_error->mean_relative, 100 * flop_error->max_relative));
  if (fit.ok()) {
    absl::StatusOr<PredictionError> fit_error =
        ComparePredictions(predicted_fit, measured_fwd, /*fit_scale=*/false);
    if (!fit_error.ok()) return Fail(fit_error.status());
    Say(absl::StrFormat("fitted model (from single documents, as is) mean %.1f%%, max %.1f%%",
                        100 * fit_error->mean_relative, 100 * fit_error->max_relative));
  }
  absl::StatusOr<MicroBatchFit> mb_fit = FitMicroBatchCost(rows);
  if (mb_fit.ok()) {
    Say(
        absl::StrFormat("micro-batch cost of forward ms %s (held out: even steps predict odd "
                        "and back, %d micro-batches)",
                        mb_fit->model.description, mb_fit->held_out.points));
  } else {
    Say("micro-batch cost fit: " + std::string(mb_fit.status().message()));
  }
  {  // Per micro-batch measured vs predicted, for the plot (scripts/plot_layer.py).
    std::ofstream csv(out_dir + "/predictions.csv");
    csv << "method,step,index,tokens,measured_fwd_ms,flop_model_ms,fitted_ms,"
           "microbatch_fit_ms\n";
    size_t k = 0;
    for (const MicroBatchMeasurement& m : rows) {
      if (m.lengths.empty()) continue;
      csv << absl::StrFormat(
          "%s,%d,%d,%d,%.6f,%.6f,%s,%s\n", m.method, m.step, m.index, m.tokens(), m.forward_ms,
          flop_error->scale * m.predicted,
          fit.ok() ? absl::StrFormat("%.6f", predicted_fit[k]) : "",
          mb_fit.ok() ? absl::StrFormat("%.6f", PredictMicroBatch(*mb_fit, m)) : "");
      ++k;
    }
  }

  // ---- measured times through the 1F1B model: WLB vs Plain-4D ----
  const wlb::ParallelSizes sizes{static_cast<int>(tp), static_cast<int>(cp_job),
                                 static_cast<int>(pp), static_cast<int>(dp)};
  const int layers = static_cast<int>(model_shape->layers);
  // Speedups of WLB over Plain-4D per trained token: from measured per-micro-batch times (rows
  // already holding the times to charge), and from the step-time model alone at CP c (original
  // per-seq vs wlb adaptive) on the same micro-batches.
  const auto measured_speedup = [&](std::span<const MicroBatchMeasurement> base,
                                    std::span<const MicroBatchMeasurement> ours,
                                    const wlb::ParallelSizes& job) -> absl::StatusOr<double> {
    absl::StatusOr<double> b = MeasuredSecondsPerToken(base, job, layers);
    absl::StatusOr<double> w = MeasuredSecondsPerToken(ours, job, layers);
    if (!b.ok() || !w.ok()) return b.ok() ? w.status() : b.status();
    return *b / *w;
  };
  const auto model_speedup = [&](std::span<const MicroBatchMeasurement> base,
                                 std::span<const MicroBatchMeasurement> ours,
                                 int c) -> absl::StatusOr<double> {
    absl::StatusOr<wlb::PipelineJob> job =
        wlb::MakePipelineJob(*model_shape, {sizes.tp, c, sizes.pp, sizes.dp});
    if (!job.ok()) return job.status();
    absl::StatusOr<wlb::StepTimeModel> model = wlb::StepTimeModel::Create(*job);
    if (!model.ok()) return model.status();
    absl::StatusOr<double> b =
        ModelSecondsPerToken(base, *model, {.candidates = {wlb::ShardStrategy("per-seq")}});
    absl::StatusOr<double> w =
        ModelSecondsPerToken(ours, *model, {.candidates = {wlb::ShardStrategy("adaptive")}});
    if (!b.ok() || !w.ok()) return b.ok() ? w.status() : b.status();
    return *b / *w;
  };
  if (plans.count("original") && plans.count("wlb") && options.backward) {
    const std::vector<MicroBatchMeasurement> base = RowsOf(rows, "original"),
                                             ours = RowsOf(rows, "wlb");
    absl::StatusOr<double> speedup = measured_speedup(base, ours, sizes);
    if (!speedup.ok()) return Fail(speedup.status());
    Say(absl::StrFormat(
        "\nSpeedup of WLB over Plain-4D from measured layer times (1F1B, PP %d, DP %d, %d "
        "layers, per trained token, whole micro-batch on one GPU): %.3fx (paper 7B-128K: "
        "1.33x)",
        sizes.pp, sizes.dp, model_shape->layers, *speedup));
    for (int c : {1, static_cast<int>(cp_job)}) {
      absl::StatusOr<double> modelled = model_speedup(base, ours, c);
      if (!modelled.ok()) return Fail(modelled.status());
      Say(
          absl::StrFormat("model-only estimate on the same steps, CP %d (original per-seq vs "
                          "wlb adaptive): %.3fx",
                          c, *modelled));
    }
  }

  // ---- CP: the same micro-batches' attention over C emulated ranks ----
  std::vector<CpMeasurement> cp_rows;
  std::ofstream cp_csv;  // opened at the first row: no cp.csv when nothing is measured
  const CpAttentionConfig cp_config{.num_heads = static_cast<int>(shape->heads),
                                    .num_kv_heads = static_cast<int>(shape->kv_heads),
                                    .head_dim = static_cast<int>(shape->head_dim),
                                    .kernel = *kernel};
  absl::StatusOr<wlb::KernelModel> kernel_model =
      wlb::KernelModel::Analytic({.shape = {.heads = shape->heads, .head_dim = shape->head_dim}});
  if (!kernel_model.ok()) return Fail(kernel_model.status());
  const size_t nq = static_cast<size_t>(config.max_tokens * shape->q_width());
  const size_t nk = static_cast<size_t>(config.max_tokens * shape->kv_width());
  for (int c : cp_steps > 0 ? cp_sizes : std::vector<int>{}) {
    absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(c);
    if (!comm.ok()) return Fail(comm.status());
    bench::DeviceBf16 q = bench::RandomDevice(nq, 1, 2), k = bench::RandomDevice(nk, 2, 2),
                      v = bench::RandomDevice(nk, 3, 1), dout = bench::RandomDevice(nq, 4, 1),
                      o = bench::EmptyDevice(nq), dq = bench::EmptyDevice(nq),
                      dk = bench::EmptyDevice(nk), dv = bench::EmptyDevice(nk);
    if (!q || !k || !v || !dout || !o || !dq || !dk || !dv) return 1;
    const PackedCpTensors t{q.get(), k.get(),  v.get(),  dout.get(),
                            o.get(), dq.get(), dk.get(), dv.get()};
    for (const MicroBatchMeasurement& m : rows) {
      if (m.lengths.empty() || m.step >= skip + cp_steps ||
          (m.method != "original" && m.method != "wlb")) {
        continue;
      }
      const wlb::MicroBatch& mb =
          plans[m.method][static_cast<size_t>(m.step - skip)].micro_batches[m.index];
      // The layer's non-attention time, shared evenly by the ranks (each holds tokens / C).
      const double linear_ms =
          (m.forward_ms - m.attention_forward_ms + m.backward_ms - m.attention_backward_ms) / c;
      for (wlb::ShardStrategy s :
           {wlb::ShardStrategy("per-seq"), wlb::ShardStrategy("per-doc"),
            wlb::ShardStrategy("adaptive"), wlb::ShardStrategy("per-seq-ordered")}) {
        absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, c, s, *kernel_model);
        if (!plan.ok()) return Fail(plan.status());
        absl::StatusOr<std::unique_ptr<CpPackedRunner>> run =
            CpPackedRunner::Create(*plan, cp_config, **comm, {.isolate_ranks = true});
        if (!run.ok()) return Fail(run.status());
        if (absl::Status st = (*run)->Run(t, true); !st.ok()) return Fail(st);
        std::vector<std::vector<double>> per_rank(static_cast<size_t>(c));
        for (int i = 0; i < warmup + iters; ++i) {
          if (absl::Status st = (*run)->Rerun(true); !st.ok()) return Fail(st);
          absl::StatusOr<std::vector<CpRankTimes>> times = (*run)->executor().RankTimes();
          if (!times.ok()) return Fail(times.status());
          if (i < warmup) continue;
          for (const CpRankTimes& x : *times) {
            per_rank[static_cast<size_t>(x.rank)].push_back(x.forward_ms + x.backward_ms);
          }
        }
        CpMeasurement cm{.method = m.method,
                         .step = m.step,
                         .index = m.index,
                         .cp = c,
                         .strategy = std::string(wlb::ShardStrategyName(s))};
        for (const auto& r : per_rank) cm.rank_ms.push_back(Median(r) + linear_ms);
        if (!cp_csv.is_open()) {
          cp_csv.open(out_dir + "/cp.csv");
          cp_csv << "# " << provenance << "\nmethod,step,index,cp,strategy,rank_ms\n";
        }
        cp_csv << absl::StrFormat("%s,%d,%d,%d,%s,%s\n", cm.method, cm.step, cm.index, cm.cp,
                                  cm.strategy, absl::StrJoin(cm.rank_ms, ";"))
               << std::flush;
        cp_rows.push_back(std::move(cm));
      }
    }
  }
  cp_csv.close();
  if (!cp_rows.empty()) {
    absl::StatusOr<std::vector<CpRow>> cp_table = CpTable(cp_rows);
    if (!cp_table.ok()) return Fail(cp_table.status());
    Say(absl::StrFormat(
        "\nCP (original and wlb micro-batches of the first %d measured step(s); per-rank layer "
        "fwd+bwd = measured rank attention + measured non-attention / C; paper, 7B one layer "
        "C=4 128K: adaptive 7.5%% faster than per-seq, 3.4%% than per-doc):\n",
        cp_steps));
    Say("| C | sharding | micro-batches | measured CP imbalance | total slowest-rank ms | vs "
        "oracle |");
    Say("|---|---|---|---|---|---|");
    for (const CpRow& r : *cp_table) {
      Say(absl::StrFormat("| %d | %s | %d | %.3f | %.2f | %.3f |", r.cp, r.strategy,
                          r.micro_batches, r.mean_imbalance, r.total_ms, r.vs_oracle));
    }
    // The 1F1B speedup under CP from these measurements: each micro-batch costs its slowest
    // rank (original per-seq, wlb adaptive), beside the same steps on one GPU and the model.
    if (options.backward) {
      Say("");
      // The same steps' rows (whole micro-batches on one GPU) for the CP 1 and model columns.
      std::vector<MicroBatchMeasurement> base_one, ours_one;
      for (const MicroBatchMeasurement& m : rows) {
        if (m.step >= skip + cp_steps) continue;
        if (m.method == "original") base_one.push_back(m);
        if (m.method == "wlb") ours_one.push_back(m);
      }
      absl::StatusOr<double> on_one = measured_speedup(base_one, ours_one, sizes);
      if (!on_one.ok()) return Fail(on_one.status());
      for (int c : cp_sizes) {
        absl::StatusOr<std::vector<MicroBatchMeasurement>> base =
            CpStageRows(rows, cp_rows, "original", "per-seq", c);
        absl::StatusOr<std::vector<MicroBatchMeasurement>> ours =
            CpStageRows(rows, cp_rows, "wlb", "adaptive", c);
        if (!base.ok() || !ours.ok()) return Fail(base.ok() ? ours.status() : base.status());
        absl::StatusOr<double> on_cp =
            measured_speedup(*base, *ours, {sizes.tp, c, sizes.pp, sizes.dp});
        absl::StatusOr<double> modelled = model_speedup(base_one, ours_one, c);
        if (!on_cp.ok() || !modelled.ok()) {
          return Fail(on_cp.ok() ? modelled.status() : on_cp.status());
        }
        Say(absl::StrFormat(
            "Speedup of WLB (adaptive CP) over Plain-4D (per-seq CP) from measured CP-%d layer "
            "times, steps %d..%d (no K/V exchange time): %.3fx; whole micro-batch on one GPU, "
            "same steps: %.3fx; model only, CP %d, same steps: %.3fx",
            c, skip, skip + std::min(cp_steps, steps) - 1, *on_cp, *on_one, c, *modelled));
      }
    }
  }
  if (*kernel == AttentionKernel::kCudnn) Say("\n" + bench::CudnnGraphLine());
  std::ofstream(out_dir + "/summary.md") << summary_text;
  return 0;
}
