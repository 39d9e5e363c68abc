// Tests of include/wlb/shard/row_exchange.hpp.
#include "wlb/shard/row_exchange.hpp"

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace wlb {
namespace row_exchange_test {

using ::testing::ElementsAre;
using ::wlb::testing::MakeMicroBatch;

TEST(RowExchangeTest, WorkedExamplePerDocument) {
  // One document of 8 tokens at CP 2, per-doc: rank 0 holds shards 0 and 3 (rows 0-1, 6-7),
  // rank 1 shards 1 and 2 (rows 2-5). Rank 0's late shard needs rows 2-5 of rank 1; rank 1's
  // shards need rows 0-1 of rank 0.
  const ShardPlan plan =
      *PlanShards(MakeMicroBatch({8}), 2, ShardStrategy("per-doc"), KernelModel::Default());
  const ShardMaps maps = *BuildShardMaps(plan);
  const RowExchange x = BuildRowExchange(maps, plan.rank_capacity);
  ASSERT_EQ(x.ranks.size(), 2u);
  EXPECT_THAT(x.ranks[0].send_rows, ElementsAre(0, 1));
  EXPECT_THAT(x.ranks[0].send_counts, ElementsAre(0, 2));
  EXPECT_THAT(x.ranks[0].recv_counts, ElementsAre(0, 4));
  EXPECT_THAT(x.ranks[1].send_rows, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(x.ranks[1].recv_counts, ElementsAre(2, 0));
  // Rank 0's keys: shard 0 = own rows 0-1; shard 3 = own 0-1, received 4-7 (rank 1's 0-3), own
  // 2-3.
  EXPECT_THAT(x.ranks[0].key_rows, ElementsAre(0, 1, 0, 1, 4, 5, 6, 7, 2, 3));
  EXPECT_EQ(x.ranks[0].buffer_rows(), 8);
  EXPECT_TRUE(x.moves());
}

TEST(RowExchangeTest, RandomPlansMoveExactlyThePlannersRowsAndFindEveryKey) {
  std::mt19937_64 rng(23);
  const auto strategies = ShardStrategy::All();
  const int kStrategies = static_cast<int>(strategies.size());
  for (int trial = 0; trial < 1200; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 8);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 400);
    const MicroBatch mb = MakeMicroBatch(lengths);
    const int cp = 1 + static_cast<int>(rng() % 8);
    const int64_t size = 1 + static_cast<int64_t>(rng() % 300);
    const AttentionMask mask = trial % 3 == 0   ? AttentionMask::Causal()
                               : trial % 3 == 1 ? *AttentionMask::SlidingWindow(size)
                                                : *AttentionMask::ChunkedLocal(size);
    const CpPlanOptions options{.comm = {.link_gbps = trial % 2 == 0 ? 0.5 : 4000.0},
                                .mix = LayerMix{{{mask, 1}}}};
    const ShardPlan plan = *PlanShards(mb, cp, strategies[trial % kStrategies],
                                       KernelModel::Default(), options);
    const ShardMaps maps = *BuildShardMaps(plan, mask);
    const RowExchange x = BuildRowExchange(maps, plan.rank_capacity);
    const std::vector<RankExchange> predicted = ExchangedKvRows(plan, mask);
    ASSERT_EQ(x.ranks.size(), static_cast<size_t>(cp));
    // Run it on token ids: rank r's local row i holds the packed token it holds.
    std::vector<std::vector<int64_t>> sends(static_cast<size_t>(cp));
    for (int r = 0; r < cp; ++r) {
      const RankRowExchange& e = x.ranks[static_cast<size_t>(r)];
      const RankMaps& m = maps.ranks[static_cast<size_t>(r)];
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " rank " << r << " " << mask.Name()
                                        << " " << ShardStrategyName(strategies[trial % kStrategies]));
      EXPECT_EQ(e.tokens, static_cast<int64_t>(m.local_to_packed.size()));
      EXPECT_EQ(e.received(), predicted[static_cast<size_t>(r)].recv_rows);
      EXPECT_EQ(e.sent(), predicted[static_cast<size_t>(r)].send_rows);
      EXPECT_EQ(e.send_counts[static_cast<size_t>(r)], 0);
      EXPECT_EQ(e.recv_counts[static_cast<size_t>(r)], 0);
      for (int32_t row : e.send_rows) {
        ASSERT_GE(row, 0);
        ASSERT_LT(row, e.tokens);
        sends[static_cast<size_t>(r)].push_back(m.local_to_packed[static_cast<size_t>(row)]);
      }
    }
    for (int d = 0; d < cp; ++d) {
      const RankRowExchange& e = x.ranks[static_cast<size_t>(d)];
      const RankMaps& m = maps.ranks[static_cast<size_t>(d)];
      // The all-to-all-v: from every source s, its block for d, in source order.
      std::vector<int64_t> buffer(m.local_to_packed.begin(), m.local_to_packed.end());
      for (int s = 0; s < cp; ++s) {
        const RankRowExchange& src = x.ranks[static_cast<size_t>(s)];
        int64_t offset = 0;
        for (int t = 0; t < d; ++t) offset += src.send_counts[static_cast<size_t>(t)];
        ASSERT_EQ(src.send_counts[static_cast<size_t>(d)], e.recv_counts[static_cast<size_t>(s)]);
        for (int64_t i = 0; i < e.recv_counts[static_cast<size_t>(s)]; ++i) {
          buffer.push_back(sends[static_cast<size_t>(s)][static_cast<size_t>(offset + i)]);
        }
      }
      ASSERT_EQ(static_cast<int64_t>(buffer.size()), e.buffer_rows());
      // Every received row is used, and each key finds the token the all-gather would give it.
      std::vector<bool> used(buffer.size(), false);
      ASSERT_EQ(e.key_rows.size(), m.key_rows.size());
      for (size_t j = 0; j < e.key_rows.size(); ++j) {
        const int32_t g = m.key_rows[j];
        const int owner = static_cast<int>(g / plan.rank_capacity);
        const int64_t token = maps.ranks[static_cast<size_t>(owner)]
                                  .local_to_packed[static_cast<size_t>(g % plan.rank_capacity)];
        ASSERT_EQ(buffer[static_cast<size_t>(e.key_rows[j])], token) << "key " << j;
        used[static_cast<size_t>(e.key_rows[j])] = true;
      }
      for (size_t i = static_cast<size_t>(e.tokens); i < used.size(); ++i) {
        ASSERT_TRUE(used[i]) << "received row " << i << " is never read";
      }
    }
    EXPECT_EQ(x.moves(), std::any_of(predicted.begin(), predicted.end(),
                                     [](const RankExchange& r) { return r.send_rows > 0; }));
  }
}

TEST(RowExchangeTest, SingleRankAndEmptyMicroBatchMoveNothing) {
  for (const auto& [lengths, cp] :
       {std::pair{std::vector<int64_t>{5, 9}, 1}, std::pair{std::vector<int64_t>{}, 4}}) {
    const ShardPlan plan = *PlanShards(MakeMicroBatch(lengths), cp, ShardStrategy("per-doc"),
                                       KernelModel::Default());
    const RowExchange x = BuildRowExchange(*BuildShardMaps(plan), plan.rank_capacity);
    EXPECT_FALSE(x.moves());
    for (const RankRowExchange& r : x.ranks) EXPECT_EQ(r.received(), 0);
  }
}

}  // namespace row_exchange_test
}  // namespace wlb
