// Reference kernels: one thread per (row, head), fp32 accumulation, any head_dim up to
// kMaxReferenceHeadDim. Slow on purpose; they exist to check the flash kernels at sizes the CPU
// reference cannot reach.
#include <cuda_bf16.h>

#include <cstdint>

#include "src/kernels.h"
#include "wlb/cuda/attention_tiles.h"

namespace wlb::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxDim = kMaxReferenceHeadDim;

// Segment b with cu[b] <= row < cu[b+1]; the last such b when empty segments repeat offsets.
__device__ int FindSegment(const int32_t* cu, int batch, int64_t row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Where query `row` sits: its segment, its index i in it and the keys [0, n) it sees.
struct QueryRow {
  int b;
  int32_t lq, lk, i, n;
};

__device__ QueryRow LocateQuery(const LaunchShape& a, int64_t row) {
  QueryRow r;
  r.b = FindSegment(a.cu_seqlens_q, a.batch, row);
  r.lq = a.cu_seqlens_q[r.b + 1] - a.cu_seqlens_q[r.b];
  r.lk = a.cu_seqlens_k[r.b + 1] - a.cu_seqlens_k[r.b];
  r.i = static_cast<int32_t>(row - a.cu_seqlens_q[r.b]);
  r.n = a.causal ? r.i + (r.lk - r.lq) + 1 : r.lk;
  return r;
}

__device__ float Dot(const __nv_bfloat16* a, const __nv_bfloat16* b, int d) {
  float s = 0.f;
  for (int x = 0; x < d; ++x) s += __bfloat162float(a[x]) * __bfloat162float(b[x]);
  return s;
}

__global__ void ReferenceForwardKernel(ForwardLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.total_q * a.num_heads) return;
  const int64_t row = idx / a.num_heads;
  const int h = static_cast<int>(idx % a.num_heads);
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const QueryRow r = LocateQuery(a, row);
  const int b = r.b;
  const int32_t n = r.n;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q) + (row * a.num_heads + h) * d;
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  float acc[kMaxDim];
  for (int x = 0; x < d; ++x) acc[x] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int32_t j = 0; j < n; ++j) {
    const int64_t kv = ((a.cu_seqlens_k[b] + int64_t(j)) * a.num_kv_heads + hk) * d;
    const float s = Dot(q, k + kv, d) * a.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    for (int x = 0; x < d; ++x) acc[x] = acc[x] * corr + p * __bfloat162float(v[kv + x]);
    m = m_new;
  }
  auto* out = static_cast<__nv_bfloat16*>(a.out) + (row * a.num_heads + h) * d;
  for (int x = 0; x < d; ++x) out[x] = __float2bfloat16(acc[x] / l);
  a.lse[int64_t(h) * a.total_q + row] = m + logf(l);
}

// D = rowsum(dout * out) per (row, head), laid out (heads, total_q).
__global__ void ReferenceDotKernel(BackwardLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.total_q * a.num_heads) return;
  const int64_t row = idx / a.num_heads;
  const int h = static_cast<int>(idx % a.num_heads);
  const int64_t off = (row * a.num_heads + h) * a.head_dim;
  a.dot_do_o[int64_t(h) * a.total_q + row] =
      Dot(static_cast<const __nv_bfloat16*>(a.dout) + off,
          static_cast<const __nv_bfloat16*>(a.out) + off, a.head_dim);
}

