#include "wlb/io/lengths.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/io/default_distribution.hpp"

namespace wlb {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseLengths, ReadsOneIntegerPerLineSkippingBlanksAndComments) {
  auto lengths = ParseLengths("# lengths\n5\n\n  19 \n8\n", "t");
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_THAT(*lengths, ElementsAre(5, 19, 8));
}

TEST(ParseLengths, ReadsAJsonArray) {
  auto lengths = ParseLengths("  [5, 19, 8]\n", "t");
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_THAT(*lengths, ElementsAre(5, 19, 8));
}

TEST(ParseLengths, BadLineIsAnErrorNamingItsLineNumberAndValue) {
  for (const char* bad : {"abc", "-3", "0", "12x", "3.5"}) {
    auto lengths = ParseLengths(std::string("5\n19\n") + bad + "\n8\n", "docs.txt");
    ASSERT_FALSE(lengths.ok()) << bad;
    EXPECT_EQ(lengths.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(lengths.status().message(), HasSubstr("docs.txt:3"));
    EXPECT_THAT(lengths.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
}

TEST(ParseLengths, BadJsonElementIsAnErrorNamingItsIndexAndValue) {
  auto lengths = ParseLengths("[5, 19, -2]", "d.json");
  ASSERT_FALSE(lengths.ok());
  EXPECT_THAT(lengths.status().message(), HasSubstr("element 2 is -2"));
  EXPECT_THAT(ParseLengths("[5, \"x\"]", "d.json").status().message(), HasSubstr("\"x\""));
  EXPECT_THAT(ParseLengths("[5, 19", "d.json").status().message(), HasSubstr("not a valid JSON"));
}

TEST(ReadLengthsFile, MissingFileIsNotFound) {
  auto lengths = ReadLengthsFile("/nonexistent/wlb/lengths.txt");
  ASSERT_FALSE(lengths.ok());
  EXPECT_EQ(lengths.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(lengths.status().message(), HasSubstr("/nonexistent/wlb/lengths.txt"));
}

TEST(ReadLengthsFile, ReadsAFile) {
  const std::string path = ::testing::TempDir() + "/wlb_lengths_test.txt";
  std::ofstream(path) << "7\n9\n";
  auto lengths = ReadLengthsFile(path);
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_THAT(*lengths, ElementsAre(7, 9));
  std::remove(path.c_str());
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

}  // namespace
}  // namespace wlb
