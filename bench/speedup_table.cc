// speedup_table: estimated end-to-end step-time speedup of balanced packing (and CP sharding)
// over the original packing, from per-micro-batch costs run through a 1F1B pipeline simulator.
//
//   build/bench/speedup_table --docs ../shared/data/doc_lengths_wlbllm_like.json
//
// The simulator is the library's step-time model (include/wlb/sim/step_time.hpp: 1F1B over
// per-micro-batch stage costs, attention from CP shard plans and wlb::KernelModel; its
// assumptions are stated there and in docs/RESULTS.md). Speedup = total simulated time of the
// original packing / that of the method over the same document stream (every method trains
// every token; drain steps at the end count).
// What it leaves out, and why the estimates are upper-bound-ish: communication that does not
// shrink with balance, memory effects of S_max > S, kernel efficiency differences the kernel
// model does not capture.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench_plan_flags.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/sim/step_time.hpp"
#include "wlb/wlb.hpp"

// Shared flags (bench_plan_flags.hpp): --docs, --distribution, --seed (lengths are scaled by
// S / 128K for other context windows, so the shape of the distribution holds) and --queues.
ABSL_FLAG(int64_t, steps, 100, "steps of input per configuration (>= 1)");
ABSL_FLAG(double, tflops, 500.0, "achieved bf16 GEMM TFLOP/s per GPU for the linear part");
ABSL_FLAG(double, max_tokens_ratio, 1.25, "S_max / S for the variable-length packers (>= 1)");
ABSL_FLAG(std::string, csv, "", "also write table,config,packer,cp,speedup,step_seconds as CSV");
ABSL_FLAG(bool, breakdown, false,
          "print only the attribution table at 7B-128K: every packer (original cutting "
          "documents, original next-fit of whole documents, fixed-greedy, wlb, wlb-refine) with "
          "every CP sharding, with and without document ordering, under the analytic kernel model "
          "and under a FLOP-proportional one (docs/RESULTS.md)");

