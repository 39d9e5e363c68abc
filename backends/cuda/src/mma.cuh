// Warp-level building blocks of the flash kernels: cp.async tile loads into XOR-swizzled shared
// memory, ldmatrix fragment loads and the m16n8k16 bf16 mma.sync (fp32 accumulate).
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 "col":      b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C 16x8 fp32:       c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
// Shared tiles hold rows of `kDim` bf16; the 16-byte chunk c of row r lives at chunk
// c ^ (r & 7) (kDim 32: see Swz), so the 8 rows an ldmatrix phase reads fall in 8 different bank
// groups.
#ifndef WLB_CUDA_SRC_MMA_CUH_
#define WLB_CUDA_SRC_MMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace wlb::cuda::detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of (row, col) in a swizzled tile with kDim columns; col is a multiple of 8.
// Rows of 8 or more chunks swizzle as above; rows of 4 chunks (kDim 32, 64 bytes: two rows per
// 128-byte bank line) by chunk ^ ((row >> 1) & 3), so 8 consecutive rows still cover all 8 bank
// groups.
template <int kDim>
__device__ __forceinline__ int Swz(int row, int col) {
  static_assert(kDim == 32 || kDim % 64 == 0, "4 chunks, or a multiple of 8 chunks, per row");
  if constexpr (kDim == 32) return row * kDim + ((((col >> 3) ^ ((row >> 1) & 3))) << 3);
  return row * kDim + ((((col >> 3) ^ (row & 7))) << 3);
}

// 16-byte async copy; src_bytes = 0 writes zeros (rows past the end of a segment).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(src_bytes));
}

// 4-byte async copy with the same zero-fill rule.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// d += a * b, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Element `hi` (0 = low half, 1 = high half) of a packed bf16 pair, as float.
__device__ __forceinline__ float UnpackBf16(uint32_t packed, int hi) {
  const uint32_t bits = hi ? (packed & 0xffff0000u) : (packed << 16);
  return __uint_as_float(bits);
}

// A fragment (16 rows x 16 cols) of a row-major swizzled tile at (row0, col0); non-transposed.
template <int kDim>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0,
                                      int col0, int lane) {
  const int row = row0 + (lane & 15);
  const int col = col0 + ((lane >> 4) << 3);
  Ldmatrix4(a, tile + Swz<kDim>(row, col));
}

// B fragments for two n-tiles (n0, n0+8) x one k-step (k0..k0+15) from a tile stored [n][k]
// (e.g. K for S = Q K^T): b[0], b[1] for n-tile n0 and b[2], b[3] for n-tile n0 + 8.
template <int kDim>
__device__ __forceinline__ void LoadBFromNK(uint32_t (&b)[4], const __nv_bfloat16* tile, int n0,
                                            int k0, int lane) {
  const int row = n0 + (lane & 7) + ((lane >> 4) << 3);
  const int col = k0 + (((lane >> 3) & 1) << 3);
  Ldmatrix4(b, tile + Swz<kDim>(row, col));
}

// B fragments for two n-tiles (n0, n0+8) x one k-step (k0..k0+15) from a tile stored [k][n]
// (e.g. V for O = P V): b[0], b[1] for n-tile n0 and b[2], b[3] for n-tile n0 + 8.
template <int kDim>
__device__ __forceinline__ void LoadBFromKN(uint32_t (&b)[4], const __nv_bfloat16* tile, int k0,
                                            int n0, int lane) {
  const int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3);
  const int col = n0 + ((lane >> 4) << 3);
  Ldmatrix4Trans(b, tile + Swz<kDim>(row, col));
}

// A fragment (rows m0..m0+15, cols k0..k0+15) of the transpose of a tile stored [k][m]
// (e.g. dS from a stored dS^T): A(m, k) = tile[k][m].
template <int kDim>
__device__ __forceinline__ void LoadAFromKM(uint32_t (&a)[4], const __nv_bfloat16* tile, int m0,
                                            int k0, int lane) {
  const int mi = lane >> 3;  // matrix index: a0 (m0,k0) a1 (m0+8,k0) a2 (m0,k0+8) a3 (m0+8,k0+8)
  const int row = k0 + (lane & 7) + ((mi >> 1) << 3);
  const int col = m0 + ((mi & 1) << 3);
  Ldmatrix4Trans(a, tile + Swz<kDim>(row, col));
}

// Copies `rows` x kDim bf16 from global rows (row r at src + r * src_stride elements) into a
// swizzled tile of kRows rows; rows >= valid_rows are zero-filled. All kThreads threads call it.
template <int kRows, int kDim, int kThreads>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* tile, const __nv_bfloat16* src,
                                         int64_t src_stride, int valid_rows) {
  constexpr int kChunks = kDim / 8;
  static_assert((kRows * kChunks) % kThreads == 0);
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + static_cast<int>(threadIdx.x);
    const int row = idx / kChunks;
    const int col = (idx % kChunks) * 8;
    const bool valid = row < valid_rows;
    // An in-bounds address even when nothing is read.
    const __nv_bfloat16* g = src + (valid ? row * src_stride + col : 0);
    CpAsync16(tile + Swz<kDim>(row, col), g, valid);
  }
}

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_MMA_CUH_
