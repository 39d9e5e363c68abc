// Tests of include/wlb/shard/shard_metrics.hpp: CP balance of hand-computed shard plans.
#include "wlb/shard/shard_metrics.hpp"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace shard_metrics_test {

using ::testing::ElementsAre;
using ::wlb::testing::MakeMicroBatch;

// A model whose latency is exactly proportional to causal pairs (tile 1, no overheads).
KernelModel PairModel() {
  absl::StatusOr<KernelModel> m = KernelModel::Analytic(
      {.shape = {.tile_q = 1, .tile_k = 1}, .q_half = 0.0, .segment_overhead_ms = 0.0});
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

ShardPlan MustPlan(const MicroBatch& mb, int cp, ShardStrategy s, const KernelModel& model) {
  absl::StatusOr<ShardPlan> plan = PlanShards(mb, cp, s, model);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : ShardPlan{};
}

TEST(MaxOverMean, HandValues) {
  EXPECT_DOUBLE_EQ(MaxOverMean(std::vector<double>{}), 1.0);
  EXPECT_DOUBLE_EQ(MaxOverMean(std::vector<double>{0.0, 0.0}), 1.0);
  EXPECT_DOUBLE_EQ(MaxOverMean(std::vector<double>{5.0}), 1.0);
  EXPECT_DOUBLE_EQ(MaxOverMean(std::vector<double>{1.0, 3.0}), 1.5);
  EXPECT_DOUBLE_EQ(MaxOverMean(std::vector<double>{0.0, 0.0, 0.0, 4.0}), 4.0);
}

// Documents 6 and 2 per sequence at C = 2: 8 tokens in 2C = 4 chunks of 2. Rank 0 takes chunks
// 0 and 3 (queries [0, 2) of document 0 and [0, 2) of document 1: 3 + 3 pairs), rank 1 chunks 1
// and 2 (queries [2, 6) of document 0: 3 + 4 + 5 + 6 = 18 pairs). Max / mean = 18 / 12.
TEST(MeasureCpBalance, PerSequenceHandComputed) {
  const MicroBatch mb = MakeMicroBatch({6, 2});
  const KernelModel model = PairModel();
  const ShardPlan plan = MustPlan(mb, 2, ShardStrategy("per-seq"), model);
  EXPECT_THAT(RankCausalPairs(plan), ElementsAre(6.0, 18.0));
  const CpBalance b = MeasureCpBalance(plan, model);
  EXPECT_DOUBLE_EQ(b.pair_imbalance, 1.5);
  EXPECT_EQ(b.max_rank_pairs, 18);
  // Latency proportional to pairs: the same ratio, and max / mean of the rank latencies.
  EXPECT_DOUBLE_EQ(b.model_imbalance, 1.5);
  EXPECT_GT(b.max_rank_ms, 0.0);
  EXPECT_DOUBLE_EQ(b.max_rank_ms / b.mean_rank_ms, 1.5);
  const std::vector<double> ms = PredictRankMs(plan, model);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_DOUBLE_EQ(b.max_rank_ms, std::max(ms[0], ms[1]));
  EXPECT_DOUBLE_EQ(b.mean_rank_ms, (ms[0] + ms[1]) / 2);
}

// One document of 8 at C = 2 per sequence: rank 0 holds queries [0, 2) and [6, 8) (3 + 15
// pairs), rank 1 [2, 6) (18 pairs): the zigzag balances it exactly.
TEST(MeasureCpBalance, TheZigzagBalancesOneDocument) {
  const KernelModel model = PairModel();
  const ShardPlan plan = MustPlan(MakeMicroBatch({8}), 2, ShardStrategy("per-seq"), model);
  EXPECT_THAT(RankCausalPairs(plan), ElementsAre(18.0, 18.0));
  const CpBalance b = MeasureCpBalance(plan, model);
  EXPECT_DOUBLE_EQ(b.pair_imbalance, 1.0);
  EXPECT_DOUBLE_EQ(b.model_imbalance, 1.0);
  EXPECT_EQ(b.max_rank_pairs, 18);
}

TEST(CpSummary, CountsStrategiesAndKeepsMeansAndMaxima) {
  const KernelModel model = PairModel();
  const MicroBatch mb = MakeMicroBatch({6, 2});
  CpSummary summary;
  const ShardPlan seq = MustPlan(mb, 2, ShardStrategy("per-seq"), model);
  const ShardPlan doc = MustPlan(mb, 2, ShardStrategy("per-doc"), model);
  const ShardPlan hybrid = MustPlan(mb, 2, ShardStrategy("hybrid"), model);
  const CpBalance b1{.pair_imbalance = 1.5, .model_imbalance = 2.0, .max_rank_ms = 3.0};
  const CpBalance b2{.pair_imbalance = 1.0, .model_imbalance = 1.0, .max_rank_ms = 1.0};
  const CpBalance b3{.pair_imbalance = 1.25, .model_imbalance = 1.5, .max_rank_ms = 0.5};
  summary.Add(seq, b1);
  summary.Add(doc, b2);
  summary.Add(hybrid, b3);
  summary.Add(seq, b2);
  EXPECT_EQ(summary.micro_batches, 4);
  EXPECT_EQ(summary.count(ShardStrategy("per-seq")), 2);
  EXPECT_EQ(summary.count(ShardStrategy("per-doc")), 1);
  EXPECT_EQ(summary.count(ShardStrategy("hybrid")), 1);
  EXPECT_EQ(summary.count(ShardStrategy("per-seq-ordered")) +
                summary.count(ShardStrategy("te-zigzag")) +
                summary.count(ShardStrategy("doc-degree")),
            0);
  EXPECT_DOUBLE_EQ(summary.pair_imbalance_mean, (1.5 + 1.0 + 1.25 + 1.0) / 4);
  EXPECT_DOUBLE_EQ(summary.model_imbalance_mean, (2.0 + 1.0 + 1.5 + 1.0) / 4);
  EXPECT_DOUBLE_EQ(summary.pair_imbalance_max, 1.5);
  EXPECT_DOUBLE_EQ(summary.model_imbalance_max, 2.0);
  EXPECT_DOUBLE_EQ(summary.max_rank_ms_total, 3.0 + 1.0 + 0.5 + 1.0);
}

TEST(CpSummary, AnAdaptivePlanCountsAsTheStrategyItChose) {
  const KernelModel model = PairModel();
  const ShardPlan plan = MustPlan(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy("adaptive"), model);
  ASSERT_EQ(plan.requested, ShardStrategy("adaptive"));
  CpSummary summary;
  summary.Add(plan, MeasureCpBalance(plan, model));
  EXPECT_EQ(summary.micro_batches, 1);
  int64_t counted = 0;
  for (ShardStrategy s : ShardStrategy::All()) counted += summary.count(s);
  EXPECT_EQ(counted, 1);
  EXPECT_EQ(summary.count(ShardStrategy("adaptive")), 0);
}

}  // namespace shard_metrics_test
}  // namespace wlb
