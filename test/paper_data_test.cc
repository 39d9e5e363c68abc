// The 7B-128K setting of the paper's Table 2 on the WLB-LLM-like public data (S = 128K, N = 4).
#include <filesystem>

#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace paper_data_test {

TEST(PaperData, WlbTwoLevelsBeatsFixedGreedyAndOriginalByAWideMargin) {
  const std::string path = std::string(WLB_SHARED_DATA_DIR) + "/doc_lengths_wlbllm_like.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "public data not present: " << path;
  auto lengths = ReadLengthsFile(path);
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  const PackerConfig config{.context = 131072, .max_tokens = 163840, .micro_batches = 4};
  const CostModel cost = *CostModelFromPreset("llama2-7b");
  auto pieces = *MakeDocuments(*lengths, config.context);
  auto arrivals = *SplitIntoSteps(pieces, config.context * config.micro_batches);
  ASSERT_GT(arrivals.size(), 700u);

  auto run = [&](const char* name, PackerOptions options) {
    auto packer = *MakePacker(name, config, cost, options);
    auto r = *RunPacker(*packer, arrivals);
    EXPECT_TRUE(testing::CoversExactlyOnce(*lengths, testing::Collect(r.steps)));
    return Summarize(r.steps, cost);
  };
  const StreamSummary original = run("original", {});
  const StreamSummary greedy = run("fixed-greedy", {.window = 1});
  const StreamSummary wlb2 = run("wlb", {.thresholds = DefaultThresholds(config.context, 2)});
  const StreamSummary refine =
      run("wlb-refine", {.thresholds = DefaultThresholds(config.context, 2)});
  std::printf(
      "original %.3f  fixed-greedy(1) %.3f  wlb(2 levels) %.3f (delay %.2f)  "
      "wlb-refine %.3f  lower bound %.3f\n",
      original.imbalance_mean, greedy.imbalance_mean, wlb2.imbalance_mean, wlb2.delay.mean,
      refine.imbalance_mean, refine.lower_bound_mean);
  // Paper (Table 2): original 1.44, greedy 1.41, WLB 2 levels 1.05.
  EXPECT_LT(wlb2.imbalance_mean, 1.06);
  EXPECT_GT(original.imbalance_mean - wlb2.imbalance_mean, 0.15);
  EXPECT_GT(greedy.imbalance_mean - wlb2.imbalance_mean, 0.15);
  EXPECT_LT(wlb2.delay.mean, 1.0);  // the paper reports 0.5 steps on average
  EXPECT_LE(refine.imbalance_mean, wlb2.imbalance_mean);
  EXPECT_DOUBLE_EQ(refine.delay.mean, wlb2.delay.mean);
  // Look-ahead selection (K = 1): better balance than wlb-refine at no more delay.
  const StreamSummary lookahead =
      run("wlb-lookahead", {.thresholds = DefaultThresholds(config.context, 2), .lookahead = 1});
  std::printf("wlb-lookahead %.4f (delay %.3f), wlb-refine %.4f (delay %.3f)\n",
              lookahead.imbalance_mean, lookahead.delay.mean, refine.imbalance_mean,
              refine.delay.mean);
  // 1.0245 before the step check of issue 56 (kStepTolerance), 1.0292 with it: the check buys
  // worst steps within 0.006 of wlb's on every stream shape of bench/model_error_table for 0.005
  // of mean here, under the FLOP cost (planned with a calibration it is 0.015-0.019 below wlb).
  EXPECT_LT(lookahead.imbalance_mean, refine.imbalance_mean - 0.006);
  EXPECT_LE(lookahead.imbalance_mean, 1.030);
  EXPECT_LE(lookahead.delay.mean, 0.45);
  EXPECT_LE(lookahead.delay.mean, refine.delay.mean);
  EXPECT_EQ(lookahead.partial_steps, 1);  // the short last step of the file, reported apart
}

// The embedded heavy-tailed stream (1.5% of documents >= S/2): look-ahead selection against
// wlb-refine with the same queues.
TEST(PaperData, LookaheadBeatsRefineOnAHeavyTail) {
  const PackerConfig config{.context = 131072, .max_tokens = 163840, .micro_batches = 4};
  const CostModel cost = *CostModelFromPreset("llama2-7b");
  const Input input = *LoadInput({.distribution = "heavy-tail", .steps = 400}, config.context,
                                 config.micro_batches);
  auto run = [&](const char* name) {
    auto packer =
        *MakePacker(name, config, cost, {.thresholds = DefaultThresholds(config.context, 2)});
    return Summarize(RunPacker(*packer, input.steps)->steps, cost, config.max_tokens);
  };
  const StreamSummary refine = run("wlb-refine");
  const StreamSummary lookahead = run("wlb-lookahead");
  std::printf("heavy tail: wlb-lookahead %.4f (delay %.3f), wlb-refine %.4f (delay %.3f)\n",
              lookahead.imbalance_mean, lookahead.delay.mean, refine.imbalance_mean,
              refine.delay.mean);
  // Bounded (the default): 1.0611 at 0.451 steps, 0.0178 below wlb-refine (1.0479 before the
  // step check of issue 56, 1.0584 before its delay bound weighed both futures; planned with a
  // calibration and scored under it, 0.030-0.046 below, docs/results/packing/
  // lookahead_worst_step.md).
  EXPECT_LT(lookahead.imbalance_mean, refine.imbalance_mean - 0.017);
  EXPECT_LE(lookahead.delay.mean, refine.delay.mean);
  EXPECT_GE(lookahead.imbalance_mean, lookahead.cap_lower_bound_mean);
  // With a delay budget of a quarter step, below what any queue costs wlb here (>= 0.25), it
  // still balances far better than no queues at all.
  auto budgeted =
      *MakePacker("wlb-lookahead", config, cost,
                  {.thresholds = DefaultThresholds(config.context, 2), .delay_budget = 0.25});
  const StreamSummary tight =
      Summarize(RunPacker(*budgeted, input.steps)->steps, cost, config.max_tokens);
  auto no_queues = *MakePacker("wlb", config, cost, {});
  const StreamSummary none =
      Summarize(RunPacker(*no_queues, input.steps)->steps, cost, config.max_tokens);
  std::printf("heavy tail, budget 0.25: wlb-lookahead %.4f (delay %.3f), no queues %.4f\n",
              tight.imbalance_mean, tight.delay.mean, none.imbalance_mean);
  EXPECT_LE(tight.delay.mean, 0.25);
  EXPECT_LT(tight.imbalance_mean, none.imbalance_mean - 0.2);
  // The delay price alone (bound_delay = false): 1.0522 at 0.490 steps here (1.0458 at 0.450
  // before the step check, 1.0527 at 0.484 before the catch-up releases and the carry rule of
  // candidates.hpp and PlanChosen), 3.8% above wlb-refine's delay on this stream.
  auto priced =
      *MakePacker("wlb-lookahead", config, cost,
                  {.thresholds = DefaultThresholds(config.context, 2), .bound_delay = false});
  const StreamSummary price_alone =
      Summarize(RunPacker(*priced, input.steps)->steps, cost, config.max_tokens);
  std::printf("heavy tail, price alone: wlb-lookahead %.4f (delay %.3f)\n",
              price_alone.imbalance_mean, price_alone.delay.mean);
  EXPECT_LT(price_alone.imbalance_mean, refine.imbalance_mean - 0.025);
  EXPECT_LE(price_alone.delay.mean, refine.delay.mean * 1.04);
}

}  // namespace paper_data_test
}  // namespace wlb
