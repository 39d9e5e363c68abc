// Flash-style varlen attention backward: one block per (BackwardTile, kv head).
//
// A block keeps kBwdBlockN keys (4 warps x 16 keys) and their V rows in shared memory and walks
// every query tile (kBM rows) that can see them, for every query head of the GQA group, so
// dK and dV accumulate in registers without atomics. Per query tile, on tensor cores:
//   S^T = K Q^T,  P^T = exp(scale S^T - lse),  dV += P^T dO,  dP^T = V dO^T,
//   dS^T = P^T (dP^T - D),  dK += dS^T Q,  dQ += dS K  (dS^T staged in shared memory; fp32
//   atomics into a workspace, converted to bf16 by a last small kernel).
// Q/dO tiles (with their lse and D rows) are double-buffered with cp.async. D = rowsum(dO * O)
// comes from a small preprocessing kernel.
//
// The query-side shape is a template parameter, picked by BackwardConfig (kernels.h): kBM query
// rows per Q/dO tile, and kSub rows per pass of the S^T -> P^T -> dP^T -> dS^T chain inside a
// tile. The chain's fragments (S^T, P^T, dP^T) scale with kSub and sit on top of the 2 x head_dim
// / 2 fp32 dK and dV accumulators, so kSub < kBM lowers the register peak without changing the
// tile loads, the barriers or the dQ product; every configuration adds the same products in the
// same order into dK and dV (dQ sums with atomics in any configuration).
#include <cuda_bf16.h>

#include <cstdint>

#include "src/kernels.h"
#include "src/mma.cuh"

namespace wlb::cuda::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBN = kBwdBlockN;  // keys per block
static_assert(kBN == 4 * 16, "one m16 key tile per warp (per warp pair with 8 warps)");

// kBM queries per Q/dO tile, kSub queries per pass of the S^T .. dS^T chain, kWarps warps.
// 4 warps: warp w owns keys [16w, 16w + 16) and all of head_dim in dK, dV, and runs every pass.
// 8 warps: warps w and w + 4 share those keys and split the rest in halves: head_dim for dK, dV
// (half the accumulator registers), the tile's queries for the passes (kSub = kBM / 2, P^T and
// dS^T staged in shared memory for the pair), and dQ's columns.
template <int kDim, int kBM, int kSub, int kWarps>
struct BwdConfig {
  static_assert(kBM == 32 || kBM == 64, "the dS^T staging tile's swizzle needs 4 or 8 chunks");
  static_assert(kSub % 16 == 0 && kBM % kSub == 0, "passes of whole m16 query steps");
  static_assert(kWarps == 4 || (kWarps == 8 && kSub * 2 == kBM), "4 warps, or 8 with 2 passes");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHalves = kWarps / 4;      // warps per key group
  static constexpr bool kStaged = kWarps > 4;     // P^T and dS^T products read shared memory
  static constexpr int kDT = kDim / 8 / kHalves;  // n-tiles of this warp's dK, dV
  static constexpr int kKS = kDim / 16;  // k-steps over head_dim
  static constexpr int kQT = kSub / 8;   // n-tiles (queries) of one pass's S^T, dP^T
  static constexpr int kQS = kSub / 16;  // k-steps over one pass's queries
  // dQ: 4 warps each own kDim / 4 columns of every m16 query block; 8 warps each one m16 block
  // (warp % 4; kBM = 64) and half of the columns.
  static constexpr int kDqCols = kWarps == 4 ? kDim / 4 : kDim / 2;  // dQ columns per warp
  static constexpr int kDqNT = kDqCols / 8;
  static constexpr size_t kTileElems = size_t(kBM) * kDim;
  static_assert(2 * kBM <= kThreads, "one thread per lse and per D row of a tile");
  static constexpr size_t kStagedTiles = kStaged ? 2 : 1;  // dS^T, and P^T when staged
  static constexpr size_t kSmemBytes =
      (2 * size_t(kBN) * kDim + 4 * kTileElems + kStagedTiles * kBN * kBM) * sizeof(__nv_bfloat16) +
      4 * kBM * sizeof(float);
};

// D[h][row] = sum_x dout[row][h][x] * out[row][h][x]; kDim / 8 threads per (row, head).
template <int kDim>
__global__ void DotDoOKernel(BackwardLaunch a) {
  constexpr int kLanes = kDim / 8;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pair = idx / kLanes;  // (row, head) flattened as row * num_heads + head
  const int chunk = static_cast<int>(idx % kLanes);
  const bool valid = pair < a.total_q * a.num_heads;
  float s = 0.f;
  if (valid) {
    const int64_t off = pair * kDim + chunk * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.out) + off);
    const uint4 d = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.dout) + off);
    const auto* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
    const auto* d2 = reinterpret_cast<const __nv_bfloat162*>(&d);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 of = __bfloat1622float2(o2[i]);
      const float2 df = __bfloat1622float2(d2[i]);
      s += of.x * df.x + of.y * df.y;
    }
  }
