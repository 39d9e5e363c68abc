#include "wlb/cuda/cp_executor.h"

#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"
#include "src/cp_kernels.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {
namespace {

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceMem = std::unique_ptr<void, DeviceFree>;

absl::StatusOr<DeviceMem> Allocate(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) WLB_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceMem(p);
}

absl::StatusOr<DeviceMem> Upload(const std::vector<int32_t>& host, cudaStream_t stream) {
  absl::StatusOr<DeviceMem> d = Allocate(host.size() * sizeof(int32_t));
  if (!d.ok() || host.empty()) return d;
  WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d->get(), host.data(), host.size() * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, stream));
  return d;
}

template <typename T>
absl::Status CheckThd(const ThdTensor<T>& t, int64_t tokens, int64_t heads, int64_t dim,
                      const char* name, int rank) {
  if (t.tokens != tokens || t.heads != heads || t.head_dim != dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: %s is (%d, %d, %d); expected (rank_capacity %d, %d, %d)", rank, name, t.tokens,
        t.heads, t.head_dim, tokens, heads, dim));
  }
  if (t.numel() > 0 && (t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % 16 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: %s must be a non-null 16-byte-aligned device pointer", rank,
                        name));
  }
  return absl::OkStatus();
}

// The first `rows` rows of a THD tensor.
template <typename T>
ThdTensor<T> Prefix(const ThdTensor<T>& t, int64_t rows) {
  return {t.data, rows, t.heads, t.head_dim};
}

template <typename T>
absl::Status ZeroRowsFrom(const ThdTensor<T>& t, int64_t first, cudaStream_t stream) {
  const int64_t row = t.heads * t.head_dim;
  if (first >= t.tokens) return absl::OkStatus();
  WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(const_cast<__nv_bfloat16*>(t.data) + first * row, 0,
                                           (t.tokens - first) * row * sizeof(__nv_bfloat16),
                                           stream));
  return absl::OkStatus();
}

}  // namespace

struct CpExecutor::RankState {
  const CpRankMaps* maps = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::optional<VarlenAttention> attention;
  DeviceMem local_to_packed, key_rows, key_offsets, key_sources;
  DeviceMem gathered_k, gathered_v, k, v, lse, dk, dv, partial_dk, partial_dv, recv_dk, recv_dv;
  cudaEvent_t events[4] = {nullptr, nullptr, nullptr, nullptr};  // fwd begin/end, bwd begin/end
  bool backward_ran = false;
};

CpExecutor::~CpExecutor() {
  for (RankState& r : ranks_) {
    cudaSetDevice(r.device);
    for (cudaEvent_t e : r.events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
}

absl::StatusOr<std::unique_ptr<CpExecutor>> CpExecutor::Create(const ShardPlan& plan,
                                                               const CpAttentionConfig& config,
                                                               Communicator& comm,
                                                               const CpExecutorOptions& options) {
  if (plan.cp_size != comm.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard plan for cp_size %d on a communicator of %d ranks", plan.cp_size,
        comm.world_size()));
  }
  absl::StatusOr<CpMaps> maps = BuildCpMaps(plan, config);
  if (!maps.ok()) return maps.status();
  std::unique_ptr<CpExecutor> e(new CpExecutor());
  e->maps_ = *std::move(maps);
  e->config_ = config;
  e->options_ = options;
  e->comm_ = &comm;
  e->ranks_.resize(static_cast<size_t>(comm.num_local_ranks()));
  const size_t kv_row = size_t(config.num_kv_heads) * config.head_dim;
  const size_t gathered = size_t(e->maps_.gathered_rows());
  const size_t capacity = size_t(e->maps_.rank_capacity);
  AttentionOptions attention_options;
  attention_options.kernel = config.kernel;
  for (size_t i = 0; i < e->ranks_.size(); ++i) {
    RankState& r = e->ranks_[i];
    r.maps = &e->maps_.ranks[static_cast<size_t>(comm.global_rank(static_cast<int>(i)))];
    r.device = comm.device(static_cast<int>(i));
    r.stream = comm.stream(static_cast<int>(i));
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    for (cudaEvent_t& ev : r.events) WLB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev));
    const size_t total_k = size_t(r.maps->problem.total_k());
    const size_t tokens = size_t(r.maps->tokens);
    struct Want {
      DeviceMem* mem;
      size_t bytes;
    };
    for (Want w : {Want{&r.gathered_k, gathered * kv_row * 2}, Want{&r.gathered_v, gathered * kv_row * 2},
                   Want{&r.k, total_k * kv_row * 2}, Want{&r.v, total_k * kv_row * 2},
                   Want{&r.lse, size_t(config.num_heads) * tokens * 4},
                   Want{&r.dk, total_k * kv_row * 2}, Want{&r.dv, total_k * kv_row * 2},
                   Want{&r.partial_dk, gathered * kv_row * 4},
                   Want{&r.partial_dv, gathered * kv_row * 4},
                   Want{&r.recv_dk, capacity * kv_row * 4},
                   Want{&r.recv_dv, capacity * kv_row * 4}}) {
      absl::StatusOr<DeviceMem> m = Allocate(w.bytes);
      if (!m.ok()) return m.status();
      *w.mem = *std::move(m);
    }
    for (auto [mem, host] : {std::pair{&r.local_to_packed, &r.maps->local_to_packed},
                             std::pair{&r.key_rows, &r.maps->key_rows},
                             std::pair{&r.key_offsets, &r.maps->key_offsets},
                             std::pair{&r.key_sources, &r.maps->key_sources}}) {
      absl::StatusOr<DeviceMem> m = Upload(*host, r.stream);
      if (!m.ok()) return m.status();
      *mem = *std::move(m);
    }
    if (r.maps->has_work()) {
      absl::StatusOr<VarlenAttention> a =
          VarlenAttention::Create(r.maps->problem, attention_options, r.stream);
      if (!a.ok()) return a.status();
      r.attention.emplace(*std::move(a));
    }
    // The host maps must outlive the uploads; wait here rather than pin them.
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
  }
  return e;
}

