// wlb-plan: plans packed micro-batches for a stream of documents and reports their balance.
//
//   wlb-plan                                   # 100 steps of the embedded default distribution
//   wlb-plan --docs lengths.txt --packer wlb-refine --format json --out plan.json
//   cat lengths.txt | wlb-plan --docs - --micro-batches 8 --thresholds 32768,65536
//
// See README.md ("wlb-plan") for every flag and the JSON schema. On any error wlb-plan prints one
// line naming the problem, exits non-zero and writes no output file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "lengths file (one integer per line, or a JSON array); '-' reads stdin; empty samples "
          "the embedded distribution named by --distribution");
ABSL_FLAG(std::string, distribution, "default",
          "when --docs is empty: default (the embedded WLB-LLM-like histogram) or heavy-tail");
ABSL_FLAG(int64_t, context, 131072, "context window S in tokens (longest piece)");
ABSL_FLAG(int64_t, max_tokens, 0, "variable-length cap S_max per micro-batch; 0 = S + S/4");
ABSL_FLAG(int32_t, micro_batches, 4, "micro-batches per step N (= PP x DP)");
ABSL_FLAG(std::string, packer, "wlb",
          "original, original-nextfit, fixed-greedy, wlb, wlb-refine or wlb-lookahead");
ABSL_FLAG(int32_t, lookahead, 1, "wlb-lookahead: K, steps of prefetched arrivals it sees ahead");
ABSL_FLAG(int32_t, window, 1, "fixed-greedy: steps packed together");
ABSL_FLAG(std::string, thresholds, "",
          "wlb/wlb-refine: comma-separated outlier thresholds L_1<L_2<... in tokens, or 'none'");
ABSL_FLAG(int32_t, queues, -1,
          "wlb/wlb-refine: number of outlier queues with default thresholds (default 2); "
          "ignored when --thresholds is given");
ABSL_FLAG(bool, tune, false,
          "wlb/wlb-refine: pick thresholds with the tuner on the planned stream itself, within "
          "--delay_budget");
ABSL_FLAG(double, delay_budget, 1.0, "--tune: max mean token delay in steps");
ABSL_FLAG(std::string, cost, "llama2-7b",
          "cost model: a preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m) or a profile CSV "
          "of length -> latency to fit");
ABSL_FLAG(std::string, profile_cost, "fit",
          "with a profile CSV in --cost: 'fit' (least-squares quadratic) or 'table' (tile-aware "
          "interpolation of the measured points)");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the default distribution");
ABSL_FLAG(int64_t, steps, 0,
          "steps to plan: default distribution samples this many (0 = 100); a file is cut after "
          "this many (0 = all)");
ABSL_FLAG(int32_t, cp, -1,
          "context-parallel size C >= 1: add CP shard plans to every micro-batch (omit for none)");
ABSL_FLAG(std::string, sharding, "adaptive",
          "with --cp or --estimate: per-seq, per-seq-ordered, per-doc, adaptive or hybrid");
ABSL_FLAG(std::string, kernel_profile, "",
          "with --cp: kernel profile CSV (q_len,kv_len,ms) for the kernel model; empty = the "
          "analytic default (tile 128)");
ABSL_FLAG(std::string, estimate, "",
          "TP,CP,PP,DP: estimate step time with the 1F1B step-time model (wlb/sim) for this "
          "job, against Plain-4D (original packing, per-seq CP) on the same stream; needs a "
          "preset --cost and --micro-batches = PP x DP; CP shards with --sharding");
ABSL_FLAG(double, gemm_tflops, 500.0,
          "--estimate: achieved GEMM TFLOP/s per GPU for the linear part (> 0)");
ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(std::string, out, "", "write the output to this file instead of stdout");
ABSL_FLAG(bool, timing, true, "json: include planning times in the summary (they vary run to run)");
ABSL_FLAG(bool, compare, true, "table: also run original and wlb packing on the same stream");

