// Host-side plan of the `cudnn` attention engine, independent of cuDNN itself (so it is tested
// on any machine): the shape class a cuDNN SDPA graph is built and cached for, the ragged THD
// offsets and sequence lengths it reads at run time, and the layout of its softmax statistics.
//
// cuDNN's SDPA over a packed THD batch is a graph of fixed dimensions (batch b, max sequence
// lengths s_q and s_kv, packed token totals) whose per-segment lengths and element offsets are
// device tensors read at run time. Rounding those dimensions up to a shape class lets one graph
// serve every micro-batch of the class: segments without queries are dropped (their keys get
// zero gradients) and the batch is padded with zero-length segments.
//
//   wlb::cuda::AttentionProblem p = ...;
//   wlb::cuda::CudnnShapeClass c = wlb::cuda::CudnnShapeClassOf(p);   // the graph cache key
//   absl::StatusOr<wlb::cuda::CudnnRaggedLayout> l = wlb::cuda::BuildCudnnRaggedLayout(p, c);
//   // l->seq_len_q, l->q_offsets, ... are uploaded once; the run side only reads them.
#ifndef WLB_CUDA_CUDNN_LAYOUT_H_
#define WLB_CUDA_CUDNN_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/lse_layout.h"

namespace wlb::cuda {

// Oldest cuDNN the engine accepts (cudnnGetVersion() encoding): 9.6.0 is the first with ragged
// GQA backward, bottom-right causal masks at any length, and a backward workspace bounded by the
// packed token count (max_total_seq_len).
inline constexpr int64_t kMinCudnnVersion = 90600;

// The dimensions a cuDNN SDPA graph is built for. Two problems of one class share a graph.
struct CudnnShapeClass {
  int64_t batch = 0;         // segments with queries, rounded up to a power of two
  int64_t max_seqlen_q = 0;  // rounded up to a power of two, at least kCudnnMinSeqBucket
  int64_t max_seqlen_k = 0;
  int64_t total_q = 0;  // packed token totals, rounded up by CudnnTokenBucket
  int64_t total_k = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool causal = true;
  // Causal and every segment with queries has as many keys (whole documents, no CP shard): the
  // top-left causal mask is then the same set as the bottom-right one, and cuDNN's backward
  // kernel skips the masked tiles only under it (H100, cuDNN 9.19, 8 x 16K: the same bprop
  // kernel ran 80.9 ms bottom-right and 40.0 ms top-left; PyTorch's dense call 36.7 ms).
  bool causal_top_left = false;
  float softmax_scale = 0.0f;

  friend bool operator==(const CudnnShapeClass&, const CudnnShapeClass&) = default;
  // A stable, readable key ("b4 sq256 sk512 tq1024 tk2048 h32 hk8 d128 causal
  // scale=0x1.6a09e6p-4"; "causal-top-left" when causal_top_left).
  std::string ToString() const;
};

// Smallest bucket of the sequence lengths (one cuDNN tile).
inline constexpr int64_t kCudnnMinSeqBucket = 64;

// The smallest power of two >= max(n, floor). n and floor must be in [0, 2^62].
int64_t CudnnBucket(int64_t n, int64_t floor = 1);

// The packed token totals' bucket: the smallest multiple of bit_floor(n) / 8 (at least 1) that
// is >= max(n, 1), so at most 12.5% above n (eight classes per power of two). The backward
// graph's workspace grows with these totals (GQA's full-head dK/dV accumulators in fp32): a power
// of two doubled it just past one, and eight emulated CP ranks of per-doc shards at 128K (each
// rank's keys just over 128K) ran out of an H100's 80 GB on 2026-11-26. n must be in [0, 2^62].
int64_t CudnnTokenBucket(int64_t n);

// The class of a problem valid for AttentionKernel::kCudnn. A problem without queries has
// batch 0 (no graph is built for it).
CudnnShapeClass CudnnShapeClassOf(const AttentionProblem& problem);

// What the graph reads at run time, one entry per cuDNN batch slot (shape.batch of them): the
// problem's segments with queries in order, then zero-length padding slots whose offsets point at
// the end of the packed tensors. Offsets count elements: Q and O (total_q, heads, head_dim),
// K and V (total_k, kv_heads, head_dim), the statistics (total_q, heads).
struct CudnnRaggedLayout {
  std::vector<int32_t> segments;       // problem segment of each slot with queries
  std::vector<int32_t> seq_len_q;      // shape.batch
  std::vector<int32_t> seq_len_k;      // shape.batch
  std::vector<int32_t> q_offsets;      // shape.batch + 1
  std::vector<int32_t> kv_offsets;     // shape.batch + 1
  std::vector<int32_t> stats_offsets;  // shape.batch + 1
  // Some keys belong to segments without queries: cuDNN never visits them, so the engine zeroes
  // dK and dV before its backward pass.
  bool has_unvisited_keys = false;
};

// The layout of `problem` in `shape` (which must be CudnnShapeClassOf(problem) or a class whose
// every dimension is at least as large). InvalidArgument naming the dimension when `shape` is
// too small for the problem; OutOfRange naming the tensor when an element offset does not fit
// cuDNN's int32 ragged offsets.
absl::StatusOr<CudnnRaggedLayout> BuildCudnnRaggedLayout(const AttentionProblem& problem,
                                                         const CudnnShapeClass& shape);

// The engine's statistics conversion on the host (the device kernels use the same index map,
// lse_layout.h): cuDNN's token-major (total_q, heads) statistics to wlb's (heads, total_q) LSE,
// and back. Both are natural-log log-sum-exp of the scaled masked scores, so only the layout
// changes. InvalidArgument when a span's size is not heads * total_q.
absl::Status CudnnStatsToLse(absl::Span<const float> stats, int heads, int64_t total_q,
                             absl::Span<float> lse);
absl::Status LseToCudnnStats(absl::Span<const float> lse, int heads, int64_t total_q,
                             absl::Span<float> stats);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CUDNN_LAYOUT_H_
