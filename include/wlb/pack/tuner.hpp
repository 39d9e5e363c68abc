// Picking outlier-queue thresholds for a document distribution and a delay budget.
//
//   wlb::TunerOptions opts{.max_levels = 3, .delay_budget = 1.0};
//   absl::StatusOr<wlb::TunedThresholds> best =
//       wlb::TuneThresholds(sample_arrivals, config, cost, opts);
//   // best->thresholds, best->imbalance_mean, best->delay_mean
//
// Every set of up to `max_levels` strictly increasing thresholds drawn from `candidates` (default
// S/16, S/8, 3S/16, S/4, 3S/8, S/2, 5S/8, 3S/4) is run with the chosen packer over the sample; the
// one with the lowest mean imbalance whose mean token delay stays within the budget wins (ties:
// lower delay, then fewer levels). No queues at all is always a candidate; when no candidate meets
// the budget the tuner says so with an error. With packer "wlb-lookahead" each set runs with the
// budget as the packer's own delay budget, so sets that cost wlb more delay than the budget can
// still fit it (at tight budgets on heavy tails wlb-refine can only pick no queues).
#pragma once

#include <functional>
#include <vector>

#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {

struct TunerOptions {
  int max_levels = 3;               // most outlier queues to consider
  double delay_budget = 1.0;        // max mean token delay, in steps
  std::vector<int64_t> candidates;  // threshold values to draw from; empty = fractions of S
  std::string packer = "wlb";       // "wlb", "wlb-refine" or "wlb-lookahead"
};

struct TunedThresholds {
  std::vector<int64_t> thresholds;
  double imbalance_mean = 0.0;
  double delay_mean = 0.0;
  int evaluated = 0;  // threshold sets tried
};

inline absl::StatusOr<TunedThresholds> TuneThresholds(
    const std::vector<std::vector<Document>>& sample, const PackerConfig& config,
    const DocumentCost& cost, const TunerOptions& options) {
  if (options.max_levels < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tuner max_levels must be >= 0, got %d", options.max_levels));
  }
  if (!(options.delay_budget >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tuner delay budget must be >= 0 steps, got %g", options.delay_budget));
  }
  std::vector<int64_t> candidates = options.candidates;
  if (candidates.empty()) {
    for (int sixteenths : {1, 2, 3, 4, 6, 8, 10, 12}) {
      candidates.push_back(std::max<int64_t>(1, config.context * sixteenths / 16));
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());

  TunedThresholds best;
  bool have_best = false;
  absl::Status error = absl::OkStatus();
  std::vector<int64_t> current;
  auto evaluate = [&]() {
    // wlb-lookahead is given the budget too: it spends at most that much delay.
    auto packer = MakePacker(options.packer, config, cost,
                             {.thresholds = current,
                              .delay_budget = options.packer == "wlb-lookahead"
                                                  ? options.delay_budget
                                                  : std::numeric_limits<double>::infinity()});
    if (!packer.ok()) {
      error = packer.status();
      return;
    }
    absl::StatusOr<PackRun> run = RunPacker(**packer, sample);
    if (!run.ok()) {
      error = run.status();
      return;
    }
    const StreamSummary s = Summarize(run->steps, cost);
    ++best.evaluated;
    if (s.delay.mean > options.delay_budget) return;
    const bool better =
        !have_best || s.imbalance_mean < best.imbalance_mean - 1e-12 ||
        (s.imbalance_mean <= best.imbalance_mean + 1e-12 &&
         (s.delay.mean < best.delay_mean - 1e-12 ||
          (s.delay.mean <= best.delay_mean + 1e-12 && current.size() < best.thresholds.size())));
    if (better) {
      best.thresholds = current;
      best.imbalance_mean = s.imbalance_mean;
      best.delay_mean = s.delay.mean;
      have_best = true;
    }
  };
  // Depth-first over increasing subsets of the candidates, shortest prefix first.
  std::function<void(size_t)> walk = [&](size_t from) {
    evaluate();
    if (!error.ok() || static_cast<int>(current.size()) == options.max_levels) return;
    for (size_t i = from; i < candidates.size() && error.ok(); ++i) {
      if (candidates[i] > config.context) break;
      current.push_back(candidates[i]);
      walk(i + 1);
      current.pop_back();
    }
  };
  walk(0);
  if (!error.ok()) return error;
  if (!have_best) {
    return absl::NotFoundError(absl::StrFormat(
        "no threshold set keeps the mean token delay within %g steps", options.delay_budget));
  }
  return best;
}

}  // namespace wlb