namespace {

struct Options {
  wlb::PackerConfig config;
  std::string packer;
  wlb::PackerOptions packer_options;
};

absl::StatusOr<std::vector<int64_t>> ParseThresholds(const std::string& text) {
  std::vector<int64_t> values;
  if (text == "none") return values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--thresholds: '%s' is not an integer token count", std::string(part)));
    }
    values.push_back(v);
  }
  return values;
}

std::string Mega(int64_t tokens) { return absl::StrFormat("%.1fM", tokens / 1e6); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string packer;
  wlb::PackRun run;
  wlb::StreamSummary summary;
  std::vector<wlb::Document> pending;
};

absl::StatusOr<Result> Plan(const std::string& name, const wlb::PackerConfig& config,
                            const wlb::DocumentCost& cost, const wlb::PackerOptions& options,
                            const std::vector<std::vector<wlb::Document>>& arrivals) {
  absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
      wlb::MakePacker(name, config, cost, options);
  if (!packer.ok()) return packer.status();
  absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, arrivals);
  if (!run.ok()) return run.status();
  Result r{.packer = name, .run = *std::move(run)};
  r.summary = wlb::Summarize(r.run.steps, cost, config.max_tokens);
  r.pending = (*packer)->Pending();
  return r;
}

std::string SummaryRow(const Result& r) {
  const wlb::StreamSummary& s = r.summary;
  return absl::StrFormat(
      "| %-13s | %9.3f | %5.3f | %5.3f | %6.3f | %6.3f | %5.2f | %3.0f | %3.0f | %7.3f |\n",
      r.packer, s.imbalance_mean, s.imbalance_p90, s.imbalance_max,
      s.imbalance_mean - s.lower_bound_mean, s.imbalance_mean - s.cap_lower_bound_mean,
      s.delay.mean, s.delay.p99, s.delay.max, Median(r.run.plan_ms));
}

// CP shard plans of every micro-batch of a run (empty when --cp is not given).
struct CpPlans {
  int cp_size = 0;
  std::vector<std::vector<wlb::ShardPlan>> plans;  // [step][micro-batch]
  std::vector<std::vector<wlb::CpBalance>> balance;
  wlb::CpSummary summary;  // over steady steps
};

absl::StatusOr<CpPlans> PlanCp(const Result& r, int cp_size, wlb::ShardStrategy strategy,
                               const wlb::KernelModel& model) {
  CpPlans cp{.cp_size = cp_size};
  for (const wlb::StepPlan& step : r.run.steps) {
    std::vector<wlb::ShardPlan>& plans = cp.plans.emplace_back();
    std::vector<wlb::CpBalance>& balance = cp.balance.emplace_back();
    for (const wlb::MicroBatch& mb : step.micro_batches) {
      absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, cp_size, strategy, model);
      if (!plan.ok()) return plan.status();
      balance.push_back(wlb::MeasureCpBalance(*plan, model));
      if (!step.drain) cp.summary.Add(*plan, balance.back());
      plans.push_back(*std::move(plan));
    }
  }
  return cp;
}

// --estimate: modelled step time of the planned stream and of Plain-4D on the same stream.
struct Estimate {
  wlb::ParallelSizes sizes;
  double seconds = 0.0;           // the chosen packer with --sharding
  double baseline_seconds = 0.0;  // original packing, per-seq CP
  int64_t steps = 0;
};

absl::StatusOr<Estimate> EstimateSteps(const wlb::StepTimeModel& model, wlb::ShardStrategy strategy,
                                       const Result& planned, const Result& baseline) {
  Estimate e{.sizes = model.job().sizes, .steps = static_cast<int64_t>(planned.run.steps.size())};
  absl::StatusOr<double> t = model.StreamSeconds(planned.run.steps, {.candidates = {strategy}});
  if (!t.ok()) return t.status();
  absl::StatusOr<double> b =
      model.StreamSeconds(baseline.run.steps, {.candidates = {wlb::ShardStrategy::kPerSequence}});
  if (!b.ok()) return b.status();
  e.seconds = *t;
  e.baseline_seconds = *b;
  return e;
}