#pragma unroll
  for (int w = kLanes / 2; w > 0; w /= 2) s += __shfl_xor_sync(0xffffffffu, s, w, kLanes);
  if (valid && chunk == 0) {
    const int64_t row = pair / a.num_heads;
    const int h = static_cast<int>(pair % a.num_heads);
    a.dot_do_o[int64_t(h) * a.total_q + row] = s;
  }
}

__global__ void ConvertDqKernel(BackwardLaunch a, int64_t n8) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 x = reinterpret_cast<const float4*>(a.dq_accum)[2 * i];
  const float4 y = reinterpret_cast<const float4*>(a.dq_accum)[2 * i + 1];
  uint4 r;
  r.x = PackBf16(x.x, x.y);
  r.y = PackBf16(x.z, x.w);
  r.z = PackBf16(y.x, y.y);
  r.w = PackBf16(y.z, y.w);
  reinterpret_cast<uint4*>(a.dq)[i] = r;
}

// The block order is a template parameter: see FlashForwardKernel.
template <int kDim, int kBM, int kSub, int kWarps, BlockOrder kOrder>
__global__ void __launch_bounds__(kWarps * 32, 8 / kWarps) FlashBackwardKernel(BackwardLaunch a) {
  using C = BwdConfig<kDim, kBM, kSub, kWarps>;
  constexpr int kThreads = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* s_k = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_v = s_k + kBN * kDim;
  __nv_bfloat16* s_q = s_v + kBN * kDim;          // 2 stages
  __nv_bfloat16* s_do = s_q + 2 * C::kTileElems;  // 2 stages
  __nv_bfloat16* s_ds = s_do + 2 * C::kTileElems;  // dS^T: [key][query], kBN x kBM
  __nv_bfloat16* s_p = s_ds + kBN * kBM;           // P^T like dS^T, when staged
  auto* s_lse = reinterpret_cast<float*>(s_ds + C::kStagedTiles * kBN * kBM);  // 2 x kBM
  float* s_dd = s_lse + 2 * kBM;                              // 2 stages x kBM

  const TileHead th = BlockTileHead(kOrder, blockIdx.x, a.num_tiles, a.num_kv_heads);
  const int tile_index = th.tile;
  const int hk = th.head;
  const int group = a.num_heads / a.num_kv_heads;
  const BackwardTile t = a.tiles[tile_index];
  const int64_t q_stride = int64_t(a.num_heads) * kDim;
  const int64_t kv_stride = int64_t(a.num_kv_heads) * kDim;
  const int64_t kv_off = t.k_begin * kv_stride + hk * kDim;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int key_row = (kWarps == 4 ? warp : warp & 3) * 16;  // this warp's first key in the tile
  const int half = kWarps == 4 ? 0 : warp >> 2;              // which half of the split work

  const int m_first = BackwardFirstQueryTile(t, kBM);
  const int m_tiles = (t.q_len + kBM - 1) / kBM - m_first;
  const int iterations = group * m_tiles;

  // Writes a 16 x 16 bf16 A fragment (rows: this warp's keys; columns: queries qc .. qc + 15) into
  // a [key][query] tile, where LoadA and LoadAFromKM read it back.
  auto stage_fragment = [&](__nv_bfloat16* tile, const uint32_t(&f)[4], int qc) {
    const int c = key_row + g;
    *reinterpret_cast<uint32_t*>(tile + Swz<kBM>(c, qc) + 2 * tq) = f[0];
    *reinterpret_cast<uint32_t*>(tile + Swz<kBM>(c + 8, qc) + 2 * tq) = f[1];
    *reinterpret_cast<uint32_t*>(tile + Swz<kBM>(c, qc + 8) + 2 * tq) = f[2];
    *reinterpret_cast<uint32_t*>(tile + Swz<kBM>(c + 8, qc + 8) + 2 * tq) = f[3];
  };

  // Issues the loads of iteration `it` (head, query tile) into `stage`.
  auto load = [&](int it, int stage) {
    const int h = hk * group + it / m_tiles;
    const int i0 = (m_first + it % m_tiles) * kBM;
    const int rows = min(kBM, t.q_len - i0);
    const int64_t off = (t.q_begin + int64_t(i0)) * q_stride + h * kDim;
    LoadTile<kBM, kDim, kThreads>(s_q + stage * C::kTileElems,
                                  static_cast<const __nv_bfloat16*>(a.q) + off, q_stride, rows);
    LoadTile<kBM, kDim, kThreads>(s_do + stage * C::kTileElems,
                                  static_cast<const __nv_bfloat16*>(a.dout) + off, q_stride, rows);
    const int r = threadIdx.x % kBM;
    const int64_t row_off = int64_t(h) * a.total_q + t.q_begin + i0;
    const bool valid = r < rows;
    if (threadIdx.x < kBM) {
      CpAsync4(s_lse + stage * kBM + r, a.lse + (valid ? row_off + r : 0), valid);
    } else if (2 * kBM == kThreads || threadIdx.x < 2 * kBM) {
      CpAsync4(s_dd + stage * kBM + r, a.dot_do_o + (valid ? row_off + r : 0), valid);
    }
  };

  LoadTile<kBN, kDim, kThreads>(s_k, static_cast<const __nv_bfloat16*>(a.k) + kv_off, kv_stride,
                                t.k_rows);
  LoadTile<kBN, kDim, kThreads>(s_v, static_cast<const __nv_bfloat16*>(a.v) + kv_off, kv_stride,
                                t.k_rows);
  load(0, 0);
  CpAsyncCommit();

  float dk[C::kDT][4], dv[C::kDT][4];  // columns [half * kDT * 8, (half + 1) * kDT * 8)
#pragma unroll
  for (int dt = 0; dt < C::kDT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  }
  const float scale_log2 = a.scale * kLog2e;

  for (int it = 0; it < iterations; ++it) {
    const int stage = it & 1;
    if (it + 1 < iterations) load(it + 1, stage ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int h = hk * group + it / m_tiles;
    const int i0 = (m_first + it % m_tiles) * kBM;
    const __nv_bfloat16* sq = s_q + stage * C::kTileElems;
    const __nv_bfloat16* sdo = s_do + stage * C::kTileElems;
    const float* slse = s_lse + stage * kBM;
    const float* sdd = s_dd + stage * kBM;

    // One pass per kSub queries of the tile (a loop, not unrolled, so only one pass's fragments
    // are live at a time); with 8 warps, each warp of a pair runs one of the two passes.
#pragma unroll 1
    for (int q0 = half * kSub; q0 < kBM; q0 += kSub * C::kHalves) {
      // S^T = K Q^T: rows are this warp's keys, columns the tile's queries.
      float st[C::kQT][4];
#pragma unroll
      for (int nt = 0; nt < C::kQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt][e] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < C::kKS; ++ks) {
        uint32_t ka[4];
        LoadA<kDim>(ka, s_k, key_row, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < C::kQT / 2; ++np) {
          uint32_t qb[4];
          LoadBFromNK<kDim>(qb, sq, q0 + np * 16, ks * 16, lane);
          Mma(st[2 * np], ka, qb[0], qb[1]);
          Mma(st[2 * np + 1], ka, qb[2], qb[3]);
        }
      }

      // P^T; masked entries (past the segment's queries or keys, above the diagonal) are 0.
      const int iq = i0 + q0;  // the pass's first query of the segment
      const bool needs_mask = BackwardPassNeedsMask(t, iq, kSub, kBN);
#pragma unroll
      for (int nt = 0; nt < C::kQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = q0 + nt * 8 + 2 * tq + (e & 1);
          const int c = key_row + g + (e >> 1) * 8;
          float p = exp2f(fmaf(st[nt][e], scale_log2, -slse[r] * kLog2e));
          if (needs_mask && (i0 + r >= t.q_len || c >= t.k_rows || c > i0 + r + t.diag)) p = 0.f;
          st[nt][e] = p;
        }
      }

      // P^T as bf16 A fragments (k-steps over queries); dV and dS both use them, which keeps the
      // register peak under 255 at head_dim 128 (fp32 P spilled 252 bytes).
      uint32_t pa[C::kQS][4];
#pragma unroll
      for (int ps = 0; ps < C::kQS; ++ps) {
        pa[ps][0] = PackBf16(st[2 * ps][0], st[2 * ps][1]);
        pa[ps][1] = PackBf16(st[2 * ps][2], st[2 * ps][3]);
        pa[ps][2] = PackBf16(st[2 * ps + 1][0], st[2 * ps + 1][1]);
        pa[ps][3] = PackBf16(st[2 * ps + 1][2], st[2 * ps + 1][3]);
      }

      // dV += P^T dO (staged: P^T to shared memory, the product after the barrier).
#pragma unroll
      for (int ps = 0; ps < C::kQS; ++ps) {
        if constexpr (C::kStaged) {
          stage_fragment(s_p, pa[ps], q0 + ps * 16);
        } else {
#pragma unroll
          for (int dp = 0; dp < C::kDT / 2; ++dp) {
            uint32_t b[4];
            LoadBFromKN<kDim>(b, sdo, q0 + ps * 16, dp * 16, lane);
            Mma(dv[2 * dp], pa[ps], b[0], b[1]);
            Mma(dv[2 * dp + 1], pa[ps], b[2], b[3]);
          }
        }
      }

      // dP^T = V dO^T, then dS^T = P^T (dP^T - D) in place.
      float dpt[C::kQT][4];
#pragma unroll
      for (int nt = 0; nt < C::kQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[nt][e] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < C::kKS; ++ks) {
        uint32_t va[4];
        LoadA<kDim>(va, s_v, key_row, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < C::kQT / 2; ++np) {
          uint32_t b[4];
          LoadBFromNK<kDim>(b, sdo, q0 + np * 16, ks * 16, lane);
          Mma(dpt[2 * np], va, b[0], b[1]);
          Mma(dpt[2 * np + 1], va, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < C::kQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = UnpackBf16(pa[nt / 2][(nt & 1) * 2 + (e >> 1)], e & 1);
          dpt[nt][e] = p * (dpt[nt][e] - sdd[q0 + nt * 8 + 2 * tq + (e & 1)]);
        }
      }

      // dK += dS^T Q (staged: after the barrier), and stage dS^T (bf16) for the dQ product.
#pragma unroll
      for (int ps = 0; ps < C::kQS; ++ps) {
        uint32_t da[4];
        da[0] = PackBf16(dpt[2 * ps][0], dpt[2 * ps][1]);
        da[1] = PackBf16(dpt[2 * ps][2], dpt[2 * ps][3]);
        da[2] = PackBf16(dpt[2 * ps + 1][0], dpt[2 * ps + 1][1]);
        da[3] = PackBf16(dpt[2 * ps + 1][2], dpt[2 * ps + 1][3]);
        stage_fragment(s_ds, da, q0 + ps * 16);
        if constexpr (!C::kStaged) {
#pragma unroll
          for (int dp = 0; dp < C::kDT / 2; ++dp) {
            uint32_t b[4];
            LoadBFromKN<kDim>(b, sq, q0 + ps * 16, dp * 16, lane);
            Mma(dk[2 * dp], da, b[0], b[1]);
            Mma(dk[2 * dp + 1], da, b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // P^T, dS^T complete; with 4 warps, every warp is done with Q and dO

    if constexpr (C::kStaged) {
      // dV += P^T dO, dK += dS^T Q over the whole tile for this warp's half of head_dim, in the
      // same 16-query k-steps, in the same order, as the unstaged products.
      const int d0 = half * C::kDT * 8;
#pragma unroll
      for (int ps = 0; ps < kBM / 16; ++ps) {
        uint32_t pf[4], df[4];
        LoadA<kBM>(pf, s_p, key_row, ps * 16, lane);
        LoadA<kBM>(df, s_ds, key_row, ps * 16, lane);
#pragma unroll
        for (int dp = 0; dp < C::kDT / 2; ++dp) {
          uint32_t b[4];
          LoadBFromKN<kDim>(b, sdo, ps * 16, d0 + dp * 16, lane);
          Mma(dv[2 * dp], pf, b[0], b[1]);
          Mma(dv[2 * dp + 1], pf, b[2], b[3]);
          LoadBFromKN<kDim>(b, sq, ps * 16, d0 + dp * 16, lane);
          Mma(dk[2 * dp], df, b[0], b[1]);
          Mma(dk[2 * dp + 1], df, b[2], b[3]);
        }
      }
    }

    // dQ[i0 .. i0+kBM) += scale * dS K. 4 warps: warp w owns columns [w, w+1) * kDqCols of every
    // m16 block; 8 warps: block w % 4, columns [half, half + 1) * kDqCols.
    const int col0 = (kWarps == 4 ? warp : half) * C::kDqCols;
    float* dq_base = a.dq_accum + (t.q_begin + int64_t(i0)) * q_stride + h * kDim;
#pragma unroll 1
    for (int mq = kWarps == 4 ? 0 : warp & 3; mq < kBM / 16; mq += kWarps == 4 ? 1 : 4) {
      float acc[C::kDqNT][4];
#pragma unroll
      for (int nt = 0; nt < C::kDqNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < kBN / 16; ++ks) {
        uint32_t dsa[4];
        LoadAFromKM<kBM>(dsa, s_ds, mq * 16, ks * 16, lane);
#pragma unroll
        for (int dp = 0; dp < C::kDqNT / 2; ++dp) {
          uint32_t b[4];
          LoadBFromKN<kDim>(b, s_k, ks * 16, col0 + dp * 16, lane);
          Mma(acc[2 * dp], dsa, b[0], b[1]);
          Mma(acc[2 * dp + 1], dsa, b[2], b[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mq * 16 + g + hf * 8;
        if (i0 + r >= t.q_len) continue;
#pragma unroll
        for (int nt = 0; nt < C::kDqNT; ++nt) {
          float2* dst = reinterpret_cast<float2*>(dq_base + r * q_stride + col0 + nt * 8 + 2 * tq);
          atomicAdd(dst, make_float2(acc[nt][2 * hf] * a.scale, acc[nt][2 * hf + 1] * a.scale));
        }
      }
    }
  }

  // dK = scale * dS^T Q summed over the group; dV = P^T dO summed over the group.
  auto* dk_out = static_cast<__nv_bfloat16*>(a.dk) + kv_off;
  auto* dv_out = static_cast<__nv_bfloat16*>(a.dv) + kv_off;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int c = key_row + g + hf * 8;
    if (c >= t.k_rows) continue;
#pragma unroll
    for (int dt = 0; dt < C::kDT; ++dt) {
      const int64_t o = c * kv_stride + half * C::kDT * 8 + dt * 8 + 2 * tq;
      *reinterpret_cast<__nv_bfloat162*>(dk_out + o) =
          __floats2bfloat162_rn(dk[dt][2 * hf] * a.scale, dk[dt][2 * hf + 1] * a.scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_out + o) =
          __floats2bfloat162_rn(dv[dt][2 * hf], dv[dt][2 * hf + 1]);
    }
  }
}

template <int kDim, int kBM, int kSub, int kWarps>
cudaError_t Launch(const BackwardLaunch& a, BlockOrder order, cudaStream_t stream) {
  using C = BwdConfig<kDim, kBM, kSub, kWarps>;
  const int64_t rows = a.total_q * a.num_heads;
  if (rows == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(a.dq_accum, 0, size_t(rows) * kDim * sizeof(float), stream);
      e != cudaSuccess) {
    return e;
  }
  constexpr int kPre = 256;
  const int64_t pre_threads = rows * (kDim / 8);
  DotDoOKernel<kDim><<<static_cast<unsigned>((pre_threads + kPre - 1) / kPre), kPre, 0, stream>>>(
      a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  auto kernel = order == BlockOrder::kHeadMajor
                    ? FlashBackwardKernel<kDim, kBM, kSub, kWarps, BlockOrder::kHeadMajor>
                    : FlashBackwardKernel<kDim, kBM, kSub, kWarps, BlockOrder::kHeaviestFirst>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(C::kSmemBytes));
      e != cudaSuccess) {
    return e;
  }
  const int64_t blocks = int64_t(a.num_tiles) * a.num_kv_heads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (blocks > 0) {
    kernel<<<static_cast<unsigned>(blocks), C::kThreads, C::kSmemBytes, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }

  const int64_t n8 = rows * kDim / 8;
  ConvertDqKernel<<<static_cast<unsigned>((n8 + 255) / 256), 256, 0, stream>>>(a, n8);
  return cudaGetLastError();
}

template <int kDim>
cudaError_t LaunchConfig(const BackwardLaunch& a, BlockOrder order, FlashBackwardConfig config,
                         cudaStream_t stream) {
  switch (config) {
    case FlashBackwardConfig::kQ64:
      return Launch<kDim, 64, 64, 4>(a, order, stream);
    case FlashBackwardConfig::kQ64Pass32:
      return Launch<kDim, 64, 32, 4>(a, order, stream);
    case FlashBackwardConfig::kQ32:
      return Launch<kDim, 32, 32, 4>(a, order, stream);
    case FlashBackwardConfig::kQ64Warps8:
      return Launch<kDim, 64, 32, 8>(a, order, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchFlashBackward(const BackwardLaunch& a, BlockOrder order,
                                FlashBackwardConfig config, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      return LaunchConfig<64>(a, order, config, stream);
    case 128:
      return LaunchConfig<128>(a, order, config, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace wlb::cuda::detail
