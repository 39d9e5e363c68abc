// Executes a CP shard plan: K/V exchange, varlen causal attention per rank, dK/dV back to
// their owners. Forward and backward, per-rank kernel times.
//
// Every rank holds rank_capacity rows of Q/K/V (THD bf16; its segments' queries in plan order,
// then padding rows, whose values are never read). Forward fetches the K/V rows its keys need
// through the Communicator by the plan's exchange (cp_maps.h: all-gather of every buffer, or the
// row-exact all-to-all-v of exactly the rows needed; ChooseCpExchange picks it over
// CpExecutorOptions::comm, as the planner prices it), gathers each rank's segment keys into the
// varlen layout (index maps uploaded once by Create, applied with Thrust on the device) and runs
// VarlenAttention. Under the split schedule (selectable; cp_maps.h, CpSchedule) each segment's
// diagonal block runs on the rank's own rows on a second stream while the exchange is in flight,
// and the prefixes run once it lands; the two merge by log-sum-exp. Backward runs the varlen
// backward of each part (with the merged out and LSE), sums every rank's dK/dV rows into its
// source rows (CSR, fp32, deterministic order), returns them to their owners in fp32
// (reduce-scatter, or the reverse all-to-all-v plus a CSR sum; under the split schedule the
// row-exact return is in flight while the diagonal's backward runs) and rounds to bf16 once.
// Outputs' padding rows are zero. CpuCpAttention (cp_reference.h) is the same dataflow on the
// CPU; the communicator's traffic() counts the bytes moved.
//
//   auto comm = wlb::cuda::LocalCommunicator::Create(plan.cp_size);   // or NcclCommunicator
//   auto exec = wlb::cuda::CpExecutor::Create(plan, config, **comm);  // once per micro-batch
//   std::vector<wlb::cuda::CpForwardTensors> f(plan.cp_size);          // per local rank
//   absl::Status s = (*exec)->Forward(f);  // every layer
//   s = (*exec)->Backward(b);              // after Forward, with the same q, k, v and out
//   absl::StatusOr<std::vector<wlb::cuda::CpRankTimes>> t = (*exec)->RankTimes();
#ifndef WLB_CUDA_CP_EXECUTOR_H_
#define WLB_CUDA_CP_EXECUTOR_H_

#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cp_maps.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/shard/shard_plan.hpp"

namespace wlb::cuda {

// One local rank's forward tensors, each rank_capacity rows.
struct CpForwardTensors {
  ConstThd q, k, v;  // q: num_heads heads; k, v: num_kv_heads heads
  MutableThd out;    // num_heads heads; written completely
};

// One local rank's backward tensors, each rank_capacity rows.
struct CpBackwardTensors {
  ConstThd q, k, v, out, dout;  // q, k, v and out as in Forward
  MutableThd dq, dk, dv;        // written completely
};

// Kernel time of one rank's varlen attention (0 for a rank without segments; under the split
// schedule the diagonal's and the prefixes' kernel times added), and apart from it the copies
// its key rows cost: every segment reads its keys [0, its end) from one contiguous run, so the
// forward gathers cu_seqlens_k.back() K and V rows (a document's rows once per segment that
// sees them) and the backward sums their dK/dV back onto the source rows.
struct CpRankTimes {
  int rank = 0;
  float forward_ms = 0.0f;
  float backward_ms = 0.0f;       // 0 until Backward ran
  float gather_ms = 0.0f;         // the forward's K and V row gathers
  float key_gradients_ms = 0.0f;  // the backward's dK/dV sums onto the source rows (0 before)
};

struct CpExecutorOptions {
  // Run the ranks' attention kernels one after another, each alone on the device, so that
  // emulated ranks sharing one GPU (LocalCommunicator) get their own kernel time. The split
  // schedule's overlap does not happen then: RankTimes compares kernel time only.
  bool isolate_ranks = false;
  // The defaults are the paths that ran on a GPU (docs/guides/cuda.md, "What ran where"); the
  // others are selectable and become defaults once a GPU run passes and times them.
  //
  // The link the planner's rule prices the exchanges for (ChooseCpExchange).
  CommModel comm;
  // The exchange to run; std::nullopt runs the one the rule picks for `comm` (the row-exact
  // all-to-all-v unless the all-gather moves no more rows).
  std::optional<ExchangeKind> exchange = ExchangeKind::kAllGather;
  // kWhole: one bottom-right causal call per rank after the exchange. kSplit overlaps the
  // exchange with the diagonal blocks (cp_maps.h).
  CpSchedule schedule = CpSchedule::kWhole;
  // Move K and V (and dK and dV) in one collective each way (one NCCL group, one barrier pair,
  // as ChooseExchange prices it) instead of one collective per tensor.
  bool kv_one_collective = false;
};

class CpExecutor {
 public:
  // Builds the maps of `plan`, uploads them and creates every local rank's VarlenAttention and
  // buffers on its device. InvalidArgument when plan.cp_size != comm.world_size() or the plan
  // or config is invalid (see BuildCpMaps); device errors as Status.
  static absl::StatusOr<std::unique_ptr<CpExecutor>> Create(const ShardPlan& plan,
                                                            const CpAttentionConfig& config,
                                                            Communicator& comm,
                                                            const CpExecutorOptions& options = {});
  ~CpExecutor();
  CpExecutor(const CpExecutor&) = delete;
  CpExecutor& operator=(const CpExecutor&) = delete;

