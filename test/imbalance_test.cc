// Tests of include/wlb/metrics/imbalance.hpp: balance and delay metrics of packed steps.
#include "wlb/metrics/imbalance.hpp"

#include "gtest/gtest.h"

namespace wlb {
namespace imbalance_test {

MicroBatch Mb(std::vector<int64_t> lengths, int64_t arrival = 0) {
  MicroBatch mb;
  for (int64_t l : lengths) {
    mb.documents.push_back({.length = l, .arrival_step = arrival});
    mb.tokens += l;
    mb.cost += static_cast<double>(l * l);
  }
  return mb;
}

const CostModel kSquares{.attn_quadratic = 1.0};

TEST(ImbalanceDegree, MaxOverMean) {
  const std::vector<MicroBatch> mbs = {Mb({3}), Mb({1}), Mb({1, 1})};  // 9, 1, 2 -> 9 / 4
  EXPECT_DOUBLE_EQ(ImbalanceDegree(mbs), 9.0 / 4.0);
  EXPECT_DOUBLE_EQ(ImbalanceDegree(std::vector<MicroBatch>(3)), 1.0);
}

TEST(LowerBound, HeaviestDocumentOrPerfectSplit) {
  const std::vector<MicroBatch> one_big = {Mb({3}), Mb({1}), Mb({1, 1})};
  EXPECT_DOUBLE_EQ(LowerBound(one_big, kSquares), 9.0 / 4.0);
  const std::vector<MicroBatch> even = {Mb({2, 2}), Mb({1, 1, 1, 1, 1, 1, 1, 1})};
  EXPECT_DOUBLE_EQ(LowerBound(even, kSquares), 1.0);
}

TEST(CapLowerBound, AFullMicroBatchCannotShedItsCompanions) {
  // S_max = 10, 20 tokens in two micro-batches: both hold exactly 10. The one with the 8 must take
  // 2 more tokens, at least the 2 (cost 4): 68 against a mean of 59, which {8, 2} {5, 5} reaches.
  const std::vector<MicroBatch> mbs = {Mb({8, 2}), Mb({5, 5})};
  EXPECT_DOUBLE_EQ(LowerBound(mbs, kSquares), 64.0 / 59.0);
  EXPECT_DOUBLE_EQ(CapLowerBound(mbs, kSquares, 10), 68.0 / 59.0);
  EXPECT_DOUBLE_EQ(ImbalanceDegree(mbs), CapLowerBound(mbs, kSquares, 10));
  // With room to spare the cap binds nothing and the bound is LowerBound().
  EXPECT_DOUBLE_EQ(CapLowerBound(mbs, kSquares, 18), 64.0 / 59.0);
  // Fractional cover: the 7 needs 3 more tokens; the cheapest per token are the 1 (1 per token)
  // and then two tokens of a 4 (4 per token): 49 + 1 + 8 = 58 against a mean of 41 (a formula
  // check: these two micro-batches do not fit a cap of 6, so the bound exceeds their imbalance).
  const std::vector<MicroBatch> parts = {Mb({7, 1}), Mb({4, 4})};
  EXPECT_DOUBLE_EQ(CapLowerBound(parts, kSquares, 6), 58.0 / 41.0);
  EXPECT_DOUBLE_EQ(CapLowerBound(std::vector<MicroBatch>(2), kSquares, 10), 1.0);
}

TEST(TokenDelay, WeightsByTokens) {
  std::vector<StepPlan> steps(2);
  steps[0].step = 0;
  steps[0].micro_batches = {Mb({99}, 0)};
  steps[1].step = 3;
  steps[1].micro_batches = {Mb({1}, 1)};  // 1 token delayed 2 steps
  const DelayStats d = TokenDelay(steps);
  EXPECT_DOUBLE_EQ(d.mean, 2.0 / 100.0);
  EXPECT_DOUBLE_EQ(d.p99, 0.0);
  EXPECT_DOUBLE_EQ(d.max, 2.0);
}

TEST(Summarize, LeavesDrainStepsOut) {
  std::vector<StepPlan> steps(3);
  steps[0].micro_batches = {Mb({2}), Mb({2})};
  steps[1].micro_batches = {Mb({3}), Mb({1})};  // 9 / 5
  steps[2].micro_batches = {Mb({5}), Mb({})};
  steps[2].drain = true;
  const StreamSummary s = Summarize(steps, kSquares);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.drain_steps, 1);
  EXPECT_DOUBLE_EQ(s.imbalance_mean, (1.0 + 9.0 / 5.0) / 2);
  EXPECT_DOUBLE_EQ(s.imbalance_max, 9.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.imbalance_p90, 9.0 / 5.0);
}

TEST(Summarize, LeavesThePartialLastStepOutAndReportsItApart) {
  std::vector<StepPlan> steps(3);
  steps[0].micro_batches = {Mb({2}), Mb({2})};
  steps[1].micro_batches = {Mb({3}), Mb({1})};
  steps[2].micro_batches = {Mb({6}), Mb({})};  // 36 / 18
  steps[2].partial = true;
  const StreamSummary s = Summarize(steps, kSquares, /*max_tokens=*/4);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.partial_steps, 1);
  EXPECT_EQ(s.drain_steps, 0);
  EXPECT_DOUBLE_EQ(s.imbalance_mean, (1.0 + 9.0 / 5.0) / 2);
  EXPECT_DOUBLE_EQ(s.partial_imbalance_max, 2.0);
  EXPECT_GE(s.cap_lower_bound_mean, s.lower_bound_mean);
  EXPECT_LE(s.cap_lower_bound_mean, s.imbalance_mean);
}

