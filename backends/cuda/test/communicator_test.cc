// Communicator host paths (label cpu): the unique-id file rendezvous, argument checks, and the
// no-device errors. The collectives themselves are checked in cp_gpu_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {
namespace {

using ::testing::HasSubstr;

// A per-process path, so concurrent test runs do not meet.
std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(getpid())))
      .string();
}

TEST(IdFileTest, WriterThenReader) {
  const std::string path = TempPath("wlb_nccl_id");
  std::filesystem::remove(path);
  const std::string id(128, '\x5a');
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(detail::WriteFileAtomically(path, id).ok());
  });
  absl::StatusOr<std::string> got = detail::WaitAndReadFile(path, id.size(), 10.0);
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, id);
  std::filesystem::remove(path);
}

TEST(IdFileTest, TimeoutNamesThePath) {
  const std::string path = TempPath("wlb_nccl_id_missing");
  std::filesystem::remove(path);
  absl::StatusOr<std::string> got = detail::WaitAndReadFile(path, 128, 0.05);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr(path));
}

TEST(IdFileTest, WrongSizeIsDataLoss) {
  const std::string path = TempPath("wlb_nccl_id_short");
  ASSERT_TRUE(detail::WriteFileAtomically(path, "abc").ok());
  absl::StatusOr<std::string> got = detail::WaitAndReadFile(path, 128, 1.0);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(), HasSubstr("3 bytes, expected 128"));
  std::filesystem::remove(path);
}

TEST(CommunicatorTest, LocalRejectsRankCounts) {
  for (int ranks : {0, -1, LocalCommunicator::kMaxRanks + 1}) {
    auto c = LocalCommunicator::Create(ranks);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << ranks;
    EXPECT_THAT(c.status().message(), HasSubstr(std::to_string(ranks)));
  }
}

// Creation succeeds exactly when a device is usable, and fails with a Status (no abort) otherwise.
TEST(CommunicatorTest, CreateFollowsDeviceAvailability) {
  const bool device = CudaDeviceAvailable().ok();
  EXPECT_EQ(LocalCommunicator::Create(2).ok(), device);
#if WLB_CUDA_HAVE_NCCL
  const int devices[] = {0};
  EXPECT_EQ(NcclCommunicator::CreateAll(devices).ok(), device);
  EXPECT_EQ(NcclCommunicator::CreateFromFile(TempPath("wlb_nccl_id_single"), 0, 1, 0).ok(),
            device);
  std::filesystem::remove(TempPath("wlb_nccl_id_single"));
  EXPECT_EQ(NcclCommunicator::CreateFromFile("unused", 2, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
#endif
}

TEST(CommunicatorTest, DataTypeSizes) {
  EXPECT_EQ(CommDataTypeSize(CommDataType::kBf16), 2u);
  EXPECT_EQ(CommDataTypeSize(CommDataType::kFloat32), 4u);
}

}  // namespace
}  // namespace wlb::cuda
