// Tests of include/wlb/sim/dp_assign.hpp: properties over seeded random steps (each micro-batch
// once, M / DP per rank, never slower than round-robin, the reported time is the simulated one,
// deterministic), a case where round-robin is clearly beaten, a planned step through the model,
// and bad inputs.
#include "wlb/sim/dp_assign.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/io/input.hpp"
#include "wlb/pack/make_packer.hpp"

namespace wlb {
namespace dp_assign_test {

using ::testing::HasSubstr;

std::vector<StageTimes> RandomTimes(std::mt19937_64& rng, int m) {
  // Heavy-tailed micro-batch costs, as packed long-context steps have.
  std::lognormal_distribution<double> cost(0.0, 1.0);
  std::vector<StageTimes> times;
  for (int k = 0; k < m; ++k) {
    const double f = cost(rng);
    times.push_back({f, f * (1.5 + static_cast<double>(rng() % 100) / 100.0)});
  }
  return times;
}

double SlowestRank(const std::vector<StageTimes>& times, const DpAssignment& a, int pp) {
  double slowest = 0.0;
  for (const std::vector<int>& rank : a.ranks) {
    std::vector<StageTimes> run;
    for (int k : rank) run.push_back(times[static_cast<size_t>(k)]);
    absl::StatusOr<double> t = Simulate1F1B(run, pp);
    EXPECT_TRUE(t.ok()) << t.status();
    slowest = std::max(slowest, t.ok() ? *t : 0.0);
  }
  return slowest;
}

TEST(AssignDpRanksTest, PropertiesOverRandomSteps) {
  std::mt19937_64 rng(20261123);
  int beaten = 0, cases = 0;
  const int trials = testing::PropertyIterations(300);
  for (int trial = 0; trial < trials; ++trial) {
    const int pp = 1 + static_cast<int>(rng() % 6);
    const int dp = 1 + static_cast<int>(rng() % 6);
    const int per_rank = 1 + static_cast<int>(rng() % 2 == 0 ? pp - 1 : rng() % 8);
    const std::vector<StageTimes> times = RandomTimes(rng, per_rank * dp);
    absl::StatusOr<DpAssignment> a = AssignDpRanks(times, pp, dp);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->ranks.size(), static_cast<size_t>(dp));
    std::vector<int> seen(times.size(), 0);
    for (const std::vector<int>& rank : a->ranks) {
      EXPECT_EQ(rank.size(), static_cast<size_t>(per_rank));
      for (int k : rank) {
        ASSERT_GE(k, 0);
        ASSERT_LT(k, static_cast<int>(times.size()));
        ++seen[static_cast<size_t>(k)];
      }
    }
    EXPECT_THAT(seen, ::testing::Each(1)) << "trial " << trial;
    EXPECT_DOUBLE_EQ(a->step_seconds, SlowestRank(times, *a, pp)) << "trial " << trial;
    DpAssignment round_robin{.ranks = std::vector<std::vector<int>>(static_cast<size_t>(dp))};
    for (int k = 0; k < static_cast<int>(times.size()); ++k) {
      round_robin.ranks[static_cast<size_t>(k % dp)].push_back(k);
    }
    EXPECT_DOUBLE_EQ(a->round_robin_seconds, SlowestRank(times, round_robin, pp));
    EXPECT_LE(a->step_seconds, a->round_robin_seconds) << "trial " << trial;
    absl::StatusOr<DpAssignment> again = AssignDpRanks(times, pp, dp);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->ranks, a->ranks) << "trial " << trial;
    if (dp > 1) {
      ++cases;
      beaten += a->step_seconds < a->round_robin_seconds * 0.999;
    }
  }
  // The search must actually help on heavy-tailed steps, not just fall back to round-robin.
  EXPECT_GT(beaten, cases / 2) << beaten << " of " << cases;
}

