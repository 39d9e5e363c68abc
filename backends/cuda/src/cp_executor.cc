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

// Timing events of a rank: begin and end of each kernel part, and of the key rows' gather
// (forward) and their gradients' sums (backward).
enum TimingEvent {
  kForwardDiagonalBegin,
  kForwardDiagonalEnd,
  kForwardBegin,
  kForwardEnd,
  kBackwardDiagonalBegin,
  kBackwardDiagonalEnd,
  kBackwardBegin,
  kBackwardEnd,
  kGatherBegin,
  kGatherEnd,
  kKeyGradientsBegin,  // the first sum of the gathered rows' dK/dV (all of it under the all-gather)
  kKeyGradientsEnd,
  kOwnKeyGradientsBegin,  // row-exact: the own rows' sum, after the diagonal's backward
  kOwnKeyGradientsEnd,
  kTimingEvents
};

}  // namespace

struct CpExecutor::RankState {
  const CpRankMaps* maps = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;  // the communicator's: the caller's order
  cudaStream_t side = nullptr;    // the diagonal blocks' (split schedule)
  // attention: the maps' problem (keys gathered from the source rows); diagonal: kSplit's.
  std::optional<VarlenAttention> attention, diagonal;
  DeviceMem local_to_packed, key_rows, key_offsets, key_sources, send_rows, return_offsets,
      return_sources, query_rows;
  // source_k/v: the rank's source rows (cp_maps.h); partial_dk/dv: their gradients (fp32);
  // send_k/v, back_dk/dv: the row-exact exchange's rows sent and gradients coming back;
  // recv_dk/dv: the rank's own rows' gradients (fp32, rank_capacity rows); k/v, dk/dv: the
  // problem's keys and their gradients; diagonal_dk/dv: the diagonal's key gradients (tokens
  // rows; a buffer of their own, so aligned for any head size).
  DeviceMem source_k, source_v, send_k, send_v, k, v, lse, dk, dv, diagonal_dk, diagonal_dv,
      partial_dk, partial_dv, back_dk, back_dv, recv_dk, recv_dv;
  // Split schedule: the prefixes' queries, outputs (or the merged outputs they read in
  // backward), output gradients, LSE and dQ, over the maps' query_rows.
  DeviceMem prefix_q, prefix_out, prefix_dout, prefix_lse, prefix_dq;
  cudaEvent_t timing[kTimingEvents] = {};
  cudaEvent_t ready = nullptr, diagonal_done = nullptr;  // stream -> side -> stream joins
  bool backward_ran = false;
};

