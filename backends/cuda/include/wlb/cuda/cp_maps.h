// Index maps that execute a CP shard plan: where every row of every rank's tensors comes from.
//
// The executor (cp_executor.h) runs a wlb::ShardPlan Llama-3 style: every rank holds its own
// tokens' Q/K/V (rank_capacity rows, its segments' queries in plan order, padding rows last) and
// fetches the K/V rows of the other ranks that its keys need by one of two exchanges
// (wlb::ExchangeKind, chosen per plan by wlb::ChooseExchange, the planner's rule):
//  - all-gather: every rank's whole buffer, C * rank_capacity "source rows" (rank-major); in
//    backward the dK/dV of all of them are reduce-scattered;
//  - row-exact (wlb/shard/row_exchange.hpp): exactly the rows it needs and does not hold, by one
//    all-to-all-v; its source rows are its own `tokens` rows followed by the received ones, and in
//    backward the received rows' dK/dV go back to their owners by the reverse all-to-all-v.
// Each rank then gathers the keys of its segments from its source rows into a contiguous varlen
// layout and runs varlen attention (CpSchedule: one causal call over all of them, or the split
// that overlaps the exchange); in backward its dK/dV rows are summed back into its source rows.
// This header computes every index that dataflow needs, on the host, once per plan; the device
// side only reads them (plan/run split). CpuCpAttention (cp_reference.h) runs the same dataflow
// on the CPU.
//
//   absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, 4, wlb::ShardStrategy("adaptive"),
//                                                         wlb::KernelModel::Default());
//   wlb::cuda::CpAttentionConfig config{.num_heads = 32, .num_kv_heads = 8, .head_dim = 128};
//   wlb::ExchangeKind x = wlb::cuda::ChooseCpExchange(*plan, config, wlb::CommModel{});
//   absl::StatusOr<wlb::cuda::CpMaps> maps = wlb::cuda::BuildCpMaps(*plan, config, x);
//   // maps->ranks[r].problem (and .diagonal under the split) feed VarlenAttention::Create.
#ifndef WLB_CUDA_CP_MAPS_H_
#define WLB_CUDA_CP_MAPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/core/document.hpp"
#include "wlb/cuda/attention_problem.h"
#include "wlb/shard/cp_prediction.hpp"
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

// How a rank runs the attention of its segments. A CP segment holds queries [a, b) of a document
// and sees its keys [0, b).
enum class CpSchedule {
  // One bottom-right causal varlen call over every segment's keys [0, b), gathered from the
  // source rows once the exchange is done.
  kWhole,
  // Each segment as its diagonal block (queries [a, b) x keys [a, b): the rank's own rows, a
  // square causal block, so it needs no exchange and runs while the exchange is in flight) and
  // its prefix (the same queries x keys [0, a), no mask; only segments with a > 0), merged by
  // log-sum-exp. Square blocks are also where cuDNN's causal backward skips masked tiles.
  kSplit,
};

// "whole" or "split".
const char* CpScheduleName(CpSchedule schedule);

