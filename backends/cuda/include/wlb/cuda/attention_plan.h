// Host-side work lists for the flash kernels (the plan half of a plan/run split).
//
// The forward kernel runs one thread block per (ForwardTile, head): a tile is up to block_m
// consecutive query rows of one segment together with how many of the segment's keys they can
// see. The backward kernel runs one block per (BackwardTile, kv head): a tile is up to block_n
// consecutive keys of one segment together with the first query row that sees any of them. Tiles
// are ordered heaviest first so the longest blocks start early and short ones fill the tail.
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

// Forward tiles for a validated `problem`, block_m query rows per tile, heaviest (largest k_len)
// first; ties keep segment order. Segments without queries yield no tile.
std::vector<ForwardTile> BuildForwardTiles(const AttentionProblem& problem, int block_m);

// Backward tiles for a validated `problem`, block_n keys per tile, heaviest (most query rows to
// visit) first; ties keep segment order. Segments
// without queries yield no tile: their keys get zero gradients.
std::vector<BackwardTile> BuildBackwardTiles(const AttentionProblem& problem, int block_n);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_ATTENTION_PLAN_H_
