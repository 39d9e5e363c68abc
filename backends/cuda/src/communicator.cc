#include "wlb/cuda/communicator.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_format.h"
#include "src/cp_kernels.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {

size_t CommDataTypeSize(CommDataType type) { return type == CommDataType::kBf16 ? 2 : 4; }

absl::Status Communicator::CheckBuffers(absl::Span<const CommTensor> tensors, size_t send_bytes,
                                        size_t recv_bytes, const char* op) const {
  if (tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s: no tensor to move", name(), op));
  }
  const size_t n = static_cast<size_t>(num_local_ranks());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const CommTensor& x = tensors[t];
    if (x.send.size() != n || x.recv.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s: tensor %d has %d send and %d recv buffers for %d local ranks",
                          name(), op, t, x.send.size(), x.recv.size(), n));
    }
    for (size_t i = 0; i < n; ++i) {
      if ((send_bytes > 0 && x.send[i] == nullptr) || (recv_bytes > 0 && x.recv[i] == nullptr)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s %s: tensor %d has a null buffer of local rank %d", name(), op, t, i));
      }
    }
  }
  return absl::OkStatus();
}

void Communicator::AddTraffic(int local, int64_t sent, int64_t received) {
  if (traffic_.empty()) traffic_.resize(static_cast<size_t>(num_local_ranks()));
  CommTraffic& t = traffic_[static_cast<size_t>(local)];
  t.sent_bytes += sent;
  t.received_bytes += received;
  ++t.collectives;
}

CommTraffic Communicator::traffic(int local) const {
  return local >= 0 && static_cast<size_t>(local) < traffic_.size()
             ? traffic_[static_cast<size_t>(local)]
             : CommTraffic{};
}

absl::Status Communicator::AllGather(absl::Span<const CommTensor> tensors, size_t count,
                                     CommDataType type) {
  const size_t bytes = count * CommDataTypeSize(type);
  if (absl::Status s = CheckBuffers(tensors, bytes, bytes, "all-gather"); !s.ok()) return s;
  const int64_t moved = static_cast<int64_t>(bytes * tensors.size()) * (world_size() - 1);
  for (int i = 0; i < num_local_ranks(); ++i) AddTraffic(i, moved, moved);
  return bytes == 0 ? absl::OkStatus() : RunAllGather(tensors, count, type);
}

absl::Status Communicator::ReduceScatterSum(absl::Span<const CommTensor> tensors, size_t recv_count,
                                            CommDataType type) {
  const size_t bytes = recv_count * CommDataTypeSize(type);
  if (absl::Status s =
          CheckBuffers(tensors, bytes * static_cast<size_t>(world_size()), bytes, "reduce-scatter");
      !s.ok()) {
    return s;
  }
  const int64_t moved = static_cast<int64_t>(bytes * tensors.size()) * (world_size() - 1);
  for (int i = 0; i < num_local_ranks(); ++i) AddTraffic(i, moved, moved);
  return bytes == 0 ? absl::OkStatus() : RunReduceScatterSum(tensors, recv_count, type);
}

