// Variable-length causal attention on the GPU: forward (output + log-sum-exp) and backward.
//
// Tensors are THD: (tokens, heads, head_dim), bf16, contiguous, device memory, 16-byte aligned.
// Q has num_heads heads, K and V num_kv_heads (grouped-query attention). The LSE is fp32,
// natural-log, (num_heads, total_q). Semantics (segments, bottom-right causal mask) are in
// attention_problem.h. A VarlenAttention object is the plan: it validates the problem, builds the
// per-tile work lists on the host, uploads them once, and then runs forward/backward any number
// of times (once per layer); the run side only reads the plan.
//
//   wlb::cuda::AttentionProblem p = ...;  // cu_seqlens on the host
//   absl::StatusOr<wlb::cuda::VarlenAttention> attn = wlb::cuda::VarlenAttention::Create(p);
//   if (!attn.ok()) return attn.status();
//   wlb::cuda::ForwardTensors f;
//   f.q = {q_ptr, p.total_q(), 32, 128};  f.k = {k_ptr, p.total_k(), 8, 128};  f.v = ...;
//   f.out = {out_ptr, p.total_q(), 32, 128};  f.lse = {lse_ptr, 32, p.total_q()};
//   absl::Status s = attn->Forward(f, stream);
//
// Every argument is checked before anything is launched; every CUDA call's error becomes a
// Status with file:line. One object must not run two backward passes concurrently (they share
// its fp32 dQ workspace).
#ifndef WLB_CUDA_VARLEN_ATTENTION_H_
#define WLB_CUDA_VARLEN_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/cuda/attention_plan.h"
#include "wlb/cuda/attention_problem.h"

namespace wlb::cuda {
namespace detail {
struct LaunchShape;
class CudnnAttention;
}  // namespace detail

// A contiguous (tokens, heads, head_dim) bf16 tensor in device memory.
template <typename T>
struct ThdTensor {
  T* data = nullptr;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t numel() const { return tokens * heads * head_dim; }
};
using ConstThd = ThdTensor<const __nv_bfloat16>;
using MutableThd = ThdTensor<__nv_bfloat16>;

// A contiguous (heads, tokens) fp32 tensor in device memory.
template <typename T>
struct LseTensor {
  T* data = nullptr;
  int64_t heads = 0;
  int64_t tokens = 0;
  int64_t numel() const { return heads * tokens; }
};

struct ForwardTensors {
  ConstThd q, k, v;
  MutableThd out;         // written completely; must not overlap q, k, v
  LseTensor<float> lse;   // written completely
};

struct BackwardTensors {
  ConstThd q, k, v, out, dout;
  LseTensor<const float> lse;  // as written by Forward
  MutableThd dq, dk, dv;       // written completely; must not overlap the inputs or each other
};

struct AttentionOptions {
  // kFlash (wlb's own kernels), kCudnn (cuDNN fused attention, the fast path; see
  // CudnnEngineCompiledIn) or kReference (plain, slow, any head_dim).
  AttentionKernel kernel = AttentionKernel::kFlash;
  bool backward = true;  // allocate the backward workspace (fp32 dQ, 4 * total_q * heads * dim B)
  // Flash kernels: how blocks map to (tile, head); see attention_tiles.h. Same results, only the
  // schedule (and so the L2 reuse of K/V) differs. Head-major is the default: on an H100
  // (2026-11-25, wlb_cuda_attention_bench, docs/results/gpu/h100_attention.md) it took 0.63-0.97 of
  // heaviest-first's backward time and 0.81-1.01 of its forward time; heaviest-first's forward
  // at 16K hit L2 1.3% of the time and ran DRAM-bound at 2.5 TB/s, head-major's 96%.
  BlockOrder block_order = BlockOrder::kHeadMajor;
  // Flash backward only: the kernel's query tiling (attention_tiles.h). Same gradients (dK, dV
  // equal values, dQ up to its atomics' order), different register use: kQ64 spills at head_dim
  // 128 (docs/results/gpu/bwd_ptxas.md). kQ64 stays the default until a GPU has timed the others.
  FlashBackwardConfig flash_backward = FlashBackwardConfig::kQ64;
};

// Whether this build has the cudnn engine (cuDNN >= 9.6 and the cuDNN frontend headers were
// found at configure time). Without it, Create with AttentionKernel::kCudnn is FailedPrecondition.
bool CudnnEngineCompiledIn();

// The loaded cuDNN library's version (cudnnGetVersion(), e.g. 91900 for 9.19.0); needs no device.
// FailedPrecondition when the engine is compiled out.
absl::StatusOr<int64_t> CudnnRuntimeVersion();

// What the cudnn engine's process-wide graph cache has cost so far: the graphs built (cache
// misses of VarlenAttention::Create, forward and backward counted apart, every device together)
// and the wall seconds spent building them (validate, operation graph, execution plans, support
// check, plan build; failed attempts included). Building is the engine's one-time cost, which a
// benchmark's per-call times hide, so it is reported beside them. Thread-safe; zeros when the
// engine is compiled out.
struct CudnnGraphStats {
  int64_t graphs_built = 0;
  double build_seconds = 0;
};
CudnnGraphStats CudnnGraphStatistics();

// Checks shapes against `problem`, non-null 16-byte-aligned pointers and the no-overlap rules;
// InvalidArgument naming the tensor and the bad value otherwise. Runs on the host only.
absl::Status ValidateForwardTensors(const AttentionProblem& problem, const ForwardTensors& t);
absl::Status ValidateBackwardTensors(const AttentionProblem& problem, const BackwardTensors& t);

class VarlenAttention {
 public:
  // Validates `problem` for options.kernel, builds the work lists and uploads them (and
  // allocates the backward workspace) on `stream`. kCudnn builds (or reuses, per shape class and
  // device) the cuDNN graphs and sizes their workspaces here, so Forward/Backward only execute;
  // it fails with a Status naming the configuration and cuDNN's reason when cuDNN refuses it,
  // the versions when the loaded cuDNN is older than 9.6, or the CUDA error without a device.
  static absl::StatusOr<VarlenAttention> Create(const AttentionProblem& problem,
                                                const AttentionOptions& options = {},
                                                cudaStream_t stream = nullptr);