// dQ_i = scale * sum_j P_ij (dP_ij - D_i) K_j, one thread per (query row, head).
__global__ void ReferenceDqKernel(BackwardLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.total_q * a.num_heads) return;
  const int64_t row = idx / a.num_heads;
  const int h = static_cast<int>(idx % a.num_heads);
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const QueryRow r = LocateQuery(a, row);
  const int b = r.b;
  const int32_t n = r.n;
  const int64_t qo = (row * a.num_heads + h) * d;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q) + qo;
  const auto* dout = static_cast<const __nv_bfloat16*>(a.dout) + qo;
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  const float lse = a.lse[int64_t(h) * a.total_q + row];
  const float dd = a.dot_do_o[int64_t(h) * a.total_q + row];
  float acc[kMaxDim];
  for (int x = 0; x < d; ++x) acc[x] = 0.f;
  for (int32_t j = 0; j < n; ++j) {
    const int64_t kv = ((a.cu_seqlens_k[b] + int64_t(j)) * a.num_kv_heads + hk) * d;
    const float p = expf(Dot(q, k + kv, d) * a.scale - lse);
    const float ds = p * (Dot(dout, v + kv, d) - dd);
    for (int x = 0; x < d; ++x) acc[x] += ds * __bfloat162float(k[kv + x]);
  }
  auto* dq = static_cast<__nv_bfloat16*>(a.dq) + qo;
  for (int x = 0; x < d; ++x) dq[x] = __float2bfloat16(acc[x] * a.scale);
}

// dK_j, dV_j summed over the heads of j's GQA group, one thread per (key row, kv head).
__global__ void ReferenceDkvKernel(BackwardLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.total_k * a.num_kv_heads) return;
  const int64_t row = idx / a.num_kv_heads;
  const int hk = static_cast<int>(idx % a.num_kv_heads);
  const int group = a.num_heads / a.num_kv_heads;
  const int d = a.head_dim;
  const int b = FindSegment(a.cu_seqlens_k, a.batch, row);
  const int32_t lq = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
  const int32_t lk = a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b];
  const int32_t j = static_cast<int32_t>(row - a.cu_seqlens_k[b]);
  // Query i sees key j iff j <= i + (lk - lq).
  const int32_t i_first = a.causal ? max(0, j - (lk - lq)) : 0;
  const int64_t kvo = (row * a.num_kv_heads + hk) * d;
  const auto* k = static_cast<const __nv_bfloat16*>(a.k) + kvo;
  const auto* v = static_cast<const __nv_bfloat16*>(a.v) + kvo;
  float dk[kMaxDim], dv[kMaxDim];
  for (int x = 0; x < d; ++x) dk[x] = dv[x] = 0.f;
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    for (int32_t i = i_first; i < lq; ++i) {
      const int64_t qrow = a.cu_seqlens_q[b] + int64_t(i);
      const int64_t qo = (qrow * a.num_heads + h) * d;
      const auto* q = static_cast<const __nv_bfloat16*>(a.q) + qo;
      const auto* dout = static_cast<const __nv_bfloat16*>(a.dout) + qo;
      const float p = expf(Dot(q, k, d) * a.scale - a.lse[int64_t(h) * a.total_q + qrow]);
      const float ds = p * (Dot(dout, v, d) - a.dot_do_o[int64_t(h) * a.total_q + qrow]);
      for (int x = 0; x < d; ++x) {
        dv[x] += p * __bfloat162float(dout[x]);
        dk[x] += ds * __bfloat162float(q[x]);
      }
    }
  }
  auto* dk_out = static_cast<__nv_bfloat16*>(a.dk) + kvo;
  auto* dv_out = static_cast<__nv_bfloat16*>(a.dv) + kvo;
  for (int x = 0; x < d; ++x) {
    dk_out[x] = __float2bfloat16(dk[x] * a.scale);
    dv_out[x] = __float2bfloat16(dv[x]);
  }
}

unsigned Blocks(int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchReferenceForward(const ForwardLaunch& a, cudaStream_t stream) {
  const int64_t n = a.total_q * a.num_heads;
  if (n == 0) return cudaSuccess;
  ReferenceForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchReferenceBackward(const BackwardLaunch& a, cudaStream_t stream) {
  const int64_t nq = a.total_q * a.num_heads;
  const int64_t nk = a.total_k * a.num_kv_heads;
  if (nq > 0) {
    ReferenceDotKernel<<<Blocks(nq), kThreads, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    ReferenceDqKernel<<<Blocks(nq), kThreads, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (nk > 0) {
    ReferenceDkvKernel<<<Blocks(nk), kThreads, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace wlb::cuda::detail