CpExecutor::~CpExecutor() {
  for (RankState& r : ranks_) {
    cudaSetDevice(r.device);
    for (cudaEvent_t e : r.timing) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : {r.ready, r.diagonal_done}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (r.side != nullptr) cudaStreamDestroy(r.side);
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
  const ExchangeKind exchange =
      options.exchange.value_or(ChooseCpExchange(plan, config, options.comm));
  absl::StatusOr<CpMaps> maps = BuildCpMaps(plan, config, exchange, options.schedule);
  if (!maps.ok()) return maps.status();
  std::unique_ptr<CpExecutor> e(new CpExecutor());
  e->maps_ = *std::move(maps);
  e->config_ = config;
  e->options_ = options;
  e->comm_ = &comm;
  e->ranks_.resize(static_cast<size_t>(comm.num_local_ranks()));
  const int64_t kv_elems = int64_t{config.num_kv_heads} * config.head_dim;
  const size_t kv_row = size_t(kv_elems);
  const size_t q_row = size_t(config.num_heads) * size_t(config.head_dim);
  const size_t capacity = size_t(e->maps_.rank_capacity);
  AttentionOptions attention_options;
  attention_options.kernel = config.kernel;
  for (size_t i = 0; i < e->ranks_.size(); ++i) {
    RankState& r = e->ranks_[i];
    r.maps = &e->maps_.ranks[static_cast<size_t>(comm.global_rank(static_cast<int>(i)))];
    r.device = comm.device(static_cast<int>(i));
    r.stream = comm.stream(static_cast<int>(i));
    e->send_elems_.emplace_back();
    e->recv_elems_.emplace_back();
    for (int64_t rows : r.maps->send_counts) e->send_elems_.back().push_back(rows * kv_elems);
    for (int64_t rows : r.maps->recv_counts) e->recv_elems_.back().push_back(rows * kv_elems);
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    for (cudaEvent_t& ev : r.timing) WLB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev));
    for (cudaEvent_t* ev : {&r.ready, &r.diagonal_done}) {
      WLB_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
    }
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.side, cudaStreamNonBlocking));
    const size_t total_k = size_t(r.maps->problem.total_k());
    const size_t diagonal_k = size_t(r.maps->diagonal.total_k());
    const size_t tokens = size_t(r.maps->tokens);
    const size_t source = size_t(r.maps->source_rows);
    const size_t sent = r.maps->send_rows.size();
    const size_t prefix = r.maps->query_rows.size();
    struct Want {
      DeviceMem* mem;
      size_t bytes;
    };
    for (Want w : {Want{&r.source_k, source * kv_row * 2},
                   Want{&r.source_v, source * kv_row * 2},
                   Want{&r.send_k, sent * kv_row * 2},
                   Want{&r.send_v, sent * kv_row * 2},
                   Want{&r.k, total_k * kv_row * 2},
                   Want{&r.v, total_k * kv_row * 2},
                   Want{&r.lse, size_t(config.num_heads) * tokens * 4},
                   Want{&r.dk, total_k * kv_row * 2},
                   Want{&r.dv, total_k * kv_row * 2},
                   Want{&r.diagonal_dk, diagonal_k * kv_row * 2},
                   Want{&r.diagonal_dv, diagonal_k * kv_row * 2},
                   Want{&r.partial_dk, source * kv_row * 4},
                   Want{&r.partial_dv, source * kv_row * 4},
                   Want{&r.back_dk, sent * kv_row * 4},
                   Want{&r.back_dv, sent * kv_row * 4},
                   Want{&r.recv_dk, capacity * kv_row * 4},
                   Want{&r.recv_dv, capacity * kv_row * 4},
                   Want{&r.prefix_q, prefix * q_row * 2},
                   Want{&r.prefix_out, prefix * q_row * 2},
                   Want{&r.prefix_dout, prefix * q_row * 2},
                   Want{&r.prefix_dq, prefix * q_row * 2},
                   Want{&r.prefix_lse, size_t(config.num_heads) * prefix * 4}}) {
      absl::StatusOr<DeviceMem> m = Allocate(w.bytes);
      if (!m.ok()) return m.status();
      *w.mem = *std::move(m);
    }
    for (auto [mem, host] : {std::pair{&r.local_to_packed, &r.maps->local_to_packed},
                             std::pair{&r.key_rows, &r.maps->key_rows},
                             std::pair{&r.key_offsets, &r.maps->key_offsets},
                             std::pair{&r.key_sources, &r.maps->key_sources},
                             std::pair{&r.send_rows, &r.maps->send_rows},
                             std::pair{&r.return_offsets, &r.maps->return_offsets},
                             std::pair{&r.return_sources, &r.maps->return_sources},
                             std::pair{&r.query_rows, &r.maps->query_rows}}) {
      absl::StatusOr<DeviceMem> m = Upload(*host, r.stream);
      if (!m.ok()) return m.status();
      *mem = *std::move(m);
    }
    for (auto [slot, problem] :
         {std::pair{&r.attention, &r.maps->problem}, std::pair{&r.diagonal, &r.maps->diagonal}}) {
      if (problem->batch() == 0) continue;
      absl::StatusOr<VarlenAttention> a =
          VarlenAttention::Create(*problem, attention_options, r.stream);
      if (!a.ok()) return a.status();
      slot->emplace(*std::move(a));
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
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int rank = ranks_[i].maps->rank;
    for (auto [x, heads, name] : {std::tuple{&t[i].q, h, "q"}, std::tuple{&t[i].k, kh, "k"},
                                  std::tuple{&t[i].v, kh, "v"}}) {
      if (absl::Status s = CheckThd(*x, cap, heads, d, name, rank); !s.ok()) return s;
    }
    if (absl::Status s = CheckThd(t[i].out, cap, h, d, "out", rank); !s.ok()) return s;
  }
  // The diagonal blocks need only the rank's own rows: they start before the exchange, on the
  // side stream.
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.ready, r.stream));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.side, r.ready));
    if (r.diagonal.has_value()) {
      ForwardTensors f;
      f.q = Prefix(t[i].q, r.maps->tokens);
      f.k = Prefix(t[i].k, r.maps->tokens);
      f.v = Prefix(t[i].v, r.maps->tokens);
      f.out = Prefix(t[i].out, r.maps->tokens);
      f.lse = {static_cast<float*>(r.lse.get()), h, r.maps->tokens};
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kForwardDiagonalBegin], r.side));
      if (absl::Status s = r.diagonal->Forward(f, r.side); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kForwardDiagonalEnd], r.side));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.side));
    }
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.diagonal_done, r.side));
  }
  if (absl::Status s = FetchKv(t); !s.ok()) return s;
  const int64_t kv_row_bytes = kh * d * 2, q_row_bytes = h * d * 2;
  const bool split = maps_.schedule == CpSchedule::kSplit;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    const int64_t queries = r.maps->problem.total_q();
    const auto* qr = static_cast<const int32_t*>(r.query_rows.get());
    if (r.attention.has_value()) {
      const int64_t total_k = r.maps->problem.total_k();
      auto* kr = static_cast<const int32_t*>(r.key_rows.get());
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kGatherBegin], r.stream));
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(r.source_k.get(), kr, total_k, kv_row_bytes,
                                                        r.k.get(), r.stream));
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(r.source_v.get(), kr, total_k, kv_row_bytes,
                                                        r.v.get(), r.stream));
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kGatherEnd], r.stream));
      ForwardTensors f;
      f.k = {static_cast<const __nv_bfloat16*>(r.k.get()), total_k, kh, d};
      f.v = {static_cast<const __nv_bfloat16*>(r.v.get()), total_k, kh, d};
      if (split) {  // the prefixes' queries, gathered; their results merge below
        WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherRows(t[i].q.data, qr, queries, q_row_bytes,
                                                          r.prefix_q.get(), r.stream));
        f.q = {static_cast<const __nv_bfloat16*>(r.prefix_q.get()), queries, h, d};
        f.out = {static_cast<__nv_bfloat16*>(r.prefix_out.get()), queries, h, d};
        f.lse = {static_cast<float*>(r.prefix_lse.get()), h, queries};
      } else {
        f.q = Prefix(t[i].q, r.maps->tokens);
        f.out = Prefix(t[i].out, r.maps->tokens);
        f.lse = {static_cast<float*>(r.lse.get()), h, r.maps->tokens};
      }
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kForwardBegin], r.stream));
      if (absl::Status s = r.attention->Forward(f, r.stream); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kForwardEnd], r.stream));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
    }
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.stream, r.diagonal_done));
    if (split && r.attention.has_value()) {
      WLB_CUDA_RETURN_IF_ERROR(detail::LaunchMergeAttention(
          static_cast<const __nv_bfloat16*>(r.prefix_out.get()),
          static_cast<const float*>(r.prefix_lse.get()), qr, queries, h, d, r.maps->tokens,
          t[i].out.data, static_cast<float*>(r.lse.get()), r.stream));
    }
    if (absl::Status s = ZeroRowsFrom(t[i].out, r.maps->tokens, r.stream); !s.ok()) return s;
    r.backward_ran = false;
  }
  forward_done_ = true;
  return absl::OkStatus();
}

