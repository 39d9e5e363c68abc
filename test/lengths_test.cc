#include "wlb/io/lengths.hpp"

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace lengths_test {

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

TEST(ParseLengths, ANulByteIsAnErrorNotTheEndOfTheInput) {
  for (const std::string text : {std::string("[5, 6]\0[7]", 10), std::string("[5,\0 6]", 7)}) {
    auto lengths = ParseLengths(text, "f");
    ASSERT_FALSE(lengths.ok()) << text;
    EXPECT_THAT(lengths.status().message(), HasSubstr("a NUL byte at byte"));
  }
  // One integer per line: the line holding the NUL is the error (see BadValuesAreEscaped...).
  EXPECT_FALSE(ParseLengths(std::string("5\n\0\n6\n", 6), "f").ok());
}

}  // namespace lengths_test
}  // namespace wlb
