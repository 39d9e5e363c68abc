// Tests of include/wlb/core/limits.hpp: the bounds are consistent with the products the planners
// form, and QuoteForMessage keeps error messages short and printable.
#include "wlb/core/limits.hpp"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace limits_test {

using ::testing::HasSubstr;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(Limits, ProductsThePlannersFormFitInInt64WithMargin) {
  // S x N: the tokens of one step, documented as <= 2^36.
  EXPECT_EQ(kMaxContext * kMaxMicroBatches, int64_t{1} << 36);
  // S_max x N: the capacity of one step under the variable-length cap.
  EXPECT_LE(kMaxMaxTokens, kInt64Max / kMaxMicroBatches / 1024);
  // A stream's tokens and pieces: pieces x S (the stream's bound when every piece is full)
  // and tokens x C (per-rank sums under context parallelism) stay far below 2^63.
  EXPECT_EQ(kMaxPieces * kMaxContext, int64_t{1} << 48);
  EXPECT_LE(kMaxStreamTokens, kMaxPieces * kMaxContext);
  EXPECT_LE(kMaxStreamTokens, kInt64Max / kMaxCpSize / 1024);
  // Steps x tokens per step (2^56 at the bounds) stays in range.
  EXPECT_LE(kMaxSteps, kInt64Max / (kMaxContext * kMaxMicroBatches) / 64);
  EXPECT_LE(kMaxSteps, kMaxStateCounter);
  // Token index maps: rows of one plan fit in int32 offsets.
  EXPECT_LE(kMaxShardMapRows, int64_t{std::numeric_limits<int32_t>::max()});
}

TEST(Limits, BoundsAreOrderedAndPositive) {
  EXPECT_GE(kMaxMaxTokens, kMaxContext);  // S_max >= S is always satisfiable at the bound
  EXPECT_GE(kMaxWindowMicroBatches, kMaxMicroBatches);  // W = 1 at the largest N is allowed
  EXPECT_GE(int64_t{kMaxWindow}, 1);
  EXPECT_GE(kMaxOutlierQueues, 1);
  EXPECT_GT(kMaxJsonDepth, 2);
  EXPECT_GT(kMinProfileMs, 0.0);
  EXPECT_LT(kMinProfileMs, kMaxProfileMs);
  EXPECT_GT(kMinGemmTflops, 0.0);
  EXPECT_LT(kMinGemmTflops, kMaxGemmTflops);
  EXPECT_LE(kMaxInputBytes, int64_t{std::numeric_limits<int32_t>::max()} + 1);
}

TEST(QuoteForMessage, QuotesShortValuesAsTheyAre) {
  EXPECT_EQ(QuoteForMessage("wlb"), "'wlb'");
  EXPECT_EQ(QuoteForMessage(std::string()), "''");
  EXPECT_EQ(QuoteForMessage(std::string("abc")), "'abc'");
}

TEST(QuoteForMessage, EscapesControlBytesAndNuls) {
  const std::string quoted = QuoteForMessage(std::string_view("a\nb\0c\x7f", 6));
  EXPECT_EQ(quoted.find('\n'), std::string::npos);
  EXPECT_EQ(quoted.find('\0'), std::string::npos);
  EXPECT_EQ(quoted.find('\x7f'), std::string::npos);
  EXPECT_THAT(quoted, HasSubstr("a\\nb"));
  EXPECT_THAT(quoted, HasSubstr("\\x00"));
}

TEST(QuoteForMessage, CutsLongValuesAndNotesTheirSize) {
  const std::string long_value(10000, 'x');
  const std::string quoted = QuoteForMessage(long_value);
  EXPECT_EQ(quoted, "'" + std::string(64, 'x') + "...' (10000 bytes in all)");
  EXPECT_EQ(QuoteForMessage(long_value, 3), "'xxx...' (10000 bytes in all)");
  // Exactly max_chars is not cut.
  EXPECT_EQ(QuoteForMessage(std::string(64, 'y')), "'" + std::string(64, 'y') + "'");
}

}  // namespace limits_test
}  // namespace wlb
