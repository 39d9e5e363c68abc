// Tests of include/wlb/io/read_file.hpp: what ReadInputFile reads, and its errors.
#include "wlb/io/read_file.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace read_file_test {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ReadInputFile, ReadsTheWholeFileByteForByte) {
  // Larger than the 64 KiB read buffer, with NULs and every byte value.
  std::string content;
  for (int i = 0; i < 200000; ++i) content.push_back(static_cast<char>(i * 7 % 256));
  const std::string path = TempPath("wlb_read_file_bytes.bin");
  std::ofstream(path, std::ios::binary) << content;
  absl::StatusOr<std::string> text = ReadInputFile(path, "profile");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->size(), content.size());
  EXPECT_TRUE(*text == content);
  std::remove(path.c_str());
}

TEST(ReadInputFile, AnEmptyFileIsEmptyText) {
  const std::string path = TempPath("wlb_read_file_empty.txt");
  std::ofstream(path).flush();
  absl::StatusOr<std::string> text = ReadInputFile(path, "lengths file");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "");
  std::remove(path.c_str());
}

TEST(ReadInputFile, AMissingFileIsNotFoundNamingThePathAndItsRole) {
  const std::string path = TempPath("wlb_no_such_file_here.txt");
  std::remove(path.c_str());
  absl::StatusOr<std::string> text = ReadInputFile(path, "profile");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(text.status().message(), HasSubstr("cannot open profile '" + path + "'"));
  EXPECT_THAT(text.status().message(), HasSubstr("No such file"));
}

TEST(ReadInputFile, APathWithControlBytesIsEscapedInTheMessage) {
  absl::StatusOr<std::string> text = ReadInputFile("/no/such\ndir/x", "lengths file");
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("'/no/such\\ndir/x'"));
  EXPECT_THAT(std::string(text.status().message()), Not(HasSubstr("\n")));
}

TEST(ReadInputFile, ADirectoryIsAnError) {
  absl::StatusOr<std::string> text = ReadInputFile(::testing::TempDir(), "megatron index");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("megatron index"));
  EXPECT_THAT(text.status().message(), HasSubstr("is a directory, not a file"));
}

TEST(ReadInputFile, TheLimitIsInclusiveAndNamedWhenExceeded) {
  const std::string path = TempPath("wlb_read_file_limit.txt");
  // One byte past a 64 KiB read: the limit is checked across reads, not only within one.
  std::ofstream(path) << std::string(65537, 'a');
  EXPECT_TRUE(ReadInputFile(path, "lengths file", 65537).ok());
  absl::StatusOr<std::string> text = ReadInputFile(path, "lengths file", 65536);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(),
              HasSubstr("lengths file '" + path + "' is larger than the limit of 65536 bytes"));
  std::remove(path.c_str());
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
  for (const std::string& path :
       {fifo, std::string("/dev/zero"), std::string("/dev/urandom"), std::string("/dev/null")}) {
    auto text = ReadInputFile(path, "lengths file");
    ASSERT_FALSE(text.ok()) << path;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(text.status().message(), HasSubstr("is not a regular file")) << path;
  }
  std::filesystem::remove(fifo);
}

}  // namespace read_file_test
}  // namespace wlb