namespace {

// A training job: model, context window and (TP, CP, PP, DP).
struct Job {
  std::string name;
  wlb::TransformerShape shape;
  int64_t context = 131072;
  wlb::ParallelSizes sizes;
  double paper = 0.0;  // the paper's WLB-LLM speedup over Plain-4D for this job (0: not given)
};

// LLaMA-30B's published shape (the paper's 30B model is LLaMA-like; wlb has no preset for it).
wlb::TransformerShape Llama30b() { return {"llama-30b", 6656, 17920, 52, 52, 60}; }

wlb::TransformerShape Preset(const std::string& name) {
  for (const wlb::TransformerShape& s : wlb::TransformerPresets()) {
    if (s.name == name) return s;
  }
  return Llama30b();
}

// The paper's Table 1 configurations.
std::vector<Job> Table1Jobs() {
  const int64_t k64 = 65536, k128 = 131072;
  return {
      {"550M-64K", Preset("wlb-550m"), k64, {2, 2, 4, 2}},
      {"550M-128K", Preset("wlb-550m"), k128, {2, 4, 4, 1}},
      {"7B-64K", Preset("llama2-7b"), k64, {4, 2, 4, 1}},
      {"7B-128K", Preset("llama2-7b"), k128, {8, 2, 4, 1}, 1.33},
      {"30B-64K", Llama30b(), k64, {8, 2, 4, 1}},
      {"30B-128K", Llama30b(), k128, {8, 4, 4, 1}},
      {"70B-64K", Preset("llama2-70b"), k64, {16, 4, 4, 1}},
      {"70B-128K", Preset("llama2-70b"), k128, {16, 4, 4, 1}},
  };
}

// A column: a packer and a CP sharding. The first column is the baseline (Plain-4D).
struct Method {
  std::string label;
  const char* packer;  // a wlb::kPackers name (wlb::bench::Packer)
  int window = 1;      // fixed-greedy's
  wlb::CpPolicy cp;
  std::string cp_name;         // for the CSV
  bool arrival_order = false;  // shard micro-batches with documents in arrival order (by id)
  bool evened = false;  // every micro-batch of a step costs the step's mean (a packing bound)
};

// Time of a stream whose micro-batches each cost their step's mean: what a perfect
// re-packing of each step's documents (no token moved across steps, none cut) could reach.
absl::StatusOr<double> EvenedStreamSeconds(const wlb::StepTimeModel& sim,
                                           const std::vector<wlb::StepPlan>& steps,
                                           const wlb::CpPolicy& cp) {
  double total = 0.0;
  for (const wlb::StepPlan& step : steps) {
    wlb::StageTimes mean;
    for (const wlb::MicroBatch& mb : step.micro_batches) {
      absl::StatusOr<wlb::StageTimes> t = sim.MicroBatchTimes(mb, cp);
      if (!t.ok()) return t.status();
      mean.forward += t->forward / static_cast<double>(step.micro_batches.size());
      mean.backward += t->backward / static_cast<double>(step.micro_batches.size());
    }
    const std::vector<wlb::StageTimes> evened(step.micro_batches.size(), mean);
    absl::StatusOr<double> t = wlb::SimulateStep(evened, sim.job().sizes.pp, sim.job().sizes.dp);
    if (!t.ok()) return t.status();
    total += *t;
  }
  return total;
}

// The paper's adaptive CP: per micro-batch, per-sequence (micro-batch order) or per-document.
const wlb::CpPolicy kPaperAdaptive = {
    .candidates = {wlb::ShardStrategy("per-seq"), wlb::ShardStrategy("per-doc")}};

struct JobResult {
  std::vector<double> seconds;  // per method, the first being the original packing
  std::vector<double> work;     // total forward FLOPs per method (the original cuts documents)
  int64_t steps = 0;
};

// The same steps with every micro-batch's documents in arrival order (id, then piece).
std::vector<wlb::StepPlan> InArrivalOrder(std::vector<wlb::StepPlan> steps) {
  for (wlb::StepPlan& step : steps) {
    for (wlb::MicroBatch& mb : step.micro_batches) {
      std::sort(mb.documents.begin(), mb.documents.end(),
                [](const wlb::Document& a, const wlb::Document& b) {
                  return std::pair(a.id, a.piece) < std::pair(b.id, b.piece);
                });
    }
  }
  return steps;
}

// `kernel` replaces the job's analytic kernel model when given.
absl::StatusOr<JobResult> RunJob(const Job& job, const wlb::PlanSpec& spec,
                                 const wlb::Lengths& base_lengths,
                                 const std::vector<Method>& methods,
                                 const wlb::KernelModel* kernel = nullptr) {
  absl::StatusOr<wlb::CostModel> cost = wlb::CostModelFromShape(job.shape);
  if (!cost.ok()) return cost.status();
  absl::StatusOr<wlb::PipelineJob> pipeline =
      wlb::MakePipelineJob(job.shape, job.sizes, absl::GetFlag(FLAGS_tflops));
  if (!pipeline.ok()) return pipeline.status();
  if (kernel != nullptr) pipeline->kernel = *kernel;
  absl::StatusOr<wlb::StepTimeModel> sim = wlb::StepTimeModel::Create(*pipeline);
  if (!sim.ok()) return sim.status();
  // The job's plan: --queues (and the spec's other settings) at its S, S_max and N.
  wlb::PlanSpec job_spec = spec;
  job_spec.context = job.context;
  job_spec.max_tokens =
      static_cast<int64_t>(std::llround(job.context * absl::GetFlag(FLAGS_max_tokens_ratio)));
  job_spec.micro_batches = job.sizes.pp * job.sizes.dp;
  const int64_t step_tokens = job.context * job_spec.micro_batches;
  const size_t steps = static_cast<size_t>(absl::GetFlag(FLAGS_steps));
  absl::StatusOr<wlb::Input> input =
      wlb::CutSteps(base_lengths, job.context, job_spec.micro_batches,
                    {.max_steps = absl::GetFlag(FLAGS_steps), .scale_from = 131072});
  if (!input.ok()) return input.status();
  const std::vector<std::vector<wlb::Document>>& arrivals = input->steps;
  if (arrivals.size() < steps) {
    return absl::OutOfRangeError(
        absl::StrFormat("%s: the input holds only %d steps of %d tokens, --steps asks for %d",
                        job.name, arrivals.size(), step_tokens, steps));
  }
  JobResult result;
  result.steps = static_cast<int64_t>(arrivals.size());
  std::map<std::string, wlb::PackRun> runs;  // one packing per packer, shared by CP columns
  for (const Method& m : methods) {
    if (!runs.count(m.packer)) {
      wlb::PlanSpec row = wlb::bench::ForPacker(job_spec, m.packer);
      row.window = m.window;
      absl::StatusOr<wlb::PlanSettings> settings = row.Validate();
      if (!settings.ok()) return settings.status();
      absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
          wlb::MakePacker(settings->packer, settings->config, *cost, settings->options);
      if (!packer.ok()) return packer.status();
      absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, arrivals);
      if (!run.ok()) return run.status();
      runs[m.packer] = *std::move(run);
    }
    const wlb::PackRun& run = runs[m.packer];
    absl::StatusOr<double> seconds = m.evened ? EvenedStreamSeconds(*sim, run.steps, m.cp)
                                     : m.arrival_order
                                         ? sim->StreamSeconds(InArrivalOrder(run.steps), m.cp)
                                         : sim->StreamSeconds(run.steps, m.cp);
    if (!seconds.ok()) return seconds.status();
    result.seconds.push_back(*seconds);
    double work = 0.0;
    for (const wlb::StepPlan& step : run.steps) {
      for (const wlb::MicroBatch& mb : step.micro_batches) work += mb.cost;
    }
    result.work.push_back(work);
  }
  return result;
}