absl::Status CpExecutor::Forward(absl::Span<const CpForwardTensors> t) {
  if (t.size() != ranks_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Forward: %d tensor sets for %d local ranks", t.size(), ranks_.size()));
  }
  const int64_t cap = maps_.rank_capacity, h = config_.num_heads, kh = config_.num_kv_heads;
  const int64_t d = config_.head_dim;
  std::vector<const void*> send_k, send_v;
  std::vector<void*> recv_k, recv_v;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int rank = ranks_[i].maps->rank;
    for (auto [x, heads, name] : {std::tuple{&t[i].q, h, "q"}, std::tuple{&t[i].k, kh, "k"},
                                  std::tuple{&t[i].v, kh, "v"}}) {
      if (absl::Status s = CheckThd(*x, cap, heads, d, name, rank); !s.ok()) return s;
    }
    if (absl::Status s = CheckThd(t[i].out, cap, h, d, "out", rank); !s.ok()) return s;
    send_k.push_back(t[i].k.data);
    send_v.push_back(t[i].v.data);
    recv_k.push_back(ranks_[i].gathered_k.get());
    recv_v.push_back(ranks_[i].gathered_v.get());
  }
  const size_t kv_count = size_t(cap * kh * d);
  if (absl::Status s = comm_->AllGather(send_k, recv_k, kv_count, CommDataType::kBf16); !s.ok()) {
    return s;
  }
  if (absl::Status s = comm_->AllGather(send_v, recv_v, kv_count, CommDataType::kBf16); !s.ok()) {
    return s;
  }
  const int64_t kv_row_bytes = kh * d * 2;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    if (r.attention.has_value()) {
      const int64_t total_k = r.maps->problem.total_k();
      auto* kr = static_cast<const int32_t*>(r.key_rows.get());
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(r.gathered_k.get(), kr, total_k,
                                                        kv_row_bytes, r.k.get(), r.stream));
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(r.gathered_v.get(), kr, total_k,
                                                        kv_row_bytes, r.v.get(), r.stream));
      ForwardTensors f;
      f.q = Prefix(t[i].q, r.maps->tokens);
      f.k = {static_cast<const __nv_bfloat16*>(r.k.get()), total_k, kh, d};
      f.v = {static_cast<const __nv_bfloat16*>(r.v.get()), total_k, kh, d};
      f.out = Prefix(t[i].out, r.maps->tokens);
      f.lse = {static_cast<float*>(r.lse.get()), h, r.maps->tokens};
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[0], r.stream));
      if (absl::Status s = r.attention->Forward(f, r.stream); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[1], r.stream));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
    }
    if (absl::Status s = ZeroRowsFrom(t[i].out, r.maps->tokens, r.stream); !s.ok()) return s;
    r.backward_ran = false;
  }
  forward_done_ = true;
  return absl::OkStatus();
}

