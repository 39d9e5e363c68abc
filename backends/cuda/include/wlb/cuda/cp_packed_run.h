// Runs a packed micro-batch through the CP executor: shard → forward → backward → unshard.
//
// For checking CP against single-device attention and for benchmarks: the caller keeps Q/K/V/dO
// and the results in packed (micro-batch order) device tensors; the runner owns every local
// rank's rank_capacity-row buffers. All local ranks must be able to read and write the packed
// tensors (one device, as with LocalCommunicator, or peer access).
//
//   auto comm = wlb::cuda::LocalCommunicator::Create(plan.cp_size);
//   auto run = wlb::cuda::CpPackedRunner::Create(plan, config, **comm);
//   absl::Status s = (*run)->Run(packed, /*backward=*/true);   // packed.out, .dq, ... written
//   auto times = (*run)->executor().RankTimes();
#ifndef WLB_CUDA_CP_PACKED_RUN_H_
#define WLB_CUDA_CP_PACKED_RUN_H_

#include <cuda_bf16.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/cuda/cp_executor.h"

namespace wlb::cuda {

// Packed THD device tensors of a micro-batch (plan.tokens rows each).
struct PackedCpTensors {
  const __nv_bfloat16* q = nullptr;     // (tokens, num_heads, head_dim)
  const __nv_bfloat16* k = nullptr;     // (tokens, num_kv_heads, head_dim)
  const __nv_bfloat16* v = nullptr;     // (tokens, num_kv_heads, head_dim)
  const __nv_bfloat16* dout = nullptr;  // (tokens, num_heads, head_dim); backward only
  __nv_bfloat16* out = nullptr;         // written
  __nv_bfloat16* dq = nullptr;          // written by a backward run
  __nv_bfloat16* dk = nullptr;          // written by a backward run
  __nv_bfloat16* dv = nullptr;          // written by a backward run
};

class CpPackedRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CpPackedRunner>> Create(
      const ShardPlan& plan, const CpAttentionConfig& config, Communicator& comm,
      const CpExecutorOptions& options = {});
  ~CpPackedRunner();

  // Shards q/k/v (and dout), runs forward (and backward) and writes the packed results; waits
  // for completion. InvalidArgument for a null tensor the run needs.
  absl::Status Run(const PackedCpTensors& t, bool backward);

  // Forward (and backward) again on the already sharded inputs: what a benchmark times.
  absl::Status Rerun(bool backward);

  CpExecutor& executor() { return *executor_; }

 private:
  CpPackedRunner() = default;
  absl::Status Sync();

  Communicator* comm_ = nullptr;
  std::unique_ptr<CpExecutor> executor_;
  std::vector<void*> buffers_;  // every local rank's q, k, v, out, dout, dq, dk, dv
  std::vector<CpForwardTensors> forward_;
  std::vector<CpBackwardTensors> backward_;
};

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_PACKED_RUN_H_
