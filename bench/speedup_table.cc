// speedup_table: estimated end-to-end step-time speedup of balanced packing (and CP sharding)
// over the original packing, from per-micro-batch costs run through a 1F1B pipeline simulator.
//
//   build/bench/speedup_table --docs ../shared/data/doc_lengths_wlbllm_like.json
//
// The simulator (assumptions, stated once here and in docs/RESULTS.md):
//  - A step is N = PP x DP micro-batches from a packer; DP rank r runs micro-batches
//    [r*PP, (r+1)*PP) through a PP-stage 1F1B schedule (warm-up forwards, one-forward-one-backward,
//    cool-down backwards); a stage starts an operation when the stage is free and its input is
//    ready (the previous stage's forward, the next stage's backward). The step ends when the
//    slowest DP rank's pipeline drains (gradient synchronisation at the step end; its cost is the
//    same for every packing and is left out, as are P2P transfers and the optimizer).
//  - Layers are split evenly over stages, so a micro-batch costs every stage the same.
//  - Linear part (projections, MLP): the cost model's FLOPs / (PP x TP x CP x --tflops), split
//    evenly over the stage's TP x CP GPUs.
//  - Attention: every micro-batch is shard-planned for CP size C (wlb::PlanShards strategies) and
//    each rank's per-layer latency predicted by wlb::KernelModel::Default() (FlashAttention-2-like
//    H100 throughput, tile padding, per-segment overhead) with heads / TP query heads per GPU; the
//    slowest CP rank sets the stage (ranks synchronise at every layer's K/V all-gather), times the
//    stage's layers. "ideal" (a column label says "at mean rank latency") takes the per-document
//    plan's mean rank latency: no CP imbalance, but per-document segment costs.
//  - Backward = 2x the linear part and 2.5x the attention part (REFERENCE.md: attention backward
//    = 2.5x forward).
//  - Speedup = total simulated time of the original packing / that of the method over the same
//    document stream (every method trains every token; drain steps at the end count).
// What it leaves out, and why the estimates are upper-bound-ish: communication that does not
// shrink with balance, memory effects of S_max > S, kernel efficiency differences between short
// and long documents (the FLOP model counts work, not achieved throughput).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/shard/kernel_model.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "document lengths file; empty samples the embedded default distribution. Lengths are "
          "scaled by S / 128K for other context windows, so the shape of the distribution holds");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the embedded distribution");
ABSL_FLAG(int64_t, steps, 100, "steps of input per configuration (>= 1)");
ABSL_FLAG(double, tflops, 500.0, "achieved bf16 GEMM TFLOP/s per GPU for the linear part");
ABSL_FLAG(double, max_tokens_ratio, 1.25, "S_max / S for the variable-length packers (>= 1)");
ABSL_FLAG(int32_t, queues, 2, "WLB outlier-queue levels (default thresholds)");
ABSL_FLAG(std::string, csv, "", "also write table,config,packer,cp,speedup,step_seconds as CSV");

namespace {

// A training job: model, context window and (TP, CP, PP, DP).
struct Job {
  std::string name;
  wlb::TransformerShape shape;
  int64_t context = 131072;
  int tp = 1, cp = 1, pp = 1, dp = 1;
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
      {"550M-64K", Preset("wlb-550m"), k64, 2, 2, 4, 2},
      {"550M-128K", Preset("wlb-550m"), k128, 2, 4, 4, 1},
      {"7B-64K", Preset("llama2-7b"), k64, 4, 2, 4, 1},
      {"7B-128K", Preset("llama2-7b"), k128, 8, 2, 4, 1, 1.33},
      {"30B-64K", Llama30b(), k64, 8, 2, 4, 1},
      {"30B-128K", Llama30b(), k128, 8, 4, 4, 1},
      {"70B-64K", Preset("llama2-70b"), k64, 16, 4, 4, 1},
      {"70B-128K", Preset("llama2-70b"), k128, 16, 4, 4, 1},
  };
}

// Forward and backward stage times (seconds) of one micro-batch.
struct StageTimes {
  double forward = 0.0;
  double backward = 0.0;
};

