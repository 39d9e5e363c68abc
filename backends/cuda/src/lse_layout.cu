// Device conversion between cuDNN's (total_q, heads) statistics and wlb's (heads, total_q) LSE.
#include "src/kernels.h"
#include "wlb/cuda/lse_layout.h"

namespace wlb::cuda::detail {
namespace {

constexpr int kThreads = 256;

// One thread per element, in statistics order: the statistics side is read or written
// coalesced; the LSE side is strided by total_q (a few MB per call at most).
template <bool kToLse>
__global__ void ConvertLse(const float* __restrict__ from, float* __restrict__ to, int heads,
                           int64_t total_q) {
  const int64_t n = int64_t(heads) * total_q;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const LsePair p = LseLayoutPair(i, heads, total_q);
    if constexpr (kToLse) {
      to[p.lse] = from[p.stats];
    } else {
      to[p.stats] = from[p.lse];
    }
  }
}

template <bool kToLse>
cudaError_t Launch(const float* from, float* to, int heads, int64_t total_q, cudaStream_t stream) {
  const int64_t n = int64_t(heads) * total_q;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  ConvertLse<kToLse><<<grid, kThreads, 0, stream>>>(from, to, heads, total_q);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchStatsToLse(const float* stats, float* lse, int heads, int64_t total_q,
                             cudaStream_t stream) {
  return Launch<true>(stats, lse, heads, total_q, stream);
}

cudaError_t LaunchLseToStats(const float* lse, float* stats, int heads, int64_t total_q,
                             cudaStream_t stream) {
  return Launch<false>(lse, stats, heads, total_q, stream);
}

}  // namespace wlb::cuda::detail
