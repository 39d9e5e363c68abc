// Tests of include/wlb/pack/lookahead_packer.hpp on seeded random streams: the plan of step t
// comes out once K more steps are buffered, no document trains before it arrives, nothing is
// lost or duplicated, and the cap holds.
#include "wlb/pack/lookahead_packer.hpp"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace {

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

struct Case {
  PackerConfig config;
  std::vector<int64_t> lengths;
  std::vector<std::vector<Document>> arrivals;
  std::vector<int64_t> thresholds;
};

Case RandomCase(std::mt19937_64& rng, int trial, int max_docs) {
  Case c;
  c.config.context = std::uniform_int_distribution<int64_t>(16, 512)(rng);
  c.config.max_tokens = DefaultMaxTokens(c.config.context);
  c.config.micro_batches = std::uniform_int_distribution<int32_t>(1, 6)(rng);
  c.lengths = testing::RandomLengths(rng, c.config.context, trial,
                                     std::uniform_int_distribution<int>(1, max_docs)(rng));
  c.arrivals = *SplitIntoSteps(*MakeDocuments(c.lengths, c.config.context),
                               c.config.context * c.config.micro_batches);
  c.thresholds = DefaultThresholds(c.config.context, 1 + trial % 3);
  return c;
}

TEST(LookaheadPacker, EachPlanComesOutKPushesLaterAndFlushOwesTheLastK) {
  std::mt19937_64 rng(606);
  for (int trial = 0; trial < 80; ++trial) {
    const Case c = RandomCase(rng, trial, 100);
    const int k = trial % 4;
    auto made = MakePacker("wlb-lookahead", c.config, kSquares,
                           {.thresholds = c.thresholds, .lookahead = k});
    ASSERT_TRUE(made.ok()) << made.status();
    Packer& packer = **made;
    ASSERT_EQ(dynamic_cast<LookaheadPacker&>(packer).lookahead(), k);
    std::vector<StepPlan> steps;
    const int64_t pushes = static_cast<int64_t>(c.arrivals.size());
    for (int64_t p = 0; p < pushes; ++p) {
      auto ready = packer.Push(c.arrivals[p]);
      ASSERT_TRUE(ready.ok()) << ready.status();
      if (p < k) {
        ASSERT_TRUE(ready->empty()) << "push " << p << " K " << k;
        continue;
      }
      ASSERT_EQ(ready->size(), 1u);
      ASSERT_EQ((*ready)[0].step, p - k);
      steps.push_back((*ready)[0]);
    }
    const std::vector<StepPlan> rest = packer.Flush();
    const int64_t owed = std::min<int64_t>(k, pushes);
    ASSERT_GE(static_cast<int64_t>(rest.size()), owed);
    for (size_t i = 0; i < rest.size(); ++i) {
      ASSERT_EQ(rest[i].step, static_cast<int64_t>(steps.size()));
      ASSERT_EQ(rest[i].drain, static_cast<int64_t>(i) >= owed) << "trial " << trial;
      steps.push_back(rest[i]);
    }
    ASSERT_TRUE(packer.Pending().empty());
    ASSERT_TRUE(testing::CoversExactlyOnce(c.lengths, testing::Collect(steps)))
        << "trial " << trial;
    for (const StepPlan& s : steps) {
      for (const MicroBatch& mb : s.micro_batches) {
        ASSERT_LE(mb.tokens, c.config.max_tokens);
        for (const Document& d : mb.documents) ASSERT_GE(s.step, d.arrival_step);
      }
    }
  }
}

// make_packer.hpp documents PackerOptions::delay_budget as "the most mean token delay in steps
// (>= 0) it may spend; it also stays within wlb's delay on the same stream (0.9 of it)". Neither
// bound holds on these seeded streams: with a budget of 0 steps, wlb-lookahead (K = 1) spends more
// mean delay than wlb on the same stream, e.g. 0.490 against 0.314 steps (S = 232, N = 2, two
// queues, 26 steps: the second case below), 1.314 against 0.804 (S = 263, N = 4, 8 steps); without
// a budget 0.785 against 0.314. The delay account prices late tokens, it does not bound them.
// Disabled until the documentation or the packer changes; run with
// --gtest_also_run_disabled_tests to see it fail.
TEST(LookaheadPacker, DISABLED_MeanTokenDelayStaysWithinTheBudgetAndWlbs) {
  std::mt19937_64 rng(707);
  for (int trial = 0; trial < 40; ++trial) {
    const Case c = RandomCase(rng, 2 + 5 * trial, 600);  // shape 2: a heavy tail of outliers
    auto delay = [&](const char* name, double budget) {
      auto packer =
          MakePacker(name, c.config, kSquares,
                     {.thresholds = c.thresholds, .lookahead = 1, .delay_budget = budget});
      return TokenDelay(RunPacker(**packer, c.arrivals)->steps).mean;
    };
    const double wlb = delay("wlb", 0.0);
    EXPECT_LE(delay("wlb-lookahead", 0.0), wlb + 1e-9)
        << "trial " << trial << ": S = " << c.config.context << ", N = " << c.config.micro_batches
        << ", " << c.thresholds.size() << " queues, " << c.arrivals.size() << " steps";
  }
}

TEST(LookaheadPacker, ConfigRecordsTheLookaheadAndAFiniteDelayBudget) {
  const PackerConfig config{.context = 1024, .max_tokens = 1280, .micro_batches = 4};
  auto unbounded = MakePacker("wlb-lookahead", config, kSquares, {.lookahead = 3});
  ASSERT_TRUE(unbounded.ok());
  EXPECT_EQ((*unbounded)->ConfigJson().at("lookahead"), 3);
  EXPECT_FALSE((*unbounded)->ConfigJson().contains("delay_budget"));
  auto bounded =
      MakePacker("wlb-lookahead", config, kSquares, {.lookahead = 3, .delay_budget = 0.25});
  ASSERT_TRUE(bounded.ok());
  EXPECT_EQ((*bounded)->ConfigJson().at("delay_budget"), 0.25);
  // Saved under one budget, refused under another.
  EXPECT_EQ((*unbounded)->RestoreState((*bounded)->SaveState()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*unbounded)->RestoreState((*unbounded)->SaveState()).ok());
}

}  // namespace
}  // namespace wlb
