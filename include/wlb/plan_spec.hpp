// What a plan is made of, as one value: the packer and its options, the PackerConfig sizes, the
// cost model, the outlier queues and the CP settings. wlb-plan builds it from its flags, the
// Python Packer from its keyword arguments and the benchmarks from their settings, so every
// front end checks and resolves a plan the same way.
//
//   absl::StatusOr<wlb::PlanSpec> spec =
//       wlb::ParsePlanSpec({{"packer", "wlb-refine"}, {"cost", "llama2-7b-swa4k"}, {"cp", "8"}});
//   absl::StatusOr<wlb::PlanSettings> plan = spec->Validate();         // every cross-check
//   absl::StatusOr<wlb::DocumentCost> cost = spec->MakeCost();         // reads a profile CSV
//   auto packer = wlb::MakePacker(plan->packer, plan->config, *cost, plan->options);
//
// Keys are spelled like wlb-plan's flags (underscores; '-' is accepted too): packer, context,
// max_tokens (0 = S + S/4), micro_batches, cost (a FLOP preset, a shipped calibration such as
// h100-flash-llama2-7b-tp8, a masked preset, a micro-batch measurement CSV or a profile CSV),
// profile_cost (fit | table), thresholds (comma-separated, or "none"), queues, tune, window,
// refine_rounds, lookahead, delay_budget, bound_delay, attention_range (LOW,HIGH or "exact"), cp,
// sharding, cp_link_gbps, kernel_profile. A key not given keeps wlb-plan's default; a given key the
// plan would not use is an error ("--window is not used by this run: ..."), never silently ignored.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "wlb/cost/attention_mask.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/io/micro_batch_csv.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/io/read_file.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace wlb {

// A PlanSpec checked and resolved (PlanSpec::Validate): what MakePacker and PlanShards take.
struct PlanSettings {
  PackerConfig config;
  std::string packer;
  PackerOptions options;
  int32_t cp_size = -1;  // -1: no shard plans
  ShardStrategy strategy = ShardStrategy::kAdaptive;
  CpPlanOptions cp_options;  // cp_link_gbps, and a masked cost's layer mix
};

struct PlanSpec {
  std::string packer = "wlb";
  int64_t context = 131072;
  int64_t max_tokens = 0;  // 0 = S + S/4
  int32_t micro_batches = 4;
  std::string cost = "llama2-7b";  // a preset, a masked preset, or a measurement / profile CSV
  std::string profile_cost = "fit";
  std::optional<std::vector<int64_t>> thresholds;  // set: these ({} = none); unset: `queues`
  int32_t queues = 2;                              // default thresholds for this many queues
  bool tune = false;  // the caller tunes the thresholds (wlb-plan --tune) within delay_budget
  int32_t window = 1;
  int32_t refine_rounds = 0;
  int32_t lookahead = 1;
  double delay_budget = 1.0;  // wlb-lookahead's bound when given (or with tune); else none
  bool bound_delay = true;    // wlb-lookahead: PackerOptions::bound_delay
  // wlb-refine, wlb-lookahead: PackerOptions::attention_range (unset: the cost's default)
  std::optional<AttentionRange> attention_range = std::nullopt;
  int32_t cp = -1;            // -1: no CP shard plans
  std::string sharding = "adaptive";
  double cp_link_gbps = kDefaultCpLinkGbps;
  std::string kernel_profile;  // empty: the analytic kernel model

  // What else the caller does with this spec (wlb-plan's table compares against wlb with these
  // thresholds; --estimate uses the CP settings): options those use are not "unused".
  bool wlb_comparison = false;
  bool estimate = false;

  // The keys given (ParsePlanSpec, or MarkGiven); only these can be "not used by this run".
  std::set<std::string> given;

  void MarkGiven(std::string key) { given.insert(std::move(key)); }
  bool Given(const std::string& key) const { return given.count(key) > 0; }

  // Every check of the plan's settings against each other and wlb's limits (the cost model is
  // resolved only by MakeCost; a masked preset's layer mix goes into cp_options here).
  absl::StatusOr<PlanSettings> Validate() const;

  // The cost model `cost` and `profile_cost` name (reads a profile CSV).
  absl::StatusOr<DocumentCost> MakeCost() const;

  // The kernel model of `kernel_profile` (reads the CSV), or the analytic default.
  absl::StatusOr<KernelModel> MakeKernelModel() const;
};

