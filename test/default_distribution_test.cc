// Tests of include/wlb/io/default_distribution.hpp: the embedded histogram and the portable
// seeded samplers.
#include "wlb/io/default_distribution.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace default_distribution_test {

TEST(DefaultLengthHistogram, BinsAreOrderedDisjointAndWithinTheWindow) {
  int64_t previous_last = 0;
  int64_t total = 0;
  for (const LengthBin& b : kDefaultLengthHistogram) {
    ASSERT_GE(b.first, 1);
    ASSERT_LE(b.first, b.last);
    ASSERT_GT(b.first, previous_last) << "bins overlap or are out of order";
    ASSERT_GE(b.count, 0);
    previous_last = b.last;
    total += b.count;
  }
  EXPECT_LE(previous_last, 131072);  // the source's 128K context
  EXPECT_GT(total, 0);
}

// With one bin of count 1, a draw is one generator output for the bin (always bin 0), then
// first + (output % width) for a power-of-two width (rejection needs an output in the top
// width - 1 values of 2^64, which a test never sees). Computed here from std::mt19937_64 alone.
TEST(SampleLengths, IsTheDocumentedIntegerArithmeticOnStdMt19937_64) {
  const LengthBin bins[] = {{100, 355, 1}};
  const std::vector<int64_t> lengths = SampleLengths(bins, 20000, 42);
  std::mt19937_64 rng(42);
  std::vector<int64_t> expected;
  for (int64_t total = 0; total < 20000;) {
    rng();  // the bin
    expected.push_back(100 + static_cast<int64_t>(rng() % 256));
    total += expected.back();
  }
  EXPECT_EQ(lengths, expected);
}

TEST(SampleLengths, EmptyOrZeroCountBinsAndNonPositiveTotalsGiveNothing) {
  EXPECT_TRUE(SampleLengths({}, 1000, 1).empty());
  const LengthBin zero[] = {{1, 10, 0}, {20, 30, 0}};
  EXPECT_TRUE(SampleLengths(zero, 1000, 1).empty());
  const LengthBin one[] = {{5, 5, 1}};
  EXPECT_TRUE(SampleLengths(one, 0, 1).empty());
  EXPECT_TRUE(SampleLengths(one, -7, 1).empty());
  EXPECT_EQ(SampleLengths(one, 11, 1), (std::vector<int64_t>{5, 5, 5}));
}

TEST(SampleLengths, ZeroCountBinsAreNeverDrawn) {
  const LengthBin bins[] = {{1, 9, 0}, {50, 60, 2}, {70, 70, 0}};
  for (int64_t x : SampleLengths(bins, 100000, 9)) {
    ASSERT_GE(x, 50);
    ASSERT_LE(x, 60);
  }
}

TEST(SampleHeavyTailLengths, DeterministicWithinTheWindowAndAboutOnePercentTail) {
  const std::vector<int64_t> a = SampleHeavyTailLengths(int64_t{1} << 26, 5);
  EXPECT_EQ(a, SampleHeavyTailLengths(int64_t{1} << 26, 5));
  EXPECT_NE(a, SampleHeavyTailLengths(int64_t{1} << 26, 6));
  int64_t total = 0;
  int64_t long_docs = 0;
  for (int64_t x : a) {
    ASSERT_GE(x, 1);
    ASSERT_LE(x, 131072);
    total += x;
    long_docs += x >= 65536;
  }
  EXPECT_GE(total, int64_t{1} << 26);
  EXPECT_LT(total - a.back(), int64_t{1} << 26);
  // The header: about 1.5% of documents are >= 64K (1% from the tail, 0.5% from the histogram).
  EXPECT_NEAR(static_cast<double>(long_docs) / static_cast<double>(a.size()), 0.015, 0.005);
}

TEST(DefaultDistribution, SameSeedSameLengthsDifferentSeedDifferent) {
  const auto a = SampleDefaultLengths(1 << 22, 7);
  const auto b = SampleDefaultLengths(1 << 22, 7);
  const auto c = SampleDefaultLengths(1 << 22, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int64_t total = 0;
  for (int64_t x : a) {
    ASSERT_GE(x, 1);
    ASSERT_LE(x, 131072);
    total += x;
  }
  EXPECT_GE(total, 1 << 22);
  EXPECT_LT(total - a.back(), 1 << 22);  // stops as soon as the total is reached
}

TEST(DefaultDistribution, MatchesTheSourceShape) {
  // The source (README of ../shared/data): median ~3.2K, mean ~4K, ~97% of documents <= 6,250.
  const auto lengths = SampleDefaultLengths(int64_t{400} << 20, 1);
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  int64_t short_docs = 0;
  for (int64_t x : lengths) {
    mean += static_cast<double>(x);
    short_docs += x <= 6250;
  }
  mean /= static_cast<double>(lengths.size());
  EXPECT_NEAR(static_cast<double>(sorted[sorted.size() / 2]), 3227, 150);
  EXPECT_NEAR(mean, 3962, 200);
  EXPECT_NEAR(static_cast<double>(short_docs) / lengths.size(), 0.97, 0.01);
}

TEST(SampleLengths, DrawsInsideTheBins) {
  const LengthBin bins[] = {{10, 12, 1}, {100, 100, 3}};
  const auto lengths = SampleLengths(bins, 100000, 3);
  int64_t hundreds = 0;
  for (int64_t x : lengths) {
    ASSERT_TRUE((x >= 10 && x <= 12) || x == 100) << x;
    hundreds += x == 100;
  }
  EXPECT_NEAR(static_cast<double>(hundreds) / lengths.size(), 0.75, 0.03);
}

}  // namespace default_distribution_test
}  // namespace wlb
