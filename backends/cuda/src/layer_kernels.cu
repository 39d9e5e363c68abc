#include <algorithm>
#include <cub/block/block_reduce.cuh>

#include "layer_kernels.h"

namespace wlb::cuda::detail {
namespace {

constexpr int kThreads = 256;
using BlockSum = cub::BlockReduce<float, kThreads>;

__global__ void RmsNormForwardKernel(const __nv_bfloat16* x, const __nv_bfloat16* g,
                                     __nv_bfloat16* y, float* rstd, int64_t width, float eps) {
  __shared__ typename BlockSum::TempStorage temp;
  __shared__ float row_rstd;
  const __nv_bfloat16* xr = x + blockIdx.x * width;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < width; j += kThreads) {
    const float v = __bfloat162float(xr[j]);
    ss += v * v;
  }
  const float total = BlockSum(temp).Sum(ss);
  if (threadIdx.x == 0) {
    row_rstd = rsqrtf(total / static_cast<float>(width) + eps);
    rstd[blockIdx.x] = row_rstd;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < width; j += kThreads) {
    y[blockIdx.x * width + j] =
        __float2bfloat16(__bfloat162float(xr[j]) * row_rstd * __bfloat162float(g[j]));
  }
}

// Each block walks a contiguous range of rows and keeps its share of dg in shared memory, so dg
// costs one atomic per (block, column) instead of one per element.
__global__ void RmsNormBackwardKernel(const __nv_bfloat16* x, const __nv_bfloat16* g,
                                      const float* rstd, const __nv_bfloat16* dy,
                                      const __nv_bfloat16* residual, __nv_bfloat16* dx, float* dg,
                                      int64_t rows, int64_t width, int64_t rows_per_block) {
  extern __shared__ float dg_block[];
  __shared__ typename BlockSum::TempStorage temp;
  __shared__ float row_dot;
  for (int64_t j = threadIdx.x; j < width; j += kThreads) dg_block[j] = 0.f;
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = min(rows, first + rows_per_block);
  for (int64_t r = first; r < last; ++r) {
    const int64_t base = r * width;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < width; j += kThreads) {
      dot +=
          __bfloat162float(dy[base + j]) * __bfloat162float(g[j]) * __bfloat162float(x[base + j]);
    }
    const float total = BlockSum(temp).Sum(dot);
    if (threadIdx.x == 0) row_dot = total;
    __syncthreads();
    const float rs = rstd[r];
    const float c = row_dot * rs * rs * rs / static_cast<float>(width);
    for (int64_t j = threadIdx.x; j < width; j += kThreads) {
      const float xv = __bfloat162float(x[base + j]);
      const float dyv = __bfloat162float(dy[base + j]);
      dx[base + j] = __float2bfloat16(__bfloat162float(residual[base + j]) +
                                      dyv * __bfloat162float(g[j]) * rs - xv * c);
      dg_block[j] += dyv * xv * rs;
    }
    __syncthreads();  // row_dot and temp are reused by the next row
  }
  for (int64_t j = threadIdx.x; j < width; j += kThreads) atomicAdd(&dg[j], dg_block[j]);
}

__global__ void RopeKernel(__nv_bfloat16* t, const int32_t* positions, int64_t tokens,
                           int64_t heads, int64_t head_dim, double theta, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * heads * half) return;
  const int64_t j = i % half;
  const int64_t row = i / half;  // token * heads + head
  const int64_t token = row / heads;
  // The angle in double and reduced mod 2 pi before the float sincos: positions reach 2^17, where
  // a float angle would be off by a hundredth of a radian.
  const double angle = static_cast<double>(positions[token]) *
                       pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
  const float reduced = static_cast<float>(fmod(angle, 6.283185307179586));
  float s, c;
  sincosf(reduced, &s, &c);
  s *= sign;
  __nv_bfloat16* p = t + row * head_dim;
  const float a = __bfloat162float(p[j]), b = __bfloat162float(p[j + half]);
  p[j] = __float2bfloat16(a * c - b * s);
  p[j + half] = __float2bfloat16(b * c + a * s);
}

__device__ float Sigmoid(float v) { return 1.f / (1.f + __expf(-v)); }

