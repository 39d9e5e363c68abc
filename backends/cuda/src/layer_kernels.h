// Launchers of the decoder layer's small kernels (layer_kernels.cu): RMSNorm, RoPE, SwiGLU and
// a seeded fill for random inputs.
// bf16 tensors, fp32 math; every launcher returns cudaGetLastError() of its launch.
#ifndef WLB_CUDA_SRC_LAYER_KERNELS_H_
#define WLB_CUDA_SRC_LAYER_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace wlb::cuda::detail {

// Largest RMSNorm width: the backward keeps one fp32 gain-gradient row in shared memory.
inline constexpr int64_t kMaxNormWidth = 12288;

// y = x / rms(x) * g per row of `width`; rstd[r] = 1 / rms(x_r).
cudaError_t LaunchRmsNormForward(const __nv_bfloat16* x, const __nv_bfloat16* g, __nv_bfloat16* y,
                                 float* rstd, int64_t rows, int64_t width, float eps,
                                 cudaStream_t stream);

// dx = residual + d(RMSNorm)/dx^T dy; dg (fp32, zeroed by the caller) += sum over rows.
cudaError_t LaunchRmsNormBackward(const __nv_bfloat16* x, const __nv_bfloat16* g, const float* rstd,
                                  const __nv_bfloat16* dy, const __nv_bfloat16* residual,
                                  __nv_bfloat16* dx, float* dg, int64_t rows, int64_t width,
                                  cudaStream_t stream);

// In place on (tokens, heads, head_dim): rotates pairs (j, j + head_dim/2) by
// positions[token] * theta^(-2j/head_dim); `inverse` rotates back (the backward).
cudaError_t LaunchRope(__nv_bfloat16* t, const int32_t* positions, int64_t tokens, int64_t heads,
                       int64_t head_dim, double theta, bool inverse, cudaStream_t stream);

// s = silu(gate) * up, gu rows = [gate (ffn) | up (ffn)].
cudaError_t LaunchSwiGluForward(const __nv_bfloat16* gu, __nv_bfloat16* s, int64_t rows,
                                int64_t ffn, cudaStream_t stream);

// dgu = [d gate | d up] from ds.
cudaError_t LaunchSwiGluBackward(const __nv_bfloat16* gu, const __nv_bfloat16* ds,
                                 __nv_bfloat16* dgu, int64_t rows, int64_t ffn,
                                 cudaStream_t stream);

// n seeded values uniform in [-scale, scale] (a counter-based hash: the same seed gives the same
// values). The public entry point with argument checks is wlb::cuda::FillUniformBf16. One thread
// per value, so n is bounded by the grid: at most kMaxFillUniform (larger n:
// cudaErrorInvalidValue).
inline constexpr int64_t kMaxFillUniform = int64_t{0x7fffffff} * 256;
cudaError_t LaunchFillUniform(__nv_bfloat16* t, int64_t n, uint64_t seed, float scale,
                              cudaStream_t stream);

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_LAYER_KERNELS_H_
