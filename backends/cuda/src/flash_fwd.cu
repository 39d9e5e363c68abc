// Flash-style varlen attention forward: one block per (ForwardTile, head).
//
// kWarps warps each own kMT m16 row tiles of the block's kFwdBlockM query rows. Per K/V tile of
// kBlockN keys: S = Q K^T on tensor cores (mma.sync m16n8k16, bf16 in, fp32 out), the causal /
// length mask only on tiles that cross the diagonal or the end, online softmax in registers
// (running max and sum per row, exp2 with the scale folded in), then O += P V with P reused from
// the S accumulators as A fragments. K/V tiles are double-buffered in shared memory with cp.async
// so the next tile streams in while this one is multiplied.
#include <cuda_bf16.h>

#include <cstdint>

#include "src/kernels.h"
#include "src/mma.cuh"

namespace wlb::cuda::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <int kDim, int kWarps, int kMT, int kBlockN>
struct FwdConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBM = kWarps * 16 * kMT;
  static constexpr int kBN = kBlockN;
  static constexpr int kNT = kBN / 8;     // n-tiles of S
  static constexpr int kDT = kDim / 8;    // n-tiles of O
  static constexpr int kKS = kDim / 16;   // k-steps of Q K^T
  static constexpr int kPS = kBN / 16;    // k-steps of P V
  static constexpr size_t kSmemBytes = size_t(kBM + 4 * kBN) * kDim * sizeof(__nv_bfloat16);
  static_assert(kBM == kFwdBlockM, "plan and kernel must agree on the query tile");
};

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The block order is a template parameter so that each order's block -> (tile, head) map folds to
// one division: a run-time choice cost the d=128 kernel a spilled register.
template <int kDim, int kWarps, int kMT, int kBlockN, int kMinBlocks, BlockOrder kOrder>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) FlashForwardKernel(ForwardLaunch a) {
  using C = FwdConfig<kDim, kWarps, kMT, kBlockN>;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* s_q = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_k = s_q + C::kBM * kDim;  // 2 stages
  __nv_bfloat16* s_v = s_k + 2 * C::kBN * kDim;

  const TileHead th = BlockTileHead(kOrder, blockIdx.x, a.num_tiles, a.num_heads);
  const int tile_index = th.tile;
  const int h = th.head;
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const ForwardTile t = a.tiles[tile_index];
  const int64_t q_stride = int64_t(a.num_heads) * kDim;
  const int64_t kv_stride = int64_t(a.num_kv_heads) * kDim;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q) + t.q_begin * q_stride + h * kDim;
  const auto* k = static_cast<const __nv_bfloat16*>(a.k) + t.k_begin * kv_stride + hk * kDim;
  const auto* v = static_cast<const __nv_bfloat16*>(a.v) + t.k_begin * kv_stride + hk * kDim;
  const int n_blocks = (t.k_len + C::kBN - 1) / C::kBN;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int warp_row = warp * 16 * kMT;

  LoadTile<C::kBM, kDim, C::kThreads>(s_q, q, q_stride, t.q_rows);
  LoadTile<C::kBN, kDim, C::kThreads>(s_k, k, kv_stride, min(C::kBN, t.k_len));
  LoadTile<C::kBN, kDim, C::kThreads>(s_v, v, kv_stride, min(C::kBN, t.k_len));
  CpAsyncCommit();

  float o[kMT][C::kDT][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];  // per-thread partial sums; reduced across the quad at the end
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
    }
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = a.scale * kLog2e;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1;
    const int key0 = nb * C::kBN;
    if (nb + 1 < n_blocks) {
      const int next0 = key0 + C::kBN;
      const int rows = min(C::kBN, t.k_len - next0);
      LoadTile<C::kBN, kDim, C::kThreads>(s_k + (stage ^ 1) * C::kBN * kDim,
                                          k + next0 * kv_stride, kv_stride, rows);
      LoadTile<C::kBN, kDim, C::kThreads>(s_v + (stage ^ 1) * C::kBN * kDim,
                                          v + next0 * kv_stride, kv_stride, rows);
    }
    CpAsyncCommit();  // possibly empty, so that wait_group 1 always means "tile nb landed"
    CpAsyncWait<1>();
    __syncthreads();
    const __nv_bfloat16* sk = s_k + stage * C::kBN * kDim;
    const __nv_bfloat16* sv = s_v + stage * C::kBN * kDim;

    // S = Q K^T for this warp's rows.
    float s[kMT][C::kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
      }
    }