// The plan keys that set a packer's options, and the PackerInfo bit of the packers that read them
// (thresholds and queues both choose wlb's outlier queues; wlb-plan's --tune tunes them).
struct PackerOptionKey {
  const char* key;
  PackerOption option;
};
inline constexpr PackerOptionKey kPackerOptionKeys[] = {{"window", kUsesWindow},
                                                        {"thresholds", kUsesThresholds},
                                                        {"queues", kUsesThresholds},
                                                        {"tune", kUsesThresholds},
                                                        {"refine_rounds", kUsesRefineRounds},
                                                        {"lookahead", kUsesLookahead},
                                                        {"delay_budget", kUsesDelayBudget},
                                                        {"bound_delay", kUsesDelayBound},
                                                        {"attention_range", kUsesAttentionRange}};

// "--flag is not used by this run: why": an option the run would not use is an error, never
// silently ignored. `key` is spelled with '_' or '-'.
inline absl::Status UnusedOption(std::string key, std::string_view why) {
  std::replace(key.begin(), key.end(), '_', '-');  // as the README spells flags
  return absl::InvalidArgumentError(absl::StrFormat("--%s is not used by this run: %s", key, why));
}

namespace detail {

inline absl::StatusOr<std::vector<int64_t>> ParseThresholdList(const std::string& text) {
  std::vector<int64_t> values;
  if (text == "none") return values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--thresholds: %s is not an integer token count", QuoteForMessage(part)));
    }
    if (values.size() >= static_cast<size_t>(kMaxOutlierQueues)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--thresholds: more than %d thresholds (one per outlier queue)", kMaxOutlierQueues));
    }
    values.push_back(v);
  }
  return values;
}

template <typename T>
absl::Status ParseNumber(const std::string& key, const std::string& text, T& out) {
  bool ok = false;
  if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(text, &out);
  } else if constexpr (std::is_same_v<T, bool>) {
    ok = absl::SimpleAtob(text, &out);
  } else {
    ok = absl::SimpleAtoi(text, &out);
  }
  if (ok) return absl::OkStatus();
  const char* kind = std::is_same_v<T, double> ? "a number"
                     : std::is_same_v<T, bool> ? "true or false"
                                               : "an integer";
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s: %s is not %s", key, QuoteForMessage(text), kind));
}

// "LOW,HIGH" or "exact" (1,1); the range itself is checked by ValidateAttentionRange.
inline absl::StatusOr<AttentionRange> ParseAttentionRange(const std::string& text) {
  if (text == "exact") return AttentionRange{};
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  AttentionRange r;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &r.low) ||
      !absl::SimpleAtod(parts[1], &r.high)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--attention-range: %s is not LOW,HIGH (two numbers) or exact", QuoteForMessage(text)));
  }
  if (absl::Status s = ValidateAttentionRange(r); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--attention-range: ", s.message()));
  }
  return r;
}

}  // namespace detail

// A PlanSpec from key/value pairs (see the file comment); an unknown key, a key given twice or a
// malformed value is an error naming it. Cross-checks are Validate()'s.
inline absl::StatusOr<PlanSpec> ParsePlanSpec(
    const std::vector<std::pair<std::string, std::string>>& pairs) {
  PlanSpec s;
  for (const auto& [raw_key, value] : pairs) {
    std::string key = raw_key;
    std::replace(key.begin(), key.end(), '-', '_');
    if (s.Given(key)) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s is given more than once", key));
    }
    absl::Status st;
    if (key == "packer") {
      s.packer = value;
    } else if (key == "context") {
      st = detail::ParseNumber(key, value, s.context);
    } else if (key == "max_tokens") {
      st = detail::ParseNumber(key, value, s.max_tokens);
    } else if (key == "micro_batches") {
      st = detail::ParseNumber(key, value, s.micro_batches);
    } else if (key == "cost") {
      s.cost = value;
    } else if (key == "profile_cost") {
      s.profile_cost = value;
    } else if (key == "thresholds") {
      if (!value.empty()) {  // empty: the default queues, as if not given
        absl::StatusOr<std::vector<int64_t>> t = detail::ParseThresholdList(value);
        if (!t.ok()) return t.status();
        s.thresholds = *std::move(t);
      }
    } else if (key == "queues") {
      st = detail::ParseNumber(key, value, s.queues);
    } else if (key == "tune") {
      st = detail::ParseNumber(key, value, s.tune);
    } else if (key == "window") {
      st = detail::ParseNumber(key, value, s.window);
    } else if (key == "refine_rounds") {
      st = detail::ParseNumber(key, value, s.refine_rounds);
    } else if (key == "lookahead") {
      st = detail::ParseNumber(key, value, s.lookahead);
    } else if (key == "bound_delay") {
      st = detail::ParseNumber(key, value, s.bound_delay);
    } else if (key == "attention_range") {
      absl::StatusOr<AttentionRange> r = detail::ParseAttentionRange(value);
      if (!r.ok()) return r.status();
      s.attention_range = *r;
    } else if (key == "delay_budget") {
      st = detail::ParseNumber(key, value, s.delay_budget);
      if (st.ok() && (!(s.delay_budget >= 0.0) || !std::isfinite(s.delay_budget))) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--delay-budget must be a finite number >= 0, got %g", s.delay_budget));
      }
    } else if (key == "cp") {
      st = detail::ParseNumber(key, value, s.cp);
    } else if (key == "sharding") {
      s.sharding = value;
    } else if (key == "cp_link_gbps") {
      st = detail::ParseNumber(key, value, s.cp_link_gbps);
    } else if (key == "kernel_profile") {
      s.kernel_profile = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown plan setting %s", QuoteForMessage(raw_key)));
    }
    if (!st.ok()) return st;
    s.MarkGiven(key);
  }
  return s;
}

