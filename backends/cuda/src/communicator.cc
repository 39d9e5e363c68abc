#include "wlb/cuda/communicator.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "src/cp_kernels.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {

size_t CommDataTypeSize(CommDataType type) { return type == CommDataType::kBf16 ? 2 : 4; }

absl::Status Communicator::CheckBuffers(absl::Span<const void* const> send,
                                        absl::Span<void* const> recv, size_t send_bytes,
                                        size_t recv_bytes, absl::string_view op) const {
  const size_t n = static_cast<size_t>(num_local_ranks());
  if (send.size() != n || recv.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s: %d send and %d recv buffers for %d local ranks", name(), op,
                        send.size(), recv.size(), n));
  }
  for (size_t i = 0; i < n; ++i) {
    if ((send_bytes > 0 && send[i] == nullptr) || (recv_bytes > 0 && recv[i] == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s: null buffer of local rank %d", name(), op, i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCommunicator>> LocalCommunicator::Create(int ranks,
                                                                             int device) {
  if (ranks < 1 || ranks > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local communicator: ranks must be in [1, %d], got %d", kMaxRanks, ranks));
  }
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  std::unique_ptr<LocalCommunicator> comm(new LocalCommunicator());
  comm->device_ = device;
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  for (int r = 0; r < ranks; ++r) {
    cudaStream_t s = nullptr;
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    comm->streams_.push_back(s);
    cudaEvent_t e = nullptr;
    WLB_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    comm->events_.push_back(e);
  }
  return comm;
}

LocalCommunicator::~LocalCommunicator() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
}

absl::Status LocalCommunicator::Barrier() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[i], streams_[i]));
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    for (size_t j = 0; j < streams_.size(); ++j) {
      if (i != j) WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_[i], events_[j], 0));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllGather(absl::Span<const void* const> send,
                                          absl::Span<void* const> recv, size_t count,
                                          CommDataType type) {
  const size_t bytes = count * CommDataTypeSize(type);
  if (absl::Status s = CheckBuffers(send, recv, bytes, bytes, "all-gather"); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status s = Barrier(); !s.ok()) return s;
  for (size_t i = 0; i < streams_.size(); ++i) {
    for (size_t j = 0; j < streams_.size(); ++j) {
      char* dst = static_cast<char*>(recv[i]) + j * bytes;
      if (dst == send[j]) continue;  // in place
      WLB_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, send[j], bytes, cudaMemcpyDeviceToDevice, streams_[i]));
    }
  }
  return Barrier();  // senders may reuse their buffers only after every copy
}

absl::Status LocalCommunicator::ReduceScatterSum(absl::Span<const void* const> send,
                                                 absl::Span<void* const> recv,
                                                 size_t recv_count, CommDataType type) {
  const size_t bytes = recv_count * CommDataTypeSize(type);
  if (absl::Status s = CheckBuffers(send, recv, bytes * streams_.size(), bytes,
                                    "reduce-scatter");
      !s.ok()) {
    return s;
  }
  if (bytes == 0) return absl::OkStatus();
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status s = Barrier(); !s.ok()) return s;
  std::vector<const void*> blocks(streams_.size());
  for (size_t i = 0; i < streams_.size(); ++i) {
    for (size_t j = 0; j < streams_.size(); ++j) {
      blocks[j] = static_cast<const char*>(send[j]) + i * bytes;
    }
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchSumBuffers(
        blocks.data(), static_cast<int>(blocks.size()), static_cast<int64_t>(recv_count),
        type == CommDataType::kBf16, recv[i], streams_[i]));
  }
  return Barrier();
}

namespace detail {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string tmp = absl::StrFormat("%s.tmp.%d", path, static_cast<int>(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.good()) {
      return absl::PermissionDeniedError(absl::StrFormat("cannot write '%s'", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot rename '%s' to '%s': %s", tmp, path, ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WaitAndReadFile(const std::string& path, size_t size,
                                            double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, timeout_s)));
  while (true) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream buffer;
      buffer << in.rdbuf();
      std::string bytes = buffer.str();
      if (bytes.size() != size) {
        return absl::DataLossError(absl::StrFormat(
            "'%s' holds %d bytes, expected %d (a stale or foreign file?)", path, bytes.size(),
            size));
      }
      return bytes;
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "waited %.1f s for '%s' (written by rank 0); is rank 0 running, and is the path on a "
          "file system every rank sees?",
          timeout_s, path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace detail
}  // namespace wlb::cuda
