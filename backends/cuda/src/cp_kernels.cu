// Row gathers/scatters (Thrust), CSR row sums and buffer sums for the CP executor.
#include <thrust/execution_policy.h>
#include <thrust/gather.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scatter.h>
#include <thrust/system/cuda/error.h>
#include <thrust/transform.h>

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

// dst row g = (kAccumulate ? dst row g : 0) + the CSR sum of its source rows, in fp32.
template <typename Src, bool kAccumulate>
__global__ void CsrSumRowsKernel(const Src* __restrict__ src, const int32_t* __restrict__ offsets,
                                 const int32_t* __restrict__ sources, int64_t dst_rows,
                                 int64_t row_elems, float* __restrict__ dst) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dst_rows * row_elems) return;
  const int64_t row = e / row_elems;
  const int64_t col = e % row_elems;
  float sum = kAccumulate ? dst[e] : 0.0f;
  for (int32_t i = offsets[row]; i < offsets[row + 1]; ++i) {
    sum += static_cast<float>(src[static_cast<int64_t>(sources[i]) * row_elems + col]);
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

cudaError_t LaunchCsrSumRows(const __nv_bfloat16* src, const int32_t* offsets,
                             const int32_t* sources, int64_t dst_rows, int64_t row_elems,
                             float* dst, cudaStream_t stream) {
  const int64_t n = dst_rows * row_elems;
  if (n == 0) return cudaSuccess;
  CsrSumRowsKernel<__nv_bfloat16, false>
      <<<Blocks(n), kThreads, 0, stream>>>(src, offsets, sources, dst_rows, row_elems, dst);
  return cudaGetLastError();
}

cudaError_t LaunchCsrAddRows(const float* src, const int32_t* offsets, const int32_t* sources,
                             int64_t dst_rows, int64_t row_elems, float* dst, cudaStream_t stream) {
  const int64_t n = dst_rows * row_elems;
  if (n == 0) return cudaSuccess;
  CsrSumRowsKernel<float, true>
      <<<Blocks(n), kThreads, 0, stream>>>(src, offsets, sources, dst_rows, row_elems, dst);
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
