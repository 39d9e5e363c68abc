// wlb::CapLowerBound never exceeds the exact optimum: CBC solves small random instances of
// "minimise the heaviest micro-batch, every document placed, tokens <= S_max" and the bound of
// the same documents must stay at or below the optimal imbalance.
#include <random>

#include "gtest/gtest.h"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/solver/milp_packer.hpp"

namespace wlb {
namespace {

TEST(CapLowerBound, NeverAboveTheCbcOptimum) {
  // Attention-only cost, so the MILP objective (heaviest micro-batch attention) is the heaviest
  // micro-batch cost; a per-token term makes the per-token order differ from the length order.
  const CostModel cost{.attn_quadratic = 1.0, .attn_linear = 7.0, .unit = "test"};
  std::mt19937_64 rng(4242);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int optimal = 0, tight = 0;
  for (int i = 0; i < 100; ++i) {
    const int bins = static_cast<int>(uniform(2, 3));
    const int64_t cap = uniform(8, 40);
    // Fill each bin to 90..100% of the cap, so a feasible packing exists and many are cap-full.
    MilpInstance instance{.bins = bins, .capacity = cap, .carry_budget = 0};
    for (int b = 0; b < bins; ++b) {
      int64_t room = cap * uniform(90, 100) / 100;
      while (room > 0) {
        const int64_t d = std::min(room, uniform(1, uniform(0, 3) == 0 ? cap : cap / 3 + 1));
        instance.lengths.push_back(d);
        room -= d;
      }
    }
    std::shuffle(instance.lengths.begin(), instance.lengths.end(), rng);
    absl::StatusOr<MilpSolution> solved = SolveFixedLengthMilp(
        instance, cost, {.time_limit_s = 10.0, .greedy_start = false, .relative_gap = 0.0});
    ASSERT_TRUE(solved.ok()) << solved.status();
    if (!solved->stats.optimal) continue;
    ++optimal;
    std::vector<MicroBatch> mbs(bins);
    double total = 0.0;
    for (size_t k = 0; k < instance.lengths.size(); ++k) {
      MicroBatch& mb = mbs[k % mbs.size()];  // any split: the bound depends only on the documents
      mb.documents.push_back({.id = static_cast<int64_t>(k), .length = instance.lengths[k]});
      total += cost(instance.lengths[k]);
    }
    const double optimum = solved->stats.objective / (total / bins);
    const double bound = CapLowerBound(mbs, cost, cap);
    ASSERT_LE(bound, optimum * (1.0 + 1e-9)) << "instance " << i;
    ASSERT_GE(bound, LowerBound(mbs, cost) - 1e-12);
    tight += bound > LowerBound(mbs, cost) + 1e-9;
  }
  EXPECT_GT(optimal, 90);
  EXPECT_GT(tight, 10);  // the cap matters in a good share of the instances
}

}  // namespace
}  // namespace wlb
