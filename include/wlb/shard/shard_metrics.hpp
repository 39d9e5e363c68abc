// CP balance of shard plans: how much the slowest rank of a micro-batch waits on the others.
//
//   wlb::CpBalance b = wlb::MeasureCpBalance(plan, wlb::KernelModel::Default());
//   // b.pair_imbalance: max / mean over ranks of causal (query, key) pairs
//   // b.model_imbalance: max / mean over ranks of predicted kernel latency
//   wlb::CpSummary summary;
//   summary.Add(plan, b);  // once per micro-batch; then summary.pair_imbalance_mean, ...
//
// CP imbalance = max over ranks / mean over ranks (1.0 is perfect; 1.0 when no rank has work).
// Causal pairs count the exact attention work; the kernel model adds tile padding, the
// throughput drop of short query ranges and per-segment overhead.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/shard_strategies.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {

// Max / mean of non-negative values; 1.0 for none or an all-zero list.
inline double MaxOverMean(std::span<const double> values) {
  double total = 0.0, largest = 0.0;
  for (double v : values) {
    total += v;
    largest = std::max(largest, v);
  }
  if (values.empty() || total <= 0.0) return 1.0;
  return largest / (total / static_cast<double>(values.size()));
}

// Per-rank causal pairs of a plan, as doubles (for MaxOverMean).
inline std::vector<double> RankCausalPairs(const ShardPlan& plan) {
  std::vector<double> pairs;
  pairs.reserve(plan.ranks.size());
  for (const RankShard& r : plan.ranks) pairs.push_back(static_cast<double>(r.causal_pairs));
  return pairs;
}

// CP balance of one micro-batch's plan.
struct CpBalance {
  double pair_imbalance = 1.0;   // max / mean rank causal pairs
  double model_imbalance = 1.0;  // max / mean rank predicted latency
  int64_t max_rank_pairs = 0;
  double max_rank_ms = 0.0;   // predicted latency of the slowest rank
  double mean_rank_ms = 0.0;  // mean predicted rank latency
};

inline CpBalance MeasureCpBalance(const ShardPlan& plan, const KernelModel& model) {
  CpBalance b;
  const std::vector<double> pairs = RankCausalPairs(plan);
  const std::vector<double> ms = PredictRankMs(plan, model);
  b.pair_imbalance = MaxOverMean(pairs);
  b.model_imbalance = MaxOverMean(ms);
  for (const RankShard& r : plan.ranks)
    b.max_rank_pairs = std::max(b.max_rank_pairs, r.causal_pairs);
  for (double v : ms) {
    b.max_rank_ms = std::max(b.max_rank_ms, v);
    b.mean_rank_ms += v;
  }
  if (!ms.empty()) b.mean_rank_ms /= static_cast<double>(ms.size());
  return b;
}

// CP balance over many micro-batches (a run's summary line).
struct CpSummary {
  int64_t micro_batches = 0;
  // Micro-batches planned with each strategy (adaptive's and doc-degree's picks counted under the
  // strategy used), indexed by ShardStrategy::row(); read it with count().
  std::array<int64_t, kShardStrategyCount> planned{};
  double pair_imbalance_mean = 0.0;
  double pair_imbalance_max = 0.0;
  double model_imbalance_mean = 0.0;
  double model_imbalance_max = 0.0;
  double max_rank_ms_total = 0.0;  // sum over micro-batches of the slowest rank's latency

  // Micro-batches planned with `strategy` (0 for adaptive: plans never hold it).
  int64_t count(ShardStrategy strategy) const { return planned[strategy.row()]; }

  // Adds one micro-batch; means are kept up to date.
  void Add(const ShardPlan& plan, const CpBalance& b) {
    const double n = static_cast<double>(micro_batches);
    pair_imbalance_mean = (pair_imbalance_mean * n + b.pair_imbalance) / (n + 1.0);
    model_imbalance_mean = (model_imbalance_mean * n + b.model_imbalance) / (n + 1.0);
    pair_imbalance_max = std::max(pair_imbalance_max, b.pair_imbalance);
    model_imbalance_max = std::max(model_imbalance_max, b.model_imbalance);
    max_rank_ms_total += b.max_rank_ms;
    ++micro_batches;
    ++planned[plan.strategy.row()];
  }
};

// The per-strategy counts of a summary as text, in registry order: "3 per-seq, 0 per-seq-ordered,
// 5 per-doc, 0 hybrid" for the strategies with a summary key that always appear, or (optional)
// "1 te-zigzag, 0 doc-degree" for those that appear only when used, "" when none of them is.
inline std::string CpStrategyCounts(const CpSummary& s, bool optional) {
  std::string out;
  bool used = false;
  for (ShardStrategy strategy : ShardStrategy::All()) {
    const ShardStrategyInfo& info = ShardStrategyRow(strategy);
    if (info.summary_key.empty() || info.summary_only_when_used != optional) continue;
    const int64_t n = s.count(strategy);
    used = used || n > 0;
    absl::StrAppendFormat(&out, "%s%d %s", out.empty() ? "" : ", ", n, info.name);
  }
  return optional && !used ? std::string() : out;
}

}  // namespace wlb