inline absl::StatusOr<PlanSettings> PlanSpec::Validate() const {
  PlanSettings s;
  s.packer = packer;
  s.config = {.context = context, .micro_batches = micro_batches};
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max-tokens must be >= 0 (0 = S + S/4), got %d", max_tokens));
  }
  s.config.max_tokens =
      max_tokens > 0 ? max_tokens : (context > 0 ? DefaultMaxTokens(context) : context);
  if (absl::Status st = ValidateConfig(s.config); !st.ok()) return st;

  const bool cost_is_preset = CostModelFromPreset(cost).ok();
  const absl::StatusOr<MaskedModel> masked = FindMaskedModel(cost);
  if (profile_cost != "fit" && profile_cost != "table") {
    return absl::InvalidArgumentError(absl::StrFormat("--profile-cost must be fit or table, got %s",
                                                      QuoteForMessage(profile_cost)));
  }
  if (Given("profile_cost") && (cost_is_preset || masked.ok())) {
    return UnusedOption("profile_cost", absl::StrFormat("it applies to a profile CSV in --cost, "
                                                        "and --cost is the preset %s",
                                                        QuoteForMessage(cost)));
  }

  const PackerInfo* info = FindPacker(packer);
  const auto uses = [&](PackerOption o) { return info != nullptr && info->Uses(o); };
  s.options.window = window;
  s.options.lookahead = lookahead;
  s.options.refine_rounds = refine_rounds;
  if (Given("lookahead") && !uses(kUsesLookahead)) {
    return UnusedOption("lookahead", "it sets wlb-lookahead's K, and --packer is " + packer);
  }
  s.options.bound_delay = bound_delay;
  if (Given("bound_delay") && !uses(kUsesDelayBound)) {
    return UnusedOption("bound_delay",
                        "it bounds wlb-lookahead's token delay, and --packer is " + packer);
  }
  s.options.attention_range = attention_range;
  if (Given("attention_range") && !uses(kUsesAttentionRange)) {
    return UnusedOption("attention_range",
                        "it sets which costs wlb-refine's and wlb-lookahead's refinement must not "
                        "worsen, and --packer is " +
                            packer);
  }
  if (Given("window") && !uses(kUsesWindow)) {
    return UnusedOption("window", "it sets fixed-greedy's window, and --packer is " + packer);
  }
  if (Given("refine_rounds") && !uses(kUsesRefineRounds)) {
    return UnusedOption(
        "refine_rounds",
        "it sets wlb-refine's and wlb-lookahead's rounds, and --packer is " + packer);
  }
  // Thresholds are used by wlb's packers, and by a wlb comparison (wlb-plan's table).
  const bool wlb_family = uses(kUsesThresholds);
  const bool thresholds_used = wlb_family || wlb_comparison;
  if (!thresholds_used) {
    for (const char* key : {"thresholds", "queues"}) {
      if (Given(key)) {
        return UnusedOption(key, "it sets wlb's outlier queues, and neither --packer (" + packer +
                                     ") nor a wlb comparison row (--format table --compare) uses "
                                     "them");
      }
    }
  }
  if (Given("thresholds") && Given("queues")) {
    return absl::InvalidArgumentError(
        "--thresholds and --queues both choose the outlier queues: give one of them");
  }
  if (thresholds && thresholds_used) {
    if (absl::Status st = ValidateThresholds(*thresholds, context); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--thresholds%s: %s", wlb_family ? "" : " (used by the table's wlb comparison row)",
          st.message()));
    }
    s.options.thresholds = *thresholds;
  } else if (thresholds_used) {
    if (queues < 0 || queues > kMaxOutlierQueues) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--queues must be in [0, %d], got %d", kMaxOutlierQueues, queues));
    }
    s.options.thresholds = DefaultThresholds(context, queues);
    if (!ValidateThresholds(s.options.thresholds, context).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--context %d is too small for %d default outlier queues (their thresholds would be "
          "%s, not strictly increasing): give fewer --queues, --thresholds or a larger --context",
          context, queues, absl::StrJoin(s.options.thresholds, ",")));
    }
  }
  // wlb-lookahead spends at most the budget (and the tuner tunes it so).
  if (uses(kUsesDelayBudget) && (Given("delay_budget") || tune)) {
    s.options.delay_budget = delay_budget;
  }
  // The packer and its options.
  if (auto p = MakePacker(packer, s.config, CostModel{}, s.options); !p.ok()) return p.status();
  if (!wlb_family) {
    for (const char* key : {"tune", "delay_budget"}) {
      if (Given(key)) {
        return UnusedOption(key, "--tune applies to wlb, wlb-refine and wlb-lookahead only");
      }
    }
  } else if (Given("delay_budget") && !tune && !uses(kUsesDelayBudget)) {
    return UnusedOption("delay_budget", "it bounds --tune and wlb-lookahead, and neither is used");
  }

  s.cp_size = cp;
  if (cp == -1 && !Given("cp")) {
    for (const char* key : {"sharding", "kernel_profile"}) {
      if (Given(key) && !estimate) {
        return UnusedOption(
            key, "it applies to CP shard plans (--cp) and --estimate, and neither is given");
      }
    }
  } else if (cp < 1 || cp > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cp must be a context-parallel size in [1, %d] (omit it for no shard plans), got %d",
        kMaxCpSize, cp));
  }
  absl::StatusOr<ShardStrategy> strategy = ParseShardStrategy(sharding);
  if (!strategy.ok()) return strategy.status();
  s.strategy = *strategy;
  s.cp_options.comm.link_gbps = cp_link_gbps;
  if (masked.ok()) s.cp_options.mix = masked->mix;  // doc-degree plans for its masks
  if (Given("cp_link_gbps")) {
    if (!FindShardStrategy(s.strategy)->uses.cp_link || s.cp_size < 1) {
      return UnusedOption("cp_link_gbps",
                          "it applies to --cp with --sharding " +
                              ShardStrategyNameList(" or ", [](const ShardStrategyInfo& i) {
                                return i.uses.cp_link;
                              }));
    }
    if (absl::Status st = ValidateCommModel(s.cp_options.comm); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("--cp-link-gbps: %s", st.message()));
    }
  }
  return s;
}