TEST(AssignDpRanksTest, SplitsTheHeavyMicroBatchesRoundRobinStacks) {
  // Round-robin puts micro-batches 0 and 2 (both heavy) on rank 0.
  const std::vector<StageTimes> times = {{10, 20}, {1, 2}, {10, 20}, {1, 2}};
  absl::StatusOr<DpAssignment> a = AssignDpRanks(times, /*pp=*/2, /*dp=*/2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ(a->round_robin_seconds, 2 * 30.0 + 30.0);  // (m + p - 1) slots of 30
  EXPECT_LT(a->step_seconds, a->round_robin_seconds);
  for (const std::vector<int>& rank : a->ranks) {
    EXPECT_EQ(std::count_if(rank.begin(), rank.end(), [](int k) { return k % 2 == 0; }), 1);
  }
}

TEST(AssignDpRanksTest, PlannedStepThroughTheModel) {
  absl::StatusOr<TransformerShape> shape = FindTransformerShape("llama2-7b");
  ASSERT_TRUE(shape.ok());
  absl::StatusOr<PipelineJob> job = MakePipelineJob(*shape, {.tp = 8, .cp = 2, .pp = 4, .dp = 2});
  ASSERT_TRUE(job.ok());
  absl::StatusOr<StepTimeModel> model = StepTimeModel::Create(*job);
  ASSERT_TRUE(model.ok());
  absl::StatusOr<Input> input = LoadInput({.steps = 4}, 131072, 8);
  ASSERT_TRUE(input.ok()) << input.status();
  absl::StatusOr<CostModel> cost = CostModelFromShape(*shape);
  ASSERT_TRUE(cost.ok()) << cost.status();
  absl::StatusOr<std::unique_ptr<Packer>> packer =
      MakePacker("wlb", {.context = 131072, .max_tokens = 163840, .micro_batches = 8}, *cost,
                 {.thresholds = DefaultThresholds(131072, 2)});
  ASSERT_TRUE(packer.ok()) << packer.status();
  int steps = 0;
  for (const std::vector<Document>& arrivals : input->steps) {
    absl::StatusOr<std::vector<StepPlan>> ready = (*packer)->Push(arrivals);
    ASSERT_TRUE(ready.ok()) << ready.status();
    for (const StepPlan& step : *ready) {
      absl::StatusOr<DpAssignment> a = AssignStepDpRanks(*model, step, {});
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_LE(a->step_seconds, a->round_robin_seconds);
      EXPECT_GT(a->step_seconds, 0.0);
      ++steps;
    }
  }
  EXPECT_GT(steps, 0);
}

TEST(AssignDpRanksTest, LargeStepsStayWithinTheSearchBudget) {
  std::mt19937_64 rng(3);
  const std::vector<StageTimes> times = RandomTimes(rng, 512);
  absl::StatusOr<DpAssignment> a = AssignDpRanks(times, /*pp=*/64, /*dp=*/4);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_LE(a->step_seconds, a->round_robin_seconds);
  EXPECT_DOUBLE_EQ(a->step_seconds, SlowestRank(times, *a, 64));
  for (const std::vector<int>& rank : a->ranks) EXPECT_EQ(rank.size(), 128u);
}

TEST(AssignDpRanksTest, BadInputsAreErrorsNamingTheValue) {
  const std::vector<StageTimes> times(6, StageTimes{1, 2});
  EXPECT_THAT(AssignDpRanks(times, 0, 2).status().message(), HasSubstr("got PP 0"));
  EXPECT_THAT(AssignDpRanks(times, 2, 5000).status().message(), HasSubstr("DP 5000"));
  EXPECT_THAT(AssignDpRanks(times, 2, 4).status().message(),
              HasSubstr("6 micro-batches cannot be split evenly over DP = 4"));
  std::vector<StageTimes> bad = times;
  bad[3].backward = -1.0;
  EXPECT_THAT(AssignDpRanks(bad, 2, 2).status().message(),
              HasSubstr("micro-batch 3: backward time must be >= 0"));
  absl::StatusOr<DpAssignment> empty = AssignDpRanks({}, 4, 2);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->ranks, std::vector<std::vector<int>>(2));
  EXPECT_EQ(empty->step_seconds, 0.0);
}

// Finite times whose step time would overflow to inf are refused, naming the micro-batch; the
// largest accepted total still gives finite step times at the largest PP.
TEST(AssignDpRanksTest, FiniteTimesThatWouldOverflowAreErrors) {
  const double huge = std::numeric_limits<double>::max() / 4;  // finite, but 4 of them are not
  std::vector<StageTimes> times(4, StageTimes{huge, huge});
  absl::StatusOr<DpAssignment> a = AssignDpRanks(times, 2, 2);
  EXPECT_THAT(a.status().message(), HasSubstr("micro-batch 0: forward time 4.49423e+307 brings"));
  EXPECT_THAT(Simulate1F1B(times, 2).status().message(), HasSubstr("would overflow"));
  const double limit = std::numeric_limits<double>::max() / kMaxPipelineSize;
  times.assign(4, StageTimes{limit / 8, limit / 8});
  a = AssignDpRanks(times, kMaxPipelineSize, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(std::isfinite(a->step_seconds) && std::isfinite(a->round_robin_seconds));
}

}  // namespace dp_assign_test
}  // namespace wlb
