// kShardStrategyTable, the registry of CP shard strategies (one row per strategy), and
// ShardStrategy, the key that names one of its rows. The row is the strategy's only key: a
// ShardStrategy is made from a registered name at compile time (a typo does not compile) or
// parsed at run time (ParseShardStrategy in shard_strategies.hpp), and it compares rows.
//
//   constexpr wlb::ShardStrategy kAdaptive("adaptive");  // wlb::ShardStrategy("adaptiv"): error
//   for (wlb::ShardStrategy s : wlb::ShardStrategy::All()) { /* registry order */ }
//
// Read rows, names and plans through shard_strategies.hpp (ShardStrategies, ShardStrategyRow,
// ShardStrategyName, PlanShards): it includes every strategy's planning file, which the rows'
// `plan` pointers need at run time. This header only declares those functions, so the planning
// files under strategies/ can name strategies (ShardStrategy("per-doc")) before the table's
// functions are defined.
//
// Adding a strategy: its planning file under strategies/ (absl::StatusOr<ShardPlan>(const
// ShardPlanRequest&), building the plan with PlanBuilder), its declaration and its row below, and
// the file's #include in shard_strategies.hpp.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <iterator>
#include <string_view>

#include "absl/status/statusor.h"

namespace wlb {

struct ShardPlan;         // shard_types.hpp
struct ShardPlanRequest;  // plan_builder.hpp

namespace detail {

// The planning functions of the rows below, defined (inline) in the files under strategies/; this
// declaration leaves out `inline` so that a file including only this header (a strategy file, the
// header check) is not warned that an inline function it names is undefined.
absl::StatusOr<ShardPlan> PlanPerSequence(const ShardPlanRequest& r);         // per_seq.hpp
absl::StatusOr<ShardPlan> PlanPerSequenceOrdered(const ShardPlanRequest& r);  // per_seq_ordered.hpp
absl::StatusOr<ShardPlan> PlanPerDocument(const ShardPlanRequest& r);         // per_doc.hpp
absl::StatusOr<ShardPlan> PlanAdaptive(const ShardPlanRequest& r);            // adaptive.hpp
absl::StatusOr<ShardPlan> PlanHybrid(const ShardPlanRequest& r);              // hybrid.hpp
absl::StatusOr<ShardPlan> PlanPerDocumentPadded(const ShardPlanRequest& r);   // te_zigzag.hpp
absl::StatusOr<ShardPlan> PlanDocumentDegree(const ShardPlanRequest& r);      // doc_degree.hpp
absl::StatusOr<ShardPlan> PlanBalancedChunks(const ShardPlanRequest& r);      // balanced_chunks.hpp
absl::StatusOr<ShardPlan> PlanContiguous(const ShardPlanRequest& r);          // contiguous.hpp

}  // namespace detail

// What a strategy reads beyond the micro-batch and C.
struct ShardStrategyUses {
  bool kernel_model = false;  // the KernelModel (predictions steer the plan)
  bool cp_link = false;       // CpPlanOptions::comm (wlb-plan --cp-link-gbps)
  bool layer_mix = false;     // CpPlanOptions::mix (the layers' attention masks)
  bool key_copy = false;      // CommModel::gather_gbps in its ranking (wlb-plan --cp-gather-gbps)
  // CpPlanOptions::memory_cap_percent: no rank above the memory cap (wlb-plan
  // --cp-memory-cap-percent)
  bool memory_cap = false;
};

// One CP shard strategy.
struct ShardStrategyInfo {
  std::string_view name;     // the key: ShardStrategy(name), ShardStrategyName, JSON "sharding"
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
    {"per-seq",
     "the packed micro-batch cut into 2C equal chunks",
     {},
     "per_seq",
     false,
     &detail::PlanPerSequence},
    {"per-seq-ordered",
     "per-seq over the document order predicted fastest",
     {.kernel_model = true},
     "per_seq_ordered",
     false,
     &detail::PlanPerSequenceOrdered},
    {"per-doc",
     "every document cut into 2C shards, padding-free",
     {},
     "per_doc",
     false,
     &detail::PlanPerDocument},
    {"adaptive",
     "per micro-batch the fastest predicted plan within the memory cap (by default 1.01 x T / C "
     "tokens per rank), K/V exchange over the link included",
     {.kernel_model = true,
      .cp_link = true,
      .layer_mix = true,
      .key_copy = true,
      .memory_cap = true},
     "",
     false,
     &detail::PlanAdaptive},
    {"hybrid",
     "long documents per-doc, short ones whole on the least loaded rank",
     {.kernel_model = true},
     "hybrid",
     false,
     &detail::PlanHybrid},
    {"te-zigzag",
     "Transformer Engine's THD zig-zag: every document padded to 2C equal chunks",
     {},
     "te_zigzag",
     true,
     &detail::PlanPerDocumentPadded},
    {"doc-degree",
     "per-document CP degree, weighing the K/V exchange over the link and the layer masks",
     {.kernel_model = true, .cp_link = true, .layer_mix = true, .memory_cap = true},
     "doc_degree",
     true,
     &detail::PlanDocumentDegree},
    {"balanced-chunks",
     "documents whole or in equal chunks, dealt by predicted time with K/V locality under the "
     "memory cap",
     {.kernel_model = true,
      .cp_link = true,
      .layer_mix = true,
      .key_copy = true,
      .memory_cap = true},
     "balanced_chunks",
     true,
     &detail::PlanBalancedChunks},
    {"contiguous",
     "the packed micro-batch in C contiguous runs (llama3's split), each boundary moved to a "
     "document start within the memory cap",
     {.memory_cap = true},
     "contiguous",
     true,
     &detail::PlanContiguous},
};

// Number of strategies (rows of kShardStrategyTable).
inline constexpr size_t kShardStrategyCount = std::size(kShardStrategyTable);

namespace detail {

// No two rows share a name or a non-empty summary key.
constexpr bool ShardStrategyKeysUnique() {
  for (size_t i = 0; i < kShardStrategyCount; ++i) {
    for (size_t j = i + 1; j < kShardStrategyCount; ++j) {
      const ShardStrategyInfo& a = kShardStrategyTable[i];
      const ShardStrategyInfo& b = kShardStrategyTable[j];
      if (a.name == b.name) return false;
      if (!a.summary_key.empty() && a.summary_key == b.summary_key) return false;
    }
  }
  return true;
}
static_assert(ShardStrategyKeysUnique(), "kShardStrategyTable: names and summary keys must differ");

}  // namespace detail

// How a micro-batch is split across CP ranks (see shard_plan.hpp): the key of one row of
// kShardStrategyTable. Made only from a registered name, so every value names a row:
// ShardStrategy("per-doc") at compile time, ParseShardStrategy at run time, or
// ShardStrategy::All(). Compares (and orders) by row. The row number is not stable across versions:
// store the name.
class ShardStrategy {
 public:
  // The row named `name`; a name not in kShardStrategyTable does not compile.
  explicit consteval ShardStrategy(std::string_view name) : row_(RowOf(name)) {}

  // Every strategy, in registry order (All()[i].row() == i).
  static constexpr std::array<ShardStrategy, kShardStrategyCount> All() {
    std::array<ShardStrategy, kShardStrategyCount> all{};
    for (size_t i = 0; i < kShardStrategyCount; ++i) all[i].row_ = i;
    return all;
  }

  // Its row's index in kShardStrategyTable.
  constexpr size_t row() const { return row_; }

  friend constexpr bool operator==(ShardStrategy, ShardStrategy) = default;
  friend constexpr auto operator<=>(ShardStrategy, ShardStrategy) = default;

 private:
  constexpr ShardStrategy() = default;  // row 0; for All() only

  static consteval size_t RowOf(std::string_view name) {
    for (size_t i = 0; i < kShardStrategyCount; ++i) {
      if (kShardStrategyTable[i].name == name) return i;
    }
    // Not a constant expression: the compiler reports the unknown name here.
    throw "ShardStrategy: no row of kShardStrategyTable has this name";
  }

  size_t row_ = 0;
};

}  // namespace wlb