absl::Status CpExecutor::KvCollectives(
    std::initializer_list<CommTensor> kv,
    absl::FunctionRef<absl::Status(absl::Span<const CommTensor>)> collective) const {
  if (options_.kv_one_collective) return collective(kv);
  for (const CommTensor& t : kv) {
    if (absl::Status s = collective({t}); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CpExecutor::FetchKv(absl::Span<const CpForwardTensors> t) {
  const int64_t kv_elems = int64_t{config_.num_kv_heads} * config_.head_dim;
  const int64_t kv_row_bytes = kv_elems * 2;
  std::vector<const void*> send_k, send_v;
  std::vector<void*> recv_k, recv_v;
  if (maps_.exchange == ExchangeKind::kAllGather) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      send_k.push_back(t[i].k.data);
      send_v.push_back(t[i].v.data);
      recv_k.push_back(ranks_[i].source_k.get());
      recv_v.push_back(ranks_[i].source_v.get());
    }
    const size_t count = size_t(maps_.rank_capacity * kv_elems);
    return KvCollectives({{send_k, recv_k}, {send_v, recv_v}}, [&](auto tensors) {
      return comm_->AllGather(tensors, count, CommDataType::kBf16);
    });
  }
  // Row-exact: pack the rows every other rank needs, copy the own rows to the head of the
  // source rows, receive the others' behind them.
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    const auto* rows = static_cast<const int32_t*>(r.send_rows.get());
    const int64_t sent = static_cast<int64_t>(r.maps->send_rows.size());
    const int64_t own = r.maps->tokens * kv_row_bytes;
    for (auto [src, packed, dst] : {std::tuple{t[i].k.data, r.send_k.get(), r.source_k.get()},
                                    std::tuple{t[i].v.data, r.send_v.get(), r.source_v.get()}}) {
      WLB_CUDA_RETURN_IF_ERROR(
          detail::LaunchGatherRows(src, rows, sent, kv_row_bytes, packed, r.stream));
      if (own > 0) {
        WLB_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, src, size_t(own), cudaMemcpyDeviceToDevice, r.stream));
      }
    }
    send_k.push_back(r.send_k.get());
    send_v.push_back(r.send_v.get());
    recv_k.push_back(static_cast<char*>(r.source_k.get()) + own);
    recv_v.push_back(static_cast<char*>(r.source_v.get()) + own);
  }
  return KvCollectives({{send_k, recv_k}, {send_v, recv_v}}, [&](auto tensors) {
    return comm_->AllToAllV(tensors, send_elems_, recv_elems_, CommDataType::kBf16);
  });
}