  VarlenAttention(VarlenAttention&&) noexcept = default;
  VarlenAttention& operator=(VarlenAttention&&) noexcept = default;
  ~VarlenAttention() = default;

  // out = softmax(scale * Q K^T + mask) V, lse = log-sum-exp of the masked scaled scores.
  absl::Status Forward(const ForwardTensors& t, cudaStream_t stream) const;

  // dq, dk, dv: gradients of sum(out * dout). dk/dv sum over the heads of each GQA group.
  absl::Status Backward(const BackwardTensors& t, cudaStream_t stream) const;

  const AttentionProblem& problem() const { return problem_; }
  const AttentionOptions& options() const { return options_; }
  const std::vector<ForwardTile>& forward_tiles() const { return forward_tiles_; }
  const std::vector<BackwardTile>& backward_tiles() const { return backward_tiles_; }

 private:
  struct DeviceFree {
    void operator()(void* p) const;
  };
  using DevicePtr = std::unique_ptr<void, DeviceFree>;

  VarlenAttention() = default;
  detail::LaunchShape Shape() const;

  AttentionProblem problem_;
  AttentionOptions options_;
  std::vector<ForwardTile> forward_tiles_;
  std::vector<BackwardTile> backward_tiles_;
  bool zero_dkv_ = false;  // some keys belong to segments without queries: their grads are zero
  DevicePtr cu_seqlens_q_, cu_seqlens_k_, forward_tiles_dev_, backward_tiles_dev_;
  DevicePtr dq_accum_, dot_do_o_;
  std::shared_ptr<const detail::CudnnAttention> cudnn_;  // kCudnn with at least one query
};

}  // namespace wlb::cuda

#endif  // WLB_CUDA_VARLEN_ATTENTION_H_