// How attention is split over the CP ranks of a stage.
enum class Cp { kIdeal, kPerSeq, kPerDoc, kAdaptive };

// The simulator's view of one job: cost model, kernel model and rates.
struct Sim {
  Job job;
  wlb::CostModel cost;
  wlb::KernelModel kernel = wlb::KernelModel::Default();
  double gemm_flops = 0.0;  // per GPU per second
};

absl::StatusOr<StageTimes> MicroBatchStageTimes(const wlb::MicroBatch& mb, const Sim& sim, Cp cp) {
  const Job& job = sim.job;
  double linear = 0.0;
  for (const wlb::Document& d : mb.documents) linear += sim.cost.Linear(d.length);
  linear /= job.pp * job.tp * job.cp * sim.gemm_flops;
  double attention_ms = 0.0;  // one layer, slowest CP rank
  if (!mb.documents.empty()) {
    absl::StatusOr<wlb::AdaptiveChoice> c = wlb::ChooseAdaptive(mb, job.cp, sim.kernel);
    if (!c.ok()) return c.status();
    switch (cp) {
      case Cp::kPerSeq:
        attention_ms = c->per_seq_max_ms;
        break;
      case Cp::kPerDoc:
        attention_ms = c->per_doc_max_ms;
        break;
      case Cp::kAdaptive:
        attention_ms = std::min(c->per_seq_max_ms, c->per_doc_max_ms);
        break;
      case Cp::kIdeal: {
        absl::StatusOr<wlb::ShardPlan> plan =
            wlb::PlanShards(mb, job.cp, wlb::ShardStrategy::kPerDocument, sim.kernel);
        if (!plan.ok()) return plan.status();
        for (double ms : wlb::PredictRankMs(*plan, sim.kernel)) attention_ms += ms / job.cp;
        break;
      }
    }
  }
  const double attention = attention_ms * 1e-3 * job.shape.layers / job.pp;
  return StageTimes{.forward = linear + attention, .backward = 2.0 * linear + 2.5 * attention};
}

