// Collectives among the ranks of a CP group, on device buffers, in stream order.
//
// A Communicator drives num_local_ranks() of the world_size() ranks from this process: all of
// them (LocalCommunicator; NcclCommunicator::CreateAll) or one (NcclCommunicator::CreateFromFile,
// one process per GPU under a multi-node launcher). Collectives take one buffer per local rank
// and are enqueued on every local rank's stream(i); like NCCL's, they are ordered after the work
// already on those streams and the work enqueued after them is ordered after them.
//
//   absl::StatusOr<std::unique_ptr<wlb::cuda::LocalCommunicator>> comm =
//       wlb::cuda::LocalCommunicator::Create(/*ranks=*/4);   // 4 emulated ranks on GPU 0
//   std::vector<const void*> send = ...;  std::vector<void*> recv = ...;   // one per rank
//   absl::Status s = (*comm)->AllGather(send, recv, count, wlb::cuda::CommDataType::kBf16);
//   s = (*comm)->AllGather({{send_k, recv_k}, {send_v, recv_v}}, count, type);  // K and V at once
//
// LocalCommunicator exists because NCCL refuses two ranks on one device: it lets one GPU run a
// whole CP group (each rank on its own stream), for correctness tests and per-rank timing.
// Every communicator counts the bytes its collectives move between ranks (traffic()), so tests
// and benches compare what an executor moved with what the planner predicted.
#ifndef WLB_CUDA_COMMUNICATOR_H_
#define WLB_CUDA_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wlb::cuda {

enum class CommDataType { kBf16, kFloat32 };

// Bytes per element: 2 or 4.
size_t CommDataTypeSize(CommDataType type);

// Bytes one rank moved through a communicator's collectives: what left it for other ranks and
// what reached it from them (a rank's own block is not counted). An all-gather of `count`
// elements moves (C - 1) x count elements each way, a reduce-scatter (C - 1) x recv_count, an
// all-to-all-v its counts to and from the other ranks, as NCCL's ring and point-to-point
// algorithms put them on the wire.
struct CommTraffic {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t collectives = 0;  // collectives called (including those that moved nothing)
};

// One tensor of a collective: its send and receive buffer on every local rank (index i for
// local rank i). A collective moves several tensors that share its counts together: one NCCL
// group (one launch, one latency), one pair of barriers between emulated ranks.
struct CommTensor {
  absl::Span<const void* const> send;
  absl::Span<void* const> recv;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int world_size() const = 0;
  virtual int num_local_ranks() const = 0;
  virtual int global_rank(int local) const = 0;  // rank id of local rank `local`
  virtual int device(int local) const = 0;       // its CUDA device
  virtual cudaStream_t stream(int local) const = 0;
  virtual std::string name() const = 0;

  // Per tensor: recv[i] (world_size * count elements) = the send buffers of ranks 0, 1, ... in
  // rank order; send[i] holds `count` elements of local rank i. send[i] may be recv[i]'s own
  // block.
  absl::Status AllGather(absl::Span<const CommTensor> tensors, size_t count, CommDataType type);
  absl::Status AllGather(absl::Span<const void* const> send, absl::Span<void* const> recv,
                         size_t count, CommDataType type) {
    return AllGather({CommTensor{send, recv}}, count, type);
  }

  // Per tensor: recv[i] (recv_count elements) = sum over ranks of block global_rank(i) of their
  // send buffers (world_size * recv_count elements each).
  absl::Status ReduceScatterSum(absl::Span<const CommTensor> tensors, size_t recv_count,
                                CommDataType type);
  absl::Status ReduceScatterSum(absl::Span<const void* const> send, absl::Span<void* const> recv,
                                size_t recv_count, CommDataType type) {
    return ReduceScatterSum({CommTensor{send, recv}}, recv_count, type);
  }

  // Every rank sends send_counts[i][p] elements to rank p and receives recv_counts[i][p] from it
  // (one count per global rank, world_size each): send[i] holds its blocks for ranks 0, 1, ...
  // back to back, recv[i] receives the blocks from ranks 0, 1, ... back to back. The counts must
  // pair up (rank s's send count for p is rank p's receive count from s): InvalidArgument naming
  // both ranks when two local ranks disagree; ranks in other processes cannot be checked here,
  // so callers derive both sides from one plan (wlb::RowExchange). Send and receive buffers must
  // not overlap. Every tensor moves by the same counts.
  absl::Status AllToAllV(absl::Span<const CommTensor> tensors,
                         absl::Span<const std::vector<int64_t>> send_counts,
                         absl::Span<const std::vector<int64_t>> recv_counts, CommDataType type);
  absl::Status AllToAllV(absl::Span<const void* const> send,
                         absl::Span<const std::vector<int64_t>> send_counts,
                         absl::Span<void* const> recv,
                         absl::Span<const std::vector<int64_t>> recv_counts, CommDataType type) {
    return AllToAllV({CommTensor{send, recv}}, send_counts, recv_counts, type);
  }

