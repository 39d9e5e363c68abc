#include "wlb/cuda/varlen_attention.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "src/cudnn_attention.h"
#include "src/kernels.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {
namespace {

struct Range {
  const char* name;
  uintptr_t begin;
  uintptr_t end;
};

// A tensor's data must be non-null when it holds elements, and 16-byte aligned for vector loads.
absl::Status CheckPointer(const void* data, int64_t numel, const char* name) {
  if (numel > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s is null", name));
  }
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s = %p is not 16-byte aligned", name, data));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CheckThd(const ThdTensor<T>& t, const char* name, int64_t tokens, int64_t heads,
                      int64_t head_dim) {
  if (t.tokens != tokens || t.heads != heads || t.head_dim != head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has shape (%d, %d, %d); expected (tokens=%d, heads=%d, head_dim=%d)", name, t.tokens,
        t.heads, t.head_dim, tokens, heads, head_dim));
  }
  return CheckPointer(t.data, t.numel(), name);
}

template <typename T>
absl::Status CheckLse(const LseTensor<T>& t, const char* name, int64_t heads, int64_t tokens) {
  if (t.heads != heads || t.tokens != tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has shape (%d, %d); expected (heads=%d, tokens=%d)", name, t.heads,
                        t.tokens, heads, tokens));
  }
  return CheckPointer(t.data, t.numel(), name);
}

template <typename T>
Range RangeOf(const ThdTensor<T>& t, const char* name) {
  const auto b = reinterpret_cast<uintptr_t>(t.data);
  return {name, b, b + static_cast<uintptr_t>(t.numel()) * sizeof(__nv_bfloat16)};
}

template <typename T>
Range RangeOf(const LseTensor<T>& t, const char* name) {
  const auto b = reinterpret_cast<uintptr_t>(t.data);
  return {name, b, b + static_cast<uintptr_t>(t.numel()) * sizeof(float)};
}