// One rank's maps. Row indices are int32 (what the varlen kernels and the gathers take).
struct CpRankMaps {
  int rank = 0;
  int64_t tokens = 0;  // query rows in use; rows [tokens, rank_capacity) are padding
  // The attention over keys gathered from the source rows, in the rank's key layout. kWhole: the
  // causal problem of every segment, queries = local rows [0, tokens). kSplit: the prefixes (no
  // mask), queries gathered from local rows query_rows. Without segments (or, under kSplit,
  // without a segment that has a prefix) cu_seqlens are {0} and no kernel runs for it.
  AttentionProblem problem;
  std::vector<int32_t> query_rows;  // kSplit: problem query row -> local row; kWhole: empty
  // kSplit: the diagonal blocks, causal, cu_seqlens_q == cu_seqlens_k over local rows [0, tokens):
  // queries and keys are the rank's own rows, read in place. kWhole: cu_seqlens {0}.
  AttentionProblem diagonal;
  std::vector<int32_t> local_to_packed;  // local row -> packed micro-batch position (tokens)
  // The rank's source rows: what its keys are gathered from (the file comment). All-gather:
  // C * rank_capacity; row-exact: tokens + the rows it receives.
  int64_t source_rows = 0;
  std::vector<int32_t> key_rows;  // problem key row -> source row (problem.total_k())
  // dK/dV: the rank's key gradients are dkv_rows() rows, problem's keys then (kSplit) the
  // diagonal's (rows from problem.total_k() on; the executor keeps them in a buffer of their
  // own); for source row g, rows key_sources[key_offsets[g] .. key_offsets[g+1]) hold its
  // contributions (ascending, so sums are deterministic). Under the row-exact exchange the
  // received source rows [tokens, source_rows) get contributions from problem's keys only.
  std::vector<int32_t> key_offsets;  // source_rows + 1
  std::vector<int32_t> key_sources;  // dkv_rows()
  // Row-exact exchange only (empty under the all-gather), as wlb::RankRowExchange: the local
  // rows sent, grouped by destination, and the rows sent to / received from every rank.
  std::vector<int32_t> send_rows;
  std::vector<int64_t> send_counts;  // per rank (cp_size)
  std::vector<int64_t> recv_counts;  // per rank (cp_size)
  // Backward: the dK/dV rows that come back (in send_rows order) summed into local row i are
  // return_sources[return_offsets[i] .. return_offsets[i+1]) (ascending).
  std::vector<int32_t> return_offsets;  // tokens + 1
  std::vector<int32_t> return_sources;  // send_rows.size()

  bool has_work() const { return problem.batch() > 0 || diagonal.batch() > 0; }
  int64_t dkv_rows() const { return int64_t{problem.total_k()} + diagonal.total_k(); }
};

// All ranks' maps for one shard plan.
struct CpMaps {
  int cp_size = 1;
  int64_t tokens = 0;         // packed micro-batch tokens
  int64_t rank_capacity = 0;  // rows of every rank's local buffers
  ExchangeKind exchange = ExchangeKind::kAllGather;
  CpSchedule schedule = CpSchedule::kWhole;
  std::vector<int32_t> packed_to_gathered;  // packed position -> gathered row (tokens)
  std::vector<CpRankMaps> ranks;            // ranks[r].rank == r

  int64_t gathered_rows() const { return cp_size * rank_capacity; }
};

// The softmax scale `config` asks for (1 / sqrt(head_dim) when it is 0).
float EffectiveSoftmaxScale(const CpAttentionConfig& config);

// Bytes of one token's K and V rows in the executor's bf16 buffers: 2 x 2 x kv_heads x head_dim.
int64_t CpKvRowBytes(const CpAttentionConfig& config);

// The exchange the executor runs for `plan` over `comm` (wlb::ChooseExchange of its exchanged
// rows under the config's mask, rows of CpKvRowBytes(config); comm.kv_row_bytes is ignored).
ExchangeKind ChooseCpExchange(const ShardPlan& plan, const CpAttentionConfig& config,
                              const CommModel& comm);

// Builds the maps of `plan` for `exchange` and `schedule`. InvalidArgument when the config is not a valid
// attention shape for config.kernel or the plan is inconsistent (a packed token held by no rank
// or by two, a segment outside the micro-batch, a rank over its capacity); OutOfRange when
// gathered rows exceed int32.
absl::StatusOr<CpMaps> BuildCpMaps(const ShardPlan& plan, const CpAttentionConfig& config,
                                   ExchangeKind exchange = ExchangeKind::kAllGather,
                                   CpSchedule schedule = CpSchedule::kWhole);

// The single-device problem over the whole packed micro-batch: one causal segment per document
// piece. InvalidArgument for an empty micro-batch or an invalid config.
absl::StatusOr<AttentionProblem> WholeBatchProblem(const MicroBatch& mb,
                                                   const CpAttentionConfig& config);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CP_MAPS_H_