#pragma unroll
    for (int ks = 0; ks < C::kKS; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) LoadA<kDim>(qa[mt], s_q, warp_row + mt * 16, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < C::kNT / 2; ++np) {
        uint32_t kb[4];
        LoadBFromNK<kDim>(kb, sk, np * 16, ks * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          Mma(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Mask only tiles that reach past the end of the visible keys or the diagonal of row 0.
    if (key0 + C::kBN > t.k_len || key0 + C::kBN - 1 > t.diag) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = warp_row + mt * 16 + g + (e >> 1) * 8;
            const int key = key0 + nt * 8 + 2 * tq + (e & 1);
            if (key >= t.k_len || key > row + t.diag) s[mt][nt][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax. Every row sees key 0 of tile 0, so the running max is finite from then on.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = row_max[mt][hf];
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        }
        mx = QuadMax(mx);
        const float corr = exp2f((row_max[mt][hf] - mx) * scale_log2);
        row_max[mt][hf] = mx;
        const float mx_scaled = mx * scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
#pragma unroll
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            s[mt][nt][e] = exp2f(fmaf(s[mt][nt][e], scale_log2, -mx_scaled));
            sum += s[mt][nt][e];
          }
        }
        row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;
#pragma unroll
        for (int dt = 0; dt < C::kDT; ++dt) {
          o[mt][dt][2 * hf] *= corr;
          o[mt][dt][2 * hf + 1] *= corr;
        }
      }
    }

    // O += P V; the S accumulator layout of two n-tiles is exactly one A fragment.
#pragma unroll
    for (int ps = 0; ps < C::kPS; ++ps) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = PackBf16(s[mt][2 * ps][0], s[mt][2 * ps][1]);
        pa[mt][1] = PackBf16(s[mt][2 * ps][2], s[mt][2 * ps][3]);
        pa[mt][2] = PackBf16(s[mt][2 * ps + 1][0], s[mt][2 * ps + 1][1]);
        pa[mt][3] = PackBf16(s[mt][2 * ps + 1][2], s[mt][2 * ps + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < C::kDT / 2; ++dp) {
        uint32_t vb[4];
        LoadBFromKN<kDim>(vb, sv, ps * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          Mma(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          Mma(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }

  auto* out = static_cast<__nv_bfloat16*>(a.out) + t.q_begin * q_stride + h * kDim;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = warp_row + mt * 16 + g + hf * 8;
      const float l = QuadSum(row_sum[mt][hf]);
      if (row >= t.q_rows) continue;
      const float inv = 1.f / l;
      __nv_bfloat16* orow = out + row * q_stride;
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt) {
        *reinterpret_cast<__nv_bfloat162*>(orow + dt * 8 + 2 * tq) = __floats2bfloat162_rn(
            o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
      }
      if (tq == 0) {
        a.lse[int64_t(h) * a.total_q + t.q_begin + row] = row_max[mt][hf] * a.scale + logf(l);
      }
    }
  }
}

template <int kDim, int kWarps, int kMT, int kBlockN, int kMinBlocks>
cudaError_t Launch(const ForwardLaunch& a, BlockOrder order, cudaStream_t stream) {
  using C = FwdConfig<kDim, kWarps, kMT, kBlockN>;
  auto kernel =
      order == BlockOrder::kHeadMajor
          ? FlashForwardKernel<kDim, kWarps, kMT, kBlockN, kMinBlocks, BlockOrder::kHeadMajor>
          : FlashForwardKernel<kDim, kWarps, kMT, kBlockN, kMinBlocks, BlockOrder::kHeaviestFirst>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(C::kSmemBytes));
      e != cudaSuccess) {
    return e;
  }
  const int64_t blocks = int64_t(a.num_tiles) * a.num_heads;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), C::kThreads, C::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFlashForward(const ForwardLaunch& a, BlockOrder order, cudaStream_t stream) {
  switch (a.head_dim) {
    // 4 warps x 32 rows; ptxas (nvcc 13.0, sm_90): d=64 239 registers, d=128 254, no spills.
    // d=128 with 64-key tiles spilled 120 bytes, so it takes 32-key tiles.
    case 64:
      return Launch<64, 4, 2, 64, 2>(a, order, stream);
    case 128:
      return Launch<128, 4, 2, 32, 2>(a, order, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace wlb::cuda::detail