absl::Status CpExecutor::Backward(absl::Span<const CpBackwardTensors> t) {
  if (!forward_done_) {
    return absl::FailedPreconditionError("Backward needs a Forward of this executor first");
  }
  if (t.size() != ranks_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Backward: %d tensor sets for %d local ranks", t.size(), ranks_.size()));
  }
  const int64_t cap = maps_.rank_capacity, h = config_.num_heads, kh = config_.num_kv_heads;
  const int64_t d = config_.head_dim;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int rank = ranks_[i].maps->rank;
    for (auto [x, name] : {std::pair{&t[i].q, "q"}, std::pair{&t[i].out, "out"},
                           std::pair{&t[i].dout, "dout"}}) {
      if (absl::Status s = CheckThd(*x, cap, h, d, name, rank); !s.ok()) return s;
    }
    if (absl::Status s = CheckThd(t[i].dq, cap, h, d, "dq", rank); !s.ok()) return s;
    if (absl::Status s = CheckThd(t[i].dk, cap, kh, d, "dk", rank); !s.ok()) return s;
    if (absl::Status s = CheckThd(t[i].dv, cap, kh, d, "dv", rank); !s.ok()) return s;
  }
  std::vector<const void*> send_k, send_v;
  std::vector<void*> recv_k, recv_v;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    const int64_t total_k = r.maps->problem.total_k();
    if (r.attention.has_value()) {
      BackwardTensors b;
      b.q = Prefix(t[i].q, r.maps->tokens);
      b.k = {static_cast<const __nv_bfloat16*>(r.k.get()), total_k, kh, d};
      b.v = {static_cast<const __nv_bfloat16*>(r.v.get()), total_k, kh, d};
      b.out = Prefix(t[i].out, r.maps->tokens);
      b.dout = Prefix(t[i].dout, r.maps->tokens);
      b.lse = {static_cast<const float*>(r.lse.get()), h, r.maps->tokens};
      b.dq = Prefix(t[i].dq, r.maps->tokens);
      b.dk = {static_cast<__nv_bfloat16*>(r.dk.get()), total_k, kh, d};
      b.dv = {static_cast<__nv_bfloat16*>(r.dv.get()), total_k, kh, d};
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[2], r.stream));
      if (absl::Status s = r.attention->Backward(b, r.stream); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[3], r.stream));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
      r.backward_ran = true;
    }
    if (absl::Status s = ZeroRowsFrom(t[i].dq, r.maps->tokens, r.stream); !s.ok()) return s;
    // Every rank writes its whole partial (zeros where it has no key), so no memset is needed.
    const auto* offsets = static_cast<const int32_t*>(r.key_offsets.get());
    const auto* sources = static_cast<const int32_t*>(r.key_sources.get());
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCsrSumRows(
        static_cast<const __nv_bfloat16*>(r.dk.get()), offsets, sources, maps_.gathered_rows(),
        kh * d, static_cast<float*>(r.partial_dk.get()), r.stream));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCsrSumRows(
        static_cast<const __nv_bfloat16*>(r.dv.get()), offsets, sources, maps_.gathered_rows(),
        kh * d, static_cast<float*>(r.partial_dv.get()), r.stream));
    send_k.push_back(r.partial_dk.get());
    send_v.push_back(r.partial_dv.get());
    recv_k.push_back(r.recv_dk.get());
    recv_v.push_back(r.recv_dv.get());
  }
  // fp32 over the wire: the sum of C partials is rounded to bf16 once, at the end.
  const size_t count = size_t(cap * kh * d);
  if (absl::Status s = comm_->ReduceScatterSum(send_k, recv_k, count, CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = comm_->ReduceScatterSum(send_v, recv_v, count, CommDataType::kFloat32);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCastToBf16(static_cast<const float*>(r.recv_dk.get()),
                                                      int64_t(count), t[i].dk.data, r.stream));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCastToBf16(static_cast<const float*>(r.recv_dv.get()),
                                                      int64_t(count), t[i].dv.data, r.stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CpRankTimes>> CpExecutor::RankTimes() const {
  if (!forward_done_) return absl::FailedPreconditionError("RankTimes needs a Forward first");
  std::vector<CpRankTimes> times;
  for (const RankState& r : ranks_) {
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
    CpRankTimes t;
    t.rank = r.maps->rank;
    if (r.attention.has_value()) {
      WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t.forward_ms, r.events[0], r.events[1]));
      if (r.backward_ran) {
        WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t.backward_ms, r.events[2], r.events[3]));
      }
    }
    times.push_back(t);
  }
  return times;
}

absl::Status CpExecutor::ShardPacked(const void* packed, int64_t row_bytes,
                                     absl::Span<void* const> local) const {
  if (local.size() != ranks_.size() || row_bytes <= 0 || row_bytes % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ShardPacked: %d buffers for %d local ranks, row_bytes %d (need even, > 0)",
        local.size(), ranks_.size(), row_bytes));
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(
        packed, static_cast<const int32_t*>(r.local_to_packed.get()), r.maps->tokens, row_bytes,
        local[i], r.stream));
    const int64_t pad = maps_.rank_capacity - r.maps->tokens;
    if (pad > 0) {
      WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(static_cast<char*>(local[i]) + r.maps->tokens * row_bytes,
                                               0, pad * row_bytes, r.stream));
    }
  }
  return absl::OkStatus();
}

absl::Status CpExecutor::UnshardToPacked(absl::Span<const void* const> local, int64_t row_bytes,
                                         void* packed) const {
  if (local.size() != ranks_.size() || row_bytes <= 0 || row_bytes % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "UnshardToPacked: %d buffers for %d local ranks, row_bytes %d (need even, > 0)",
        local.size(), ranks_.size(), row_bytes));
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchScatterRows(
        local[i], static_cast<const int32_t*>(r.local_to_packed.get()), r.maps->tokens, row_bytes,
        packed, r.stream));
  }
  return absl::OkStatus();
}

}  // namespace wlb::cuda
