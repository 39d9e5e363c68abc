#include "wlb/io/lengths.hpp"

#include <sys/stat.h>

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

TEST(ParseLengths, DeeplyNestedJsonIsRejectedAtOnceWithoutEchoingIt) {
  // 100,000 levels used to crash (SIGSEGV) while the error path dumped the element recursively.
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  auto lengths = ParseLengths(nested, "deep.json");
  ASSERT_FALSE(lengths.ok());
  EXPECT_THAT(lengths.status().message(), HasSubstr("element 0 is a nested array"));
  EXPECT_LT(lengths.status().message().size(), 200u);
  for (const char* bad : {"[1, {\"a\": 1}]", "[1, [2]]", "[1, 2.5]", "[1, true]", "[1] 2", "{}",
                          "[18446744073709551615]"}) {
    EXPECT_FALSE(ParseLengths(bad, "b.json").ok()) << bad;
  }
  auto big = ParseLengths("[9223372036854775807]", "b.json");  // bounded later, by MakeDocuments
  ASSERT_TRUE(big.ok()) << big.status();
}

TEST(ParseLengths, BadValuesAreEscapedAndCutShort) {
  const std::string line = std::string(10'000'000, 'x') + std::string("\0\xff", 2);
  auto lengths = ParseLengths("5\n" + line + "\n", "big.txt");
  ASSERT_FALSE(lengths.ok());
  const std::string message(lengths.status().message());
  EXPECT_LT(message.size(), 200u);
  EXPECT_THAT(message, HasSubstr("big.txt:2: 'xxxx"));
  EXPECT_THAT(message, HasSubstr("(10000002 bytes in all)"));
  auto binary = ParseLengths(std::string("5\n1\0"
                                         "2\n",
                                         6),
                             "bin.txt");
  ASSERT_FALSE(binary.ok());
  EXPECT_THAT(binary.status().message(), HasSubstr("'1\\x00"));
  EXPECT_EQ(std::string(binary.status().message()).find('\0'), std::string::npos);
}

TEST(ReadLengthsFile, DirectoryIsAnErrorNotZeroDocuments) {
  auto lengths = ReadLengthsFile(::testing::TempDir());
  ASSERT_FALSE(lengths.ok());
  EXPECT_EQ(lengths.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(lengths.status().message(), HasSubstr("is a directory"));
}

TEST(ReadInputFile, StopsAtTheByteLimit) {
  const std::string path = ::testing::TempDir() + "/wlb_big_input.txt";
  std::ofstream(path) << std::string(5000, '7');
  auto text = ReadInputFile(path, "lengths file", 4096);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("larger than the limit of 4096 bytes"));
  EXPECT_TRUE(ReadInputFile(path, "lengths file", 5000).ok());
  std::remove(path.c_str());
}

TEST(ReadInputFile, RefusesFifosAndDevicesAtOnceInsteadOfHangingOrReadingForever) {
  const std::string fifo = ::testing::TempDir() + "/wlb_input_fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer: a blocking open would never return.
  for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/dev/urandom"),
                                  std::string("/dev/null")}) {
    auto text = ReadInputFile(path, "lengths file");
    ASSERT_FALSE(text.ok()) << path;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(text.status().message(), HasSubstr("is not a regular file")) << path;
  }
  std::filesystem::remove(fifo);
}

TEST(ParseLengths, ANulByteIsAnErrorNotTheEndOfTheInput) {
  for (const std::string text : {std::string("[5, 6]\0[7]", 10), std::string("[5,\0 6]", 7)}) {
    auto lengths = ParseLengths(text, "f");
    ASSERT_FALSE(lengths.ok()) << text;
    EXPECT_THAT(lengths.status().message(), HasSubstr("a NUL byte at byte"));
  }
  // One integer per line: the line holding the NUL is the error (see BadValuesAreEscaped...).
  EXPECT_FALSE(ParseLengths(std::string("5\n\0\n6\n", 6), "f").ok());
}

}  // namespace
}  // namespace wlb