__global__ void SwiGluForwardKernel(const __nv_bfloat16* gu, __nv_bfloat16* s, int64_t rows,
                                    int64_t ffn) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * ffn) return;
  const int64_t r = i / ffn, j = i % ffn;
  const float gate = __bfloat162float(gu[r * 2 * ffn + j]);
  const float up = __bfloat162float(gu[r * 2 * ffn + ffn + j]);
  s[i] = __float2bfloat16(gate * Sigmoid(gate) * up);
}

__global__ void SwiGluBackwardKernel(const __nv_bfloat16* gu, const __nv_bfloat16* ds,
                                     __nv_bfloat16* dgu, int64_t rows, int64_t ffn) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * ffn) return;
  const int64_t r = i / ffn, j = i % ffn;
  const float gate = __bfloat162float(gu[r * 2 * ffn + j]);
  const float up = __bfloat162float(gu[r * 2 * ffn + ffn + j]);
  const float d = __bfloat162float(ds[i]);
  const float sig = Sigmoid(gate);
  dgu[r * 2 * ffn + j] = __float2bfloat16(d * up * sig * (1.f + gate * (1.f - sig)));
  dgu[r * 2 * ffn + ffn + j] = __float2bfloat16(d * gate * sig);
}

__global__ void FillUniformKernel(__nv_bfloat16* t, int64_t n, uint64_t seed, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  t[i] = __float2bfloat16((static_cast<float>(z >> 40) * (2.f / 16777216.f) - 1.f) * scale);
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchRmsNormForward(const __nv_bfloat16* x, const __nv_bfloat16* g, __nv_bfloat16* y,
                                 float* rstd, int64_t rows, int64_t width, float eps,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, g, y, rstd, width,
                                                                             eps);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackward(const __nv_bfloat16* x, const __nv_bfloat16* g, const float* rstd,
                                  const __nv_bfloat16* dy, const __nv_bfloat16* residual,
                                  __nv_bfloat16* dx, float* dg, int64_t rows, int64_t width,
                                  cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(rows, 1024);
  const int64_t per_block = (rows + blocks - 1) / blocks;
  const size_t smem = static_cast<size_t>(width) * sizeof(float);
  if (smem > 32 * 1024) {  // with the static shared memory, past the 48 KiB default
    const cudaError_t e = cudaFuncSetAttribute(
        RmsNormBackwardKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  RmsNormBackwardKernel<<<static_cast<unsigned>((rows + per_block - 1) / per_block), kThreads, smem,
                          stream>>>(x, g, rstd, dy, residual, dx, dg, rows, width, per_block);
  return cudaGetLastError();
}

cudaError_t LaunchRope(__nv_bfloat16* t, const int32_t* positions, int64_t tokens, int64_t heads,
                       int64_t head_dim, double theta, bool inverse, cudaStream_t stream) {
  const int64_t n = tokens * heads * (head_dim / 2);
  if (n == 0) return cudaSuccess;
  RopeKernel<<<Blocks(n), kThreads, 0, stream>>>(t, positions, tokens, heads, head_dim, theta,
                                                 inverse ? -1.f : 1.f);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluForward(const __nv_bfloat16* gu, __nv_bfloat16* s, int64_t rows,
                                int64_t ffn, cudaStream_t stream) {
  if (rows * ffn == 0) return cudaSuccess;
  SwiGluForwardKernel<<<Blocks(rows * ffn), kThreads, 0, stream>>>(gu, s, rows, ffn);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluBackward(const __nv_bfloat16* gu, const __nv_bfloat16* ds,
                                 __nv_bfloat16* dgu, int64_t rows, int64_t ffn,
                                 cudaStream_t stream) {
  if (rows * ffn == 0) return cudaSuccess;
  SwiGluBackwardKernel<<<Blocks(rows * ffn), kThreads, 0, stream>>>(gu, ds, dgu, rows, ffn);
  return cudaGetLastError();
}

cudaError_t LaunchFillUniform(__nv_bfloat16* t, int64_t n, uint64_t seed, float scale,
                              cudaStream_t stream) {
  static_assert(kMaxFillUniform == int64_t{0x7fffffff} * kThreads, "one thread per value");
  if (n == 0) return cudaSuccess;
  if (n < 0 || n > kMaxFillUniform) return cudaErrorInvalidValue;  // the grid would wrap
  FillUniformKernel<<<Blocks(n), kThreads, 0, stream>>>(t, n, seed, scale);
  return cudaGetLastError();
}

}  // namespace wlb::cuda::detail