std::string Tuple(const Job& j) {
  return absl::StrFormat("(%d,%d,%d,%d)", j.sizes.tp, j.sizes.cp, j.sizes.pp, j.sizes.dp);
}

// The attribution study at 7B-128K (--breakdown): rows are packers, columns CP shardings.
absl::Status RunBreakdown(const wlb::PlanSpec& spec, const wlb::Lengths& lengths,
                          const std::string& source) {
  using S = wlb::ShardStrategy;
  const wlb::CpPolicy per_seq = {.candidates = {S("per-seq")}};
  struct Column {
    std::string label;
    wlb::CpPolicy cp;
    bool arrival_order = false;
  };
  const std::vector<Column> columns = {
      {"per-seq, packer's order", per_seq},
      {"per-seq, arrival order", per_seq, true},
      {"per-seq-ordered", {.candidates = {S("per-seq-ordered")}}},
      {"per-doc", {.candidates = {S("per-doc")}}},
      {"paper's adaptive (per-seq / per-doc)", kPaperAdaptive},
      {"adaptive over per-seq-ordered / per-doc",
       {.candidates = {S("per-seq-ordered"), S("per-doc")}}},
      {"adaptive (per-seq-ordered / per-doc / hybrid)", {.candidates = {S("adaptive")}}},
      {"per-doc at mean rank (no CP imbalance)",
       {.candidates = {S("per-doc")}, .at_mean_rank = true}},
  };
  struct Row {
    std::string label;
    const char* packer;
    int window = 1;
    bool evened = false;
  };
  const std::vector<Row> rows = {
      {"original (cuts documents at S)", wlb::bench::Packer("original")},
      {"original, micro-batches evened out within each step (bound on re-packing its steps)",
       wlb::bench::Packer("original"), 1, true},
      {"original-nextfit (whole documents)", wlb::bench::Packer("original-nextfit")},
      {"original-nextfit, evened out within each step", wlb::bench::Packer("original-nextfit"), 1,
       true},
      {"fixed-greedy, window 1", wlb::bench::Packer("fixed-greedy"), 1},
      {"wlb (2 queues)", wlb::bench::Packer("wlb")},
      {"wlb-refine (2 queues)", wlb::bench::Packer("wlb-refine")},
  };
  // The baseline (Plain-4D) is the first method: original packing, per-seq CP.
  std::vector<Method> methods = {
      {"Plain-4D", wlb::bench::Packer("original"), 1, per_seq, "per-seq"}};
  for (const Row& r : rows) {
    for (const Column& c : columns) {
      methods.push_back({r.label, r.packer, r.window, c.cp, c.label, c.arrival_order, r.evened});
    }
  }
  const Job job{"7B-128K", Preset("llama2-7b"), 131072, {8, 2, 4, 1}, 1.33};
  absl::StatusOr<wlb::KernelModel> flop_model =
      wlb::KernelModel::Analytic({.shape = {.heads = 4, .head_dim = 128, .tile_q = 1, .tile_k = 1},
                                  .q_half = 0.0,
                                  .segment_overhead_ms = 0.0});
  if (!flop_model.ok()) return flop_model.status();
  std::printf(
      "Attribution at 7B-128K, (TP,CP,PP,DP) = %s: estimated speedup over Plain-4D "
      "(original packing, per-seq CP in the packer's order) of every packer with every CP "
      "sharding, from the library's step-time model (wlb/sim). Input: %s, %d steps, S_max "
      "= %.2f S, %d queue levels, linear part at %g TFLOP/s per GPU. The paper measured "
      "1.28x for WLB packing alone (per-seq CP), 1.05x for adaptive CP alone (original "
      "packing) and 1.33x for both.\n",
      Tuple(job).c_str(), source.c_str(), static_cast<int>(absl::GetFlag(FLAGS_steps)),
      absl::GetFlag(FLAGS_max_tokens_ratio), spec.queues, absl::GetFlag(FLAGS_tflops));
  const std::vector<const wlb::KernelModel*> kernels = {nullptr, &*flop_model};
  for (const wlb::KernelModel* kernel : kernels) {
    std::fprintf(stderr, "speedup_table: breakdown, %s\n", kernel ? "flop model" : "analytic");
    absl::StatusOr<JobResult> r = RunJob(job, spec, lengths, methods, kernel);
    if (!r.ok()) return r.status();
    std::printf("\n%s; step time of Plain-4D %.3f s:\n\n",
                kernel ? "FLOP-proportional kernel model (attention time = causal FLOPs at 345 "
                         "TFLOP/s: no tiles, no short-segment slowdown, no per-segment cost)"
                       : "Analytic kernel model (wlb::KernelModel::Default() shape: 128 x 128 "
                         "tiles, throughput falling below 256 query rows, 1 us per segment)",
                r->seconds[0] / r->steps);
    std::string header = "| packer | FLOPs / original's";
    std::string rule = "|---|---";
    for (const Column& c : columns) {
      header += " | " + c.label;
      rule += "|---";
    }
    std::printf("%s |\n%s|\n", header.c_str(), rule.c_str());
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t first = 1 + i * columns.size();
      std::string line = absl::StrFormat("| %s | %.3f", rows[i].label, r->work[first] / r->work[0]);
      for (size_t c = 0; c < columns.size(); ++c) {
        line += absl::StrFormat(" | %.3fx", r->seconds[0] / r->seconds[first + c]);
      }
      std::printf("%s |\n", line.c_str());
    }
  }
  return absl::OkStatus();
}

