// Creating packers by name, as wlb-plan's --packer spells them.
//
//   auto packer = wlb::MakePacker("wlb-refine", config, cost, {.thresholds = {32768, 65536}});
//
// kPackers below is the registry: every packer's name, one-line summary, the PackerOptions it
// uses and its factory; MakePacker, kPackerNames, the plan settings table (plan_settings.hpp:
// which packers read each option, for --help and the "not used by this run" check), wlb-plan, the
// Python binding and the tests read it.
#pragma once

#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
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
  // wlb-lookahead: a target for its mean token delay in steps (>= 0). It is not a bound: the
  // packer prices delay beyond 0.9 of it (lookahead/delay_account.hpp), which steers but does
  // not guarantee. Infinity: the price against wlb's delay alone.
  double delay_budget = std::numeric_limits<double>::infinity();
  // wlb-lookahead (the default): plan each step only under a candidate whose real packing keeps
  // the packer's token delay within a lower bound of wlb-refine's on the same stream (counted as
  // it accrues, the held tokens' drain or continuation included; LookaheadPacker::PlanChosen);
  // when none does, under the one that comes closest among those that pass its step check.
  // Measured (bench/model_error_table, 7 stream shapes x 3 seeds x 5 truths, 750 steps at
  // S = 128K, N = 4): above wlb's mean token delay on 13 of 133 cases, by 0.001 steps but one
  // saturated bimodal stream (+0.124); tiny heavy-tailed streams and N = 16 at S = 128K: see
  // test/lookahead_packer_test.cc and docs/guides/packers.md. false: the price alone steers
  // delay. With one micro-batch either way the packer is wlb-refine.
  bool bound_delay = true;
  // wlb-refine, wlb-lookahead: the attention weights, relative to the planning cost, under which
  // a refinement change must not make a step worse (AttentionRange, pack/refine.hpp). Unset: the
  // default for the cost, DefaultAttentionRange.
  std::optional<AttentionRange> attention_range = std::nullopt;
};

// The attention range a refinement uses when none is given: [1, 2.5] for a FLOP cost (unit
// "flop": nobody calibrated it, and every kernel measured on the H100 weighs attention more than
// the FLOP presets say, 1.17x (cuDNN, 550M) to 2.3x (wlb's flash, 7B TP-8),
// docs/guides/calibration.md "Planning under model error"), exact for any other (a measured cost
// in "ms", whose error is a percent or two and not systematic).
inline AttentionRange DefaultAttentionRange(const DocumentCost& cost) {
  if (cost.unit() == "flop") return {.low = 1.0, .high = 2.5};
  return {};
}

// Default outlier thresholds for `levels` queues: S/2 for one level; S/4, S/2 for two; S/4, S/2,
// 3S/4 for three; S*i/(levels+1) beyond. These were the best of a grid on the WLB-LLM-like data at
// S = 128K, N = 4 (docs/RESULTS.md); the tuner (wlb/pack/tuner.hpp) picks thresholds for other
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

// Which PackerOptions a packer reads (bits of PackerInfo::options).
enum PackerOption : unsigned {
  kUsesWindow = 1u << 0,          // window
  kUsesThresholds = 1u << 1,      // thresholds (wlb-plan: --thresholds or --queues)
  kUsesRefineRounds = 1u << 2,    // refine_rounds
  kUsesLookahead = 1u << 3,       // lookahead
  kUsesDelayBudget = 1u << 4,     // delay_budget
  kUsesDelayBound = 1u << 5,      // bound_delay
  kUsesAttentionRange = 1u << 6,  // attention_range
};

// One packer of the registry: what MakePacker builds for `name`. The factory gets a valid config
// and cost and checks the options it uses (errors name the bad value).
struct PackerInfo {
  const char* name;
  const char* summary;  // one line, for --help
  unsigned options;     // PackerOption bits
  absl::StatusOr<std::unique_ptr<Packer>> (*make)(const PackerConfig& config, DocumentCost cost,
                                                  const PackerOptions& options);

  bool Uses(PackerOption option) const { return (options & option) != 0; }
};

namespace detail {

inline absl::Status CheckWindow(const PackerConfig& config, const PackerOptions& options) {
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
  return absl::OkStatus();
}

// The attention range a refining packer uses: the given one, checked, or the cost's default.
inline absl::StatusOr<AttentionRange> CheckAttentionRange(const DocumentCost& cost,
                                                          const PackerOptions& options) {
  if (!options.attention_range) return DefaultAttentionRange(cost);
  if (absl::Status s = ValidateAttentionRange(*options.attention_range); !s.ok()) return s;
  return *options.attention_range;
}

// The thresholds and refinement rounds of wlb's packers: the rounds a packer runs (`refines`:
// 0 = 4N), or an error.
inline absl::StatusOr<int> CheckWlbOptions(const PackerConfig& config, const PackerOptions& options,
                                           bool refines) {
  if (absl::Status s = ValidateThresholds(options.thresholds, config.context); !s.ok()) return s;
  if (options.refine_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("refine rounds must be >= 0, got %d", options.refine_rounds));
  }
  if (!refines) return 0;
  return options.refine_rounds > 0 ? options.refine_rounds : 4 * config.micro_batches;
}

}  // namespace detail