constexpr char kSummaryHeader[] =
    "| packer        | imbalance |   p90 |   max | gap LB | gap CB | delay |  p99 | max | ms/step "
    "|\n"
    "|---------------|-----------|-------|-------|--------|--------|-------|------|-----|---------|"
    "\n";

// The per-step summary of the chosen packer, then its stream summary.
std::string StepTable(const Result& r, const wlb::DocumentCost& cost, int64_t max_tokens) {
  std::string out =
      "\n step | docs |   tokens | tokens per micro-batch (min..max) | imbalance | lower bound | "
      "cap bound | held back\n";
  for (const wlb::StepPlan& s : r.run.steps) {
    int64_t docs = 0, tokens = 0, lo = INT64_MAX, hi = 0;
    for (const wlb::MicroBatch& mb : s.micro_batches) {
      docs += static_cast<int64_t>(mb.documents.size());
      tokens += mb.tokens;
      lo = std::min(lo, mb.tokens);
      hi = std::max(hi, mb.tokens);
    }
    absl::StrAppendFormat(
        &out, "%5d%s | %4d | %8d | %15d..%-16d | %9.3f | %11.3f | %9.3f | %d docs\n", s.step,
        s.drain ? "*" : (s.partial ? "+" : " "), docs, tokens, lo, hi,
        wlb::ImbalanceDegree(s.micro_batches), wlb::LowerBound(s.micro_batches, cost),
        wlb::CapLowerBound(s.micro_batches, cost, max_tokens), s.held_back_documents);
  }
  absl::StrAppend(&out,
                  "(* = drain step after the end of input, + = partial step planned from the "
                  "short last step of the input; both left out of the summary)\n");
  return out;
}

