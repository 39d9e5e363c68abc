// Communicator host paths (label cpu): the unique-id file rendezvous, argument checks, traffic
// counting, and the no-device errors. The collectives themselves are checked in cp_gpu_test.cc.
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

// The base class's checks and byte counts, over a communicator whose collectives only record
// that they ran (what a device would do is cp_gpu_test.cc's part). `local` of `world` ranks live
// in this process, as global ranks 0 .. local-1.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(int world, int local) : world_(world), local_(local) {}
  int world_size() const override { return world_; }
  int num_local_ranks() const override { return local_; }
  int global_rank(int local) const override { return local; }
  int device(int) const override { return 0; }
  cudaStream_t stream(int) const override { return nullptr; }
  std::string name() const override { return "recording"; }
  int runs = 0;     // collectives that reached the backend
  int tensors = 0;  // tensors of the last one

 private:
  absl::Status RunAllGather(absl::Span<const CommTensor> t, size_t, CommDataType) override {
    return Record(t);
  }
  absl::Status RunReduceScatterSum(absl::Span<const CommTensor> t, size_t, CommDataType) override {
    return Record(t);
  }
  absl::Status RunAllToAllV(absl::Span<const CommTensor> t, absl::Span<const std::vector<int64_t>>,
                            absl::Span<const std::vector<int64_t>>, CommDataType) override {
    return Record(t);
  }
  absl::Status Record(absl::Span<const CommTensor> t) {
    ++runs;
    tensors = static_cast<int>(t.size());
    return absl::OkStatus();
  }
  int world_, local_;
};