// Every packer MakePacker builds, in the order wlb-plan --help and packer_names() list them.
// Adding a packer: one entry here (its options and factory); wlb-plan, the Python binding, the
// state fuzzer and the tests that loop over packers pick it up.
inline constexpr PackerInfo kPackers[] = {
    {"original", "the baseline: greedy fill in arrival order, documents split at the cap", 0,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions&) -> absl::StatusOr<std::unique_ptr<Packer>> {
       return std::make_unique<OriginalPacker>(config, std::move(cost));
     }},
    {"original-nextfit", "the baseline with whole documents (next-fit, never split)", 0,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions&) -> absl::StatusOr<std::unique_ptr<Packer>> {
       return std::make_unique<OriginalPacker>(config, std::move(cost),
                                               OriginalPacker::WholeDocuments::kYes);
     }},
    {"fixed-greedy", "balances each window of W steps at a fixed cap (--window)", kUsesWindow,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions& options) -> absl::StatusOr<std::unique_ptr<Packer>> {
       if (absl::Status s = detail::CheckWindow(config, options); !s.ok()) return s;
       return std::make_unique<FixedGreedyPacker>(config, std::move(cost), options.window);
     }},
    {"wlb", "WLB-LLM: variable-length packing with outlier queues (--thresholds / --queues)",
     kUsesThresholds,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions& options) -> absl::StatusOr<std::unique_ptr<Packer>> {
       absl::StatusOr<int> rounds = detail::CheckWlbOptions(config, options, false);
       if (!rounds.ok()) return rounds.status();
       return std::make_unique<WlbPacker>(config, std::move(cost), options.thresholds, *rounds);
     }},
    {"wlb-refine", "wlb, then moves pieces between micro-batches to cut the step's imbalance",
     kUsesThresholds | kUsesRefineRounds | kUsesAttentionRange,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions& options) -> absl::StatusOr<std::unique_ptr<Packer>> {
       absl::StatusOr<int> rounds = detail::CheckWlbOptions(config, options, true);
       if (!rounds.ok()) return rounds.status();
       absl::StatusOr<AttentionRange> range = detail::CheckAttentionRange(cost, options);
       if (!range.ok()) return range.status();
       return std::make_unique<WlbPacker>(config, std::move(cost), options.thresholds, *rounds,
                                          *range);
     }},
    {"wlb-lookahead",
     "wlb-refine that sees K prefetched steps ahead (--lookahead), within a delay budget",
     kUsesThresholds | kUsesRefineRounds | kUsesLookahead | kUsesDelayBudget | kUsesDelayBound |
         kUsesAttentionRange,
     [](const PackerConfig& config, DocumentCost cost,
        const PackerOptions& options) -> absl::StatusOr<std::unique_ptr<Packer>> {
       absl::StatusOr<int> rounds = detail::CheckWlbOptions(config, options, true);
       if (!rounds.ok()) return rounds.status();
       if (options.lookahead < 0 || options.lookahead > kMaxLookahead) {
         return absl::InvalidArgumentError(absl::StrFormat(
             "look-ahead must be in [0, %d] steps, got %d", kMaxLookahead, options.lookahead));
       }
       if (!(options.delay_budget >= 0.0)) {
         return absl::InvalidArgumentError(absl::StrFormat(
             "wlb-lookahead delay budget must be >= 0 steps, got %g", options.delay_budget));
       }
       absl::StatusOr<AttentionRange> range = detail::CheckAttentionRange(cost, options);
       if (!range.ok()) return range.status();
       return std::make_unique<LookaheadPacker>(config, std::move(cost), options.thresholds,
                                                *rounds, options.lookahead, options.delay_budget,
                                                options.bound_delay, *range);
     }},
};

// The registry's names, in its order.
inline constexpr auto kPackerNames = [] {
  std::array<const char*, std::size(kPackers)> names{};
  for (size_t i = 0; i < names.size(); ++i) names[i] = kPackers[i].name;
  return names;
}();

// The registry entry named `name`, or nullptr.
inline const PackerInfo* FindPacker(std::string_view name) {
  for (const PackerInfo& p : kPackers) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

// The error for a packer name the registry does not hold; it lists the registry's names.
inline absl::Status UnknownPacker(std::string_view name) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown packer %s (known: %s)", QuoteForMessage(name), absl::StrJoin(kPackerNames, ", ")));
}

// Validates everything and builds the named packer; errors name the bad value. A cost of the
// dense attention family plans with its per-document form at the cap (CostModel::ForPacking).
inline absl::StatusOr<std::unique_ptr<Packer>> MakePacker(std::string_view name,
                                                          const PackerConfig& config,
                                                          DocumentCost cost,
                                                          const PackerOptions& options) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (const CostModel* p = cost.polynomial(); p != nullptr && p->dense_quadratic != 0.0) {
    if (!(p->dense_quadratic > 0.0) || !std::isfinite(p->dense_quadratic)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cost model dense_quadratic must be >= 0 and finite, got %g", p->dense_quadratic));
    }
    cost = p->ForPacking(config.max_tokens);
  }
  if (absl::Status s = ValidateCost(cost); !s.ok()) return s;
  const PackerInfo* info = FindPacker(name);
  if (info == nullptr) return UnknownPacker(name);
  return info->make(config, std::move(cost), options);
}

}  // namespace wlb
