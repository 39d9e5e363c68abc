// Step-time model: how long a training step of packed micro-batches takes on a 4D-parallel job.
//
//   absl::StatusOr<wlb::PipelineJob> job = wlb::MakePipelineJob(*wlb::FindTransformerShape(
//                                                               "llama2-7b"), {8, 2, 4, 1});
//   absl::StatusOr<wlb::StepTimeModel> model = wlb::StepTimeModel::Create(*job);
//   absl::StatusOr<double> seconds = model->StepSeconds(step_plan, {ShardStrategy("adaptive")});
//
//   // Measured per-micro-batch stage latencies instead of the model (seconds):
//   absl::StatusOr<double> measured = wlb::SimulateStep(stage_times, /*pp=*/4, /*dp=*/1);
//
// Schedule. A step's M micro-batches are split over the DP ranks in consecutive blocks (rank r
// runs micro-batches [r*M/DP, (r+1)*M/DP)); each DP rank runs its block through a PP-stage 1F1B
// schedule: stage s does min(PP-s-1, m) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. A stage starts an operation when it is free and
// its input is ready (the previous stage's forward, the next stage's backward; the last stage's
// backward follows its own forward). The step ends when the slowest DP rank's pipeline drains
// (gradient synchronisation at the step end is the same for every packing and is left out, as
// are P2P transfers and the optimizer).
//
// Per-micro-batch stage costs (StepTimeModel; layers split evenly over stages, so a micro-batch
// costs every stage the same):
//  - linear part (projections, MLP): the shape's forward FLOPs (wlb::CostModelFromShape's W_l) /
//    (PP x TP x CP x gemm_tflops), spread evenly over the stage's TP x CP GPUs;
//  - attention: the micro-batch is shard-planned for CP size C (wlb::PlanShards) and each rank's
//    latency of one layer predicted by the job's KernelModel (heads / TP query heads per GPU); the
//    slowest CP rank sets the stage (ranks synchronise at every layer's K/V all-gather), times the
//    stage's layers. With several candidate strategies the one with the fastest slowest rank is
//    used per micro-batch; `at_mean_rank` charges the mean rank instead (no CP imbalance);
//  - backward = backward_linear x linear + backward_attention x attention (defaults 2 and 2.5:
//    attention backward is about 2.5x its forward).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace wlb {

// Forward and backward time (seconds) of one micro-batch on one pipeline stage.
struct StageTimes {
  double forward = 0.0;
  double backward = 0.0;
};

// Largest PP or DP size accepted (bounds the simulation's size).
inline constexpr int kMaxPipelineSize = 4096;

namespace detail {

// Every time >= 0 and finite, and their sum small enough that no schedule of them overflows: a
// makespan is at most PP x the sum of all forward and backward times (every operation of every
// stage one after another), so the sum must stay within DBL_MAX / kMaxPipelineSize; finite times
// whose step time would be infinite are an error naming the micro-batch where the sum overflows.
inline absl::Status CheckStageTimes(std::span<const StageTimes> times) {
  constexpr double kMaxTotal = std::numeric_limits<double>::max() / kMaxPipelineSize;
  double total = 0.0;
  for (size_t k = 0; k < times.size(); ++k) {
    for (auto [name, v] :
         {std::pair{"forward", times[k].forward}, std::pair{"backward", times[k].backward}}) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("micro-batch %d: %s time must be >= 0 and finite, got %g", k, name, v));
      }
      if (v > kMaxTotal - total) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "micro-batch %d: %s time %g brings the step's times to more than %g seconds, where a "
            "step time would overflow",
            k, name, v, kMaxTotal));
      }
      total += v;
    }
  }
  return absl::OkStatus();
}

// Makespan of a 1F1B schedule of checked inputs.
inline double Makespan1F1B(std::span<const StageTimes> mbs, int stages) {
  const int m = static_cast<int>(mbs.size());
  if (m == 0) return 0.0;
  // Each stage's operation order: k >= 0 is the forward of micro-batch k, -(k+1) its backward.
  std::vector<std::vector<int>> order(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - s - 1, m);
    for (int k = 0; k < warmup; ++k) order[s].push_back(k);
    for (int k = warmup; k < m; ++k) {
      order[s].push_back(k);
      order[s].push_back(-(k - warmup + 1));
    }
    for (int k = m - warmup; k < m; ++k) order[s].push_back(-(k + 1));
  }
  constexpr double kUnset = -1.0;
  std::vector<std::vector<double>> fwd_end(static_cast<size_t>(stages),
                                           std::vector<double>(static_cast<size_t>(m), kUnset));
  std::vector<std::vector<double>> bwd_end = fwd_end;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> free_at(static_cast<size_t>(stages), 0.0);
  // Every pass runs at least one operation (1F1B has no circular waits), so this terminates.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < order[s].size()) {
        const int op = order[s][next[s]];
        const int k = op >= 0 ? op : -op - 1;
        const double ready = op >= 0 ? (s == 0 ? 0.0 : fwd_end[s - 1][k])
                                     : (s == stages - 1 ? fwd_end[s][k] : bwd_end[s + 1][k]);
        if (ready == kUnset) break;  // waits for another stage
        const double start = std::max(free_at[s], ready);
        double& end = op >= 0 ? fwd_end[s][k] : bwd_end[s][k];
        end = start + (op >= 0 ? mbs[k].forward : mbs[k].backward);
        free_at[s] = end;
        ++next[s];
        progress = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace detail

