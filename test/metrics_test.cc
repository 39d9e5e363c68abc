#include "wlb/metrics/imbalance.hpp"

#include "gtest/gtest.h"

namespace wlb {
namespace {

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

}  // namespace
}  // namespace wlb
