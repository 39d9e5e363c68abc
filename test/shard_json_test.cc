// Tests of include/wlb/shard/shard_json.hpp: the keys and values of shard plans and CP balance
// in JSON.
#include "wlb/shard/shard_json.hpp"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace shard_json_test {

using ::testing::HasSubstr;
using ::wlb::testing::MakeMicroBatch;

std::set<std::string> Keys(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  return keys;
}

ShardPlan MustPlan(const MicroBatch& mb, int cp, ShardStrategy s,
                   const KernelModel& model = KernelModel::Default()) {
  absl::StatusOr<ShardPlan> plan = PlanShards(mb, cp, s, model);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : ShardPlan{};
}

TEST(SegmentToJson, HoldsTheSixFieldsOfASegment) {
  const Segment s{
      .id = 4, .piece = 1, .q_begin = 3, .q_end = 9, .doc_index = 2, .q_pos = 17, .k_pos = 14};
  EXPECT_EQ(
      SegmentToJson(s),
      nlohmann::json(
          {{"id", 4}, {"piece", 1}, {"q_begin", 3}, {"q_end", 9}, {"q_pos", 17}, {"k_pos", 14}}));
}

TEST(ShardPlanToJson, EveryRankWithItsArraysMatchesThePlan) {
  const MicroBatch mb = MakeMicroBatch({5, 19, 8});
  for (ShardStrategy strategy : {ShardStrategy("per-seq"), ShardStrategy("per-doc"),
                                 ShardStrategy("hybrid"), ShardStrategy("adaptive")}) {
    const ShardPlan plan = MustPlan(mb, 2, strategy);
    const nlohmann::json j = ShardPlanToJson(plan);
    EXPECT_EQ(Keys(j), (std::set<std::string>{"sharding", "requested_sharding", "cp_size",
                                              "rank_capacity", "padding_tokens", "shards"}));
    EXPECT_EQ(j.at("sharding"), std::string(ShardStrategyName(plan.strategy)));
    EXPECT_EQ(j.at("requested_sharding"), std::string(ShardStrategyName(strategy)));
    EXPECT_EQ(j.at("cp_size"), 2);
    EXPECT_EQ(j.at("rank_capacity"), plan.rank_capacity);
    EXPECT_EQ(j.at("padding_tokens"), plan.padding_tokens());
    ASSERT_EQ(j.at("shards").size(), plan.ranks.size());
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      const nlohmann::json& shard = j.at("shards")[r];
      const RankShard& rank = plan.ranks[r];
      EXPECT_EQ(Keys(shard),
                (std::set<std::string>{"rank", "segments", "cu_seqlens_q", "cu_seqlens_k",
                                       "max_seqlen_q", "max_seqlen_k", "tokens", "causal_pairs"}));
      EXPECT_EQ(shard.at("rank"), static_cast<int>(r));
      EXPECT_EQ(shard.at("cu_seqlens_q").get<std::vector<int32_t>>(), rank.cu_seqlens_q);
      EXPECT_EQ(shard.at("cu_seqlens_k").get<std::vector<int32_t>>(), rank.cu_seqlens_k);
      EXPECT_EQ(shard.at("max_seqlen_q"), rank.max_seqlen_q);
      EXPECT_EQ(shard.at("max_seqlen_k"), rank.max_seqlen_k);
      EXPECT_EQ(shard.at("tokens"), rank.tokens);
      EXPECT_EQ(shard.at("causal_pairs"), rank.causal_pairs);
      ASSERT_EQ(shard.at("segments").size(), rank.segments.size());
      for (size_t s = 0; s < rank.segments.size(); ++s) {
        EXPECT_EQ(shard.at("segments")[s], SegmentToJson(rank.segments[s]));
      }
    }
  }
}

TEST(CpBalanceToJson, HoldsEveryField) {
  const CpBalance b{.pair_imbalance = 1.5,
                    .model_imbalance = 1.25,
                    .max_rank_pairs = 184,
                    .max_rank_ms = 0.75,
                    .mean_rank_ms = 0.5};
  EXPECT_EQ(CpBalanceToJson(b), nlohmann::json({{"pair_imbalance", 1.5},
                                                {"model_imbalance", 1.25},
                                                {"max_rank_pairs", 184},
                                                {"max_rank_ms", 0.75},
                                                {"mean_rank_ms", 0.5}}));
}