  // One entry per local rank. Enqueued on the communicator's streams.
  absl::Status Forward(absl::Span<const CpForwardTensors> t);
  // FailedPrecondition before the first Forward.
  absl::Status Backward(absl::Span<const CpBackwardTensors> t);

  // Waits for the last Forward/Backward and returns each local rank's kernel times.
  absl::StatusOr<std::vector<CpRankTimes>> RankTimes() const;

  // local[i] = the rows of local rank i taken from a packed (micro-batch order) tensor of
  // `row_bytes`-byte rows, padding rows zeroed; `packed` must be readable from every local
  // rank's device and ready before the call. For tests and examples that start from a packed
  // micro-batch.
  absl::Status ShardPacked(const void* packed, int64_t row_bytes,
                           absl::Span<void* const> local) const;
  // The inverse: packed rows from every local rank's rows.
  absl::Status UnshardToPacked(absl::Span<const void* const> local, int64_t row_bytes,
                               void* packed) const;

  const CpMaps& maps() const { return maps_; }
  const CpAttentionConfig& config() const { return config_; }

 private:
  struct RankState;
  CpExecutor() = default;
  // Runs `collective` over K and V (or dK and dV) together, or over each alone
  // (CpExecutorOptions::kv_one_collective).
  absl::Status KvCollectives(
      std::initializer_list<CommTensor> kv,
      absl::FunctionRef<absl::Status(absl::Span<const CommTensor>)> collective) const;
  // K/V of every rank's source rows (cp_maps.h) by the maps' exchange.
  absl::Status FetchKv(absl::Span<const CpForwardTensors> t);
  // Sums a rank's dK/dV contributions (the problem's dk/dv, then the diagonal's) into its source
  // rows [first, last) (partial_dk/dv).
  absl::Status SumKeyGradients(RankState& r, int64_t first, int64_t last);
  // The source rows' dK/dV (partial_dk/dv) to their owners: the reduce-scatter into recv_dk/dv,
  // or the reverse all-to-all-v of the received rows' into back_dk/dv.
  absl::Status SendKvGradients();
  // Row-exact: recv_dk/dv = the own rows' partial sums plus what came back.
  absl::Status AddReturnedKvGradients(RankState& r);

  CpMaps maps_;
  CpAttentionConfig config_;
  CpExecutorOptions options_;
  Communicator* comm_ = nullptr;
  std::vector<RankState> ranks_;  // per local rank
  // Row-exact exchange, per local rank: elements (rows x K/V row elements) sent to and received
  // from every rank, as AllToAllV takes them; empty lists under the all-gather.
  std::vector<std::vector<int64_t>> send_elems_, recv_elems_;
  bool forward_done_ = false;
};

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_EXECUTOR_H_
