// The MILP baseline: optimality against brute force on tiny instances, constraints, the packer.
#include "wlb/solver/milp_packer.hpp"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "wlb/core/steps.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace {

CostModel Quadratic() { return CostModel{.attn_quadratic = 1.0, .unit = "tokens^2"}; }

// The optimum of the instance by enumerating every assignment ((bins + 1)^n of them).
double BruteForceOptimum(const MilpInstance& in, const CostModel& cost) {
  const int n = static_cast<int>(in.lengths.size());
  std::vector<int> bin(n, -1);
  double best = -1.0;
  while (true) {
    std::vector<int64_t> tokens(in.bins, 0);
    std::vector<double> load(in.bins, 0.0);
    int64_t carried = 0;
    bool ok = true;
    for (int i = 0; i < n && ok; ++i) {
      if (bin[i] < 0) {
        carried += in.lengths[i];
        ok = in.must_place.empty() || !in.must_place[i];
      } else {
        tokens[bin[i]] += in.lengths[i];
        load[bin[i]] += cost.Attention(in.lengths[i]);
        ok = tokens[bin[i]] <= in.capacity;
      }
    }
    if (ok && carried <= in.carry_budget) {
      const double heaviest = *std::max_element(load.begin(), load.end());
      if (best < 0 || heaviest < best) best = heaviest;
    }
    int i = 0;  // next assignment: count in base bins + 1, digit -1 .. bins - 1
    while (i < n && ++bin[i] == in.bins) bin[i++] = -1;
    if (i == n) break;
  }
  return best;
}

TEST(SolveFixedLengthMilp, MatchesBruteForceOnTinyInstances) {
  std::mt19937_64 rng(7);
  const CostModel cost = Quadratic();
  for (int trial = 0; trial < 12; ++trial) {
    MilpInstance in;
    const int n = 3 + static_cast<int>(rng() % 5);  // 3..7 documents
    in.bins = 2 + static_cast<int>(rng() % 2);      // 2..3 micro-batches
    in.capacity = 20;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      in.lengths.push_back(1 + static_cast<int64_t>(rng() % 12));
      total += in.lengths.back();
    }
    // Some trials must carry (more tokens than room), some may not carry at all.
    in.carry_budget = trial % 3 == 0 ? 0 : std::max<int64_t>(0, total - in.bins * in.capacity) + 5;
    const double expected = BruteForceOptimum(in, cost);
    if (expected < 0) continue;  // infeasible draw
    absl::StatusOr<MilpSolution> got = SolveFixedLengthMilp(in, cost, {.time_limit_s = 20.0});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->stats.optimal) << "trial " << trial;
    EXPECT_FALSE(got->stats.time_limit_hit);
    EXPECT_NEAR(got->stats.objective, expected, 1e-6 * expected) << "trial " << trial;
    EXPECT_LE(got->stats.carried_tokens, in.carry_budget);
  }
}

TEST(SolveFixedLengthMilp, BeatsTheGreedyStartWhereGreedyIsSuboptimal) {
  // Longest first into the lighter of 2 bins: 4|4, 3|3, then the last 3 makes 16+9+9 = 34.
  // The optimum puts the 4s together: 32 against 27.
  MilpInstance in{.lengths = {4, 4, 3, 3, 3}, .bins = 2, .capacity = 11, .carry_budget = 0};
  in.start = {0, 1, 0, 1, 0};
  ASSERT_DOUBLE_EQ(BruteForceOptimum(in, Quadratic()), 32.0);
  absl::StatusOr<MilpSolution> got = SolveFixedLengthMilp(in, Quadratic(), {.time_limit_s = 20.0});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_DOUBLE_EQ(got->stats.start_objective, 34.0);
  EXPECT_DOUBLE_EQ(got->stats.objective, 32.0);
  EXPECT_TRUE(got->stats.solver_solution);
  EXPECT_TRUE(got->stats.optimal);
}

