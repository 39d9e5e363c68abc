// The registry of CP shard strategies, read: the rows of kShardStrategyTable (strategy_table.hpp),
// which everything that names, parses, lists, plans or counts strategies reads (ShardStrategyName,
// ParseShardStrategy, PlanShards, CpSummary and its JSON, wlb-plan --sharding, wlb.plan_shards,
// the benches and the tests). This header includes every strategy's planning file.
//
//   for (const wlb::ShardStrategyInfo& s : wlb::ShardStrategies()) {
//     // s.name ("per-doc"), s.summary (help), s.uses (which options it reads), s.plan
//   }
//   const wlb::ShardStrategyInfo& row = wlb::ShardStrategyRow(wlb::ShardStrategy("adaptive"));
//
// Adding a strategy: its planning file under shard/strategies/ (absl::StatusOr<ShardPlan>(const
// ShardPlanRequest&), building the plan with PlanBuilder), its declaration and row in
// kShardStrategyTable (strategy_table.hpp), and the file's #include below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/adaptive.hpp"
#include "wlb/shard/strategies/balanced_chunks.hpp"
#include "wlb/shard/strategies/contiguous.hpp"
#include "wlb/shard/strategies/doc_degree.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"
#include "wlb/shard/strategies/te_zigzag.hpp"
#include "wlb/shard/strategy_table.hpp"

namespace wlb {

// All strategies (kShardStrategyTable).
inline std::span<const ShardStrategyInfo> ShardStrategies() { return kShardStrategyTable; }

// The row a strategy names.
inline const ShardStrategyInfo& ShardStrategyRow(ShardStrategy strategy) {
  return kShardStrategyTable[strategy.row()];
}

// "per-seq", "per-seq-ordered", ... (its row's name).
inline std::string_view ShardStrategyName(ShardStrategy s) { return ShardStrategyRow(s).name; }

// The names of the strategies with keep(info) (all by default), in registry order, separated by
// ", " and the last by `last_separator`: "per-seq, per-seq-ordered, ..., doc-degree".
template <typename Keep>
std::string ShardStrategyNameList(std::string_view last_separator, Keep&& keep) {
  std::vector<std::string_view> names;
  for (const ShardStrategyInfo& s : kShardStrategyTable) {
    if (keep(s)) names.push_back(s.name);
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? last_separator : std::string_view(", ");
    out += names[i];
  }
  return out;
}
inline std::string ShardStrategyNameList(std::string_view last_separator = ", ") {
  return ShardStrategyNameList(last_separator, [](const ShardStrategyInfo&) { return true; });
}

// Accepts exactly the names ShardStrategyName returns.
inline absl::StatusOr<ShardStrategy> ParseShardStrategy(std::string_view name) {
  for (ShardStrategy s : ShardStrategy::All()) {
    if (name == ShardStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown sharding %s; expected one of %s", QuoteForMessage(name), ShardStrategyNameList()));
}

// Plans one micro-batch for CP size cp_size (see shard_plan.hpp for strategies and rules).
// `model` is used by the strategies whose uses.kernel_model is set (per-seq-ordered, adaptive,
// hybrid, doc-degree, balanced-chunks); `options` (link, layer masks, key copy, memory cap) by
// those with uses.cp_link, uses.layer_mix, uses.key_copy or uses.memory_cap (adaptive,
// doc-degree, balanced-chunks; contiguous reads the memory cap only). Bad options are
// InvalidArgument naming the value.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model,
                                            const CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  if (absl::Status s = ValidateCpPlanOptions(options); !s.ok()) return s;
  const ShardPlanRequest request{.mb = mb,
                                 .starts = *starts,
                                 .cp_size = cp_size,
                                 .requested = strategy,
                                 .model = model,
                                 .options = options};
  return ShardStrategyRow(strategy).plan(request);
}

// PlanShards with the default options: a 450 GB/s link and one causal layer.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model) {
  return PlanShards(mb, cp_size, strategy, model, CpPlanOptions{});
}

}  // namespace wlb
