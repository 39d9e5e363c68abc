// NcclCommunicator: built only when CMake finds NCCL (WLB_CUDA_HAVE_NCCL).
#include <nccl.h>

#include <set>

#include "absl/strings/str_format.h"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {
namespace {

absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrFormat("NCCL error %d (%s) in `%s` at %s:%d", static_cast<int>(result),
                      ncclGetErrorString(result), expr, file, line);
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define WLB_NCCL_RETURN_IF_ERROR(expr)                                             \
  do {                                                                             \
    const ncclResult_t wlb_nccl_result_ = (expr);                                  \
    if (wlb_nccl_result_ != ncclSuccess) {                                         \
      return NcclStatus(wlb_nccl_result_, #expr, __FILE__, __LINE__);              \
    }                                                                              \
  } while (false)

ncclDataType_t NcclType(CommDataType type) {
  return type == CommDataType::kBf16 ? ncclBfloat16 : ncclFloat32;
}

}  // namespace

struct NcclCommunicator::Rank {
  int global = 0;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

int NcclCommunicator::num_local_ranks() const { return static_cast<int>(ranks_.size()); }
int NcclCommunicator::global_rank(int local) const { return ranks_[local].global; }
int NcclCommunicator::device(int local) const { return ranks_[local].device; }
cudaStream_t NcclCommunicator::stream(int local) const { return ranks_[local].stream; }

NcclCommunicator::~NcclCommunicator() {
  for (Rank& r : ranks_) {
    cudaSetDevice(r.device);
    if (r.comm != nullptr) ncclCommDestroy(r.comm);
    if (r.stream != nullptr) cudaStreamDestroy(r.stream);
  }
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateAll(
    absl::Span<const int> devices) {
  if (devices.empty()) return absl::InvalidArgumentError("NCCL communicator: no devices given");
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  int count = 0;
  WLB_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= count || !seen.insert(d).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "NCCL communicator: device %d is out of range [0, %d) or given twice (NCCL refuses two "
          "ranks on one device; use LocalCommunicator to emulate them)",
          d, count));
    }
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->world_size_ = static_cast<int>(devices.size());
  c->ranks_.resize(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  WLB_NCCL_RETURN_IF_ERROR(
      ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  for (size_t i = 0; i < devices.size(); ++i) {
    Rank& r = c->ranks_[i];
    r.global = static_cast<int>(i);
    r.device = devices[i];
    r.comm = comms[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateFromFile(
    const std::string& id_path, int rank, int world_size, int device, double timeout_s) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NCCL communicator: rank %d is not in [0, world_size %d)", rank, world_size));
  }
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id;
  if (rank == 0) {
    WLB_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (absl::Status s = detail::WriteFileAtomically(
            id_path, absl::string_view(id.internal, sizeof(id.internal)));
        !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> bytes =
        detail::WaitAndReadFile(id_path, sizeof(id.internal), timeout_s);
    if (!bytes.ok()) return bytes.status();
    std::copy(bytes->begin(), bytes->end(), id.internal);
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->world_size_ = world_size;
  c->ranks_.resize(1);
  Rank& r = c->ranks_[0];
  r.global = rank;
  r.device = device;
  WLB_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&r.comm, world_size, id, rank));
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  return c;
}

// Every tensor of a call in one NCCL group: one launch per rank, the latency paid once.
absl::Status NcclCommunicator::RunAllGather(absl::Span<const CommTensor> tensors, size_t count,
                                            CommDataType type) {
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (const CommTensor& t : tensors) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const ncclResult_t r = ncclAllGather(t.send[i], t.recv[i], count, NcclType(type),
                                           ranks_[i].comm, ranks_[i].stream);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(r, "ncclAllGather", __FILE__, __LINE__);
      }
    }
  }
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return absl::OkStatus();
}

absl::Status NcclCommunicator::RunReduceScatterSum(absl::Span<const CommTensor> tensors,
                                                   size_t recv_count, CommDataType type) {
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (const CommTensor& t : tensors) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const ncclResult_t r = ncclReduceScatter(t.send[i], t.recv[i], recv_count, NcclType(type),
                                               ncclSum, ranks_[i].comm, ranks_[i].stream);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(r, "ncclReduceScatter", __FILE__, __LINE__);
      }
    }
  }
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return absl::OkStatus();
}

absl::Status NcclCommunicator::RunAllToAllV(absl::Span<const CommTensor> tensors,
                                            absl::Span<const std::vector<int64_t>> send_counts,
                                            absl::Span<const std::vector<int64_t>> recv_counts,
                                            CommDataType type) {
  // Grouped point-to-point: NCCL runs the group's sends and receives concurrently.
  const size_t size = CommDataTypeSize(type);
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (const CommTensor& t : tensors) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      size_t send_at = 0, recv_at = 0;
      for (int p = 0; p < world_size_; ++p) {
        const size_t out = static_cast<size_t>(send_counts[i][static_cast<size_t>(p)]);
        const size_t in = static_cast<size_t>(recv_counts[i][static_cast<size_t>(p)]);
        ncclResult_t r = ncclSuccess;
        if (out > 0) {
          r = ncclSend(static_cast<const char*>(t.send[i]) + send_at * size, out, NcclType(type), p,
                       ranks_[i].comm, ranks_[i].stream);
        }
        if (r == ncclSuccess && in > 0) {
          r = ncclRecv(static_cast<char*>(t.recv[i]) + recv_at * size, in, NcclType(type), p,
                       ranks_[i].comm, ranks_[i].stream);
        }
        if (r != ncclSuccess) {
          ncclGroupEnd();
          return NcclStatus(r, out > 0 ? "ncclSend" : "ncclRecv", __FILE__, __LINE__);
        }
        send_at += out;
        recv_at += in;
      }
    }
  }
  WLB_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return absl::OkStatus();
}

}  // namespace wlb::cuda