inline absl::StatusOr<DocumentCost> PlanSpec::MakeCost() const {
  // A masked model preset (llama2-7b-swa4k, ...): the mask-aware FLOP cost of its layer mix.
  if (absl::StatusOr<MaskedModel> masked = FindMaskedModel(cost); masked.ok()) {
    return masked->MakeCost();
  }
  absl::StatusOr<ProfileFit> fit = ResolveCostModel(cost);
  if (!fit.ok()) return fit.status();
  if (profile_cost != "table") return DocumentCost(fit->model);
  if (fit->model.unit != "ms") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--profile-cost table needs a profile CSV in --cost, got %s", QuoteForMessage(cost)));
  }
  absl::StatusOr<std::string> text = ReadInputFile(cost, "profile");
  if (!text.ok()) return text.status();
  if (IsMicroBatchCsv(*text)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--profile-cost table interpolates single-document latencies, and --cost %s holds "
        "micro-batch measurements (a 'lengths' column): leave --profile-cost at fit",
        QuoteForMessage(cost)));
  }
  absl::StatusOr<std::vector<ProfilePoint>> points = ParseProfileCsv(*text, absl::CHexEscape(cost));
  if (!points.ok()) return points.status();
  absl::StatusOr<TabulatedCost> table = TabulatedCost::Create(*points);
  if (!table.ok()) return table.status();
  return DocumentCost::From(*std::move(table), "ms",
                            absl::StrFormat("tile-aware table of %d measured lengths from %s "
                                            "(128-token tiles, log-log interpolation)",
                                            points->size(), absl::CHexEscape(cost)));
}

inline absl::StatusOr<KernelModel> PlanSpec::MakeKernelModel() const {
  if (kernel_profile.empty()) return KernelModel::Default();
  return ReadKernelProfileCsv(kernel_profile);
}

}  // namespace wlb