// Outputs must not overlap any other tensor of the call.
absl::Status CheckNoOverlap(std::initializer_list<Range> outputs,
                            std::initializer_list<Range> all) {
  for (const Range& o : outputs) {
    if (o.begin == o.end) continue;
    for (const Range& x : all) {
      if (x.name == o.name || x.begin == x.end) continue;
      if (o.begin < x.end && x.begin < o.end) {
        return absl::InvalidArgumentError(
            absl::StrFormat("output %s overlaps %s in memory", o.name, x.name));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForwardTensors(const AttentionProblem& p, const ForwardTensors& t) {
  const int64_t tq = p.total_q(), tk = p.total_k(), d = p.head_dim;
  if (auto s = CheckThd(t.q, "q", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.k, "k", tk, p.num_kv_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.v, "v", tk, p.num_kv_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.out, "out", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckLse(t.lse, "lse", p.num_heads, tq); !s.ok()) return s;
  const Range out = RangeOf(t.out, "out"), lse = RangeOf(t.lse, "lse");
  return CheckNoOverlap({out, lse}, {RangeOf(t.q, "q"), RangeOf(t.k, "k"), RangeOf(t.v, "v"),
                                     out, lse});
}

absl::Status ValidateBackwardTensors(const AttentionProblem& p, const BackwardTensors& t) {
  const int64_t tq = p.total_q(), tk = p.total_k(), d = p.head_dim;
  if (auto s = CheckThd(t.q, "q", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.k, "k", tk, p.num_kv_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.v, "v", tk, p.num_kv_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.out, "out", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.dout, "dout", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckLse(t.lse, "lse", p.num_heads, tq); !s.ok()) return s;
  if (auto s = CheckThd(t.dq, "dq", tq, p.num_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.dk, "dk", tk, p.num_kv_heads, d); !s.ok()) return s;
  if (auto s = CheckThd(t.dv, "dv", tk, p.num_kv_heads, d); !s.ok()) return s;
  const Range dq = RangeOf(t.dq, "dq"), dk = RangeOf(t.dk, "dk"), dv = RangeOf(t.dv, "dv");
  return CheckNoOverlap({dq, dk, dv},
                        {RangeOf(t.q, "q"), RangeOf(t.k, "k"), RangeOf(t.v, "v"),
                         RangeOf(t.out, "out"), RangeOf(t.dout, "dout"), RangeOf(t.lse, "lse"),
                         dq, dk, dv});
}

void VarlenAttention::DeviceFree::operator()(void* p) const {
  // A destructor cannot report; cudaFree only fails here if the context is already gone.
  (void)cudaFree(p);
}

namespace {

template <typename Ptr>
absl::Status Upload(Ptr& dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  void* raw = nullptr;
  WLB_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, bytes));
  dst.reset(raw);
  WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(raw, src, bytes, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

template <typename Ptr>
absl::Status Allocate(Ptr& dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  void* raw = nullptr;
  WLB_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, bytes));
  dst.reset(raw);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VarlenAttention> VarlenAttention::Create(const AttentionProblem& problem,
                                                        const AttentionOptions& options,
                                                        cudaStream_t stream) {
  if (absl::Status s = ValidateProblem(problem, options.kernel); !s.ok()) return s;
  if (absl::Status s = ValidateFlashBackwardConfig(options.flash_backward); !s.ok()) return s;
  VarlenAttention a;
  a.problem_ = problem;
  a.options_ = options;
  if (options.kernel == AttentionKernel::kCudnn) {
    if (auto v = CudnnRuntimeVersion(); !v.ok()) return v.status();
    if (problem.total_q() > 0) {
      auto engine = detail::CreateCudnnAttention(problem, options.backward, stream);
      if (!engine.ok()) return engine.status();
      a.cudnn_ = *std::move(engine);
    }
    return a;
  }
  if (options.kernel == AttentionKernel::kFlash) {
    a.forward_tiles_ = BuildForwardTiles(problem, detail::kFwdBlockM, options.block_order);
    a.backward_tiles_ = BuildBackwardTiles(problem, detail::kBwdBlockN, options.block_order);
    for (int b = 0; b < problem.batch(); ++b) {
      if (problem.seqlen_q(b) == 0 && problem.seqlen_k(b) > 0) a.zero_dkv_ = true;
    }
  }
  const size_t cu_bytes = problem.cu_seqlens_q.size() * sizeof(int32_t);
  if (auto s = Upload(a.cu_seqlens_q_, problem.cu_seqlens_q.data(), cu_bytes, stream); !s.ok()) {
    return s;
  }
  if (auto s = Upload(a.cu_seqlens_k_, problem.cu_seqlens_k.data(), cu_bytes, stream); !s.ok()) {
    return s;
  }
  if (auto s = Upload(a.forward_tiles_dev_, a.forward_tiles_.data(),
                      a.forward_tiles_.size() * sizeof(ForwardTile), stream);
      !s.ok()) {
    return s;
  }
  if (auto s = Upload(a.backward_tiles_dev_, a.backward_tiles_.data(),
                      a.backward_tiles_.size() * sizeof(BackwardTile), stream);
      !s.ok()) {
    return s;
  }
  if (options.backward) {
    const size_t rows = size_t(problem.total_q()) * problem.num_heads;
    if (options.kernel == AttentionKernel::kFlash) {
      if (auto s = Allocate(a.dq_accum_, rows * problem.head_dim * sizeof(float)); !s.ok()) {
        return s;
      }
    }
    if (auto s = Allocate(a.dot_do_o_, rows * sizeof(float)); !s.ok()) return s;
  }
  // The host vectors stay alive in `a`, but make the upload visible to other streams too.
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return a;
}

detail::LaunchShape VarlenAttention::Shape() const {
  detail::LaunchShape s{};
  s.total_q = problem_.total_q();
  s.total_k = problem_.total_k();
  s.num_heads = problem_.num_heads;
  s.num_kv_heads = problem_.num_kv_heads;
  s.head_dim = problem_.head_dim;
  s.scale = problem_.softmax_scale;
  s.causal = problem_.causal;
  s.cu_seqlens_q = static_cast<const int32_t*>(cu_seqlens_q_.get());
  s.cu_seqlens_k = static_cast<const int32_t*>(cu_seqlens_k_.get());
  s.batch = problem_.batch();
  return s;
}

absl::Status VarlenAttention::Forward(const ForwardTensors& t, cudaStream_t stream) const {
  if (absl::Status s = ValidateForwardTensors(problem_, t); !s.ok()) return s;
  if (problem_.total_q() == 0) return absl::OkStatus();
  if (cudnn_) return detail::CudnnForward(*cudnn_, t, stream);
  detail::ForwardLaunch l{};
  l.q = t.q.data;
  l.k = t.k.data;
  l.v = t.v.data;
  l.out = t.out.data;
  l.lse = t.lse.data;
  static_cast<detail::LaunchShape&>(l) = Shape();
  l.tiles = static_cast<const ForwardTile*>(forward_tiles_dev_.get());
  l.num_tiles = static_cast<int>(forward_tiles_.size());
  if (options_.kernel == AttentionKernel::kFlash) {
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchFlashForward(l, options_.block_order, stream));
  } else {
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchReferenceForward(l, stream));
  }
  return absl::OkStatus();
}

absl::Status VarlenAttention::Backward(const BackwardTensors& t, cudaStream_t stream) const {
  if (!options_.backward) {
    return absl::FailedPreconditionError(
        "Backward called on a VarlenAttention created with options.backward = false");
  }
  if (absl::Status s = ValidateBackwardTensors(problem_, t); !s.ok()) return s;
  const size_t kv_bytes = size_t(t.dk.numel()) * sizeof(__nv_bfloat16);
  if (problem_.total_q() == 0) {
    // No query: every key's gradient is zero.
    if (kv_bytes > 0) {
      WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dk.data, 0, kv_bytes, stream));
      WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dv.data, 0, kv_bytes, stream));
    }
    return absl::OkStatus();
  }
  if (cudnn_) return detail::CudnnBackward(*cudnn_, t, stream);
  detail::BackwardLaunch l{};
  l.q = t.q.data;
  l.k = t.k.data;
  l.v = t.v.data;
  l.out = t.out.data;
  l.dout = t.dout.data;
  l.lse = t.lse.data;
  l.dq = t.dq.data;
  l.dk = t.dk.data;
  l.dv = t.dv.data;
  l.dq_accum = static_cast<float*>(dq_accum_.get());
  l.dot_do_o = static_cast<float*>(dot_do_o_.get());
  static_cast<detail::LaunchShape&>(l) = Shape();
  l.tiles = static_cast<const BackwardTile*>(backward_tiles_dev_.get());
  l.num_tiles = static_cast<int>(backward_tiles_.size());
  if (options_.kernel == AttentionKernel::kFlash) {
    if (zero_dkv_ && kv_bytes > 0) {
      WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dk.data, 0, kv_bytes, stream));
      WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dv.data, 0, kv_bytes, stream));
    }
    WLB_CUDA_RETURN_IF_ERROR(
        detail::LaunchFlashBackward(l, options_.block_order, options_.flash_backward, stream));
  } else {
    WLB_CUDA_RETURN_IF_ERROR(detail::LaunchReferenceBackward(l, stream));
  }
  return absl::OkStatus();
}

}  // namespace wlb::cuda