// Makespan (seconds) of one pipeline running `micro_batches` in order through `stages` stages
// with 1F1B (see the file comment). Errors name a stage count outside [1, kMaxPipelineSize] or a
// negative / non-finite time.
inline absl::StatusOr<double> Simulate1F1B(std::span<const StageTimes> micro_batches, int stages) {
  if (stages < 1 || stages > kMaxPipelineSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pipeline stages must be in [1, %d], got %d", kMaxPipelineSize, stages));
  }
  if (absl::Status s = detail::CheckStageTimes(micro_batches); !s.ok()) return s;
  return detail::Makespan1F1B(micro_batches, stages);
}

// Time (seconds) of one step of micro-batches: DP rank r runs the r-th block of M / DP
// consecutive micro-batches through a PP-stage 1F1B pipeline; the slowest rank sets the step.
// The times may be measured (a layer runner's per-micro-batch latency x layers per stage) or
// come from StepTimeModel. M must be a multiple of DP.
inline absl::StatusOr<double> SimulateStep(std::span<const StageTimes> micro_batches, int pp,
                                           int dp) {
  if (pp < 1 || pp > kMaxPipelineSize || dp < 1 || dp > kMaxPipelineSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PP and DP must be in [1, %d], got PP %d, DP %d", kMaxPipelineSize, pp, dp));
  }
  if (micro_batches.size() % static_cast<size_t>(dp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a step of %d micro-batches cannot be split evenly over DP = %d ranks",
                        micro_batches.size(), dp));
  }
  if (absl::Status s = detail::CheckStageTimes(micro_batches); !s.ok()) return s;
  const size_t per_rank = micro_batches.size() / static_cast<size_t>(dp);
  double slowest = 0.0;
  for (size_t r = 0; r < static_cast<size_t>(dp); ++r) {
    slowest =
        std::max(slowest, detail::Makespan1F1B(micro_batches.subspan(r * per_rank, per_rank), pp));
  }
  return slowest;
}

// (TP, CP, PP, DP) sizes of a 4D-parallel job.
struct ParallelSizes {
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int dp = 1;
};

// Parses "TP,CP,PP,DP" (four integers >= 1), e.g. "8,2,4,1".
inline absl::StatusOr<ParallelSizes> ParseParallelSizes(std::string_view text) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ',');
  ParallelSizes p;
  int* fields[] = {&p.tp, &p.cp, &p.pp, &p.dp};
  if (parts.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrFormat("parallel sizes %s must be four integers TP,CP,PP,DP (e.g. 8,2,4,1)",
                        QuoteForMessage(text)));
  }
  for (size_t i = 0; i < 4; ++i) {
    if (!absl::SimpleAtoi(parts[i], fields[i]) || *fields[i] < 1 || *fields[i] > kMaxPipelineSize) {
      return absl::InvalidArgumentError(
          absl::StrFormat("parallel sizes %s: %s is not an integer in [1, %d]",
                          QuoteForMessage(text), QuoteForMessage(parts[i]), kMaxPipelineSize));
    }
  }
  return p;
}

// A training job for the step-time model.
struct PipelineJob {
  TransformerShape shape;
  ParallelSizes sizes;
  double gemm_tflops = 500.0;                   // achieved bf16 GEMM TFLOP/s per GPU (linear part)
  KernelModel kernel = KernelModel::Default();  // one layer's attention on one GPU
  double backward_linear = 2.0;                 // backward / forward, linear part
  double backward_attention = 2.5;              // backward / forward, attention
};

// A job whose kernel model is the analytic default for the shape's heads / TP query heads of
// hidden / heads dimensions per GPU. Errors name a bad shape, size or rate.
inline absl::StatusOr<PipelineJob> MakePipelineJob(const TransformerShape& shape,
                                                   const ParallelSizes& sizes,
                                                   double gemm_tflops = 500.0) {
  if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
  if (sizes.tp < 1 || sizes.tp > shape.heads) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TP must be in [1, heads = %d] for '%s', got %d", shape.heads, shape.name, sizes.tp));
  }
  absl::StatusOr<KernelModel> kernel = KernelModel::Analytic(
      {.shape = {.heads = shape.heads / sizes.tp, .head_dim = shape.hidden / shape.heads}});
  if (!kernel.ok()) return kernel.status();
  return PipelineJob{
      .shape = shape, .sizes = sizes, .gemm_tflops = gemm_tflops, .kernel = *std::move(kernel)};
}