// Makespan of a 1F1B schedule of the micro-batches over `stages` stages (see the file comment).
double Pipeline1F1B(const std::vector<StageTimes>& mbs, int stages) {
  const int m = static_cast<int>(mbs.size());
  if (m == 0) return 0.0;
  // Each stage's operation order: +k = forward of micro-batch k, -(k+1) = its backward.
  std::vector<std::vector<int>> order(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - s - 1, m);
    for (int k = 0; k < warmup; ++k) order[s].push_back(k);
    for (int k = warmup; k < m; ++k) {
      order[s].push_back(k);
      order[s].push_back(-(k - warmup + 1));
    }
    for (int k = m - warmup; k < m; ++k) order[s].push_back(-(k + 1));
  }
  const double unset = -1.0;
  std::vector<std::vector<double>> fwd_end(stages, std::vector<double>(m, unset));
  std::vector<std::vector<double>> bwd_end(stages, std::vector<double>(m, unset));
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < order[s].size()) {
        const int op = order[s][next[s]];
        double ready;
        if (op >= 0) {
          ready = s == 0 ? 0.0 : fwd_end[s - 1][op];
        } else {
          const int k = -op - 1;
          ready = s == stages - 1 ? fwd_end[s][k] : bwd_end[s + 1][k];
        }
        if (ready == unset) break;  // waits for another stage
        const double start = std::max(free_at[s], ready);
        if (op >= 0) {
          free_at[s] = fwd_end[s][op] = start + mbs[op].forward;
        } else {
          free_at[s] = bwd_end[s][-op - 1] = start + mbs[-op - 1].backward;
        }
        ++next[s];
        progress = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

// Simulated time of a whole packed stream: per step, the slowest DP rank's pipeline.
absl::StatusOr<double> StreamSeconds(const std::vector<wlb::StepPlan>& steps, const Sim& sim,
                                     Cp cp) {
  const Job& job = sim.job;
  double total = 0.0;
  for (const wlb::StepPlan& step : steps) {
    double slowest = 0.0;
    for (int r = 0; r < job.dp; ++r) {
      std::vector<StageTimes> mbs;
      for (int k = r * job.pp; k < (r + 1) * job.pp; ++k) {
        if (k >= static_cast<int>(step.micro_batches.size())) break;
        absl::StatusOr<StageTimes> t = MicroBatchStageTimes(step.micro_batches[k], sim, cp);
        if (!t.ok()) return t.status();
        mbs.push_back(*t);
      }
      slowest = std::max(slowest, Pipeline1F1B(mbs, job.pp));
    }
    total += slowest;
  }
  return total;
}

// A column: a packer and a CP sharding. The first column is the baseline (Plain-4D).
struct Method {
  std::string label;
  std::string packer;
  wlb::PackerOptions options;
  Cp cp;
};

struct JobResult {
  std::vector<double> seconds;  // per method, the first being the original packing
  std::vector<double> work;     // total forward FLOPs per method (the original cuts documents)
  int64_t steps = 0;
};

absl::StatusOr<JobResult> RunJob(const Job& job, const std::vector<int64_t>& base_lengths,
                                 const std::vector<Method>& methods) {
  absl::StatusOr<wlb::CostModel> cost = wlb::CostModelFromShape(job.shape);
  if (!cost.ok()) return cost.status();
  // The attention kernel sees heads / TP query heads of hidden / heads dimensions per GPU.
  absl::StatusOr<wlb::KernelModel> kernel = wlb::KernelModel::Analytic(
      {.shape = {.heads = std::max<int64_t>(1, job.shape.heads / job.tp),
                 .head_dim = job.shape.hidden / job.shape.heads}});
  if (!kernel.ok()) return kernel.status();
  const Sim sim{.job = job,
                .cost = *cost,
                .kernel = *kernel,
                .gemm_flops = absl::GetFlag(FLAGS_tflops) * 1e12};
  wlb::PackerConfig config{
      .context = job.context,
      .max_tokens = static_cast<int64_t>(
          std::llround(job.context * absl::GetFlag(FLAGS_max_tokens_ratio))),
      .micro_batches = job.pp * job.dp};
  std::vector<int64_t> lengths = base_lengths;
  for (int64_t& l : lengths) {
    l = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(l) * job.context / 131072));
  }
  absl::StatusOr<std::vector<wlb::Document>> pieces = wlb::MakeDocuments(lengths, job.context);
  if (!pieces.ok()) return pieces.status();
  const int64_t step_tokens = job.context * config.micro_batches;
  absl::StatusOr<std::vector<std::vector<wlb::Document>>> split =
      wlb::SplitIntoSteps(*pieces, step_tokens);
  if (!split.ok()) return split.status();
  std::vector<std::vector<wlb::Document>> arrivals = *std::move(split);
  const size_t steps = static_cast<size_t>(absl::GetFlag(FLAGS_steps));
  if (arrivals.size() > steps) arrivals.resize(steps);
  if (arrivals.size() < steps) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s: the input holds only %d steps of %d tokens, --steps asks for %d", job.name,
        arrivals.size(), step_tokens, steps));
  }
  JobResult result;
  result.steps = static_cast<int64_t>(arrivals.size());
  std::map<std::string, wlb::PackRun> runs;  // one packing per packer, shared by CP columns
  for (const Method& m : methods) {
    wlb::PackerOptions options = m.options;
    if (m.packer == "wlb" || m.packer == "wlb-refine") {
      options.thresholds = wlb::DefaultThresholds(job.context, absl::GetFlag(FLAGS_queues));
    }
    if (!runs.count(m.packer)) {
      absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
          wlb::MakePacker(m.packer, config, *cost, options);
      if (!packer.ok()) return packer.status();
      absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, arrivals);
      if (!run.ok()) return run.status();
      runs[m.packer] = *std::move(run);
    }
    const wlb::PackRun& run = runs[m.packer];
    absl::StatusOr<double> seconds = StreamSeconds(run.steps, sim, m.cp);
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
  return absl::StrFormat("(%d,%d,%d,%d)", j.tp, j.cp, j.pp, j.dp);
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_steps) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps must be >= 1, got %d", absl::GetFlag(FLAGS_steps)));
  }
  if (!(absl::GetFlag(FLAGS_tflops) > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--tflops must be > 0, got %g", absl::GetFlag(FLAGS_tflops)));
  }
  if (!(absl::GetFlag(FLAGS_max_tokens_ratio) >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_tokens_ratio must be >= 1, got %g", absl::GetFlag(FLAGS_max_tokens_ratio)));
  }
  if (absl::GetFlag(FLAGS_queues) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--queues must be >= 0, got %d", absl::GetFlag(FLAGS_queues)));
  }
  // The largest job needs steps x N x 160K tokens (N = 8 for 550M-64K).
  std::string source = absl::GetFlag(FLAGS_docs);
  std::vector<int64_t> lengths;
  if (source.empty()) {
    lengths = wlb::SampleDefaultLengths(
        (absl::GetFlag(FLAGS_steps) + 1) * 8 * int64_t{131072} * 2, absl::GetFlag(FLAGS_seed));
    source = absl::StrFormat("embedded default distribution, seed %d", absl::GetFlag(FLAGS_seed));
  } else {
    absl::StatusOr<std::vector<int64_t>> read = wlb::ReadLengthsFile(source);
    if (!read.ok()) return read.status();
    lengths = *std::move(read);
  }
  const std::vector<Method> methods = {
      {"Plain-4D: original, per-seq CP", "original", {}, Cp::kPerSeq},
      {"original, adaptive CP", "original", {}, Cp::kAdaptive},
      {"Fixed-4D: fixed-length greedy, per-seq CP", "fixed-greedy", {.window = 1}, Cp::kPerSeq},
      {"WLB packing, per-seq CP", "wlb", {}, Cp::kPerSeq},
      {"WLB-LLM: WLB packing, adaptive CP", "wlb", {}, Cp::kAdaptive},
      {"wlb-refine, adaptive CP", "wlb-refine", {}, Cp::kAdaptive},
      {"wlb-refine, per-doc CP at mean rank latency", "wlb-refine", {}, Cp::kIdeal},
  };
  const char* kCpNames[] = {"ideal", "per-seq", "per-doc", "adaptive"};
  const size_t kWlb = 3;  // the WLB packing column, for the FLOPs ratio
  std::vector<std::string> csv;
  std::string header = "| step (s), Plain-4D";
  std::string rule = "|---";
  for (size_t m = 1; m < methods.size(); ++m) {
    header += " | " + methods[m].label;
    rule += "|---";
  }

  std::printf("Estimated speedup over Plain-4D (original packing, per-sequence CP) from a 1F1B "
              "pipeline simulator (assumptions: bench/speedup_table.cc, docs/RESULTS.md). Input: "
              "%s, %d steps per job, S_max = %.2f S, %d queue levels, linear part at %g TFLOP/s "
              "per GPU, attention by wlb::KernelModel::Default().\n\n",
              source.c_str(), absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_max_tokens_ratio),
              absl::GetFlag(FLAGS_queues), absl::GetFlag(FLAGS_tflops));
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
                                    kCpNames[static_cast<int>(methods[m].cp)],
                                    r.seconds[0] / r.seconds[m], r.seconds[m] / r.steps));
    }
    return line;
  };
  const std::vector<Job> jobs = Table1Jobs();
  for (const Job& job : jobs) {
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, lengths, methods);
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

  std::printf("\n7B, (TP,CP,PP,DP) = (8,2,4,1), by context window (document lengths scaled by "
              "S / 128K):\n\n");
  std::printf("| context %s | FLOPs, WLB / original | paper: WLB-LLM over Plain-4D |\n",
              header.c_str());
  std::printf("|---%s|---|---|\n", rule.c_str());
  for (int64_t k : {32, 64, 96, 128, 160}) {
    Job job{absl::StrFormat("7B-%dK", k), Preset("llama2-7b"), k * 1024, 8, 2, 4, 1};
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, lengths, methods);
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
  absl::SetProgramUsageMessage(
      "Estimates end-to-end speedup of balanced packing with a 1F1B pipeline simulator.");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "speedup_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
