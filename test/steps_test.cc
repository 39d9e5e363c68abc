// Tests of include/wlb/core/steps.hpp: cutting a stream of pieces into steps.
#include "wlb/core/steps.hpp"

#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace steps_test {

using ::testing::HasSubstr;

std::vector<Document> Docs(std::vector<int64_t> lengths, int64_t context) {
  return *MakeDocuments(lengths, context);
}

// On seeded random streams: the steps, concatenated, are the pieces in stream order; every piece

// lies in the step of its first token; every step but the last holds more than T - S and less

// than T + S tokens; pieces are at most S.

TEST(SplitIntoSteps, EveryPieceOnceInOrderInTheStepOfItsFirstToken) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t context = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    const int64_t per_step = context * n;
    const std::vector<int64_t> lengths = testing::RandomLengths(
        rng, context, trial, std::uniform_int_distribution<int>(0, 120)(rng));
    const std::vector<Document> pieces = Docs(lengths, context);
    ASSERT_TRUE(testing::CoversExactlyOnce(lengths, pieces));
    for (const Document& d : pieces) ASSERT_LE(d.length, context);
    auto steps = SplitIntoSteps(pieces, per_step);
    ASSERT_TRUE(steps.ok()) << steps.status();
    std::vector<Document> concatenated;
    int64_t offset = 0;
    for (size_t s = 0; s < steps->size(); ++s) {
      int64_t step_tokens = 0;
      for (const Document& d : (*steps)[s]) {
        ASSERT_EQ(offset / per_step, static_cast<int64_t>(s)) << "trial " << trial;
        offset += d.length;
        step_tokens += d.length;
        concatenated.push_back(d);
      }
      ASSERT_LT(step_tokens, per_step + context) << "trial " << trial << " step " << s;
      if (s + 1 < steps->size()) {
        ASSERT_GT(step_tokens, per_step - context) << "trial " << trial << " step " << s;
      }
    }
    ASSERT_EQ(concatenated, pieces) << "trial " << trial;
    if (!pieces.empty()) {
      // The last step is the one of the last piece's first token.
      EXPECT_EQ(static_cast<int64_t>(steps->size()),
                (TotalTokens(pieces) - pieces.back().length) / per_step + 1);
    }
  }
}

TEST(SplitIntoSteps, HandWorkedBoundaries) {
  // Steps of 10 tokens; pieces 6, 6, 6, 3 start at tokens 0, 6, 12, 18: steps {6, 6}, {6, 3}.
  auto steps = SplitIntoSteps(Docs({6, 6, 6, 3}, 10), 10);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ(TotalTokens((*steps)[0]), 12);  // the straddling piece goes wholly to step 0
  EXPECT_EQ(TotalTokens((*steps)[1]), 9);
  // A piece longer than a step leaves empty steps after it: 25 tokens from token 0 cover steps
  // 0..2, and the next piece starts at token 25 (step 2).
  auto gaps = SplitIntoSteps(Docs({25, 1, 1}, 25), 10);
  ASSERT_TRUE(gaps.ok());
  ASSERT_EQ(gaps->size(), 3u);
  EXPECT_EQ((*gaps)[0].size(), 1u);
  EXPECT_TRUE((*gaps)[1].empty());
  EXPECT_EQ((*gaps)[2].size(), 2u);
  auto none = SplitIntoSteps(std::vector<Document>{}, 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(SplitIntoSteps, BadPiecesNameTheDocumentPieceAndLength) {
  std::vector<Document> pieces = Docs({5, 7}, 10);
  pieces.push_back({.id = 4, .length = 0, .piece = 2, .offset = 20});
  EXPECT_THAT(SplitIntoSteps(pieces, 10).status().message(),
              HasSubstr("document 4 piece 2: length 0 is outside [1, 16777216]"));
  pieces.back().length = kMaxContext + 1;
  EXPECT_THAT(SplitIntoSteps(pieces, 10).status().message(),
              HasSubstr("length 16777217 is outside"));
  EXPECT_EQ(SplitIntoSteps(pieces, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SplitIntoSteps(pieces, kMaxContext * kMaxMicroBatches).status().code() ==
              absl::StatusCode::kInvalidArgument);
  // The largest step size itself is accepted.
  EXPECT_TRUE(SplitIntoSteps(Docs({5, 7}, 10), kMaxContext * kMaxMicroBatches).ok());
}

TEST(StreamTokensForSteps, IsStepsTimesSTimesNAndChecksTheConfig) {
  const PackerConfig config{.context = 1000, .max_tokens = 1250, .micro_batches = 3};
  EXPECT_EQ(*StreamTokensForSteps(config, 1), 3000);
  EXPECT_EQ(*StreamTokensForSteps(config, 7), 21000);
  EXPECT_EQ(*StreamTokensForSteps(config, kMaxSteps), kMaxSteps * 3000);
  EXPECT_THAT(StreamTokensForSteps(config, kMaxSteps + 1).status().message(),
              HasSubstr(absl::StrFormat("got %d", kMaxSteps + 1)));
  EXPECT_THAT(StreamTokensForSteps({.context = 0, .max_tokens = 10, .micro_batches = 3}, 5)
                  .status()
                  .message(),
              HasSubstr("got 0"));
}

TEST(SplitIntoSteps, RejectsStepSizesThatCannotBeRight) {
  const std::vector<Document> pieces = Docs({5, 7}, 10);
  for (int64_t bad : {int64_t{0}, int64_t{-4}, kMaxContext * kMaxMicroBatches + 1}) {
    auto steps = SplitIntoSteps(pieces, bad);  // 0 used to divide by zero (SIGFPE)
    ASSERT_FALSE(steps.ok()) << bad;
    EXPECT_THAT(steps.status().message(), HasSubstr(absl::StrFormat("got %d", bad)));
  }
  EXPECT_FALSE(SplitIntoSteps(std::vector<Document>{{.id = 0, .length = 0}}, 10).ok());
  auto steps = SplitIntoSteps(pieces, 5);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps->size(), 2u);
}

TEST(StreamTokensForSteps, ChecksTheProductAgainstTheStreamLimit) {
  const PackerConfig config{.context = 131072, .max_tokens = 163840, .micro_batches = 4};
  EXPECT_EQ(*StreamTokensForSteps(config, 100), 100 * 4 * 131072);
  EXPECT_THAT(StreamTokensForSteps(config, 0).status().message(), HasSubstr("got 0"));
  EXPECT_THAT(StreamTokensForSteps(config, int64_t{1} << 50).status().message(),
              HasSubstr("steps must be in [1, 1048576]"));
  EXPECT_THAT(StreamTokensForSteps(config, 65537).status().message(),
              HasSubstr("at most 65536 steps at this S and N"));
}

}  // namespace steps_test
}  // namespace wlb
