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
// Keys are the rows of kPlanSettings (plan_settings.hpp: each key's type, default, help and the
// packers that read it), spelled like wlb-plan's flags (underscores; '-' is accepted too). A key
// not given keeps wlb-plan's default; a given key the plan would not use is an error ("--window is
// not used by this run: ..."), never silently ignored.
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
#include "wlb/plan_settings.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace wlb {

// A PlanSpec from key/value pairs (see the file comment); an unknown key, a key given twice or a
// malformed value is an error naming it. Cross-checks are Validate()'s.
// The keys are kPlanSettings' rows; each row's parser reads its value.
inline absl::StatusOr<PlanSpec> ParsePlanSpec(
    const std::vector<std::pair<std::string, std::string>>& pairs) {
  PlanSpec s;
  for (const auto& [raw_key, value] : pairs) {
    const PlanSetting* row = FindPlanSetting(raw_key);
    if (row == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown plan setting %s (known: %s)",
                                                        QuoteForMessage(raw_key),
                                                        absl::StrJoin(PlanSettingKeys(), ", ")));
    }
    if (s.Given(row->key)) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s is given more than once", row->key));
    }
    if (absl::Status st = row->parse(row->key, value, s); !st.ok()) return st;
    s.MarkGiven(row->key);
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
  if (info == nullptr) return UnknownPacker(packer);
  const auto uses = [&](PackerOption o) { return info->Uses(o); };
  if (absl::Status st = CheckPackerOptionsUsed(*this, *info); !st.ok()) return st;
  s.options.window = window;
  s.options.lookahead = lookahead;
  s.options.refine_rounds = refine_rounds;
  s.options.bound_delay = bound_delay;
  s.options.attention_range = attention_range;
  // Thresholds are used by wlb's packers, and by a wlb comparison (wlb-plan's table).
  const bool wlb_family = uses(kUsesThresholds);
  const bool thresholds_used = wlb_family || wlb_comparison;
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
  s.cp_options.comm.gather_gbps = cp_gather_gbps;
  s.cp_options.memory_cap_percent = cp_memory_cap_percent;
  if (masked.ok()) s.cp_options.mix = masked->mix;  // adaptive and doc-degree plan for its masks
  // A given CpPlanOptions setting must be read by the strategy (its uses bit) and valid.
  struct CpSetting {
    const char* key;
    bool ShardStrategyUses::*used;
    // Copies the setting from `from` into `to` (options at their defaults otherwise).
    void (*copy)(const CpPlanOptions& from, CpPlanOptions& to);
  };
  constexpr CpSetting kCpSettings[] = {{"cp_link_gbps", &ShardStrategyUses::cp_link,
                                        [](const CpPlanOptions& from, CpPlanOptions& to) {
                                          to.comm.link_gbps = from.comm.link_gbps;
                                        }},
                                       {"cp_gather_gbps", &ShardStrategyUses::key_copy,
                                        [](const CpPlanOptions& from, CpPlanOptions& to) {
                                          to.comm.gather_gbps = from.comm.gather_gbps;
                                        }},
                                       {"cp_memory_cap_percent", &ShardStrategyUses::memory_cap,
                                        [](const CpPlanOptions& from, CpPlanOptions& to) {
                                          to.memory_cap_percent = from.memory_cap_percent;
                                        }}};
  for (const CpSetting& c : kCpSettings) {
    if (!Given(c.key)) continue;
    const auto reads = [&c](const ShardStrategyInfo& i) { return i.uses.*c.used; };
    if (!reads(ShardStrategyRow(s.strategy)) || s.cp_size < 1) {
      return UnusedOption(
          c.key, "it applies to --cp with --sharding " + ShardStrategyNameList(" or ", reads));
    }
    CpPlanOptions only;  // the defaults but for this setting: the error is about its value
    c.copy(s.cp_options, only);
    if (absl::Status st = ValidateCpPlanOptions(only); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s", FlagSpelling(c.key), st.message()));
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