absl::Status CpExecutor::SumKeyGradients(RankState& r, int64_t first, int64_t last) {
  const int64_t kv_elems = int64_t{config_.num_kv_heads} * config_.head_dim;
  const auto* offsets = static_cast<const int32_t*>(r.key_offsets.get()) + first;
  const auto* sources = static_cast<const int32_t*>(r.key_sources.get());
  for (auto [grad, diagonal, partial] :
       {std::tuple{r.dk.get(), r.diagonal_dk.get(), r.partial_dk.get()},
        std::tuple{r.dv.get(), r.diagonal_dv.get(), r.partial_dv.get()}}) {
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCsrSumRows(
        static_cast<const __nv_bfloat16*>(grad), r.maps->problem.total_k(),
        static_cast<const __nv_bfloat16*>(diagonal), offsets, sources, last - first, kv_elems,
        static_cast<float*>(partial) + first * kv_elems, r.stream));
  }
  return absl::OkStatus();
}

absl::Status CpExecutor::SendKvGradients() {
  const int64_t kv_elems = int64_t{config_.num_kv_heads} * config_.head_dim;
  const size_t capacity_elems = size_t(maps_.rank_capacity * kv_elems);
  std::vector<const void*> send_k, send_v;
  std::vector<void*> recv_k, recv_v;
  if (maps_.exchange == ExchangeKind::kAllGather) {
    for (RankState& r : ranks_) {
      send_k.push_back(r.partial_dk.get());
      send_v.push_back(r.partial_dv.get());
      recv_k.push_back(r.recv_dk.get());
      recv_v.push_back(r.recv_dv.get());
    }
    // fp32 over the wire: the sum of C partials is rounded to bf16 once, at the end.
    return KvCollectives({{send_k, recv_k}, {send_v, recv_v}}, [&](auto tensors) {
      return comm_->ReduceScatterSum(tensors, capacity_elems, CommDataType::kFloat32);
    });
  }
  // Row-exact: the received rows' gradients go back to their owners (the reverse all-to-all-v:
  // each rank sends what it received), arriving in send_rows order.
  for (RankState& r : ranks_) {
    const size_t own = size_t(r.maps->tokens * kv_elems) * 4;
    send_k.push_back(static_cast<const char*>(r.partial_dk.get()) + own);
    send_v.push_back(static_cast<const char*>(r.partial_dv.get()) + own);
    recv_k.push_back(r.back_dk.get());
    recv_v.push_back(r.back_dv.get());
  }
  return KvCollectives({{send_k, recv_k}, {send_v, recv_v}}, [&](auto tensors) {
    return comm_->AllToAllV(tensors, recv_elems_, send_elems_, CommDataType::kFloat32);
  });
}

