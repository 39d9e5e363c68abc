// Index maps that execute a CP shard plan: where every row of every rank's tensors comes from.
//
// The executor (cp_executor.h) runs a wlb::ShardPlan Llama-3 style: every rank holds its own
// tokens' Q/K/V (rank_capacity rows, its segments' queries in plan order, padding rows last),
// K/V are all-gathered into C * rank_capacity rows (rank-major), each rank gathers the keys of
// its segments into a contiguous varlen layout, runs varlen causal attention, and in backward
// its dK/dV rows are summed back into the gathered layout and reduce-scattered. This header
// computes every index that dataflow needs, on the host, once per plan; the device side only
// reads them (plan/run split). CpuCpAttention (cp_reference.h) runs the same dataflow on the CPU.
//
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, 4, wlb::ShardStrategy("adaptive"),
//                                                         wlb::KernelModel::Default());
//   wlb::cuda::CpAttentionConfig config{.num_heads = 32, .num_kv_heads = 8, .head_dim = 128};
//   absl::StatusOr<wlb::cuda::CpMaps> maps = wlb::cuda::BuildCpMaps(*plan, config);
//   // maps->ranks[r].problem feeds VarlenAttention::Create on rank r (when it has segments).
#ifndef WLB_CUDA_CP_MAPS_H_
#define WLB_CUDA_CP_MAPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/core/document.hpp"
#include "wlb/cuda/attention_problem.h"
#include "wlb/shard/shard_plan.hpp"

namespace wlb::cuda {

// The attention shape shared by every rank of a CP group.
struct CpAttentionConfig {
  int num_heads = 0;           // query heads per rank
  int num_kv_heads = 0;        // key/value heads; divides num_heads
  int head_dim = 0;            // flash kernel: 64 or 128
  float softmax_scale = 0.0f;  // 0 means 1 / sqrt(head_dim)
  AttentionKernel kernel = AttentionKernel::kFlash;
  // The layer's attention mask. The CUDA kernels apply causal masks only: any other mask is
  // InvalidArgument naming it (wlb.torch.cp_attention runs window and chunk masks).
  AttentionMask mask;
};

// One rank's maps. Row indices are int32 (what the varlen kernels and the gathers take).
struct CpRankMaps {
  int rank = 0;
  int64_t tokens = 0;  // query rows in use; rows [tokens, rank_capacity) are padding
  // Varlen problem of the rank: queries in the local layout, keys in the rank's key layout.
  // Without segments, cu_seqlens are {0} and the rank runs no kernel.
  AttentionProblem problem;
  std::vector<int32_t> local_to_packed;  // local row -> packed micro-batch position (tokens)
  std::vector<int32_t> key_rows;         // rank key row -> gathered row (problem.total_k())
  // dK/dV: for gathered row g, the rank key rows key_sources[key_offsets[g] ..
  // key_offsets[g+1]) hold its gradient contributions (ascending, so sums are deterministic).
  std::vector<int32_t> key_offsets;  // gathered_rows + 1
  std::vector<int32_t> key_sources;  // problem.total_k()

  bool has_work() const { return problem.batch() > 0; }
};

// All ranks' maps for one shard plan.
struct CpMaps {
  int cp_size = 1;
  int64_t tokens = 0;         // packed micro-batch tokens
  int64_t rank_capacity = 0;  // rows of every rank's local buffers
  std::vector<int32_t> packed_to_gathered;  // packed position -> gathered row (tokens)
  std::vector<CpRankMaps> ranks;            // ranks[r].rank == r

  int64_t gathered_rows() const { return cp_size * rank_capacity; }
};

// The softmax scale `config` asks for (1 / sqrt(head_dim) when it is 0).
float EffectiveSoftmaxScale(const CpAttentionConfig& config);

// Builds the maps of `plan`. InvalidArgument when the config is not a valid attention shape for
// config.kernel or the plan is inconsistent (a packed token held by no rank or by two, a segment
// outside the micro-batch, a rank over its capacity); OutOfRange when gathered rows exceed int32.
absl::StatusOr<CpMaps> BuildCpMaps(const ShardPlan& plan, const CpAttentionConfig& config);

// The single-device problem over the whole packed micro-batch: one causal segment per document
// piece. InvalidArgument for an empty micro-batch or an invalid config.
absl::StatusOr<AttentionProblem> WholeBatchProblem(const MicroBatch& mb,
                                                   const CpAttentionConfig& config);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_MAPS_H_
