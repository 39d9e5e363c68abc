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
//  - Layers are split evenly over stages, so a micro-batch costs every stage the same. Forward
//    time = the cost model's FLOPs / (PP x TP x CP x --tflops); backward = 2x the linear part and
//    2.5x the attention part (REFERENCE.md: attention backward = 2.5x forward).
//  - TP and CP divide the linear work evenly. Attention under CP: "ideal" splits it evenly over
//    the CP ranks; the slowest rank sets the stage time (CP ranks synchronise at every layer's
//    all-gather), so an uneven shard plan stretches the stage.
//  - Speedup = total simulated time of the original packing / that of the method over the same
//    document stream (every method trains every token; drain steps at the end count).
// What it leaves out, and why the estimates are upper-bound-ish: communication that does not
// shrink with balance, memory effects of S_max > S, kernel efficiency differences between short
// and long documents (the FLOP model counts work, not achieved throughput).
#include <algorithm>
#include <cmath>
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
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "document lengths file; empty samples the embedded default distribution. Lengths are "
          "scaled by S / 128K for other context windows, so the shape of the distribution holds");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the embedded distribution");
ABSL_FLAG(int64_t, steps, 100, "steps of input per configuration (>= 1)");
ABSL_FLAG(double, tflops, 400.0, "achieved bf16 TFLOP/s per GPU, for absolute step times only");
ABSL_FLAG(double, max_tokens_ratio, 1.25, "S_max / S for the variable-length packers (>= 1)");
ABSL_FLAG(int32_t, queues, 2, "WLB outlier-queue levels (default thresholds)");
ABSL_FLAG(std::string, csv, "", "also write table,config,method,speedup,step_seconds as CSV");

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