TEST(CpSummaryToJson, NewerStrategyCountsAppearOnlyWhenNonZero) {
  CpSummary s;
  s.micro_batches = 3;
  s.planned[ShardStrategy("per-seq").row()] = 1;
  s.planned[ShardStrategy("per-doc").row()] = 2;
  s.pair_imbalance_mean = 1.125;
  s.max_rank_ms_total = 2.5;
  const nlohmann::json j = CpSummaryToJson(s);
  EXPECT_EQ(Keys(j), (std::set<std::string>{"micro_batches", "per_seq", "per_seq_ordered",
                                            "per_doc", "hybrid", "cp_pair_imbalance_mean",
                                            "cp_pair_imbalance_max", "cp_model_imbalance_mean",
                                            "cp_model_imbalance_max", "max_rank_ms_total"}));
  EXPECT_EQ(j.at("per_doc"), 2);
  EXPECT_EQ(j.at("cp_pair_imbalance_mean"), 1.125);
  EXPECT_EQ(j.at("max_rank_ms_total"), 2.5);
  s.planned[ShardStrategy("te-zigzag").row()] = 4;
  EXPECT_EQ(CpSummaryToJson(s).at("te_zigzag"), 4);
  EXPECT_FALSE(CpSummaryToJson(s).contains("doc_degree"));
  s.planned[ShardStrategy("doc-degree").row()] = 1;
  EXPECT_EQ(CpSummaryToJson(s).at("doc_degree"), 1);
}

TEST(CpPredictionToJson, MaxRankPairsIsTheLargestRanksOrZero) {
  CpPrediction p;
  p.max_ms = 2.0;
  p.attention_max_ms = 1.5;
  p.exchanged_bytes = 1024.0;
  p.max_rank_bytes = 512.0;
  p.allgather_bytes = 4096.0;
  p.allgather_share = 0.25;
  p.exchange = {ExchangeKind::kRowExact, ExchangeKind::kAllGather};
  EXPECT_EQ(CpPredictionToJson(p).at("max_rank_pairs"), 0);
  p.rank_pairs = {7, 31, 12};
  const nlohmann::json j = CpPredictionToJson(p);
  EXPECT_EQ(j, nlohmann::json({{"max_ms", 2.0},
                               {"attention_max_ms", 1.5},
                               {"exchanged_bytes", 1024.0},
                               {"max_rank_bytes", 512.0},
                               {"allgather_bytes", 4096.0},
                               {"allgather_share", 0.25},
                               {"exchange", {"row-exact", "all-gather"}},
                               {"max_rank_pairs", 31}}));
  // A real plan: the pairs of a causal plan are its ranks' causal pairs.
  const ShardPlan plan = MustPlan(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy("per-seq"));
  const nlohmann::json real = CpPredictionToJson(PredictCp(plan, KernelModel::Default()));
  EXPECT_EQ(real.at("max_rank_pairs"), 184);  // the worked example's rank 1
}

TEST(ShardPlanTest, JsonShape) {
  const MicroBatch mb = MakeMicroBatch({5, 19, 8});
  const nlohmann::json j = ShardPlanToJson(MustPlan(mb, 2, ShardStrategy("per-doc")));
  EXPECT_EQ(j.at("sharding"), "per-doc");
  EXPECT_EQ(j.at("cp_size"), 2);
  ASSERT_EQ(j.at("shards").size(), 2u);
  const nlohmann::json& s0 = j.at("shards")[0];
  EXPECT_EQ(s0.at("rank"), 0);
  EXPECT_EQ(s0.at("cu_seqlens_q"), nlohmann::json({0, 2, 6, 8, 9, 14, 16}));
  EXPECT_EQ(s0.at("cu_seqlens_k"), nlohmann::json({0, 2, 6, 8, 13, 32, 40}));
  const nlohmann::json& seg = s0.at("segments")[4];
  EXPECT_EQ(seg.at("id"), 1);
  EXPECT_EQ(seg.at("piece"), 0);
  EXPECT_EQ(seg.at("q_begin"), 14);
  EXPECT_EQ(seg.at("q_end"), 19);
  EXPECT_EQ(seg.at("q_pos"), 19);
  EXPECT_EQ(seg.at("k_pos"), 5);
  nlohmann::json mb_json = {{"tokens", 32}};
  mb_json.update(j);
  EXPECT_EQ(mb_json.at("tokens"), 32);
  EXPECT_EQ(mb_json.at("sharding"), "per-doc");
  const nlohmann::json b = CpBalanceToJson(
      MeasureCpBalance(MustPlan(mb, 2, ShardStrategy("per-seq")), KernelModel::Default()));
  EXPECT_TRUE(b.contains("pair_imbalance") && b.contains("model_imbalance"));
}

}  // namespace shard_json_test
}  // namespace wlb
