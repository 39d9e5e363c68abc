// Row gathers/scatters (Thrust), CSR row sums, buffer sums and the split schedule's log-sum-exp
// merge for the CP executor.
#include <thrust/execution_policy.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scatter.h>
#include <thrust/system/cuda/error.h>
#include <thrust/transform.h>

#include <cstdint>

#include "src/cp_kernels.h"

namespace wlb::cuda::detail {
namespace {

// Element e of a row-indexed copy: unit (e % units) of row index[e / units].
struct RowUnitMap {
  const int32_t* index;
  int64_t units;
  __host__ __device__ int64_t operator()(int64_t e) const {
    return static_cast<int64_t>(index[e / units]) * units + e % units;
  }
};

template <typename Unit, bool kScatter>
cudaError_t MoveRows(const void* src, const int32_t* index, int64_t rows, int64_t units,
                     void* dst, cudaStream_t stream) {
  const auto policy = thrust::cuda::par_nosync.on(stream);
  const auto map = thrust::make_transform_iterator(thrust::counting_iterator<int64_t>(0),
                                                   RowUnitMap{index, units});
  const Unit* s = static_cast<const Unit*>(src);
  Unit* d = static_cast<Unit*>(dst);
  try {
    if constexpr (kScatter) {
      thrust::scatter(policy, s, s + rows * units, map, d);
    } else {
      thrust::gather(policy, map, map + rows * units, s, d);
    }
  } catch (const thrust::system_error& e) {
    return static_cast<cudaError_t>(e.code().value());
  }
  return cudaGetLastError();
}

// The widest unit that divides the row and the pointers' alignment.
template <bool kScatter>
cudaError_t MoveRowsDispatch(const void* src, const int32_t* index, int64_t rows,
                             int64_t row_bytes, void* dst, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const auto align = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                     static_cast<uintptr_t>(row_bytes);
  if (align % 16 == 0) return MoveRows<uint4, kScatter>(src, index, rows, row_bytes / 16, dst, stream);
  if (align % 8 == 0) return MoveRows<uint2, kScatter>(src, index, rows, row_bytes / 8, dst, stream);
  if (align % 4 == 0) return MoveRows<uint32_t, kScatter>(src, index, rows, row_bytes / 4, dst, stream);
  if (align % 2 == 0) return MoveRows<uint16_t, kScatter>(src, index, rows, row_bytes / 2, dst, stream);
  return cudaErrorInvalidValue;
}

// dst row g = (kAccumulate ? dst row g : 0) + the CSR sum of its source rows, in fp32; source
// rows from `split` on are tail's rows (source - split).
template <typename Src, bool kAccumulate>
__global__ void CsrSumRowsKernel(const Src* __restrict__ src, int64_t split,
                                 const Src* __restrict__ tail, const int32_t* __restrict__ offsets,
                                 const int32_t* __restrict__ sources, int64_t dst_rows,
                                 int64_t row_elems, float* __restrict__ dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dst_rows * row_elems) return;
  const int64_t row = e / row_elems;
  const int64_t col = e % row_elems;
  float sum = kAccumulate ? dst[e] : 0.0f;
  for (int32_t i = offsets[row]; i < offsets[row + 1]; ++i) {
    const int64_t s = sources[i];
    const Src* from = s < split ? src + s * row_elems : tail + (s - split) * row_elems;
    sum += static_cast<float>(from[col]);
  }
  dst[e] = sum;
}

struct SumInputs {
  const void* p[kMaxSumInputs];
};

template <typename T>
__global__ void SumBuffersKernel(SumInputs in, int n, int64_t count, T* __restrict__ dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= count) return;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 2) {
      sum += __bfloat162float(static_cast<const __nv_bfloat16*>(in.p[i])[e]);
    } else {
      sum += static_cast<const float*>(in.p[i])[e];
    }
  }
  if constexpr (sizeof(T) == 2) {
    dst[e] = __float2bfloat16_rn(sum);
  } else {
    dst[e] = sum;
  }
}

// One (row, head, element) of LaunchMergeAttention's output; lse is updated by a second kernel,
// after every element has read the old value.
__global__ void MergeOutKernel(const __nv_bfloat16* __restrict__ part_out,
                               const float* __restrict__ part_lse, const int32_t* __restrict__ rows,
                               int64_t n, int64_t heads, int64_t head_dim, int64_t tokens,
                               __nv_bfloat16* __restrict__ out, const float* __restrict__ lse) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * heads * head_dim) return;
  const int64_t i = e / (heads * head_dim);
  const int64_t h = e / head_dim % heads;
  const int64_t row = rows[i];
  const float own = lse[h * tokens + row], part = part_lse[h * n + i];
  const float top = fmaxf(own, part);
  const float w_own = expf(own - top), w_part = expf(part - top);
  const int64_t at = (row * heads + h) * head_dim + e % head_dim;
  const float merged =
      (w_own * __bfloat162float(out[at]) + w_part * __bfloat162float(part_out[e])) /
      (w_own + w_part);
  out[at] = __float2bfloat16_rn(merged);
}

