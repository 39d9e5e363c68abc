// Assigning a step's micro-batches to data-parallel ranks under the 1F1B step-time model.
//
//   absl::StatusOr<wlb::DpAssignment> a = wlb::AssignDpRanks(stage_times, /*pp=*/4, /*dp=*/2);
//   // a->ranks[r]: the micro-batch indices DP rank r runs, in the order it runs them
//   // a->step_seconds <= a->round_robin_seconds (micro-batch k on rank k % DP, in order)
//
//   // From a planned step and the step-time model (times from StepTimeModel::MicroBatchTimes):
//   absl::StatusOr<wlb::DpAssignment> b = wlb::AssignStepDpRanks(model, step, policy);
//
// The step ends when the slowest DP rank's 1F1B pipeline drains (wlb/sim/step_time.hpp), so the
// assignment minimises the slowest rank's makespan, not the spread of summed costs. Each rank gets
// exactly M / DP micro-batches (M = the step's count, a multiple of DP; normally PP x DP), so every
// rank runs the same number of forward/backward passes and gradient accumulation stays uniform.
//
// Method (deterministic: ties go to the lower index): longest-processing-time first by a
// micro-batch's forward + backward time onto the rank with the least work and a free slot; then
// pairwise swaps between the slowest rank and any other while the pair's slower makespan drops;
// the run order inside a rank is the best 1F1B makespan over ascending, descending and
// index order, improved by adjacent swaps (a 1F1B pipeline's warm-up and drain expose the first
// and last micro-batches). Round-robin, reordered the same way, is a candidate too, so the result
// is never slower than round-robin under the model. The optional search stops after
// kDpSearchBudget simulated stage operations (only huge PP x M reach it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/step_plan.hpp"
#include "wlb/sim/step_time.hpp"

