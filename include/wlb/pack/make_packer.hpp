// Creating packers by name, as wlb-plan's --packer spells them.
//
//   auto packer = wlb::MakePacker("wlb-refine", config, cost, {.thresholds = {32768, 65536}});
//
// Names: "original", "original-nextfit" (whole documents), "fixed-greedy" (uses window), "wlb"
// and "wlb-refine" (use thresholds), and "wlb-lookahead" (thresholds and lookahead: K prefetched
// steps).
#pragma once

#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "wlb/pack/fixed_greedy_packer.hpp"
#include "wlb/pack/lookahead_packer.hpp"
#include "wlb/pack/original_packer.hpp"
#include "wlb/pack/wlb_packer.hpp"

namespace wlb {

// Settings only some packers use.
struct PackerOptions {
  int window = 1;                   // fixed-greedy: steps packed together (W >= 1)
  std::vector<int64_t> thresholds;  // wlb, wlb-refine: outlier thresholds L_1 < ... < L_n
  int refine_rounds = 0;            // wlb-refine, wlb-lookahead: max refinement changes per
                                    // step; 0 = 4N
  int lookahead = 1;                // wlb-lookahead: K, steps of arrivals seen ahead (>= 0)
  // wlb-lookahead: the most mean token delay in steps (>= 0) it may spend; it also stays within
  // wlb's delay on the same stream (0.9 of it). Infinity: wlb's bound alone.
  double delay_budget = std::numeric_limits<double>::infinity();
};

inline constexpr const char* kPackerNames[] = {"original", "original-nextfit", "fixed-greedy",
                                               "wlb",      "wlb-refine",       "wlb-lookahead"};

// The most steps wlb-lookahead may see ahead (each costs a step of buffered arrivals and of
// planning work per candidate).
inline constexpr int kMaxLookahead = 8;

// Default outlier thresholds for `levels` queues: S/2 for one level; S/4, S/2 for two; S/4, S/2,
// 3S/4 for three; S*i/(levels+1) beyond. These were the best of a grid on the WLB-LLM-like data at
// S = 128K, N = 4 (README, "Results"); the tuner (wlb/pack/tuner.hpp) picks thresholds for other
// distributions and delay budgets.
inline std::vector<int64_t> DefaultThresholds(int64_t context, int levels) {
  std::vector<int64_t> t;
  for (int i = 1; i <= levels; ++i) {
    const int64_t value = levels == 1   ? context / 2
                          : levels <= 3 ? context * i / 4
                                        : context * i / (levels + 1);
    t.push_back(std::max<int64_t>(1, value));
  }
  return t;
}

// Validates everything and builds the named packer; errors name the bad value.
inline absl::StatusOr<std::unique_ptr<Packer>> MakePacker(std::string_view name,
                                                          const PackerConfig& config,
                                                          DocumentCost cost,
                                                          const PackerOptions& options) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (absl::Status s = ValidateCost(cost); !s.ok()) return s;
  if (name == "original") return std::make_unique<OriginalPacker>(config, std::move(cost));
  if (name == "original-nextfit") {
    return std::make_unique<OriginalPacker>(config, std::move(cost),
                                            OriginalPacker::WholeDocuments::kYes);
  }
  if (name == "fixed-greedy") {
    if (options.window < 1 || options.window > kMaxWindow) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fixed-greedy window must be in [1, %d] steps, got %d", kMaxWindow, options.window));
    }
    if (int64_t{options.window} * config.micro_batches > kMaxWindowMicroBatches) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fixed-greedy window W = %d times N = %d is %d micro-batches per window, over the limit "
          "of %d",
          options.window, config.micro_batches, int64_t{options.window} * config.micro_batches,
          kMaxWindowMicroBatches));
    }
    return std::make_unique<FixedGreedyPacker>(config, std::move(cost), options.window);
  }
  if (name == "wlb" || name == "wlb-refine" || name == "wlb-lookahead") {
    if (absl::Status s = ValidateThresholds(options.thresholds, config.context); !s.ok()) return s;
    if (options.refine_rounds < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("refine rounds must be >= 0, got %d", options.refine_rounds));
    }
    const int rounds = name == "wlb" ? 0
                                     : (options.refine_rounds > 0 ? options.refine_rounds
                                                                  : 4 * config.micro_batches);
    if (name != "wlb-lookahead") {
      return std::make_unique<WlbPacker>(config, std::move(cost), options.thresholds, rounds);
    }
    if (options.lookahead < 0 || options.lookahead > kMaxLookahead) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "look-ahead must be in [0, %d] steps, got %d", kMaxLookahead, options.lookahead));
    }
    if (!(options.delay_budget >= 0.0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "wlb-lookahead delay budget must be >= 0 steps, got %g", options.delay_budget));
    }
    return std::make_unique<LookaheadPacker>(config, std::move(cost), options.thresholds, rounds,
                                             options.lookahead, options.delay_budget);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown packer %s (known: %s)", QuoteForMessage(name), absl::StrJoin(kPackerNames, ", ")));
}

}  // namespace wlb