  // Bytes local rank `local` has moved since creation or the last ResetTraffic().
  CommTraffic traffic(int local) const;
  void ResetTraffic() { traffic_.clear(); }

 protected:
  // The collectives, called by the public ones above with checked buffers and counts (and not
  // at all when nothing would move), every tensor in one collective.
  virtual absl::Status RunAllGather(absl::Span<const CommTensor> tensors, size_t count,
                                    CommDataType type) = 0;
  virtual absl::Status RunReduceScatterSum(absl::Span<const CommTensor> tensors, size_t recv_count,
                                           CommDataType type) = 0;
  virtual absl::Status RunAllToAllV(absl::Span<const CommTensor> tensors,
                                    absl::Span<const std::vector<int64_t>> send_counts,
                                    absl::Span<const std::vector<int64_t>> recv_counts,
                                    CommDataType type) = 0;

 private:
  // InvalidArgument unless there is a tensor and each has one send and one recv entry per local
  // rank, non-null where the byte count is not 0.
  absl::Status CheckBuffers(absl::Span<const CommTensor> tensors, size_t send_bytes,
                            size_t recv_bytes, const char* op) const;
  void AddTraffic(int local, int64_t sent, int64_t received);

  std::vector<CommTraffic> traffic_;  // per local rank, grown on first use
};

// C ranks emulated on one device, one stream each. Collectives are device copies and an
// in-order fp32 sum (deterministic).
class LocalCommunicator final : public Communicator {
 public:
  static constexpr int kMaxRanks = 64;

  // InvalidArgument unless 1 <= ranks <= kMaxRanks; FailedPrecondition without a usable device.
  static absl::StatusOr<std::unique_ptr<LocalCommunicator>> Create(int ranks, int device = 0);
  ~LocalCommunicator() override;

  int world_size() const override { return static_cast<int>(streams_.size()); }
  int num_local_ranks() const override { return world_size(); }
  int global_rank(int local) const override { return local; }
  int device(int) const override { return device_; }
  cudaStream_t stream(int local) const override { return streams_[local]; }
  std::string name() const override { return "local"; }

 private:
  LocalCommunicator() = default;
  absl::Status RunAllGather(absl::Span<const CommTensor> tensors, size_t count,
                            CommDataType type) override;
  absl::Status RunReduceScatterSum(absl::Span<const CommTensor> tensors, size_t recv_count,
                                   CommDataType type) override;
  absl::Status RunAllToAllV(absl::Span<const CommTensor> tensors,
                            absl::Span<const std::vector<int64_t>> send_counts,
                            absl::Span<const std::vector<int64_t>> recv_counts,
                            CommDataType type) override;
  // Every stream waits for the work enqueued so far on every other stream.
  absl::Status Barrier();

  int device_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};

#if WLB_CUDA_HAVE_NCCL
// NCCL ranks: one process driving several GPUs, or one rank per process.
class NcclCommunicator final : public Communicator {
 public:
  // One rank per device in `devices` (distinct), all driven by this process (ncclCommInitAll).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateAll(absl::Span<const int> devices);

  // Rank `rank` of `world_size` in this process, on `device`. Rank 0 creates the NCCL unique id
  // and writes it to `id_path` (atomically, by rename); the others wait up to `timeout_s`
  // seconds for it (DeadlineExceeded naming the path otherwise). Use a fresh path per job: a
  // stale file from an earlier job would join the wrong group.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateFromFile(
      const std::string& id_path, int rank, int world_size, int device, double timeout_s = 120.0);

  ~NcclCommunicator() override;

  int world_size() const override { return world_size_; }
  int num_local_ranks() const override;
  int global_rank(int local) const override;
  int device(int local) const override;
  cudaStream_t stream(int local) const override;
  std::string name() const override { return "nccl"; }

 private:
  struct Rank;
  absl::Status RunAllGather(absl::Span<const CommTensor> tensors, size_t count,
                            CommDataType type) override;
  absl::Status RunReduceScatterSum(absl::Span<const CommTensor> tensors, size_t recv_count,
                                   CommDataType type) override;
  absl::Status RunAllToAllV(absl::Span<const CommTensor> tensors,
                            absl::Span<const std::vector<int64_t>> send_counts,
                            absl::Span<const std::vector<int64_t>> recv_counts,
                            CommDataType type) override;
  NcclCommunicator() = default;

  int world_size_ = 0;
  std::vector<Rank> ranks_;
};
#endif  // WLB_CUDA_HAVE_NCCL

namespace detail {

// Writes `bytes` to `path` through a temporary file and a rename, so readers never see a part.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// Waits until `path` exists, then reads it; DeadlineExceeded after `timeout_s` seconds and
// DataLoss when its size is not `size` bytes (messages name the path).
absl::StatusOr<std::string> WaitAndReadFile(const std::string& path, size_t size,
                                            double timeout_s);

}  // namespace detail
}  // namespace wlb::cuda

#endif  // WLB_CUDA_COMMUNICATOR_H_
