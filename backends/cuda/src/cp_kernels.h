// Device launchers of the CP executor and the local communicator (row gathers/scatters, CSR
// row sums, buffer sums, casts). Plain C++17 types only: included by .cu files, which see no
// Abseil. Every launcher returns the launch's error (cudaSuccess when nothing was launched).
#ifndef WLB_CUDA_SRC_CP_KERNELS_H_
#define WLB_CUDA_SRC_CP_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace wlb::cuda::detail {

// Most buffers one LaunchSumBuffers call adds (the pointers travel as a kernel argument).
inline constexpr int kMaxSumInputs = 64;

// dst row i = src row index[i], rows of row_bytes bytes (row_bytes even; 16-byte rows and
// pointers move as uint4).
cudaError_t LaunchGatherRows(const void* src, const int32_t* index, int64_t rows,
                             int64_t row_bytes, void* dst, cudaStream_t stream);

// dst row index[i] = src row i; index must not repeat.
cudaError_t LaunchScatterRows(const void* src, const int32_t* index, int64_t rows,
                              int64_t row_bytes, void* dst, cudaStream_t stream);

// dst row g (fp32) = sum of rows sources[offsets[g] .. offsets[g+1]) (bf16), in that order, of
// the rows of src ([0, split)) followed by those of tail ([split, ...); tail may be null when no
// source reaches split); rows without sources become zero.
cudaError_t LaunchCsrSumRows(const __nv_bfloat16* src, int64_t split, const __nv_bfloat16* tail,
                             const int32_t* offsets, const int32_t* sources, int64_t dst_rows,
                             int64_t row_elems, float* dst, cudaStream_t stream);

// dst row g (fp32) += sum of src rows sources[offsets[g] .. offsets[g+1]) (fp32), in that order.
cudaError_t LaunchCsrAddRows(const float* src, const int32_t* offsets, const int32_t* sources,
                             int64_t dst_rows, int64_t row_elems, float* dst, cudaStream_t stream);

// dst[e] = sum over i < n of srcs[i][e] (host array of n <= kMaxSumInputs device pointers),
// accumulated in fp32 in order i = 0, 1, ...; bf16 when `bf16`, else fp32.
cudaError_t LaunchSumBuffers(const void* const* srcs, int n, int64_t count, bool bf16, void* dst,
                             cudaStream_t stream);

// The split schedule's log-sum-exp merge (cp_maps.h, CpSchedule::kSplit): for i < n, local row
// r = rows[i] of out (bf16, (tokens, heads, head_dim)) and lse (fp32, (heads, tokens)) become the
// attention over both parts' keys: out = (e^lse out + e^part_lse part_out) / (e^lse + e^part_lse)
// and lse = log(e^lse + e^part_lse), with part_out (n, heads, head_dim) and part_lse (heads, n).
// rows must not repeat.
cudaError_t LaunchMergeAttention(const __nv_bfloat16* part_out, const float* part_lse,
                                 const int32_t* rows, int64_t n, int64_t heads, int64_t head_dim,
                                 int64_t tokens, __nv_bfloat16* out, float* lse,
                                 cudaStream_t stream);

// dst[h][i] = src[h][rows[i]] for h < heads, i < n: columns of a (heads, src_tokens) fp32 LSE.
cudaError_t LaunchGatherLseColumns(const float* src, int64_t src_tokens, const int32_t* rows,
                                   int64_t n, int64_t heads, float* dst, cudaStream_t stream);

// dst row rows[i] = bf16(dst row rows[i] + src row i) for i < n (bf16 rows of row_elems,
// added in fp32); rows must not repeat.
cudaError_t LaunchScatterAddRows(const __nv_bfloat16* src, const int32_t* rows, int64_t n,
                                 int64_t row_elems, __nv_bfloat16* dst, cudaStream_t stream);

// dst[e] = bf16(src[e]), round to nearest even.
cudaError_t LaunchCastToBf16(const float* src, int64_t count, __nv_bfloat16* dst,
                             cudaStream_t stream);

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_CP_KERNELS_H_
