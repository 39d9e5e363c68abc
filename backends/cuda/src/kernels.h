// Internal launch interface between the C++ API (varlen_attention.cc, compiled by the host
// compiler) and the CUDA translation units. Plain types only, so nvcc never sees Abseil.
#ifndef WLB_CUDA_SRC_KERNELS_H_
#define WLB_CUDA_SRC_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "wlb/cuda/attention_tiles.h"

namespace wlb::cuda::detail {

// Tile sizes of the flash kernels; the host plan builder and the kernels must agree.
inline constexpr int kFwdBlockM = 128;  // query rows per forward block (4 warps x 32 rows)
inline constexpr int kBwdBlockN = 64;   // keys per backward block (4 warps x 16 keys)

// What every launch needs to know about the problem (filled once from the plan).
struct LaunchShape {
  int64_t total_q;
  int64_t total_k;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  float scale;
  bool causal;
  const int32_t* cu_seqlens_q;  // device; reference kernels only
  const int32_t* cu_seqlens_k;
  int batch;
};

struct ForwardLaunch : LaunchShape {
  const void* q;  // bf16 (total_q, num_heads, head_dim)
  const void* k;  // bf16 (total_k, num_kv_heads, head_dim)
  const void* v;
  void* out;   // bf16 (total_q, num_heads, head_dim)
  float* lse;  // (num_heads, total_q)
  const ForwardTile* tiles;  // flash kernel
  int num_tiles;
};

struct BackwardLaunch : LaunchShape {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  float* dq_accum;  // fp32 (total_q, num_heads, head_dim), flash only
  float* dot_do_o;  // fp32 (num_heads, total_q): rowsum(dout * out)
  const BackwardTile* tiles;  // flash kernel
  int num_tiles;
};

// Each returns the first CUDA error met (attribute setting, launch), else cudaSuccess. The flash
// launchers accept head_dim 64 and 128 only (cudaErrorInvalidValue otherwise).
// `order` must be the one the tile list was built for: it picks the kernel instantiation (a
// template parameter, not a launch field, so the default kernel's registers are unchanged).
cudaError_t LaunchFlashForward(const ForwardLaunch& a, BlockOrder order, cudaStream_t stream);
// `config` picks the backward kernel's query tiling (attention_tiles.h); any value is valid for any
// tile list.
cudaError_t LaunchFlashBackward(const BackwardLaunch& a, BlockOrder order,
                                FlashBackwardConfig config, cudaStream_t stream);
cudaError_t LaunchReferenceForward(const ForwardLaunch& a, cudaStream_t stream);
cudaError_t LaunchReferenceBackward(const BackwardLaunch& a, cudaStream_t stream);

// The cudnn engine's statistics layout: (total_q, heads) <-> (heads, total_q), fp32, lse_layout.h.
cudaError_t LaunchStatsToLse(const float* stats, float* lse, int heads, int64_t total_q,
                             cudaStream_t stream);
cudaError_t LaunchLseToStats(const float* lse, float* stats, int heads, int64_t total_q,
                             cudaStream_t stream);

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_KERNELS_H_