TEST(CommunicatorTest, AllToAllVChecksCountsAndCountsBytes) {
  RecordingCommunicator comm(3, 3);
  float buffers[3][64];
  std::vector<const void*> send = {buffers[0], buffers[1], buffers[2]};
  std::vector<void*> recv = {buffers[0] + 32, buffers[1] + 32, buffers[2] + 32};
  // send[s][d] elements from s to d; rank 1 also copies 4 to itself (not traffic).
  const std::vector<std::vector<int64_t>> sends = {{0, 5, 2}, {3, 4, 0}, {1, 0, 0}};
  const std::vector<std::vector<int64_t>> recvs = {{0, 3, 1}, {5, 4, 0}, {2, 0, 0}};
  ASSERT_TRUE(comm.AllToAllV(send, sends, recv, recvs, CommDataType::kBf16).ok());
  EXPECT_EQ(comm.runs, 1);
  EXPECT_EQ(comm.traffic(0).sent_bytes, 7 * 2);
  EXPECT_EQ(comm.traffic(0).received_bytes, 4 * 2);
  EXPECT_EQ(comm.traffic(1).sent_bytes, 3 * 2);
  EXPECT_EQ(comm.traffic(1).received_bytes, 5 * 2);
  EXPECT_EQ(comm.traffic(2).received_bytes, 2 * 2);
  EXPECT_EQ(comm.traffic(2).collectives, 1);

  // Mismatched pairs name both ranks; bad counts name the rank, the peer and the value.
  std::vector<std::vector<int64_t>> bad = recvs;
  bad[2][0] = 3;
  absl::Status s = comm.AllToAllV(send, sends, recv, bad, CommDataType::kBf16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 0 sends 2 elements to rank 2, which expects 3"));
  bad = sends;
  bad[1][2] = -4;
  s = comm.AllToAllV(send, bad, recv, recvs, CommDataType::kBf16);
  EXPECT_THAT(s.message(), HasSubstr("rank 1's send count for rank 2 is -4"));
  bad[1] = {3, 4};
  s = comm.AllToAllV(send, bad, recv, recvs, CommDataType::kBf16);
  EXPECT_THAT(s.message(), HasSubstr("rank 1 has 2 send counts for 3 ranks"));
  bad = sends;
  bad[0][1] = int64_t{1} << 62;  // a total that would overflow is refused, not wrapped
  bad[0][2] = int64_t{1} << 62;
  s = comm.AllToAllV(send, bad, recv, recvs, CommDataType::kBf16);
  EXPECT_THAT(s.message(), HasSubstr("rank 0's send count for rank 1"));
  s = comm.AllToAllV(send, std::vector<std::vector<int64_t>>(2), recv, recvs, CommDataType::kBf16);
  EXPECT_THAT(s.message(), HasSubstr("2 send and 3 receive count lists for 3 local ranks"));
  std::vector<const void*> null_send = send;
  null_send[1] = nullptr;
  s = comm.AllToAllV(null_send, sends, recv, recvs, CommDataType::kBf16);
  EXPECT_THAT(s.message(), HasSubstr("null buffer of rank 1"));
  EXPECT_EQ(comm.runs, 1);  // no refused call reached the collective

  // Nothing to move: no collective runs (over NCCL, no group at all), one call counted.
  const std::vector<std::vector<int64_t>> none(3, std::vector<int64_t>(3, 0));
  comm.ResetTraffic();
  ASSERT_TRUE(comm.AllToAllV(send, none, recv, none, CommDataType::kFloat32).ok());
  EXPECT_EQ(comm.runs, 1);
  EXPECT_EQ(comm.traffic(0).sent_bytes, 0);
  EXPECT_EQ(comm.traffic(0).collectives, 1);
}

TEST(CommunicatorTest, CollectivesCountWhatLeavesAndEntersEachRank) {
  RecordingCommunicator comm(4, 2);  // ranks 2 and 3 in other processes
  float buffers[2][64];
  std::vector<const void*> send = {buffers[0], buffers[1]};
  std::vector<void*> recv = {buffers[0], buffers[1]};
  ASSERT_TRUE(comm.AllGather(send, recv, 10, CommDataType::kBf16).ok());
  ASSERT_TRUE(comm.ReduceScatterSum(send, recv, 5, CommDataType::kFloat32).ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(comm.traffic(i).sent_bytes, 3 * 10 * 2 + 3 * 5 * 4);
    EXPECT_EQ(comm.traffic(i).received_bytes, 3 * 10 * 2 + 3 * 5 * 4);
    EXPECT_EQ(comm.traffic(i).collectives, 2);
  }
  EXPECT_EQ(comm.runs, 2);
  // A receive count from a rank of another process cannot be checked here, and is not refused.
  const std::vector<std::vector<int64_t>> sends = {{0, 1, 6, 0}, {1, 0, 0, 0}};
  const std::vector<std::vector<int64_t>> recvs = {{0, 1, 0, 2}, {1, 0, 0, 0}};
  comm.ResetTraffic();
  ASSERT_TRUE(comm.AllToAllV(send, sends, recv, recvs, CommDataType::kBf16).ok());
  EXPECT_EQ(comm.traffic(0).sent_bytes, 7 * 2);
  EXPECT_EQ(comm.traffic(0).received_bytes, 3 * 2);
  EXPECT_EQ(comm.traffic(5).sent_bytes, 0);  // no such local rank: nothing
}

// Several tensors in one call: one collective, every tensor's bytes counted, every tensor's
// buffers checked.
TEST(CommunicatorTest, TensorsShareOneCollective) {
  RecordingCommunicator comm(2, 2);
  float k[2][64], v[2][64];
  std::vector<const void*> send_k = {k[0], k[1]}, send_v = {v[0], v[1]};
  std::vector<void*> recv_k = {k[0] + 32, k[1] + 32}, recv_v = {v[0] + 32, v[1] + 32};
  const std::vector<std::vector<int64_t>> counts = {{1, 3}, {3, 2}};
  ASSERT_TRUE(
      comm.AllToAllV({{send_k, recv_k}, {send_v, recv_v}}, counts, counts, CommDataType::kFloat32)
          .ok());
  EXPECT_EQ(comm.runs, 1);
  EXPECT_EQ(comm.tensors, 2);
  EXPECT_EQ(comm.traffic(0).sent_bytes, 2 * 3 * 4);  // 3 elements to rank 1, of K and of V
  EXPECT_EQ(comm.traffic(0).collectives, 1);
  ASSERT_TRUE(comm.AllGather({{send_k, recv_k}, {send_v, recv_v}}, 8, CommDataType::kBf16).ok());
  EXPECT_EQ(comm.runs, 2);
  EXPECT_EQ(comm.traffic(1).received_bytes, 2 * 3 * 4 + 2 * 8 * 2);
  std::vector<const void*> null_v = {v[0], nullptr};
  absl::Status s =
      comm.ReduceScatterSum({{send_k, recv_k}, {null_v, recv_v}}, 4, CommDataType::kFloat32);
  EXPECT_THAT(s.message(), HasSubstr("tensor 1 has a null buffer of local rank 1"));
  s = comm.AllToAllV({{send_k, recv_k}, {null_v, recv_v}}, counts, counts, CommDataType::kFloat32);
  EXPECT_THAT(s.message(), HasSubstr("tensor 1 has a null buffer of rank 1"));
  EXPECT_THAT(comm.AllGather(absl::Span<const CommTensor>(), 8, CommDataType::kBf16).message(),
              HasSubstr("no tensor"));
  EXPECT_EQ(comm.runs, 2);
}

TEST(CommunicatorTest, DataTypeSizes) {
  EXPECT_EQ(CommDataTypeSize(CommDataType::kBf16), 2u);
  EXPECT_EQ(CommDataTypeSize(CommDataType::kFloat32), 4u);
}

}  // namespace
}  // namespace wlb::cuda
