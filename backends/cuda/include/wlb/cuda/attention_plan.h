// Host-side work lists for the flash kernels (the plan half of a plan/run split).
//
// The forward kernel runs one thread block per (ForwardTile, head): a tile is up to block_m
// consecutive query rows of one segment together with how many of the segment's keys they can
// see. The backward kernel runs one block per (BackwardTile, kv head): a tile is up to block_n
// consecutive keys of one segment together with the first query row that sees any of them. Tiles
// are ordered heaviest first so the longest blocks start early and short ones fill the tail;
// with BlockOrder::kHeadMajor, heaviest segment first and heaviest tile first inside each
// segment, so a segment's tiles are contiguous (the kernels then run head-major).
// Lists are built once per packed batch and reused by every layer.
//
//   wlb::cuda::AttentionProblem p = ...;  // validated
//   std::vector<wlb::cuda::ForwardTile> fwd = wlb::cuda::BuildForwardTiles(p, 128);
//   std::vector<wlb::cuda::BackwardTile> bwd = wlb::cuda::BuildBackwardTiles(p, 64);
#ifndef WLB_CUDA_ATTENTION_PLAN_H_
#define WLB_CUDA_ATTENTION_PLAN_H_

#include <cstdint>
#include <vector>

#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/attention_tiles.h"

namespace wlb::cuda {

// Forward tiles for a validated `problem`, block_m query rows per tile. kHeaviestFirst: largest
// k_len first, ties in segment order. kHeadMajor: segments by forward work (sum of q_rows x
// k_len) heaviest first, ties in segment order, each segment's tiles contiguous and largest
// k_len first. Segments without queries yield no tile.
std::vector<ForwardTile> BuildForwardTiles(const AttentionProblem& problem, int block_m,
                                           BlockOrder order = BlockOrder::kHeaviestFirst);

// Backward tiles for a validated `problem`, block_n keys per tile, ordered like the forward ones
// with "query rows to visit" (q_len - q_first) as a tile's weight and the sum of k_rows x that as
// a segment's work. Segments without queries yield no tile: their keys get zero gradients.
std::vector<BackwardTile> BuildBackwardTiles(const AttentionProblem& problem, int block_n,
                                             BlockOrder order = BlockOrder::kHeaviestFirst);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_ATTENTION_PLAN_H_
