// Tests of include/wlb/pack/fixed_greedy_packer.hpp on seeded random streams: W steps every W
// pushes, micro-batches within S, nothing lost or duplicated, a document carried only when it fit
// nowhere, and token delay no lower than -(W - 1).
#include "wlb/pack/fixed_greedy_packer.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace fixed_greedy_packer_test {

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

TEST(FixedGreedyPacker, RandomStreamsWindowsCapsCoverageAndDelay) {
  std::mt19937_64 rng(303);
  for (int trial = 0; trial < 120; ++trial) {
    const int window = 1 + trial % 3;
    const auto [config, lengths, arrivals] = testing::RandomPackingCase(
        rng, trial, {.min_context = 8, .max_context = 200, .max_micro_batches = 5, .max_docs = 80});
    auto packer = MakePacker("fixed-greedy", config, kSquares, {.window = window});
    ASSERT_TRUE(packer.ok()) << packer.status();
    EXPECT_EQ((*packer)->name(), "fixed-greedy");
    std::vector<StepPlan> steps;
    for (size_t p = 0; p < arrivals.size(); ++p) {
      auto ready = (*packer)->Push(arrivals[p]);
      ASSERT_TRUE(ready.ok());
      const size_t expected = (p + 1) % window == 0 ? window : 0;
      ASSERT_EQ(ready->size(), expected) << "push " << p << " window " << window;
      for (StepPlan& s : *ready) steps.push_back(std::move(s));
      // W = 1: what is carried fit in no micro-batch of the step just planned (micro-batches only
      // grow while a step is planned, so it fits in none at the end either).
      if (window == 1) {
        int64_t most_room = 0;
        for (const MicroBatch& mb : steps.back().micro_batches) {
          most_room = std::max(most_room, config.context - mb.tokens);
        }
        for (const Document& d : (*packer)->Pending()) {
          ASSERT_GT(d.length, most_room) << "trial " << trial << ": carried but it fit";
        }
      }
    }
    for (StepPlan& s : (*packer)->Flush()) steps.push_back(std::move(s));
    ASSERT_TRUE((*packer)->Pending().empty());
    ASSERT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(steps))) << "trial " << trial;
    for (size_t s = 0; s < steps.size(); ++s) {
      ASSERT_EQ(steps[s].step, static_cast<int64_t>(s));
      ASSERT_EQ(steps[s].micro_batches.size(), static_cast<size_t>(config.micro_batches));
      for (const MicroBatch& mb : steps[s].micro_batches) {
        ASSERT_LE(mb.tokens, config.context) << "fixed-length packing stays within S";
        for (const Document& d : mb.documents) {
          ASSERT_GE(steps[s].step - d.arrival_step, -(window - 1)) << "trial " << trial;
        }
      }
    }
  }
}

TEST(FixedGreedyPacker, EachDocumentGoesToTheLeastAttentionMicroBatchWithRoom) {
  // S = 10, N = 3, one step, longest first (attention = length^2): 6 -> mb0 (36); 5 -> mb1
  // (25); 4 -> mb2 (16); 3 -> mb2 (16 is least: 25); 3 -> mb1 (25 ties mb2's 25, the smaller
  // index wins: 34); 2 -> mb2 (25 is least with room: 29).
  FixedGreedyPacker packer({.context = 10, .max_tokens = 12, .micro_batches = 3}, kSquares, 1);
  auto steps = packer.Push(*MakeDocuments(std::vector<int64_t>{3, 6, 2, 4, 5, 3}, 10));
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 1u);
  const auto& mbs = (*steps)[0].micro_batches;
  auto lengths = [](const MicroBatch& mb) {
    std::vector<int64_t> out;
    for (const Document& d : mb.documents) out.push_back(d.length);
    return out;
  };
  EXPECT_THAT(lengths(mbs[0]), ::testing::ElementsAre(6));
  EXPECT_THAT(lengths(mbs[1]), ::testing::ElementsAre(5, 3));
  EXPECT_THAT(lengths(mbs[2]), ::testing::ElementsAre(4, 3, 2));
  EXPECT_TRUE(packer.Pending().empty());
}

}  // namespace fixed_greedy_packer_test
}  // namespace wlb