namespace wlb {

// Micro-batches of one step placed on DP ranks.
struct DpAssignment {
  std::vector<std::vector<int>> ranks;  // ranks[r]: micro-batch indices in run order
  double step_seconds = 0.0;            // slowest rank's 1F1B makespan
  double round_robin_seconds = 0.0;     // micro-batch k on rank k % DP, in index order
};

namespace detail {

inline double RankMakespan(std::span<const StageTimes> times, const std::vector<int>& order,
                           int pp) {
  std::vector<StageTimes> run;
  run.reserve(order.size());
  for (int k : order) run.push_back(times[static_cast<size_t>(k)]);
  return Makespan1F1B(run, pp);
}

inline double Work(const StageTimes& t) { return t.forward + t.backward; }

// Stage operations the optional search (adjacent-swap polishing, swaps between ranks) may
// simulate per assignment: a bound on time for huge PP x M, never reached at usual sizes, and a
// count, not a clock, so results stay deterministic.
inline constexpr int64_t kDpSearchBudget = int64_t{1} << 26;

// Cost of one simulation of `m` micro-batches on `pp` stages, in stage operations.
inline int64_t SimulationCost(size_t m, int pp) { return 2 * static_cast<int64_t>(m) * pp; }

// Reorders `order` (one rank's micro-batches) to a short 1F1B makespan; returns it. With a
// `polish_budget`, adjacent swaps improve the best of the three orders while the budget lasts.
inline double OrderRank(std::span<const StageTimes> times, std::vector<int>& order, int pp,
                        int64_t* polish_budget) {
  std::vector<int> by_index = order;
  std::sort(by_index.begin(), by_index.end());
  std::vector<int> ascending = by_index;
  std::stable_sort(ascending.begin(), ascending.end(),
                   [&](int a, int b) { return Work(times[a]) < Work(times[b]); });
  std::vector<int> descending = by_index;
  std::stable_sort(descending.begin(), descending.end(),
                   [&](int a, int b) { return Work(times[a]) > Work(times[b]); });
  double best = RankMakespan(times, by_index, pp);
  order = by_index;
  for (const std::vector<int>* candidate : {&ascending, &descending}) {
    const double t = RankMakespan(times, *candidate, pp);
    if (t < best) best = t, order = *candidate;
  }
  // Adjacent swaps while they help (at most 8 passes); each accepted swap lowers the makespan.
  bool improved = polish_budget != nullptr;
  for (int pass = 0; improved && pass < 8; ++pass) {
    improved = false;
    for (size_t i = 0; i + 1 < order.size() && *polish_budget > 0; ++i) {
      *polish_budget -= SimulationCost(order.size(), pp);
      std::swap(order[i], order[i + 1]);
      const double t = RankMakespan(times, order, pp);
      if (t < best) {
        best = t;
        improved = true;
      } else {
        std::swap(order[i], order[i + 1]);
      }
    }
  }
  return best;
}

// Orders every rank (polished) and returns the slowest rank's makespan.
inline double OrderAll(std::span<const StageTimes> times, std::vector<std::vector<int>>& ranks,
                       int pp, int64_t& budget) {
  double slowest = 0.0;
  for (std::vector<int>& r : ranks) slowest = std::max(slowest, OrderRank(times, r, pp, &budget));
  return slowest;
}

}  // namespace detail

// Places M micro-batches (their stage times) on `dp` ranks of a `pp`-stage 1F1B pipeline, M / DP
// each, minimising the slowest rank's makespan (see the file comment). Errors name a PP or DP
// outside [1, kMaxPipelineSize], an M that is not a multiple of DP, or a bad time.
inline absl::StatusOr<DpAssignment> AssignDpRanks(std::span<const StageTimes> times, int pp,
                                                  int dp) {
  if (pp < 1 || pp > kMaxPipelineSize || dp < 1 || dp > kMaxPipelineSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PP and DP must be in [1, %d], got PP %d, DP %d", kMaxPipelineSize, pp, dp));
  }
  if (times.size() % static_cast<size_t>(dp) != 0 || times.size() > size_t{kMaxMicroBatches}) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a step of %d micro-batches cannot be split evenly over DP = %d ranks (at most %d "
        "micro-batches)",
        times.size(), dp, kMaxMicroBatches));
  }
  if (absl::Status s = detail::CheckStageTimes(times); !s.ok()) return s;
  const int m = static_cast<int>(times.size());
  const size_t per_rank = static_cast<size_t>(m / dp);
  const size_t ranks = static_cast<size_t>(dp);

  DpAssignment out;
  std::vector<std::vector<int>> round_robin(ranks);
  for (int k = 0; k < m; ++k) round_robin[static_cast<size_t>(k % dp)].push_back(k);
  for (const std::vector<int>& r : round_robin) {
    out.round_robin_seconds = std::max(out.round_robin_seconds, detail::RankMakespan(times, r, pp));
  }

  // Longest processing time first onto the least-loaded rank with a free slot.
  std::vector<int> by_work(static_cast<size_t>(m));
  std::iota(by_work.begin(), by_work.end(), 0);
  std::stable_sort(by_work.begin(), by_work.end(),
                   [&](int a, int b) { return detail::Work(times[a]) > detail::Work(times[b]); });
  std::vector<std::vector<int>> greedy(ranks);
  std::vector<double> load(ranks, 0.0);
  for (int k : by_work) {
    size_t best = ranks;
    for (size_t r = 0; r < ranks; ++r) {
      if (greedy[r].size() < per_rank && (best == ranks || load[r] < load[best])) best = r;
    }
    greedy[best].push_back(k);
    load[best] += detail::Work(times[k]);
  }

  // Swaps between the slowest rank and another while the pair's slower makespan drops.
  std::vector<double> span(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    span[r] = detail::OrderRank(times, greedy[r], pp, nullptr);
  }
  int64_t budget = detail::kDpSearchBudget;
  const int64_t attempt_cost = 6 * detail::SimulationCost(per_rank, pp);  // 3 orders x 2 ranks
  for (int round = 0; round < 4 * m && budget > 0; ++round) {
    const size_t a = static_cast<size_t>(std::max_element(span.begin(), span.end()) - span.begin());
    bool swapped = false;
    for (size_t b = 0; b < ranks && !swapped; ++b) {
      if (b == a) continue;
      for (size_t i = 0; i < greedy[a].size() && !swapped; ++i) {
        for (size_t j = 0; j < greedy[b].size() && !swapped && budget > 0; ++j) {
          budget -= attempt_cost;
          std::vector<int> ra = greedy[a], rb = greedy[b];
          std::swap(ra[i], rb[j]);
          const double ta = detail::OrderRank(times, ra, pp, nullptr);
          const double tb = detail::OrderRank(times, rb, pp, nullptr);
          if (std::max(ta, tb) < span[a]) {
            greedy[a] = std::move(ra), greedy[b] = std::move(rb);
            span[a] = ta, span[b] = tb;
            swapped = true;
          }
        }
      }
    }
    if (!swapped) break;
  }

  // Both candidates get the same polishing budget, so round-robin is never polished less.
  int64_t greedy_budget = std::max<int64_t>(budget, detail::kDpSearchBudget / 2);
  int64_t round_robin_budget = greedy_budget;
  const double greedy_seconds = detail::OrderAll(times, greedy, pp, greedy_budget);
  const double reordered_rr_seconds = detail::OrderAll(times, round_robin, pp, round_robin_budget);
  if (greedy_seconds <= reordered_rr_seconds) {
    out.ranks = std::move(greedy);
    out.step_seconds = greedy_seconds;
  } else {
    out.ranks = std::move(round_robin);
    out.step_seconds = reordered_rr_seconds;
  }
  return out;
}

// AssignDpRanks over the step's micro-batch times under `model` (its job's PP and DP).
inline absl::StatusOr<DpAssignment> AssignStepDpRanks(const StepTimeModel& model,
                                                      const StepPlan& step,
                                                      const CpPolicy& policy) {
  std::vector<StageTimes> times;
  times.reserve(step.micro_batches.size());
  for (const MicroBatch& mb : step.micro_batches) {
    absl::StatusOr<StageTimes> t = model.MicroBatchTimes(mb, policy);
    if (!t.ok()) return t.status();
    times.push_back(*t);
  }
  return AssignDpRanks(times, model.job().sizes.pp, model.job().sizes.dp);
}

}  // namespace wlb
