// The registry of CP shard strategies: one row per strategy, which everything that names, parses,
// lists, plans or counts strategies reads (ShardStrategyName, ParseShardStrategy, PlanShards,
// CpSummary and its JSON, wlb-plan --sharding, wlb.plan_shards, the benches and the tests).
//
//   for (const wlb::ShardStrategyInfo& s : wlb::ShardStrategies()) {
//     // s.name ("per-doc"), s.summary (help), s.uses (which options it reads), s.plan
//   }
//
// Adding a strategy: the next ShardStrategy value (shard_types.hpp), its planning file under
// shard/strategies/ (absl::StatusOr<ShardPlan>(const ShardPlanRequest&), building the plan with
// PlanBuilder), and its row in kShardStrategyTable below (plus the file's #include there).
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
#include "wlb/shard/strategies/doc_degree.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"
#include "wlb/shard/strategies/te_zigzag.hpp"

namespace wlb {

// What a strategy reads beyond the micro-batch and C.
struct ShardStrategyUses {
  bool kernel_model = false;  // the KernelModel (predictions steer the plan)
  bool cp_link = false;       // CpPlanOptions::comm (wlb-plan --cp-link-gbps)
  bool layer_mix = false;     // CpPlanOptions::mix (the layers' attention masks)
};

// One CP shard strategy.
struct ShardStrategyInfo {
  ShardStrategy strategy = ShardStrategy::kPerSequence;
  std::string_view name;     // ShardStrategyName, ParseShardStrategy, JSON "sharding"
  std::string_view summary;  // one line for help texts
  ShardStrategyUses uses;
  // The JSON key of its CpSummary count ("per_seq"); empty when no plan records it (adaptive).
  std::string_view summary_key;
  // The count appears in CP summaries only when non-zero (so summaries of the strategies that
  // predate it keep their exact form).
  bool summary_only_when_used = false;
  // Plans a checked request (PlanShards checks the micro-batch, C and the options first).
  absl::StatusOr<ShardPlan> (*plan)(const ShardPlanRequest&) = nullptr;
};

// The strategies, in the order help texts and error messages list them.
inline constexpr ShardStrategyInfo kShardStrategyTable[] = {
    {ShardStrategy::kPerSequence,
     "per-seq",
     "the packed micro-batch cut into 2C equal chunks",
     {},
     "per_seq",
     false,
     &detail::PlanPerSequence},
    {ShardStrategy::kPerSequenceOrdered,
     "per-seq-ordered",
     "per-seq over the document order predicted fastest",
     {.kernel_model = true},
     "per_seq_ordered",
     false,
     [](const ShardPlanRequest& r) { return detail::PlanPerSequenceOrdered(r); }},
    {ShardStrategy::kPerDocument,
     "per-doc",
     "every document cut into 2C shards, padding-free",
     {},
     "per_doc",
     false,
     &detail::PlanPerDocument},
    {ShardStrategy::kAdaptive,
     "adaptive",
     "per micro-batch the fastest predicted of per-seq-ordered, per-doc and hybrid, K/V exchange "
     "over the link included",
     {.kernel_model = true, .cp_link = true, .layer_mix = true},
     "",
     false,
     &detail::PlanAdaptive},
    {ShardStrategy::kHybrid,
     "hybrid",
     "long documents per-doc, short ones whole on the least loaded rank",
     {.kernel_model = true},
     "hybrid",
     false,
     &detail::PlanHybrid},
    {ShardStrategy::kPerDocumentPadded,
     "te-zigzag",
     "Transformer Engine's THD zig-zag: every document padded to 2C equal chunks",
     {},
     "te_zigzag",
     true,
     &detail::PlanPerDocumentPadded},
    {ShardStrategy::kDocumentDegree,
     "doc-degree",
     "per-document CP degree, weighing the K/V exchange over the link and the layer masks",
     {.kernel_model = true, .cp_link = true, .layer_mix = true},
     "doc_degree",
     true,
     &detail::PlanDocumentDegree},
};

// Number of ShardStrategy values (0 .. kShardStrategyCount - 1, one row each).
inline constexpr size_t kShardStrategyCount = std::size(kShardStrategyTable);

namespace detail {

// Every ShardStrategy value 0 .. kShardStrategyCount - 1 has exactly one row.
constexpr bool ShardStrategyTableComplete() {
  for (size_t v = 0; v < kShardStrategyCount; ++v) {
    int rows = 0;
    for (const ShardStrategyInfo& s : kShardStrategyTable) {
      if (static_cast<size_t>(s.strategy) == v) ++rows;
    }
    if (rows != 1) return false;
  }
  return true;
}
static_assert(ShardStrategyTableComplete(), "kShardStrategyTable needs one row per ShardStrategy");

}  // namespace detail

// All strategies (kShardStrategyTable).
inline std::span<const ShardStrategyInfo> ShardStrategies() { return kShardStrategyTable; }

// The row of a strategy; nullptr for a value outside the enum.
inline const ShardStrategyInfo* FindShardStrategy(ShardStrategy strategy) {
  for (const ShardStrategyInfo& s : kShardStrategyTable) {
    if (s.strategy == strategy) return &s;
  }
  return nullptr;
}

// "per-seq", "per-seq-ordered", ... (the registry's name); "unknown" outside the enum.
inline std::string_view ShardStrategyName(ShardStrategy s) {
  const ShardStrategyInfo* info = FindShardStrategy(s);
  return info != nullptr ? info->name : "unknown";
}

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
  for (const ShardStrategyInfo& s : kShardStrategyTable) {
    if (name == s.name) return s.strategy;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown sharding %s; expected one of %s", QuoteForMessage(name), ShardStrategyNameList()));
}

// Plans one micro-batch for CP size cp_size (see shard_plan.hpp for strategies and rules).
// `model` is used by the strategies whose uses.kernel_model is set (kPerSequenceOrdered,
// kAdaptive, kHybrid, kDocumentDegree); `options` (link and layer masks) by those with uses.cp_link
// or uses.layer_mix (kAdaptive, kDocumentDegree). Bad options are InvalidArgument naming the
// value.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model,
                                            const CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  if (absl::Status s = ValidateCpPlanOptions(options); !s.ok()) return s;
  const ShardStrategyInfo* info = FindShardStrategy(strategy);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown shard strategy value %d", static_cast<int>(strategy)));
  }
  return info->plan(ShardPlanRequest{.mb = mb,
                                     .starts = *starts,
                                     .cp_size = cp_size,
                                     .requested = strategy,
                                     .model = model,
                                     .options = options});
}

// PlanShards with the default options: a 450 GB/s link and one causal layer.
inline absl::StatusOr<ShardPlan> PlanShards(const MicroBatch& mb, int cp_size,
                                            ShardStrategy strategy, const KernelModel& model) {
  return PlanShards(mb, cp_size, strategy, model, CpPlanOptions{});
}

}  // namespace wlb