absl::Status WriteOutput(const std::string& text) {
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return absl::OkStatus();
  }
  // Write a sibling temporary file and rename it, so a failure never leaves a partial file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return absl::UnavailableError(absl::StrFormat("cannot write output file '%s'", path));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(absl::StrFormat("cannot write output file '%s'", path));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  wlb::PackerConfig config{.context = absl::GetFlag(FLAGS_context),
                           .micro_batches = absl::GetFlag(FLAGS_micro_batches)};
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max_tokens must be >= 0 (0 = S + S/4), got %d", max_tokens));
  }
  config.max_tokens = max_tokens > 0 ? max_tokens : wlb::DefaultMaxTokens(config.context);
  if (absl::Status s = wlb::ValidateConfig(config); !s.ok()) return s;
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--format must be table or json, got '%s'", format));
  }
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--steps must be >= 0, got %d", steps));
  }
  absl::StatusOr<wlb::ProfileFit> cost = wlb::ResolveCostModel(absl::GetFlag(FLAGS_cost));
  if (!cost.ok()) return cost.status();
  wlb::DocumentCost doc_cost = cost->model;
  if (const std::string profile_cost = absl::GetFlag(FLAGS_profile_cost); profile_cost == "table") {
    if (cost->model.unit != "ms") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--profile-cost table needs a profile CSV in --cost, got the preset '%s'",
                          absl::GetFlag(FLAGS_cost)));
    }
    absl::StatusOr<std::vector<wlb::ProfilePoint>> points =
        wlb::ReadProfileCsv(absl::GetFlag(FLAGS_cost));
    if (!points.ok()) return points.status();
    absl::StatusOr<wlb::TabulatedCost> table = wlb::TabulatedCost::Create(*points);
    if (!table.ok()) return table.status();
    doc_cost = wlb::DocumentCost::From(
        *std::move(table), "ms",
        absl::StrFormat("tile-aware table of %d measured lengths from %s (128-token tiles, "
                        "log-log interpolation)",
                        points->size(), absl::GetFlag(FLAGS_cost)));
  } else if (profile_cost != "fit") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--profile-cost must be fit or table, got '%s'", profile_cost));
  }

  const std::string packer = absl::GetFlag(FLAGS_packer);
  wlb::PackerOptions options{.window = absl::GetFlag(FLAGS_window),
                             .lookahead = absl::GetFlag(FLAGS_lookahead)};
  const std::string thresholds = absl::GetFlag(FLAGS_thresholds);
  if (!thresholds.empty()) {
    absl::StatusOr<std::vector<int64_t>> t = ParseThresholds(thresholds);
    if (!t.ok()) return t.status();
    options.thresholds = *t;
  } else {
    const int queues = absl::GetFlag(FLAGS_queues) < 0 ? 2 : absl::GetFlag(FLAGS_queues);
    if (queues > 16) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--queues must be in [0, 16], got %d", queues));
    }
    options.thresholds = wlb::DefaultThresholds(config.context, queues);
  }
  // Validate the packer and its options before reading any input.
  if (auto p = wlb::MakePacker(packer, config, doc_cost, options); !p.ok()) return p.status();
  const int32_t cp_size = absl::GetFlag(FLAGS_cp);
  if (cp_size == 0 || cp_size < -1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cp must be a context-parallel size >= 1 (omit it for no shard plans), got %d", cp_size));
  }
  absl::StatusOr<wlb::ShardStrategy> strategy =
      wlb::ParseShardStrategy(absl::GetFlag(FLAGS_sharding));
  if (!strategy.ok()) return strategy.status();
  wlb::KernelModel kernel_model = wlb::KernelModel::Default();
  if (const std::string profile = absl::GetFlag(FLAGS_kernel_profile); !profile.empty()) {
    absl::StatusOr<wlb::KernelModel> m = wlb::ReadKernelProfileCsv(profile);
    if (!m.ok()) return m.status();
    kernel_model = *std::move(m);
  }

  std::optional<wlb::StepTimeModel> step_model;
  if (const std::string estimate = absl::GetFlag(FLAGS_estimate); !estimate.empty()) {
    absl::StatusOr<wlb::ParallelSizes> sizes = wlb::ParseParallelSizes(estimate);
    if (!sizes.ok()) return sizes.status();
    if (static_cast<int64_t>(sizes->pp) * sizes->dp != config.micro_batches) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--estimate %s needs --micro-batches = PP x DP = %d, got %d", estimate,
                          static_cast<int64_t>(sizes->pp) * sizes->dp, config.micro_batches));
    }
    if (cp_size > 0 && cp_size != sizes->cp) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--cp %d differs from the CP size %d of --estimate %s", cp_size, sizes->cp, estimate));
    }
    absl::StatusOr<wlb::TransformerShape> shape =
        wlb::FindTransformerShape(absl::GetFlag(FLAGS_cost));
    if (!shape.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--estimate needs a model shape: --cost must be a preset, got '%s' (%s)",
                          absl::GetFlag(FLAGS_cost), shape.status().message()));
    }
    absl::StatusOr<wlb::PipelineJob> job =
        wlb::MakePipelineJob(*shape, *sizes, absl::GetFlag(FLAGS_gemm_tflops));
    if (!job.ok()) return job.status();
    if (!absl::GetFlag(FLAGS_kernel_profile).empty()) job->kernel = kernel_model;
    absl::StatusOr<wlb::StepTimeModel> m = wlb::StepTimeModel::Create(*std::move(job));
    if (!m.ok()) return m.status();
    step_model = *std::move(m);
  }

  absl::StatusOr<wlb::Input> input =
      wlb::LoadInput({.docs = absl::GetFlag(FLAGS_docs),
                      .distribution = absl::GetFlag(FLAGS_distribution),
                      .seed = absl::GetFlag(FLAGS_seed),
                      .steps = steps},
                     config.context, config.micro_batches);
  if (!input.ok()) return input.status();
  const std::vector<std::vector<wlb::Document>>& arrivals = input->steps;

  std::string tune_note;
  if (absl::GetFlag(FLAGS_tune)) {
    if (packer != "wlb" && packer != "wlb-refine" && packer != "wlb-lookahead") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--tune applies to wlb, wlb-refine and wlb-lookahead, not '%s'", packer));
    }
    absl::StatusOr<wlb::TunedThresholds> tuned =
        wlb::TuneThresholds(arrivals, config, doc_cost,
                            {.delay_budget = absl::GetFlag(FLAGS_delay_budget), .packer = packer});
    if (!tuned.ok()) return tuned.status();
    options.thresholds = tuned->thresholds;
    tune_note = absl::StrFormat(" (tuned over %d sets for mean delay <= %g)", tuned->evaluated,
                                absl::GetFlag(FLAGS_delay_budget));
  }

  absl::StatusOr<Result> main = Plan(packer, config, doc_cost, options, arrivals);
  if (!main.ok()) return main.status();
  CpPlans cp;
  if (cp_size > 0) {
    absl::StatusOr<CpPlans> planned = PlanCp(*main, cp_size, *strategy, kernel_model);
    if (!planned.ok()) return planned.status();
    cp = *std::move(planned);
  }

  std::optional<Estimate> estimate;
  if (step_model) {
    absl::StatusOr<Result> baseline =
        packer == "original" ? main : Plan("original", config, doc_cost, options, arrivals);
    if (!baseline.ok()) return baseline.status();
    absl::StatusOr<Estimate> e = EstimateSteps(*step_model, *strategy, *main, *baseline);
    if (!e.ok()) return e.status();
    estimate = *e;
  }

  if (format == "json") {
    nlohmann::json j = wlb::PlanToJson(main->run.steps, main->pending, doc_cost, config.max_tokens);
    for (size_t s = 0; s < cp.plans.size(); ++s) {
      for (size_t m = 0; m < cp.plans[s].size(); ++m) {
        nlohmann::json& mb = j["steps"][s]["micro_batches"][m];
        mb.update(wlb::ShardPlanToJson(cp.plans[s][m]));
        mb["cp_balance"] = wlb::CpBalanceToJson(cp.balance[s][m]);
      }
    }
    nlohmann::json summary = wlb::SummaryToJson(main->summary);
    if (cp_size > 0) {
      summary["cp"] = wlb::CpSummaryToJson(cp.summary);
      summary["cp"]["cp_size"] = cp_size;
      summary["cp"]["sharding"] = absl::GetFlag(FLAGS_sharding);
    }
    if (estimate) {
      summary["estimate"] = {
          {"tp", estimate->sizes.tp},
          {"cp", estimate->sizes.cp},
          {"pp", estimate->sizes.pp},
          {"dp", estimate->sizes.dp},
          {"sharding", absl::GetFlag(FLAGS_sharding)},
          {"gemm_tflops", absl::GetFlag(FLAGS_gemm_tflops)},
          {"steps", estimate->steps},
          {"seconds", estimate->seconds},
          {"baseline_seconds", estimate->baseline_seconds},
          {"speedup", estimate->baseline_seconds / estimate->seconds},
      };
    }
    summary["packer"] = packer;
    summary["context"] = config.context;
    summary["max_tokens"] = config.max_tokens;
    summary["micro_batches"] = config.micro_batches;
    summary["thresholds"] = options.thresholds;
    summary["window"] = options.window;
    summary["cost_model"] = doc_cost.description();
    summary["cost_unit"] = doc_cost.unit();
    summary["documents"] = input->lengths.size();
    summary["tokens"] = wlb::TotalTokens(input->pieces);
    if (absl::GetFlag(FLAGS_timing)) {
      summary["planning_ms_per_step_median"] = Median(main->run.plan_ms);
      double total = 0.0;
      for (double ms : main->run.plan_ms) total += ms;
      summary["planning_ms_total"] = total;
    }
    j["summary"] = std::move(summary);
    return WriteOutput(j.dump(1) + "\n");
  }

  std::string header = absl::StrFormat(
      "wlb-plan: %s: %d documents, %s tokens, %d steps\n"
      "packer %s: S = %d, S_max = %d, N = %d, thresholds = %s%s, window = %d\n"
      "cost: %s\n",
      input->name, input->lengths.size(), Mega(wlb::TotalTokens(input->pieces)), arrivals.size(),
      packer, config.context, config.max_tokens, config.micro_batches,
      options.thresholds.empty() ? "none" : absl::StrJoin(options.thresholds, ","), tune_note,
      options.window, doc_cost.description());
  std::string out = header + StepTable(*main, doc_cost, config.max_tokens);
  absl::StrAppend(
      &out,
      absl::StrFormat("\nsummary over the %d steady steps (%d drain, %d partial left out; "
                      "imbalance = max/mean micro-batch cost; gap LB / gap CB = mean imbalance - "
                      "mean lower bound / cap-aware bound; delay in steps, per token):\n",
                      main->summary.steps, main->summary.drain_steps, main->summary.partial_steps),
      kSummaryHeader);
  std::vector<std::string> compared = {"original", "wlb"};
  if (packer != "original" && packer != "wlb") compared.push_back(packer);
  if (!absl::GetFlag(FLAGS_compare)) compared = {packer};
  for (const std::string& name : compared) {
    if (name == packer) {
      absl::StrAppend(&out, SummaryRow(*main));
      continue;
    }
    absl::StatusOr<Result> other = Plan(name, config, doc_cost, options, arrivals);
    if (!other.ok()) return other.status();
    absl::StrAppend(&out, SummaryRow(*other));
  }
  if (cp_size > 0) {
    const wlb::CpSummary& c = cp.summary;
    absl::StrAppendFormat(
        &out,
        "\nCP shard plans of %s (C = %d, --sharding %s; %d micro-batches: %d per-seq, %d "
        "per-seq-ordered, %d per-doc, %d hybrid):\n"
        "CP imbalance (max/mean over ranks) in causal pairs: mean %.3f, max %.3f; under the kernel "
        "model: mean %.3f, max %.3f; predicted slowest-rank attention %.1f ms in all\n",
        packer, cp_size, absl::GetFlag(FLAGS_sharding), c.micro_batches, c.per_seq,
        c.per_seq_ordered, c.per_doc, c.hybrid, c.pair_imbalance_mean, c.pair_imbalance_max,
        c.model_imbalance_mean, c.model_imbalance_max, c.max_rank_ms_total);
  }
  if (estimate) {
    const Estimate& e = *estimate;
    absl::StrAppendFormat(
        &out,
        "\nEstimated step time (1F1B step-time model, wlb/sim; (TP,CP,PP,DP) = (%d,%d,%d,%d), "
        "%s, linear part at %g TFLOP/s per GPU, attention by the kernel model, drain steps "
        "included):\n"
        "%s with %s CP: %.3f s per step, %.1f s in all\n"
        "Plain-4D (original packing, per-seq CP) on the same stream: %.1f s in all\n"
        "estimated speedup over Plain-4D: %.3fx\n",
        e.sizes.tp, e.sizes.cp, e.sizes.pp, e.sizes.dp, absl::GetFlag(FLAGS_cost),
        absl::GetFlag(FLAGS_gemm_tflops), packer, absl::GetFlag(FLAGS_sharding),
        e.seconds / static_cast<double>(std::max<int64_t>(1, e.steps)), e.seconds,
        e.baseline_seconds, e.baseline_seconds / e.seconds);
  }
  return WriteOutput(out);
}

}  // namespace

// Abseil flag names cannot hold '-', so "--max-tokens=5" is accepted by rewriting it to
// "--max_tokens=5" (only the name, never the value). "--docs -" becomes "--docs=-", which Abseil
// would otherwise question as a value that looks like a flag.
std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a.compare(0, 2, "--") == 0) {
      const size_t end = std::min(a.find('='), a.size());
      std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
      if (end == a.size() && i + 1 < argc && std::string(argv[i + 1]) == "-") {
        a += "=-";
        ++i;
      }
    }
    args.push_back(std::move(a));
  }
  return args;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "plans balanced micro-batches for a document stream; see README.md for the flags");
  std::vector<std::string> args = NormalizeArgs(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "wlb-plan: error: unexpected argument '%s' (inputs go in --docs)\n",
                 rest[1]);
    return 2;
  }
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "wlb-plan: error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