absl::Status Communicator::AllToAllV(absl::Span<const CommTensor> tensors,
                                     absl::Span<const std::vector<int64_t>> send_counts,
                                     absl::Span<const std::vector<int64_t>> recv_counts,
                                     CommDataType type) {
  const int n = num_local_ranks(), world = world_size();
  if (absl::Status s = CheckBuffers(tensors, 0, 0, "all-to-all-v"); !s.ok()) return s;
  if (send_counts.size() != static_cast<size_t>(n) ||
      recv_counts.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s all-to-all-v: %d send and %d receive count lists for %d local ranks",
                        name(), send_counts.size(), recv_counts.size(), n));
  }
  // Per local rank: total elements each way (overflow-checked) and bytes to/from other ranks.
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  std::vector<int64_t> send_total(static_cast<size_t>(n)), recv_total(static_cast<size_t>(n));
  std::vector<int> local_of(static_cast<size_t>(world), -1);
  for (int i = 0; i < n; ++i) local_of[static_cast<size_t>(global_rank(i))] = i;
  for (int i = 0; i < n; ++i) {
    for (const auto& [counts, total, what] :
         {std::tuple{&send_counts[i], &send_total[i], "send"},
          std::tuple{&recv_counts[i], &recv_total[i], "receive"}}) {
      if (counts->size() != static_cast<size_t>(world)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s all-to-all-v: rank %d has %d %s counts for %d ranks", name(),
                            global_rank(i), counts->size(), what, world));
      }
      for (int p = 0; p < world; ++p) {
        const int64_t c = (*counts)[static_cast<size_t>(p)];
        if (c < 0 || c > kMaxElements - *total) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s all-to-all-v: rank %d's %s count for rank %d is %d (need >= 0, %d in all at "
              "most)",
              name(), global_rank(i), what, p, c, kMaxElements));
        }
        *total += c;
      }
    }
    for (int p = 0; p < world; ++p) {
      const int j = local_of[static_cast<size_t>(p)];
      if (j < 0) continue;
      const int64_t sends = send_counts[i][static_cast<size_t>(p)];
      const int64_t expects = recv_counts[j][static_cast<size_t>(global_rank(i))];
      if (sends != expects) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s all-to-all-v: rank %d sends %d elements to rank %d, which expects %d", name(),
            global_rank(i), sends, p, expects));
      }
    }
  }
  const int64_t size = static_cast<int64_t>(CommDataTypeSize(type) * tensors.size());
  bool moves = false;
  for (int i = 0; i < n; ++i) {
    if (send_total[i] > 0 || recv_total[i] > 0) moves = true;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if ((send_total[i] > 0 && tensors[t].send[i] == nullptr) ||
          (recv_total[i] > 0 && tensors[t].recv[i] == nullptr)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s all-to-all-v: tensor %d has a null buffer of rank %d", name(), t, global_rank(i)));
      }
    }
  }
  for (int i = 0; i < n; ++i) {  // counted once every check has passed
    const size_t self = static_cast<size_t>(global_rank(i));
    AddTraffic(i, (send_total[i] - send_counts[i][self]) * size,
               (recv_total[i] - recv_counts[i][self]) * size);
  }
  return moves ? RunAllToAllV(tensors, send_counts, recv_counts, type) : absl::OkStatus();
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

absl::Status LocalCommunicator::RunAllGather(absl::Span<const CommTensor> tensors, size_t count,
                                             CommDataType type) {
  const size_t bytes = count * CommDataTypeSize(type);
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status s = Barrier(); !s.ok()) return s;
  for (const CommTensor& t : tensors) {
    for (size_t i = 0; i < streams_.size(); ++i) {
      for (size_t j = 0; j < streams_.size(); ++j) {
        char* dst = static_cast<char*>(t.recv[i]) + j * bytes;
        if (dst == t.send[j]) continue;  // in place
        WLB_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, t.send[j], bytes, cudaMemcpyDeviceToDevice, streams_[i]));
      }
    }
  }
  return Barrier();  // senders may reuse their buffers only after every copy
}

absl::Status LocalCommunicator::RunReduceScatterSum(absl::Span<const CommTensor> tensors,
                                                    size_t recv_count, CommDataType type) {
  const size_t bytes = recv_count * CommDataTypeSize(type);
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status s = Barrier(); !s.ok()) return s;
  std::vector<const void*> blocks(streams_.size());
  for (const CommTensor& t : tensors) {
    for (size_t i = 0; i < streams_.size(); ++i) {
      for (size_t j = 0; j < streams_.size(); ++j) {
        blocks[j] = static_cast<const char*>(t.send[j]) + i * bytes;
      }
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchSumBuffers(
          blocks.data(), static_cast<int>(blocks.size()), static_cast<int64_t>(recv_count),
          type == CommDataType::kBf16, t.recv[i], streams_[i]));
    }
  }
  return Barrier();
}

absl::Status LocalCommunicator::RunAllToAllV(absl::Span<const CommTensor> tensors,
                                             absl::Span<const std::vector<int64_t>> send_counts,
                                             absl::Span<const std::vector<int64_t>> recv_counts,
                                             CommDataType type) {
  const size_t size = CommDataTypeSize(type), ranks = streams_.size();
  WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status s = Barrier(); !s.ok()) return s;
  for (const CommTensor& t : tensors) {
    // Receiver d copies, on its own stream, block d of every source s; send_at[s]: where source
    // s's block for d starts (its counts to the ranks before d).
    std::vector<size_t> send_at(ranks, 0);
    for (size_t d = 0; d < ranks; ++d) {
      size_t recv_at = 0;
      for (size_t s = 0; s < ranks; ++s) {
        const size_t n = static_cast<size_t>(recv_counts[d][s]);
        if (n > 0) {
          WLB_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(static_cast<char*>(t.recv[d]) + recv_at * size,
                              static_cast<const char*>(t.send[s]) + send_at[s] * size, n * size,
                              cudaMemcpyDeviceToDevice, streams_[d]));
        }
        recv_at += n;
        send_at[s] += static_cast<size_t>(send_counts[s][d]);
      }
    }
  }
  return Barrier();  // senders may reuse their buffers only after every copy
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