absl::Status CpExecutor::AddReturnedKvGradients(RankState& r) {
  const int64_t kv_elems = int64_t{config_.num_kv_heads} * config_.head_dim;
  const size_t capacity_elems = size_t(maps_.rank_capacity * kv_elems);
  const size_t own = size_t(r.maps->tokens * kv_elems) * 4;
  const auto* offsets = static_cast<const int32_t*>(r.return_offsets.get());
  const auto* sources = static_cast<const int32_t*>(r.return_sources.get());
  for (auto [mine, partial, back] :
       {std::tuple{r.recv_dk.get(), r.partial_dk.get(), r.back_dk.get()},
        std::tuple{r.recv_dv.get(), r.partial_dv.get(), r.back_dv.get()}}) {
    // Padding rows are zero; the own rows start from the rank's own partial sums.
    WLB_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(static_cast<char*>(mine) + own, 0, capacity_elems * 4 - own, r.stream));
    if (own > 0) {
      WLB_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(mine, partial, own, cudaMemcpyDeviceToDevice, r.stream));
    }
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCsrAddRows(static_cast<const float*>(back), offsets,
                                                      sources, r.maps->tokens, kv_elems,
                                                      static_cast<float*>(mine), r.stream));
  }
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
    for (auto [x, heads, name] :
         {std::tuple{&t[i].q, h, "q"}, std::tuple{&t[i].k, kh, "k"}, std::tuple{&t[i].v, kh, "v"},
          std::tuple{&t[i].out, h, "out"}, std::tuple{&t[i].dout, h, "dout"}}) {
      if (absl::Status s = CheckThd(*x, cap, heads, d, name, rank); !s.ok()) return s;
    }
    if (absl::Status s = CheckThd(t[i].dq, cap, h, d, "dq", rank); !s.ok()) return s;
    if (absl::Status s = CheckThd(t[i].dk, cap, kh, d, "dk", rank); !s.ok()) return s;
    if (absl::Status s = CheckThd(t[i].dv, cap, kh, d, "dv", rank); !s.ok()) return s;
  }
  const bool split = maps_.schedule == CpSchedule::kSplit;
  const bool row_exact = maps_.exchange == ExchangeKind::kRowExact;
  const int64_t q_row_bytes = h * d * 2;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    const int64_t tokens = r.maps->tokens, total_k = r.maps->problem.total_k();
    // The diagonal's backward on the side stream, on the rank's own rows, with the merged out
    // and LSE: dQ of every own row, the diagonal's dK/dV.
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.ready, r.stream));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.side, r.ready));
    if (r.diagonal.has_value()) {
      BackwardTensors b;
      b.q = Prefix(t[i].q, tokens);
      b.k = Prefix(t[i].k, tokens);
      b.v = Prefix(t[i].v, tokens);
      b.out = Prefix(t[i].out, tokens);
      b.dout = Prefix(t[i].dout, tokens);
      b.lse = {static_cast<const float*>(r.lse.get()), h, tokens};
      b.dq = Prefix(t[i].dq, tokens);
      b.dk = {static_cast<__nv_bfloat16*>(r.diagonal_dk.get()), tokens, kh, d};
      b.dv = {static_cast<__nv_bfloat16*>(r.diagonal_dv.get()), tokens, kh, d};
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kBackwardDiagonalBegin], r.side));
      if (absl::Status s = r.diagonal->Backward(b, r.side); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kBackwardDiagonalEnd], r.side));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.side));
    }
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.diagonal_done, r.side));
    // The problem's backward (every segment, or the prefixes) on the rank's stream.
    if (r.attention.has_value()) {
      const int64_t queries = r.maps->problem.total_q();
      BackwardTensors b;
      b.k = {static_cast<const __nv_bfloat16*>(r.k.get()), total_k, kh, d};
      b.v = {static_cast<const __nv_bfloat16*>(r.v.get()), total_k, kh, d};
      b.dk = {static_cast<__nv_bfloat16*>(r.dk.get()), total_k, kh, d};
      b.dv = {static_cast<__nv_bfloat16*>(r.dv.get()), total_k, kh, d};
      if (split) {  // the prefixes' rows of q, the merged out, dout and the merged LSE
        const auto* qr = static_cast<const int32_t*>(r.query_rows.get());
        // prefix_q holds the forward's gather of the same q (Backward's contract).
        for (auto [src, dst] : {std::pair{t[i].out.data, r.prefix_out.get()},
                                std::pair{t[i].dout.data, r.prefix_dout.get()}}) {
          WLB_CUDA_RETURN_IF_ERROR(
              detail::LaunchGatherRows(src, qr, queries, q_row_bytes, dst, r.stream));
        }
        WLB_CUDA_RETURN_IF_ERROR(detail::LaunchGatherLseColumns(
            static_cast<const float*>(r.lse.get()), tokens, qr, queries, h,
            static_cast<float*>(r.prefix_lse.get()), r.stream));
        b.q = {static_cast<const __nv_bfloat16*>(r.prefix_q.get()), queries, h, d};
        b.out = {static_cast<const __nv_bfloat16*>(r.prefix_out.get()), queries, h, d};
        b.dout = {static_cast<const __nv_bfloat16*>(r.prefix_dout.get()), queries, h, d};
        b.lse = {static_cast<const float*>(r.prefix_lse.get()), h, queries};
        b.dq = {static_cast<__nv_bfloat16*>(r.prefix_dq.get()), queries, h, d};
      } else {
        b.q = Prefix(t[i].q, tokens);
        b.out = Prefix(t[i].out, tokens);
        b.dout = Prefix(t[i].dout, tokens);
        b.lse = {static_cast<const float*>(r.lse.get()), h, tokens};
        b.dq = Prefix(t[i].dq, tokens);
      }
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kBackwardBegin], r.stream));
      if (absl::Status s = r.attention->Backward(b, r.stream); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kBackwardEnd], r.stream));
      if (options_.isolate_ranks) WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
    }
    r.backward_ran = r.attention.has_value() || r.diagonal.has_value();
    if (absl::Status s = ZeroRowsFrom(t[i].dq, tokens, r.stream); !s.ok()) return s;
    // The source rows' dK/dV sums (every rank writes its whole partial: zeros where it has no
    // key). Row-exact: the received rows first, which only the problem's keys touch, so their
    // return overlaps the diagonal's backward; the own rows after it. All-gather: every row,
    // after it.
    if (!row_exact) WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.stream, r.diagonal_done));
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kKeyGradientsBegin], r.stream));
    if (absl::Status s = SumKeyGradients(r, row_exact ? tokens : 0, r.maps->source_rows); !s.ok()) {
      return s;
    }
    WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kKeyGradientsEnd], r.stream));
  }
  if (absl::Status s = SendKvGradients(); !s.ok()) return s;
  const int64_t count = cap * kh * d;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankState& r = ranks_[i];
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(r.stream, r.diagonal_done));
    if (row_exact) {
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kOwnKeyGradientsBegin], r.stream));
      if (absl::Status s = SumKeyGradients(r, 0, r.maps->tokens); !s.ok()) return s;
      WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.timing[kOwnKeyGradientsEnd], r.stream));
      if (absl::Status s = AddReturnedKvGradients(r); !s.ok()) return s;
    }
    if (split) {  // the prefixes' dQ onto the diagonal's
      WLB_CUDA_RETURN_IF_ERROR(
          detail::LaunchScatterAddRows(static_cast<const __nv_bfloat16*>(r.prefix_dq.get()),
                                       static_cast<const int32_t*>(r.query_rows.get()),
                                       r.maps->problem.total_q(), h * d, t[i].dq.data, r.stream));
    }
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCastToBf16(static_cast<const float*>(r.recv_dk.get()),
                                                      count, t[i].dk.data, r.stream));
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchCastToBf16(static_cast<const float*>(r.recv_dv.get()),
                                                      count, t[i].dv.data, r.stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CpRankTimes>> CpExecutor::RankTimes() const {
  if (!forward_done_) return absl::FailedPreconditionError("RankTimes needs a Forward first");
  std::vector<CpRankTimes> times;
  for (const RankState& r : ranks_) {
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(r.device));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.side));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
    // The kernel time between two timing events; 0 for a part the rank does not run.
    auto elapsed = [&](bool ran, TimingEvent begin, TimingEvent end) -> absl::StatusOr<float> {
      float ms = 0.0f;
      if (ran) WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.timing[begin], r.timing[end]));
      return ms;
    };
    const bool whole = r.attention.has_value(), diagonal = r.diagonal.has_value();
    const bool row_exact = maps_.exchange == ExchangeKind::kRowExact;
    CpRankTimes t;
    t.rank = r.maps->rank;
    for (auto [ms, ran, begin, end] :
         {std::tuple{&t.gather_ms, whole, kGatherBegin, kGatherEnd},
          std::tuple{&t.key_gradients_ms, r.backward_ran, kKeyGradientsBegin, kKeyGradientsEnd},
          std::tuple{&t.key_gradients_ms, r.backward_ran && row_exact, kOwnKeyGradientsBegin,
                     kOwnKeyGradientsEnd}}) {
      absl::StatusOr<float> part = elapsed(ran, begin, end);
      if (!part.ok()) return part.status();
      *ms += *part;
    }
    for (auto [ms, ran, begin, end] :
         {std::tuple{&t.forward_ms, whole, kForwardBegin, kForwardEnd},
          std::tuple{&t.forward_ms, diagonal, kForwardDiagonalBegin, kForwardDiagonalEnd},
          std::tuple{&t.backward_ms, whole && r.backward_ran, kBackwardBegin, kBackwardEnd},
          std::tuple{&t.backward_ms, diagonal && r.backward_ran, kBackwardDiagonalBegin,
                     kBackwardDiagonalEnd}}) {
      absl::StatusOr<float> part = elapsed(ran, begin, end);
      if (!part.ok()) return part.status();
      *ms += *part;
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