__global__ void MergeLseKernel(const float* __restrict__ part_lse, const int32_t* __restrict__ rows,
                               int64_t n, int64_t heads, int64_t tokens, float* __restrict__ lse) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * heads) return;
  const int64_t h = e / n, i = e % n;
  float& own = lse[h * tokens + rows[i]];
  const float part = part_lse[e];
  const float top = fmaxf(own, part);
  own = top + logf(expf(own - top) + expf(part - top));
}

__global__ void GatherLseKernel(const float* __restrict__ src, int64_t src_tokens,
                                const int32_t* __restrict__ rows, int64_t n, int64_t heads,
                                float* __restrict__ dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * heads) return;
  dst[e] = src[(e / n) * src_tokens + rows[e % n]];
}

__global__ void ScatterAddRowsKernel(const __nv_bfloat16* __restrict__ src,
                                     const int32_t* __restrict__ rows, int64_t n, int64_t row_elems,
                                     __nv_bfloat16* __restrict__ dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * row_elems) return;
  __nv_bfloat16& d = dst[static_cast<int64_t>(rows[e / row_elems]) * row_elems + e % row_elems];
  d = __float2bfloat16_rn(__bfloat162float(d) + __bfloat162float(src[e]));
}

struct ToBf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchGatherRows(const void* src, const int32_t* index, int64_t rows,
                             int64_t row_bytes, void* dst, cudaStream_t stream) {
  return MoveRowsDispatch<false>(src, index, rows, row_bytes, dst, stream);
}

cudaError_t LaunchScatterRows(const void* src, const int32_t* index, int64_t rows,
                              int64_t row_bytes, void* dst, cudaStream_t stream) {
  return MoveRowsDispatch<true>(src, index, rows, row_bytes, dst, stream);
}

cudaError_t LaunchCsrSumRows(const __nv_bfloat16* src, int64_t split, const __nv_bfloat16* tail,
                             const int32_t* offsets, const int32_t* sources, int64_t dst_rows,
                             int64_t row_elems, float* dst, cudaStream_t stream) {
  const int64_t n = dst_rows * row_elems;
  if (n == 0) return cudaSuccess;
  CsrSumRowsKernel<__nv_bfloat16, false><<<Blocks(n), kThreads, 0, stream>>>(
      src, split, tail, offsets, sources, dst_rows, row_elems, dst);
  return cudaGetLastError();
}

cudaError_t LaunchCsrAddRows(const float* src, const int32_t* offsets, const int32_t* sources,
                             int64_t dst_rows, int64_t row_elems, float* dst, cudaStream_t stream) {
  const int64_t n = dst_rows * row_elems;
  if (n == 0) return cudaSuccess;
  CsrSumRowsKernel<float, true><<<Blocks(n), kThreads, 0, stream>>>(
      src, INT64_MAX, nullptr, offsets, sources, dst_rows, row_elems, dst);
  return cudaGetLastError();
}

cudaError_t LaunchSumBuffers(const void* const* srcs, int n, int64_t count, bool bf16, void* dst,
                             cudaStream_t stream) {
  if (n < 1 || n > kMaxSumInputs) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  SumInputs in{};
  for (int i = 0; i < n; ++i) in.p[i] = srcs[i];
  if (bf16) {
    SumBuffersKernel<<<Blocks(count), kThreads, 0, stream>>>(
        in, n, count, static_cast<__nv_bfloat16*>(dst));
  } else {
    SumBuffersKernel<<<Blocks(count), kThreads, 0, stream>>>(in, n, count,
                                                             static_cast<float*>(dst));
  }
  return cudaGetLastError();
}

cudaError_t LaunchMergeAttention(const __nv_bfloat16* part_out, const float* part_lse,
                                 const int32_t* rows, int64_t n, int64_t heads, int64_t head_dim,
                                 int64_t tokens, __nv_bfloat16* out, float* lse,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MergeOutKernel<<<Blocks(n * heads * head_dim), kThreads, 0, stream>>>(
      part_out, part_lse, rows, n, heads, head_dim, tokens, out, lse);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  MergeLseKernel<<<Blocks(n * heads), kThreads, 0, stream>>>(part_lse, rows, n, heads, tokens, lse);
  return cudaGetLastError();
}

cudaError_t LaunchGatherLseColumns(const float* src, int64_t src_tokens, const int32_t* rows,
                                   int64_t n, int64_t heads, float* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GatherLseKernel<<<Blocks(n * heads), kThreads, 0, stream>>>(src, src_tokens, rows, n, heads, dst);
  return cudaGetLastError();
}

cudaError_t LaunchScatterAddRows(const __nv_bfloat16* src, const int32_t* rows, int64_t n,
                                 int64_t row_elems, __nv_bfloat16* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScatterAddRowsKernel<<<Blocks(n * row_elems), kThreads, 0, stream>>>(src, rows, n, row_elems,
                                                                       dst);
  return cudaGetLastError();
}

cudaError_t LaunchCastToBf16(const float* src, int64_t count, __nv_bfloat16* dst,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  try {
    thrust::transform(thrust::cuda::par_nosync.on(stream), src, src + count, dst, ToBf16{});
  } catch (const thrust::system_error& e) {
    return static_cast<cudaError_t>(e.code().value());
  }
  return cudaGetLastError();
}

}  // namespace wlb::cuda::detail
