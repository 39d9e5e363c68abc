// Tests of include/wlb/wlb.hpp: the umbrella header alone reaches every public header (the ones
// it names and the ones they include: limits, read_file, argmin_tree), and the pieces work
// together end to end.
#include "wlb/wlb.hpp"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace wlb {
namespace wlb_test {

TEST(Umbrella, EveryHeaderIsReachableAndThePiecesWorkTogether) {
  // Transitively included headers.
  static_assert(kMaxContext * kMaxMicroBatches == int64_t{1} << 36);      // core/limits.hpp
  EXPECT_FALSE(ReadInputFile("/no/such/wlb/file", "lengths file").ok());  // io/read_file.hpp
  detail::ArgminTree<int64_t> tree(3, 5);                                 // pack/argmin_tree.hpp
  tree.Set(2, 1);
  EXPECT_EQ(tree.Min(), 2u);
  // Sample, pack with every packer, summarize, shard a micro-batch and write JSON.
  const PackerConfig config{.context = 8192, .max_tokens = 10240, .micro_batches = 4};
  const std::vector<int64_t> lengths = SampleDefaultLengths(int64_t{6} * 4 * 8192, 1);
  auto arrivals = SplitIntoSteps(*MakeDocuments(lengths, config.context), 4 * 8192);
  ASSERT_TRUE(arrivals.ok());
  const CostModel cost = *CostModelFromPreset("llama2-7b");
  for (const char* name : kPackerNames) {
    auto packer = MakePacker(name, config, cost, {.thresholds = DefaultThresholds(8192, 2)});
    ASSERT_TRUE(packer.ok()) << name;
    auto run = RunPacker(**packer, *arrivals);
    ASSERT_TRUE(run.ok()) << name;
    ASSERT_FALSE(run->steps.empty());
    const StreamSummary summary = Summarize(run->steps, cost, config.max_tokens);
    EXPECT_GE(summary.imbalance_mean, 1.0) << name;
    const nlohmann::json j = PlanToJson(run->steps, (*packer)->Pending(), cost);
    EXPECT_EQ(j.at("steps").size(), run->steps.size());
    const MicroBatch& mb = run->steps[0].micro_batches[0];
    if (mb.tokens == 0) continue;
    auto plan = PlanShards(mb, 2, ShardStrategy::kAdaptive, KernelModel::Default());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(ValidateShardPlan(*plan, mb).ok());
    EXPECT_EQ(ShardPlanToJson(*plan).at("cp_size"), 2);
    EXPECT_GE(MeasureCpBalance(*plan, KernelModel::Default()).pair_imbalance, 1.0);
  }
}

}  // namespace wlb_test
}  // namespace wlb