StageTimes MicroBatchStageTimes(const wlb::MicroBatch& mb, const wlb::CostModel& cost,
                                const Job& job, double flops_per_gpu) {
  double attention = 0.0, linear = 0.0;
  for (const wlb::Document& d : mb.documents) {
    attention += cost.Attention(d.length);
    linear += cost.Linear(d.length);
  }
  // Ideal CP: attention and linear work both split evenly over TP x CP GPUs of the stage.
  const double scale = 1.0 / (job.pp * job.tp * job.cp * flops_per_gpu);
  return {.forward = (linear + attention) * scale,
          .backward = (2.0 * linear + 2.5 * attention) * scale};
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
double StreamSeconds(const std::vector<wlb::StepPlan>& steps, const wlb::CostModel& cost,
                     const Job& job, double flops_per_gpu) {
  double total = 0.0;
  for (const wlb::StepPlan& step : steps) {
    double slowest = 0.0;
    for (int r = 0; r < job.dp; ++r) {
      std::vector<StageTimes> mbs;
      for (int k = r * job.pp; k < (r + 1) * job.pp; ++k) {
        if (k < static_cast<int>(step.micro_batches.size())) {
          mbs.push_back(MicroBatchStageTimes(step.micro_batches[k], cost, job, flops_per_gpu));
        }
      }
      slowest = std::max(slowest, Pipeline1F1B(mbs, job.pp));
    }
    total += slowest;
  }
  return total;
}

struct Method {
  std::string label;
  std::string packer;
  wlb::PackerOptions options;
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
  std::vector<std::vector<wlb::Document>> arrivals = wlb::SplitIntoSteps(*pieces, step_tokens);
  const size_t steps = static_cast<size_t>(absl::GetFlag(FLAGS_steps));
  if (arrivals.size() > steps) arrivals.resize(steps);
  if (arrivals.size() < steps) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s: the input holds only %d steps of %d tokens, --steps asks for %d", job.name,
        arrivals.size(), step_tokens, steps));
  }
  JobResult result;
  result.steps = static_cast<int64_t>(arrivals.size());
  const double flops = absl::GetFlag(FLAGS_tflops) * 1e12;
  for (const Method& m : methods) {
    wlb::PackerOptions options = m.options;
    if (m.packer == "wlb" || m.packer == "wlb-refine") {
      options.thresholds = wlb::DefaultThresholds(job.context, absl::GetFlag(FLAGS_queues));
    }
    absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
        wlb::MakePacker(m.packer, config, *cost, options);
    if (!packer.ok()) return packer.status();
    absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, arrivals);
    if (!run.ok()) return run.status();
    result.seconds.push_back(StreamSeconds(run->steps, *cost, job, flops));
    double work = 0.0;
    for (const wlb::StepPlan& step : run->steps) {
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
      {"original", "original", {}},
      {"fixed-length greedy", "fixed-greedy", {.window = 1}},
      {"WLB var-len + queues", "wlb", {}},
      {"wlb-refine", "wlb-refine", {}},
  };
  std::vector<std::string> csv;

  std::printf("Estimated speedup over the original packing (1F1B simulator, ideal CP split; "
              "bench/speedup_table.cc states the assumptions). Input: %s, %d steps per job, "
              "S_max = %.2f S, %d queue levels.\n\n",
              source.c_str(), absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_max_tokens_ratio),
              absl::GetFlag(FLAGS_queues));
  std::printf("| job | (TP,CP,PP,DP) | N | step (s), original | fixed-length greedy | WLB var-len + "
              "queues | wlb-refine | paper: WLB-LLM over Plain-4D |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<double> sums(methods.size(), 0.0), sums64(methods.size(), 0.0),
      sums128(methods.size(), 0.0);
  int n64 = 0, n128 = 0;
  const std::vector<Job> jobs = Table1Jobs();
  for (const Job& job : jobs) {
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, lengths, methods);
    if (!r.ok()) return r.status();
    std::string line = absl::StrFormat("| %s | %s | %d | %.2f", job.name, Tuple(job),
                                       job.pp * job.dp, r->seconds[0] / r->steps);
    (job.context == 65536 ? n64 : n128)++;
    for (size_t m = 1; m < methods.size(); ++m) {
      const double speedup = r->seconds[0] / r->seconds[m];
      line += absl::StrFormat(" | %.2fx", speedup);
      sums[m] += speedup;
      (job.context == 65536 ? sums64 : sums128)[m] += speedup;
      csv.push_back(absl::StrFormat("table1,%s,%s,%.4f,%.6g", job.name, methods[m].packer,
                                    speedup, r->seconds[m] / r->steps));
    }
    std::printf("%s | %s |\n", line.c_str(),
                job.paper > 0 ? absl::StrFormat("%.2fx", job.paper).c_str() : "");
  }
  auto average_line = [&](const char* label, const std::vector<double>& s, int n,
                          const char* paper) {
    std::string line = absl::StrFormat("| %s | | | ", label);
    for (size_t m = 1; m < methods.size(); ++m) line += absl::StrFormat(" | %.2fx", s[m] / n);
    std::printf("%s | %s |\n", line.c_str(), paper);
  };
  average_line("average, 64K", sums64, n64, "1.15x");
  average_line("average, 128K", sums128, n128, "1.30x");
  average_line("average", sums, static_cast<int>(jobs.size()), "1.23x");

  std::printf("\n7B, (TP,CP,PP,DP) = (8,2,4,1), by context window:\n\n");
  std::printf("| context | step (s), original | fixed-length greedy | WLB var-len + queues | "
              "wlb-refine | FLOPs, WLB / original | paper: WLB-LLM over Plain-4D |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int64_t k : {32, 64, 96, 128, 160}) {
    Job job{absl::StrFormat("7B-%dK", k), Preset("llama2-7b"), k * 1024, 8, 2, 4, 1};
    std::fprintf(stderr, "speedup_table: %s\n", job.name.c_str());
    absl::StatusOr<JobResult> r = RunJob(job, lengths, methods);
    if (!r.ok()) return r.status();
    std::string line = absl::StrFormat("| %dK | %.2f", k, r->seconds[0] / r->steps);
    for (size_t m = 1; m < methods.size(); ++m) {
      line += absl::StrFormat(" | %.2fx", r->seconds[0] / r->seconds[m]);
      csv.push_back(absl::StrFormat("context,%s,%s,%.4f,%.6g", job.name, methods[m].packer,
                                    r->seconds[0] / r->seconds[m], r->seconds[m] / r->steps));
    }
    const char* paper = k == 160 ? "1.40x" : k == 128 ? "1.33x" : "";
    std::printf("%s | %.3f | %s |\n", line.c_str(), r->work[2] / r->work[0], paper);
  }

  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --csv '%s'", path));
    out << "table,config,method,speedup,step_seconds\n";
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
