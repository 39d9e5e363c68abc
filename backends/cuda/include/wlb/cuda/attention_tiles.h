// Work-list entries of the flash kernels, shared by the host plan builder (attention_plan.h)
// and the device code; plain structs with no dependencies, so CUDA translation units can
// include them.
//
//   wlb::cuda::ForwardTile t = plan.front();
//   int32_t end = wlb::cuda::ForwardVisibleEnd(t, 0);  // keys row 0 of the tile sees
#ifndef WLB_CUDA_ATTENTION_TILES_H_
#define WLB_CUDA_ATTENTION_TILES_H_

#include <cstdint>

namespace wlb::cuda {

// Largest head_dim the reference kernels accept.
inline constexpr int kMaxReferenceHeadDim = 256;

#if defined(__CUDACC__)
#define WLB_CUDA_HOST_DEVICE __host__ __device__
#else
#define WLB_CUDA_HOST_DEVICE
#endif

// How the flash kernels map thread blocks to (tile, head) pairs. The plan orders the tiles to
// match (attention_plan.h); both orders cover every pair once and produce the same numbers.
enum class BlockOrder : int32_t {
  // Tiles heaviest first across all segments, head varying fastest: the longest blocks start
  // first, but blocks resident together read different heads' and segments' K/V.
  kHeaviestFirst = 0,
  // FlashAttention's (segment, head) grouping: head slowest; inside a head, segments heaviest
  // first and each segment's tiles heaviest first, so resident blocks share K/V in L2.
  kHeadMajor = 1,
};

// The query-side shape of the flash backward kernel (flash_bwd.cu). A backward block always holds
// kBwdBlockN = 64 keys, so the work lists (BackwardTile) are the same for every configuration; it
// walks the queries that see them in tiles of Q/dO rows, computing S^T, P^T, dP^T and dS^T for a
// tile in one or more passes. Fewer queries per pass need fewer registers: at head_dim 128 the
// default spills (docs/results/gpu/bwd_ptxas.md). Every configuration adds the same products in
// the same order into dK and dV (equal values); dQ sums with fp32 atomics in any of them.
enum class FlashBackwardConfig : int32_t {
  kQ64 = 0,        // 64-query tiles, one pass (the default until a GPU measures the others)
  kQ64Pass32 = 1,  // 64-query tiles, two 32-query passes: same loads and barriers as kQ64
  kQ32 = 2,        // 32-query tiles, one pass: twice the tiles and barriers of kQ64
  // 64-query tiles, 8 warps: two warps per 16 keys, each with half of head_dim in dK, dV (half
  // the accumulators) and one 32-query pass; P^T and dS^T go through shared memory.
  kQ64Warps8 = 3,
};

// The (tile, head) pair that block `block` of a launch over num_tiles x heads blocks runs.
// Unsigned, like blockIdx.x: a signed division costs the kernels a register they do not have.
struct TileHead {
  uint32_t tile;
  uint32_t head;
};
WLB_CUDA_HOST_DEVICE inline TileHead BlockTileHead(BlockOrder order, uint32_t block,
                                                   uint32_t num_tiles, uint32_t heads) {
  if (order == BlockOrder::kHeadMajor) return {block % num_tiles, block / num_tiles};
  return {block / heads, block % heads};
}

// A "diagonal" so large that the causal test never masks (used for non-causal segments).
inline constexpr int32_t kNoDiagonal = 1 << 30;

// Query rows [q_begin, q_begin + q_rows) of the packed Q (global token indices). Tile row r
// (0-based) sees key j (0-based within the segment, stored from global k_begin) iff
// j < k_len and j <= r + diag.
struct ForwardTile {
  int32_t q_begin;
  int32_t q_rows;   // 1..block_m
  int32_t k_begin;  // global index of the segment's first key
  int32_t k_len;    // keys [0, k_len) of the segment are visited; the rest are masked for all rows
  int32_t diag;     // causal offset, kNoDiagonal when not causal
  int32_t segment;  // index into cu_seqlens (for diagnostics)
};
static_assert(sizeof(ForwardTile) == 24);

// Keys [k_begin, k_begin + k_rows) (global). Query q of the segment (0-based, stored from global
// q_begin) sees tile key c (0-based) iff q < q_len and c <= q + diag; queries before q_first see
// none of the tile's keys.
struct BackwardTile {
  int32_t k_begin;
  int32_t k_rows;   // 1..block_n
  int32_t q_begin;  // global index of the segment's first query
  int32_t q_len;    // the segment's query count
  int32_t q_first;  // first query that sees a key of this tile
  int32_t diag;     // causal offset, kNoDiagonal when not causal
  int32_t segment;
  int32_t pad = 0;
};
static_assert(sizeof(BackwardTile) == 32);

// The backward kernel's walk over a tile's queries, shared with the tests of its properties:
// query tiles of block_m rows, aligned to multiples of block_m, from the one holding q_first.
WLB_CUDA_HOST_DEVICE inline int32_t BackwardFirstQueryTile(const BackwardTile& t,
                                                           int32_t block_m) {
  return t.q_first / block_m;
}

// Whether a pass over segment queries [q0, q0 + rows) of a tile of block_n keys may meet a masked
// (query, key) pair: a query past the segment, a key past the tile's rows, or a key above the
// diagonal of the pass's first (most restricted) query. False means every pair is visible.
WLB_CUDA_HOST_DEVICE inline bool BackwardPassNeedsMask(const BackwardTile& t, int q0, int rows,
                                                       int block_n) {
  return q0 + rows > t.q_len || t.k_rows < block_n || block_n - 1 > q0 + t.diag;
}

// Keys of the segment that tile row r sees, as the half-open range [0, end): end = min(k_len,
// r + diag + 1). Shared by tests and the CPU model of the kernels.
inline int32_t ForwardVisibleEnd(const ForwardTile& t, int32_t r) {
  const int64_t end = static_cast<int64_t>(r) + t.diag + 1;
  return end < t.k_len ? static_cast<int32_t>(end) : t.k_len;
}

}  // namespace wlb::cuda

#endif  // WLB_CUDA_ATTENTION_TILES_H_
