// The CP executor's dataflow on the CPU, in float64: the proof that the maps are right.
//
// CpuCpAttention does on plain arrays exactly what CpExecutor does on the device, step by step:
// shard the packed Q/K/V/dO into every rank's local rows (padding rows poisoned with NaN, so a
// map that touches one shows), exchange K/V as maps.exchange says (all-gather, or the row-exact
// all-to-all-v), gather each rank's keys from its source rows, run the float64 CPU reference
// attention per rank, sum each rank's dK/dV rows into its source rows, send them back
// (reduce-scatter, or the reverse all-to-all-v and the return sums) and put every rank's rows
// back into packed order. Its result must equal CpuAttentionForward/Backward over
// WholeBatchProblem, and the rows it moves are what the planner predicts (ExchangedKvRows).
//
//   absl::StatusOr<wlb::cuda::CpMaps> maps = wlb::cuda::BuildCpMaps(plan, config);
//   absl::StatusOr<wlb::cuda::CpuCpResult> cp = wlb::cuda::CpuCpAttention(*maps, q, k, v, dout);
#ifndef WLB_CUDA_CP_REFERENCE_H_
#define WLB_CUDA_CP_REFERENCE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/cp_maps.h"

namespace wlb::cuda {

// Packed (micro-batch order) results of the emulated CP run.
struct CpuCpResult {
  std::vector<double> out;  // (tokens, num_heads, head_dim)
  std::vector<double> lse;  // (num_heads, tokens)
  std::vector<double> dq;   // (tokens, num_heads, head_dim)
  std::vector<double> dk;   // (tokens, num_kv_heads, head_dim)
  std::vector<double> dv;   // (tokens, num_kv_heads, head_dim)
  // Per rank: K/V rows it sent to and received from the other ranks in forward (backward's
  // dK/dV exchange moves as many rows the other way).
  std::vector<int64_t> sent_rows, received_rows;
};

// Runs the executor's dataflow for `maps` on packed THD inputs (micro-batch order). Errors:
// InvalidArgument when a tensor's size does not match maps.tokens and the config, or when a
// rank's problem is rejected by the CPU reference; Internal when row-exact maps disagree between
// ranks.
absl::StatusOr<CpuCpResult> CpuCpAttention(const CpMaps& maps, absl::Span<const float> q,
                                           absl::Span<const float> k, absl::Span<const float> v,
                                           absl::Span<const float> dout);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_REFERENCE_H_