TEST(ImbalanceDegree, EmptyAndAllZeroStepsArePerfect) {
  EXPECT_DOUBLE_EQ(ImbalanceDegree(std::vector<MicroBatch>{}), 1.0);
  EXPECT_DOUBLE_EQ(ImbalanceDegree(std::vector<MicroBatch>(4)), 1.0);
  EXPECT_DOUBLE_EQ(LowerBound(std::vector<MicroBatch>{}, kSquares), 1.0);
  EXPECT_DOUBLE_EQ(LowerBound(std::vector<MicroBatch>(3), kSquares), 1.0);
  // One non-empty micro-batch of N carries N times the mean.
  EXPECT_DOUBLE_EQ(ImbalanceDegree(std::vector<MicroBatch>{Mb({4}), Mb({}), Mb({}), Mb({})}), 4.0);
}

TEST(TokenDelay, P99IsTheDelayWhereTheTokensReach99PercentAndNegativeDelaysCount) {
  std::vector<StepPlan> steps(3);
  steps[0].step = 0;
  steps[0].micro_batches = {Mb({97}, 0), Mb({1}, 2)};  // 1 token trained 2 steps early
  steps[1].step = 5;
  steps[1].micro_batches = {Mb({2}, 0)};  // 2 tokens 5 steps late
  steps[2].step = 6;
  const DelayStats d = TokenDelay(steps);
  // Sorted by delay: 1 token at -2, 97 at 0 (98 in all, below 99), 2 at 5 (100).
  EXPECT_DOUBLE_EQ(d.p99, 5.0);
  EXPECT_DOUBLE_EQ(d.max, 5.0);
  EXPECT_DOUBLE_EQ(d.mean, (-2.0 + 10.0) / 100.0);
  const DelayStats none = TokenDelay(std::vector<StepPlan>{});
  EXPECT_DOUBLE_EQ(none.mean, 0.0);
  EXPECT_DOUBLE_EQ(none.max, 0.0);
}

TEST(Summarize, P90IsTheNinthOfTenSortedStepsAndNoCapMeansTheBoundItself) {
  // Step k: micro-batches {k} and {1}: imbalance 2k^2 / (k^2 + 1), increasing in k; in shuffled
  // step order.
  std::vector<StepPlan> steps;
  for (int64_t k : {3, 10, 1, 7, 9, 2, 5, 8, 4, 6}) {
    StepPlan s;
    s.micro_batches = {Mb({k}), Mb({1})};
    steps.push_back(s);
  }
  const StreamSummary s = Summarize(steps, kSquares);
  EXPECT_EQ(s.steps, 10);
  auto imbalance = [](double k) { return 2 * k * k / (k * k + 1); };
  EXPECT_DOUBLE_EQ(s.imbalance_p90, imbalance(9));
  EXPECT_DOUBLE_EQ(s.imbalance_p99, imbalance(10));  // nearest rank: ceil(0.99 x 10) = 10
  EXPECT_DOUBLE_EQ(s.imbalance_max, imbalance(10));
  double mean = 0;
  for (int k = 1; k <= 10; ++k) mean += imbalance(k) / 10;
  EXPECT_NEAR(s.imbalance_mean, mean, 1e-12);
  EXPECT_DOUBLE_EQ(s.cap_lower_bound_mean, s.lower_bound_mean);
  // No steady step: every mean stays at its perfect 1.0.
  std::vector<StepPlan> drained(1);
  drained[0].drain = true;
  drained[0].micro_batches = {Mb({5}), Mb({})};
  const StreamSummary d = Summarize(drained, kSquares);
  EXPECT_EQ(d.steps, 0);
  EXPECT_DOUBLE_EQ(d.imbalance_mean, 1.0);
  EXPECT_DOUBLE_EQ(d.imbalance_max, 1.0);
}

}  // namespace imbalance_test
}  // namespace wlb
