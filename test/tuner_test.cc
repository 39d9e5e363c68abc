#include "wlb/pack/tuner.hpp"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/core/steps.hpp"
#include "wlb/io/default_distribution.hpp"

namespace wlb {
namespace tuner_test {

using ::testing::HasSubstr;

struct Sample {
  PackerConfig config{.context = 32768, .max_tokens = 40960, .micro_batches = 4};
  std::vector<std::vector<Document>> arrivals;
  CostModel cost = *CostModelFromPreset("llama2-7b");
  Sample() {
    // The default distribution scaled to a 32K window (lengths / 4), 60 steps.
    std::vector<int64_t> lengths = SampleDefaultLengths(60 * 4 * 131072, 5);
    for (int64_t& l : lengths) l = std::max<int64_t>(1, l / 4);
    arrivals = *SplitIntoSteps(*MakeDocuments(lengths, config.context), 4 * config.context);
  }
};

TEST(TuneThresholds, BeatsNoQueuesWithinTheBudget) {
  Sample s;
  auto tuned = TuneThresholds(s.arrivals, s.config, s.cost, {.max_levels = 2, .delay_budget = 1});
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_LE(tuned->delay_mean, 1.0);
  EXPECT_FALSE(tuned->thresholds.empty());
  EXPECT_EQ(tuned->evaluated, 1 + 8 + 28);  // none, one of 8, two of 8
  auto none = *MakePacker("wlb", s.config, s.cost, {});
  const double plain = Summarize(RunPacker(*none, s.arrivals)->steps, s.cost).imbalance_mean;
  EXPECT_LT(tuned->imbalance_mean, plain - 0.05);
  // Reproducible: the reported imbalance is what the thresholds give.
  auto check = *MakePacker("wlb", s.config, s.cost, {.thresholds = tuned->thresholds});
  EXPECT_DOUBLE_EQ(Summarize(RunPacker(*check, s.arrivals)->steps, s.cost).imbalance_mean,
                   tuned->imbalance_mean);
}

TEST(TuneThresholds, TighterBudgetNeverLowersDelay) {
  Sample s;
  auto loose = *TuneThresholds(s.arrivals, s.config, s.cost, {.max_levels = 2, .delay_budget = 5});
  auto tight =
      *TuneThresholds(s.arrivals, s.config, s.cost, {.max_levels = 2, .delay_budget = 0.2});
  EXPECT_LE(tight.delay_mean, 0.2);
  EXPECT_LE(loose.imbalance_mean, tight.imbalance_mean);
}

// wlb-lookahead is tuned with the budget as its own delay budget: the same brute force, with the
// packer each budget makes.
TEST(TuneThresholds, LookaheadNoSetOfItsGridWithinTheBudgetIsBetter) {
  Sample s;
  const std::vector<int64_t> grid = {4096, 8192, 16384, 24576};
  for (double budget : {0.1, 0.25, 1.0}) {
    auto tuned = TuneThresholds(
        s.arrivals, s.config, s.cost,
        {.max_levels = 2, .delay_budget = budget, .candidates = grid, .packer = "wlb-lookahead"});
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    EXPECT_LE(tuned->delay_mean, budget);
    for (int mask = 0; mask < (1 << grid.size()); ++mask) {
      std::vector<int64_t> t;
      for (size_t i = 0; i < grid.size(); ++i) {
        if (mask & (1 << i)) t.push_back(grid[i]);
      }
      if (t.size() > 2) continue;
      auto packer =
          *MakePacker("wlb-lookahead", s.config, s.cost, {.thresholds = t, .delay_budget = budget});
      const StreamSummary summary = Summarize(RunPacker(*packer, s.arrivals)->steps, s.cost);
      if (summary.delay.mean > budget) continue;
      EXPECT_LE(tuned->imbalance_mean, summary.imbalance_mean + 1e-12)
          << "budget " << budget << ": {" << absl::StrJoin(t, ",") << "} has "
          << summary.imbalance_mean << " at delay " << summary.delay.mean;
    }
  }
}

// Every threshold set of the grid, by brute force, against what the tuner returns: nothing within
// the budget may have a lower steady-step mean.
TEST(TuneThresholds, NoSetOfItsGridWithinTheBudgetIsBetter) {
  Sample s;
  // The sample ends in a short step (a few documents), which must not decide anything.
  s.arrivals.push_back({Document{.id = 1 << 30, .length = 30000}});
  const std::vector<int64_t> grid = {2048, 4096, 8192, 16384, 24576};
  std::vector<std::pair<std::vector<int64_t>, StreamSummary>> all;
  for (int mask = 0; mask < (1 << grid.size()); ++mask) {
    std::vector<int64_t> t;
    for (size_t i = 0; i < grid.size(); ++i) {
      if (mask & (1 << i)) t.push_back(grid[i]);
    }
    if (t.size() > 2) continue;
    auto packer = *MakePacker("wlb", s.config, s.cost, {.thresholds = t});
    all.push_back({t, Summarize(RunPacker(*packer, s.arrivals)->steps, s.cost)});
    EXPECT_EQ(all.back().second.partial_steps, 1);
  }
  for (double budget : {0.1, 0.25, 0.5, 1.0, 3.0}) {
    auto tuned = TuneThresholds(s.arrivals, s.config, s.cost,
                                {.max_levels = 2, .delay_budget = budget, .candidates = grid});
    ASSERT_TRUE(tuned.ok()) << tuned.status();
    EXPECT_EQ(tuned->evaluated, static_cast<int>(all.size()));
    EXPECT_LE(tuned->delay_mean, budget);
    for (const auto& [t, summary] : all) {
      if (summary.delay.mean > budget) continue;
      EXPECT_LE(tuned->imbalance_mean, summary.imbalance_mean + 1e-12)
          << "budget " << budget << ": {" << absl::StrJoin(t, ",") << "} has "
          << summary.imbalance_mean << " at delay " << summary.delay.mean;
    }
  }
}

TEST(TuneThresholds, BadOptionsAndImpossibleBudgets) {
  Sample s;
  EXPECT_THAT(TuneThresholds(s.arrivals, s.config, s.cost, {.max_levels = -1}).status().message(),
              HasSubstr("got -1"));
  EXPECT_THAT(
      TuneThresholds(s.arrivals, s.config, s.cost, {.delay_budget = -0.5}).status().message(),
      HasSubstr("got -0.5"));
  auto none = TuneThresholds(s.arrivals, s.config, s.cost, {.max_levels = 1, .delay_budget = 0});
  if (!none.ok()) EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace tuner_test
}  // namespace wlb