TEST(SolveFixedLengthMilp, HonoursMustPlaceAndTheCarryBudget) {
  // Without must_place the best is to carry the 9 (budget 9); with it, the 9 must go in.
  MilpInstance in{.lengths = {9, 5, 5}, .bins = 2, .capacity = 10, .carry_budget = 9};
  absl::StatusOr<MilpSolution> free = SolveFixedLengthMilp(in, Quadratic(), {.time_limit_s = 20.0});
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_DOUBLE_EQ(free->stats.objective, 25.0);
  EXPECT_EQ(free->bin[0], -1);
  in.must_place = {true, false, false};
  absl::StatusOr<MilpSolution> forced =
      SolveFixedLengthMilp(in, Quadratic(), {.time_limit_s = 20.0});
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_DOUBLE_EQ(forced->stats.objective, 81.0);
  EXPECT_GE(forced->bin[0], 0);
}

TEST(SolveFixedLengthMilp, RejectsBadInstancesNamingTheValue) {
  MilpInstance in{.lengths = {3, 11}, .bins = 2, .capacity = 10};
  absl::StatusOr<MilpSolution> got = SolveFixedLengthMilp(in, Quadratic(), {});
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("length 11"), std::string_view::npos);
  in.lengths = {3, 4};
  in.start = {0, 5};
  got = SolveFixedLengthMilp(in, Quadratic(), {});
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("micro-batch 5"), std::string_view::npos);
  in.start.clear();
  got = SolveFixedLengthMilp(in, Quadratic(), {.time_limit_s = 0.0});
  EXPECT_FALSE(got.ok());
}

TEST(MakeMilpPacker, RejectsBadOptions) {
  const PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 2};
  EXPECT_FALSE(MakeMilpPacker(config, Quadratic(), {.window = 0}).ok());
  EXPECT_FALSE(MakeMilpPacker(config, Quadratic(), {.time_limit_s = -1.0}).ok());
  EXPECT_FALSE(MakeMilpPacker({.context = 10, .max_tokens = 5}, Quadratic(), {}).ok());
}

// A small stream: every token trains exactly once, no micro-batch exceeds S, and each window is
// at least as balanced (heaviest attention) as the greedy packing of the same window.
TEST(MilpPacker, PacksAStreamLosingNothingAndNoWorseThanGreedy) {
  const PackerConfig config{.context = 64, .max_tokens = 64, .micro_batches = 2};
  std::mt19937_64 rng(3);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 30; ++i) lengths.push_back(1 + static_cast<int64_t>(rng() % 40));
  const std::vector<Document> pieces = *MakeDocuments(lengths, config.context);
  const auto arrivals = *SplitIntoSteps(pieces, config.micro_batches * config.context);
  auto packer = *MakeMilpPacker(config, Quadratic(), {.window = 2, .time_limit_s = 5.0});
  absl::StatusOr<PackRun> run = RunPacker(*packer, arrivals);
  ASSERT_TRUE(run.ok()) << run.status();
  int64_t tokens = 0;
  for (const StepPlan& s : run->steps) {
    ASSERT_EQ(s.micro_batches.size(), 2u);
    for (const MicroBatch& mb : s.micro_batches) {
      EXPECT_LE(mb.tokens, config.context);
      tokens += mb.tokens;
    }
  }
  EXPECT_EQ(tokens, TotalTokens(pieces));
  EXPECT_TRUE(packer->Pending().empty());
  EXPECT_EQ(packer->fallbacks(), 0);
  ASSERT_FALSE(packer->solves().empty());
  for (const MilpSolveStats& s : packer->solves()) {
    EXPECT_LE(s.objective, s.start_objective * (1 + 1e-12));
    EXPECT_LE(s.best_bound, s.objective * (1 + 1e-12));
  }
}

TEST(MilpPacker, StateRoundTripsAndRejectsAnotherWindow) {
  const PackerConfig config{.context = 16, .max_tokens = 16, .micro_batches = 2};
  auto a = *MakeMilpPacker(config, Quadratic(), {.window = 2, .time_limit_s = 5.0});
  ASSERT_TRUE(a->Push(*MakeDocuments(std::vector<int64_t>{9, 7, 5, 12}, 16)).ok());
  const std::string blob = a->SaveState();
  auto b = *MakeMilpPacker(config, Quadratic(), {.window = 2, .time_limit_s = 5.0});
  ASSERT_TRUE(b->RestoreState(blob).ok());
  EXPECT_EQ(b->Pending(), a->Pending());
  auto c = *MakeMilpPacker(config, Quadratic(), {.window = 3, .time_limit_s = 5.0});
  EXPECT_FALSE(c->RestoreState(blob).ok());
}

}  // namespace
}  // namespace wlb