absl::Status Run() {
  absl::StatusOr<wlb::bench::BenchPlan> shared = wlb::bench::PlanFromFlags();
  if (!shared.ok()) return shared.status();
  const wlb::PlanSpec& spec = shared->spec;
  // --queues, checked as wlb-plan checks it (the jobs' S, S_max and N are checked per job).
  if (absl::StatusOr<wlb::PlanSettings> s =
          wlb::bench::ForPacker(spec, wlb::bench::Packer("wlb")).Validate();
      !s.ok()) {
    return s.status();
  }
  if (absl::GetFlag(FLAGS_steps) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps must be >= 1, got %d", absl::GetFlag(FLAGS_steps)));
  }
  if (!(absl::GetFlag(FLAGS_tflops) > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--tflops must be > 0, got %g", absl::GetFlag(FLAGS_tflops)));
  }
  if (!(absl::GetFlag(FLAGS_max_tokens_ratio) >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("--max_tokens_ratio must be >= 1, got %g",
                                                      absl::GetFlag(FLAGS_max_tokens_ratio)));
  }
  // The largest job needs steps x N x 160K tokens (N = 8 for 550M-64K).
  absl::StatusOr<wlb::Lengths> lengths =
      wlb::LoadLengths(shared->input, (absl::GetFlag(FLAGS_steps) + 1) * 8 * int64_t{131072} * 2);
  if (!lengths.ok()) return lengths.status();
  const std::string source = lengths->name;
  using S = wlb::ShardStrategy;
  const wlb::CpPolicy per_seq = {.candidates = {S("per-seq")}};
  const wlb::CpPolicy ordered = {.candidates = {S("per-seq-ordered")}};
  const wlb::CpPolicy adaptive = {.candidates = {S("adaptive")}};
  const wlb::CpPolicy ideal = {.candidates = {S("per-doc")}, .at_mean_rank = true};
  if (absl::GetFlag(FLAGS_breakdown)) return RunBreakdown(spec, *lengths, source);
  const std::vector<Method> methods = {
      {"Plain-4D: original, per-seq CP", wlb::bench::Packer("original"), 1, per_seq, "per-seq"},
      {"original, adaptive CP", wlb::bench::Packer("original"), 1, kPaperAdaptive,
       "adaptive-paper"},
      {"Fixed-4D: fixed-length greedy, per-seq CP", wlb::bench::Packer("fixed-greedy"), 1, per_seq,
       "per-seq"},
      {"WLB packing, per-seq CP", wlb::bench::Packer("wlb"), 1, per_seq, "per-seq"},
      {"WLB-LLM: WLB packing, adaptive CP", wlb::bench::Packer("wlb"), 1, kPaperAdaptive,
       "adaptive-paper"},
      {"WLB packing, per-seq-ordered CP", wlb::bench::Packer("wlb"), 1, ordered, "per-seq-ordered"},
      {"wlb-refine, adaptive CP (ordered / per-doc / hybrid)", wlb::bench::Packer("wlb-refine"), 1,
       adaptive, "adaptive"},
      {"wlb-refine, per-doc CP at mean rank latency", wlb::bench::Packer("wlb-refine"), 1, ideal,
       "ideal"},
  };
  const size_t kWlb = 3;  // the WLB packing column, for the FLOPs ratio
  std::vector<std::string> csv;
  std::string header = "| step (s), Plain-4D";
  std::string rule = "|---";
  for (size_t m = 1; m < methods.size(); ++m) {
    header += " | " + methods[m].label;
    rule += "|---";
  }

  std::printf(
      "Estimated speedup over Plain-4D (original packing, per-sequence CP) from a 1F1B "
      "pipeline simulator (wlb/sim/step_time.hpp; assumptions in docs/RESULTS.md). Input: "
      "%s, %d steps per job, S_max = %.2f S, %d queue levels, linear part at %g TFLOP/s "
      "per GPU, attention by wlb::KernelModel::Default().\n\n",
      source.c_str(), absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_max_tokens_ratio),
      spec.queues, absl::GetFlag(FLAGS_tflops));
  std::printf("| job | (TP,CP,PP,DP) %s | paper: WLB-LLM over Plain-4D |\n", header.c_str());
  std::printf("|---|---%s|---|\n", rule.c_str());
  std::vector<double> sums(methods.size(), 0.0), sums64(methods.size(), 0.0),
      sums128(methods.size(), 0.0);
  int n64 = 0, n128 = 0;
  auto record = [&](const char* table, const Job& job, const JobResult& r) {
    std::string line = absl::StrFormat(" | %.2f", r.seconds[0] / r.steps);
    for (size_t m = 1; m < methods.size(); ++m) {
      line += absl::StrFormat(" | %.2fx", r.seconds[0] / r.seconds[m]);
    }
    for (size_t m = 0; m < methods.size(); ++m) {
      csv.push_back(absl::StrFormat("%s,%s,%s,%s,%.4f,%.6g", table, job.name, methods[m].packer,
                                    methods[m].cp_name, r.seconds[0] / r.seconds[m],
                                    r.seconds[m] / r.steps));
    }
    return line;
  };
  const std::vector<Job> jobs = Table1Jobs();
  for (const Job& job : jobs) {
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, spec, *lengths, methods);
    if (!r.ok()) return r.status();
    (job.context == 65536 ? n64 : n128)++;
    for (size_t m = 1; m < methods.size(); ++m) {
      const double speedup = r->seconds[0] / r->seconds[m];
      sums[m] += speedup;
      (job.context == 65536 ? sums64 : sums128)[m] += speedup;
    }
    std::printf("| %s | %s%s | %s |\n", job.name.c_str(), Tuple(job).c_str(),
                record("table1", job, *r).c_str(),
                job.paper > 0 ? absl::StrFormat("%.2fx", job.paper).c_str() : "");
  }
  auto average_line = [&](const char* label, const std::vector<double>& s, int n,
                          const char* paper) {
    std::string line = absl::StrFormat("| %s | | ", label);
    for (size_t m = 1; m < methods.size(); ++m) line += absl::StrFormat(" | %.2fx", s[m] / n);
    std::printf("%s | %s |\n", line.c_str(), paper);
  };
  average_line("average, 64K", sums64, n64, "1.15x");
  average_line("average, 128K", sums128, n128, "1.30x");
  average_line("average", sums, static_cast<int>(jobs.size()), "1.23x");

  std::printf(
      "\n7B, (TP,CP,PP,DP) = (8,2,4,1), by context window (document lengths scaled by "
      "S / 128K):\n\n");
  std::printf("| context %s | FLOPs, WLB / original | paper: WLB-LLM over Plain-4D |\n",
              header.c_str());
  std::printf("|---%s|---|---|\n", rule.c_str());
  for (int64_t k : {32, 64, 96, 128, 160}) {
    Job job{absl::StrFormat("7B-%dK", k), Preset("llama2-7b"), k * 1024, {8, 2, 4, 1}};
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, spec, *lengths, methods);
    if (!r.ok()) return r.status();
    const char* paper = k == 160 ? "1.40x" : k == 128 ? "1.33x" : "";
    std::printf("| %dK%s | %.3f | %s |\n", k, record("context", job, *r).c_str(),
                r->work[kWlb] / r->work[0], paper);
  }

  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --csv '%s'", path));
    out << "table,config,packer,cp,speedup,step_seconds\n";
    for (const std::string& line : csv) out << line << "\n";
    if (!out) return absl::DataLossError(absl::StrFormat("error writing --csv '%s'", path));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  wlb::bench::ParseFlags(
      argc, argv,
      "Estimates end-to-end speedup of balanced packing with a 1F1B pipeline simulator.",
      {"queues"});
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "speedup_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
