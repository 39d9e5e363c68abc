// Balance and delay metrics of packed steps.
//
//   double imbalance = wlb::ImbalanceDegree(step.micro_batches);        // 1.0 is perfect
//   double bound = wlb::LowerBound(step.micro_batches, cost);            // no packing beats it
//   wlb::DelayStats delay = wlb::TokenDelay(run.steps);                  // in steps
//   wlb::StreamSummary summary = wlb::Summarize(run.steps, cost);
//
// Imbalance degree of a step = max micro-batch cost / mean micro-batch cost (the paper's
// Max_Latency x PP / Total_Latency). Lower bound = max(max_d W(d), sum W / N) / (sum W / N): the
// heaviest single document, or a perfect split, whichever is worse.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "wlb/cost/document_cost.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {

// Max cost / mean cost over the micro-batches; 1.0 when all are empty.
inline double ImbalanceDegree(std::span<const MicroBatch> mbs) {
  double total = 0.0;
  double heaviest = 0.0;
  for (const MicroBatch& mb : mbs) {
    total += mb.cost;
    heaviest = std::max(heaviest, mb.cost);
  }
  if (mbs.empty() || total <= 0.0) return 1.0;
  return heaviest / (total / static_cast<double>(mbs.size()));
}

// The best imbalance any packing of these documents into as many micro-batches could reach.
inline double LowerBound(std::span<const MicroBatch> mbs, const DocumentCost& cost) {
  double total = 0.0;
  double heaviest_doc = 0.0;
  for (const MicroBatch& mb : mbs) {
    for (const Document& d : mb.documents) {
      const double w = cost(d.length);
      total += w;
      heaviest_doc = std::max(heaviest_doc, w);
    }
  }
  if (mbs.empty() || total <= 0.0) return 1.0;
  const double mean = total / static_cast<double>(mbs.size());
  return std::max(heaviest_doc, mean) / mean;
}

// Token delay: for every token, steps between its arrival and the step that trains on it.
struct DelayStats {
  double mean = 0.0;
  double p99 = 0.0;
  double max = 0.0;
};

inline DelayStats TokenDelay(std::span<const StepPlan> steps) {
  std::vector<std::pair<int64_t, int64_t>> delay_tokens;  // (delay, tokens)
  int64_t total_tokens = 0;
  double weighted = 0.0;
  for (const StepPlan& s : steps) {
    for (const MicroBatch& mb : s.micro_batches) {
      for (const Document& d : mb.documents) {
        const int64_t delay = s.step - d.arrival_step;
        delay_tokens.push_back({delay, d.length});
        total_tokens += d.length;
        weighted += static_cast<double>(delay) * static_cast<double>(d.length);
      }
    }
  }
  DelayStats stats;
  if (total_tokens == 0) return stats;
  std::sort(delay_tokens.begin(), delay_tokens.end());
  stats.mean = weighted / static_cast<double>(total_tokens);
  stats.max = static_cast<double>(delay_tokens.back().first);
  const double p99_rank = 0.99 * static_cast<double>(total_tokens);
  int64_t seen = 0;
  for (const auto& [delay, tokens] : delay_tokens) {
    seen += tokens;
    if (static_cast<double>(seen) >= p99_rank) {
      stats.p99 = static_cast<double>(delay);
      break;
    }
  }
  return stats;
}

// Balance over the steady steps (drain steps at the end of input are counted apart: they hold
// only what was left over and say little about the packer).
struct StreamSummary {
  int64_t steps = 0;         // steady steps
  int64_t drain_steps = 0;
  double imbalance_mean = 1.0;
  double imbalance_p90 = 1.0;
  double imbalance_max = 1.0;
  double lower_bound_mean = 1.0;
  DelayStats delay;          // over every step, drain steps included
};

inline StreamSummary Summarize(std::span<const StepPlan> steps, const DocumentCost& cost) {
  StreamSummary sum;
  std::vector<double> imbalance;
  double bound_total = 0.0;
  for (const StepPlan& s : steps) {
    if (s.drain) {
      ++sum.drain_steps;
      continue;
    }
    imbalance.push_back(ImbalanceDegree(s.micro_batches));
    bound_total += LowerBound(s.micro_batches, cost);
  }
  sum.steps = static_cast<int64_t>(imbalance.size());
  if (!imbalance.empty()) {
    double total = 0.0;
    for (double x : imbalance) total += x;
    sum.imbalance_mean = total / static_cast<double>(imbalance.size());
    sum.lower_bound_mean = bound_total / static_cast<double>(imbalance.size());
    std::vector<double> sorted = imbalance;
    std::sort(sorted.begin(), sorted.end());
    sum.imbalance_max = sorted.back();
    sum.imbalance_p90 = sorted[static_cast<size_t>(std::ceil(0.9 * sorted.size())) - 1];
  }
  sum.delay = TokenDelay(steps);
  return sum;
}

}  // namespace wlb
