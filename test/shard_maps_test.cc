// Tests of include/wlb/shard/shard_maps.hpp.
#include "wlb/shard/shard_maps.hpp"

#include <cstdint>
#include <iterator>
#include <random>
#include <span>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace wlb {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::wlb::testing::MakeMicroBatch;

TEST(ShardMapsTest, WorkedExamplePerSequence) {
  // Documents 5, 19, 8 at CP 2: rank 0 holds packed rows [0, 8) and [24, 32).
  const ShardPlan plan = *PlanShards(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy::kPerSequence,
                                     KernelModel::Default());
  const ShardMaps maps = *BuildShardMaps(plan);
  ASSERT_EQ(maps.ranks.size(), 2u);
  EXPECT_THAT(maps.ranks[0].local_to_packed,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31));
  // Rank 0's keys: document 0 [0, 5), document 1's prefix [5, 8), document 2 [24, 32) -- all
  // its own rows, gathered rows 0..15.
  EXPECT_THAT(maps.ranks[0].key_rows,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  EXPECT_EQ(maps.packed_to_gathered[8], 16);  // rank 1's first row
}

TEST(ShardMapsTest, RandomPlansHoldEveryTokenOnceAndFindTheirKeys) {
  std::mt19937_64 rng(7);
  const std::span<const ShardStrategyInfo> strategies = ShardStrategies();
  const int kStrategies = static_cast<int>(strategies.size());
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 10);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 3000);
    const MicroBatch mb = MakeMicroBatch(lengths);
    const int cp = 1 + static_cast<int>(rng() % 8);
    // doc-degree also under a slow link (documents stay whole) and a fast one (sharded).
    const CpPlanOptions options{.comm = {.link_gbps = trial % 3 == 0 ? 0.5 : 4000.0}};
    const ShardPlan plan = *PlanShards(mb, cp, strategies[trial % kStrategies].strategy,
                                       KernelModel::Default(), options);
    absl::StatusOr<ShardMaps> maps = BuildShardMaps(plan);
    ASSERT_TRUE(maps.ok()) << maps.status();
    // The gathered buffer: rank r's local row i at r * rank_capacity + i.
    std::vector<int64_t> gathered(static_cast<size_t>(cp * plan.rank_capacity), -1);
    std::vector<int> held(static_cast<size_t>(mb.tokens), 0);
    for (int r = 0; r < cp; ++r) {
      const RankMaps& m = maps->ranks[static_cast<size_t>(r)];
      ASSERT_EQ(static_cast<int64_t>(m.local_to_packed.size()), plan.ranks[r].tokens);
      for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
        gathered[static_cast<size_t>(r * plan.rank_capacity) + i] = m.local_to_packed[i];
        ++held[static_cast<size_t>(m.local_to_packed[i])];
      }
    }
    for (int h : held) ASSERT_EQ(h, 1) << "trial " << trial;
    for (int64_t p = 0; p < mb.tokens; ++p) {
      ASSERT_EQ(gathered[static_cast<size_t>(maps->packed_to_gathered[p])], p);
    }
    for (int r = 0; r < cp; ++r) {
      const RankMaps& m = maps->ranks[static_cast<size_t>(r)];
      ASSERT_EQ(static_cast<int64_t>(m.key_rows.size()), plan.ranks[r].cu_seqlens_k.back());
      size_t k = 0;
      for (const Segment& s : plan.ranks[r].segments) {
        for (int64_t j = 0; j < s.q_end; ++j, ++k) {
          ASSERT_EQ(gathered[static_cast<size_t>(m.key_rows[k])], s.k_pos + j);
        }
      }
    }
  }
}

TEST(ShardMapsTest, InconsistentPlansAreRejected) {
  const ShardPlan good = *PlanShards(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy::kPerDocument,
                                     KernelModel::Default());
  ShardPlan twice = good;
  twice.ranks[1].segments.push_back(twice.ranks[0].segments[0]);
  twice.rank_capacity += 100;
  EXPECT_THAT(BuildShardMaps(twice).status().message(), HasSubstr("is held by rank 1"));
  ShardPlan missing = good;
  missing.ranks[0].segments.pop_back();
  EXPECT_THAT(BuildShardMaps(missing).status().message(), HasSubstr("held by no rank"));
  ShardPlan outside = good;
  outside.ranks[0].segments[0].k_pos = 40;
  outside.ranks[0].segments[0].q_pos = 40 + outside.ranks[0].segments[0].q_begin;
  EXPECT_THAT(BuildShardMaps(outside).status().message(), HasSubstr("do not lie in the"));
  ShardPlan huge = good;
  huge.rank_capacity = int64_t{1} << 31;
  EXPECT_EQ(BuildShardMaps(huge).status().code(), absl::StatusCode::kOutOfRange);
  ShardPlan small = good;
  small.rank_capacity = 3;
  EXPECT_THAT(BuildShardMaps(small).status().message(), HasSubstr("more than rank_capacity 3"));
  ShardPlan ranks = good;
  ranks.ranks.pop_back();
  EXPECT_THAT(BuildShardMaps(ranks).status().message(), HasSubstr("cp_size 2 and 1 ranks"));
}

// One document of 2^24 tokens at C = 4096: the plan is O(C) segments, but its maps would hold
// about C x tokens = 2^36 key rows; BuildShardMaps refuses them at once, naming the limit.
TEST(ShardMapsTest, MapsOverTheRowLimitAreRefusedBeforeAllocating) {
  const MicroBatch mb = MakeMicroBatch({int64_t{1} << 24});
  const ShardPlan plan =
      *PlanShards(mb, kMaxCpSize, ShardStrategy::kPerDocument, KernelModel::Default());
  ASSERT_EQ(plan.ranks.size(), static_cast<size_t>(kMaxCpSize));
  const absl::StatusOr<ShardMaps> maps = BuildShardMaps(plan);
  EXPECT_EQ(maps.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(maps.status().message(), HasSubstr("kMaxShardMapRows"));
  EXPECT_THAT(maps.status().message(), HasSubstr("16777216 tokens over 4096 ranks"));
  // A smaller one still builds: 2^12 tokens at C = 4096 is about 2^23 key rows.
  const ShardPlan small = *PlanShards(MakeMicroBatch({int64_t{1} << 12}), kMaxCpSize,
                                      ShardStrategy::kPerDocument, KernelModel::Default());
  EXPECT_TRUE(BuildShardMaps(small).ok());
}

}  // namespace
}  // namespace wlb