// How a micro-batch's attention is split over CP ranks in the model.
struct CpPolicy {
  // Per micro-batch, the candidate whose slowest rank is predicted fastest (one entry: that
  // strategy). Adaptive may be listed: it resolves as PlanShards resolves it.
  std::vector<ShardStrategy> candidates = {ShardStrategy("adaptive")};
  bool at_mean_rank = false;  // charge the mean rank latency (a CP-balanced ideal)
};

// The step-time model of one job (see the file comment); immutable once built.
class StepTimeModel {
 public:
  // Validates the job: sizes in [1, kMaxPipelineSize], rates > 0 and finite, backward factors
  // >= 0 and finite, a valid shape.
  static absl::StatusOr<StepTimeModel> Create(PipelineJob job) {
    const ParallelSizes& p = job.sizes;
    for (auto [name, v] : {std::pair{"TP", p.tp}, std::pair{"CP", p.cp}, std::pair{"PP", p.pp},
                           std::pair{"DP", p.dp}}) {
      if (v < 1 || v > kMaxPipelineSize) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s must be in [1, %d], got %d", name, kMaxPipelineSize, v));
      }
    }
    if (!(job.gemm_tflops > 0.0) || !std::isfinite(job.gemm_tflops)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gemm_tflops must be > 0 and finite, got %g", job.gemm_tflops));
    }
    for (auto [name, v] : {std::pair{"backward_linear", job.backward_linear},
                           std::pair{"backward_attention", job.backward_attention}}) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s must be >= 0 and finite, got %g", name, v));
      }
    }
    absl::StatusOr<CostModel> flops = CostModelFromShape(job.shape);
    if (!flops.ok()) return flops.status();
    return StepTimeModel(std::move(job), *std::move(flops));
  }

  const PipelineJob& job() const { return job_; }

  // Stage times of one micro-batch.
  absl::StatusOr<StageTimes> MicroBatchTimes(const MicroBatch& mb, const CpPolicy& policy) const {
    if (policy.candidates.empty()) {
      return absl::InvalidArgumentError("CP policy lists no candidate sharding strategy");
    }
    const ParallelSizes& p = job_.sizes;
    double linear = 0.0;
    for (const Document& d : mb.documents) linear += flops_.Linear(d.length);
    linear /= static_cast<double>(p.pp) * p.tp * p.cp * job_.gemm_tflops * 1e12;
    double attention_ms = 0.0;  // one layer
    if (!mb.documents.empty()) {
      attention_ms = INFINITY;
      for (ShardStrategy s : policy.candidates) {
        absl::StatusOr<ShardPlan> plan = PlanShards(mb, p.cp, s, job_.kernel);
        if (!plan.ok()) return plan.status();
        const std::vector<double> ms = PredictRankMs(*plan, job_.kernel);
        double rank_ms = 0.0;
        for (double v : ms) {
          rank_ms = policy.at_mean_rank ? rank_ms + v / static_cast<double>(ms.size())
                                        : std::max(rank_ms, v);
        }
        attention_ms = std::min(attention_ms, rank_ms);
      }
    }
    const double attention =
        attention_ms * 1e-3 * static_cast<double>(job_.shape.layers) / static_cast<double>(p.pp);
    return StageTimes{
        .forward = linear + attention,
        .backward = job_.backward_linear * linear + job_.backward_attention * attention};
  }

  // Time of one step; its micro-batch count must be a multiple of DP (normally PP x DP).
  absl::StatusOr<double> StepSeconds(const StepPlan& step, const CpPolicy& policy) const {
    std::vector<StageTimes> times;
    times.reserve(step.micro_batches.size());
    for (const MicroBatch& mb : step.micro_batches) {
      absl::StatusOr<StageTimes> t = MicroBatchTimes(mb, policy);
      if (!t.ok()) return t.status();
      times.push_back(*t);
    }
    return SimulateStep(times, job_.sizes.pp, job_.sizes.dp);
  }

  // Time of a whole packed stream (sum over its steps, drain steps included).
  absl::StatusOr<double> StreamSeconds(std::span<const StepPlan> steps,
                                       const CpPolicy& policy) const {
    double total = 0.0;
    for (const StepPlan& step : steps) {
      absl::StatusOr<double> t = StepSeconds(step, policy);
      if (!t.ok()) return t.status();
      total += *t;
    }
    return total;
  }

 private:
  StepTimeModel(PipelineJob job, CostModel flops)
      : job_(std::move(job)), flops_(std::move(flops)) {}

  PipelineJob job_;
  CostModel flops_;  // forward FLOPs of the shape (its linear part is used)
};

}  // namespace wlb
