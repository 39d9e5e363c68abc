// The plan settings as one table: every key of a plan (wlb::PlanSpec), its type, default, help
// group and text, the packers (or other parts of a run) that read it, the front ends that offer
// it and its parser. wlb-plan's flags and --help, ParsePlanSpec, the "not used by this run" check,
// the table benches' shared flags and the Python keyword arguments of wlb.Packer all iterate
// kPlanSettings; lists of packer and CP strategy names come from their registries (kPackers in
// pack/make_packer.hpp, kShardStrategyTable in shard/strategy_table.hpp).
//
//   const wlb::PlanSetting* row = wlb::FindPlanSetting("refine_rounds");
//   wlb::PlanSpec spec;
//   absl::Status s = row->parse(row->key, "8", spec);   // spec.refine_rounds = 8
//   std::string shown = row->show(spec);                 // "8"
//   std::string readers = wlb::PlanSettingReaders(*row); // "wlb-refine, wlb-lookahead"
//
// A new setting is one field of PlanSpec (and of PackerOptions when a packer reads it) plus one
// row below (docs/guides/extending.md).
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "wlb/cost/document_cost.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace wlb {

// A PlanSpec checked and resolved (PlanSpec::Validate): what MakePacker and PlanShards take.
struct PlanSettings {
  PackerConfig config;
  std::string packer;
  PackerOptions options;
  int32_t cp_size = -1;  // -1: no shard plans
  ShardStrategy strategy = ShardStrategy("adaptive");
  CpPlanOptions cp_options;  // cp_link_gbps, cp_gather_gbps, the memory cap, a masked layer mix
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
  int32_t cp = -1;  // -1: no CP shard plans
  std::string sharding = "adaptive";
  double cp_link_gbps = kDefaultCpLinkGbps;
  double cp_gather_gbps = 0.0;  // CommModel::gather_gbps (0: the key rows' copy is not priced)
  int64_t cp_memory_cap_percent = kDefaultCpMemoryCapPercent;  // CpPlanOptions::memory_cap_percent
  std::string kernel_profile;  // empty: KernelModel::Default() (the measured H100 flash table)

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

  // The kernel model of `kernel_profile` (reads the CSV), or KernelModel::Default().
  absl::StatusOr<KernelModel> MakeKernelModel() const;
};

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

// How a setting's value is spelled (PlanSetting::type).
enum class SettingType {
  kString,   // as given
  kInt,      // an integer
  kNumber,   // a real number
  kBool,     // true or false
  kIntList,  // comma-separated integers, or "none" for the empty list
  kRange,    // LOW,HIGH or "exact"
};

inline constexpr const char* SettingTypeName(SettingType type) {
  switch (type) {
    case SettingType::kString:
      return "string";
    case SettingType::kInt:
      return "int";
    case SettingType::kNumber:
      return "number";
    case SettingType::kBool:
      return "bool";
    case SettingType::kIntList:
      return "int list";
    case SettingType::kRange:
      return "range";
  }
  return "?";
}

// The front ends that offer a setting (bits of PlanSetting::fronts).
enum SettingFront : unsigned {
  kWlbPlanFlag = 1u << 0,    // a wlb-plan flag (--key)
  kPythonKeyword = 1u << 1,  // a keyword argument of wlb.Packer
  kBenchFlag = 1u << 2,      // a shared flag of the table benches (bench/bench_plan_flags.hpp)
};

// One plan setting: one row of kPlanSettings.
struct PlanSetting {
  const char* key;  // PlanSpec key, spelled with '_' (flags accept '-' too)
  SettingType type;
  const char* group;  // wlb-plan --help group
  // Help text; "{packers}" and "{strategies}" stand for the registries' names. A packer option's
  // help is shown after the names of the packers that read it.
  const char* help;
  unsigned readers;  // PackerOption bits of the packers that read it; 0: not a packer option
  // A packer option that something other than a packer can read in a run: who, for the "not used
  // by this run" message, and whether it does in `spec` with `packer` (nullptr: nothing else).
  const char* also_read_by;
  bool (*also_used)(const PlanSpec& spec, const PackerInfo& packer);
  unsigned fronts;      // SettingFront bits
  const char* example;  // a valid value other than the default (the table's tests parse it)
  // Sets the setting in `spec` from its text (an error names `key` and the bad text).
  absl::Status (*parse)(std::string_view key, const std::string& text, PlanSpec& spec);
  // The setting's value in `spec` as text `parse` reads back ("" for an unset optional).
  std::string (*show)(const PlanSpec& spec);

  bool Reads(const PackerInfo& packer) const { return (packer.options & readers) != 0; }
};

namespace detail {

// Parsers and printers of PlanSpec members, by type.
template <auto Member>
absl::Status ParseMember(std::string_view key, const std::string& text, PlanSpec& spec) {
  auto& field = spec.*Member;
  using T = std::remove_reference_t<decltype(field)>;
  if constexpr (std::is_same_v<T, std::string>) {
    field = text;
    return absl::OkStatus();
  } else {
    return ParseNumber(std::string(key), text, field);
  }
}

template <auto Member>
std::string ShowMember(const PlanSpec& spec) {
  const auto& field = spec.*Member;
  using T = std::remove_cvref_t<decltype(field)>;
  if constexpr (std::is_same_v<T, bool>) {
    return field ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    std::string text = absl::StrFormat("%g", field);  // reads back the same number, or 17 digits
    double read = 0.0;
    if (absl::SimpleAtod(text, &read) && read == field) return text;
    return absl::StrFormat("%.17g", field);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return field;
  } else {
    return absl::StrCat(field);
  }
}

inline absl::Status ParseThresholds(std::string_view, const std::string& text, PlanSpec& spec) {
  if (text.empty()) return absl::OkStatus();  // empty: the default queues, as if not given
  absl::StatusOr<std::vector<int64_t>> t = ParseThresholdList(text);
  if (!t.ok()) return t.status();
  spec.thresholds = *std::move(t);
  return absl::OkStatus();
}

inline std::string ShowThresholds(const PlanSpec& spec) {
  if (!spec.thresholds) return "";
  return spec.thresholds->empty() ? "none" : absl::StrJoin(*spec.thresholds, ",");
}

inline absl::Status ParseDelayBudget(std::string_view key, const std::string& text,
                                     PlanSpec& spec) {
  if (absl::Status st = ParseNumber(std::string(key), text, spec.delay_budget); !st.ok()) return st;
  if (!(spec.delay_budget >= 0.0) || !std::isfinite(spec.delay_budget)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--delay-budget must be a finite number >= 0, got %g", spec.delay_budget));
  }
  return absl::OkStatus();
}

inline absl::Status ParseRange(std::string_view, const std::string& text, PlanSpec& spec) {
  absl::StatusOr<AttentionRange> r = ParseAttentionRange(text);
  if (!r.ok()) return r.status();
  spec.attention_range = *r;
  return absl::OkStatus();
}

inline std::string ShowRange(const PlanSpec& spec) {
  if (!spec.attention_range) return "";
  return absl::StrFormat("%g,%g", spec.attention_range->low, spec.attention_range->high);
}

}  // namespace detail

// Every plan setting, in wlb-plan --help's order within each group. Adding one: a PlanSpec field
// (and its PackerOptions field and PackerOption bit when a packer reads it), then a row here.
inline constexpr PlanSetting kPlanSettings[] = {
    {"packer", SettingType::kString, "Packing", "{packers} (listed below)", 0, nullptr, nullptr,
     kWlbPlanFlag | kBenchFlag, "wlb-refine", detail::ParseMember<&PlanSpec::packer>,
     detail::ShowMember<&PlanSpec::packer>},
    {"context", SettingType::kInt, "Packing", "context window S in tokens (longest piece)", 0,
     nullptr, nullptr, kWlbPlanFlag | kPythonKeyword | kBenchFlag, "65536",
     detail::ParseMember<&PlanSpec::context>, detail::ShowMember<&PlanSpec::context>},
    {"max_tokens", SettingType::kInt, "Packing",
     "variable-length cap S_max per micro-batch; 0 = S + S/4", 0, nullptr, nullptr,
     kWlbPlanFlag | kPythonKeyword | kBenchFlag, "200000",
     detail::ParseMember<&PlanSpec::max_tokens>, detail::ShowMember<&PlanSpec::max_tokens>},
    {"micro_batches", SettingType::kInt, "Packing", "micro-batches per step N (= PP x DP)", 0,
     nullptr, nullptr, kWlbPlanFlag | kPythonKeyword | kBenchFlag, "8",
     detail::ParseMember<&PlanSpec::micro_batches>, detail::ShowMember<&PlanSpec::micro_batches>},
    {"thresholds", SettingType::kIntList, "Packing",
     "comma-separated outlier thresholds L_1<L_2<... in tokens, or 'none'", kUsesThresholds,
     "wlb-plan's table comparison row (--format table --compare)",
     [](const PlanSpec& spec, const PackerInfo&) { return spec.wlb_comparison; },
     kWlbPlanFlag | kPythonKeyword, "1000,2000", detail::ParseThresholds, detail::ShowThresholds},
    {"queues", SettingType::kInt, "Packing",
     "number of outlier queues with default thresholds (instead of --thresholds)", kUsesThresholds,
     "wlb-plan's table comparison row (--format table --compare)",
     [](const PlanSpec& spec, const PackerInfo&) { return spec.wlb_comparison; },
     kWlbPlanFlag | kPythonKeyword | kBenchFlag, "3", detail::ParseMember<&PlanSpec::queues>,
     detail::ShowMember<&PlanSpec::queues>},
    {"tune", SettingType::kBool, "Packing",
     "pick thresholds with the tuner on the planned stream itself, within --delay-budget",
     kUsesThresholds, nullptr, nullptr, kWlbPlanFlag, "true", detail::ParseMember<&PlanSpec::tune>,
     detail::ShowMember<&PlanSpec::tune>},
    {"delay_budget", SettingType::kNumber, "Packing",
     "max mean token delay in steps (wlb-lookahead: default none beyond wlb's delay, 1 with "
     "--tune)",
     kUsesDelayBudget, "--tune",
     [](const PlanSpec& spec, const PackerInfo& packer) {
       return spec.tune && packer.Uses(kUsesThresholds);
     },
     kWlbPlanFlag | kPythonKeyword, "0.5", detail::ParseDelayBudget,
     detail::ShowMember<&PlanSpec::delay_budget>},
    {"window", SettingType::kInt, "Packing", "steps packed together", kUsesWindow, nullptr, nullptr,
     kWlbPlanFlag | kPythonKeyword, "3", detail::ParseMember<&PlanSpec::window>,
     detail::ShowMember<&PlanSpec::window>},
    {"refine_rounds", SettingType::kInt, "Packing", "max refinement changes per step; 0 = 4N",
     kUsesRefineRounds, nullptr, nullptr, kWlbPlanFlag | kPythonKeyword, "8",
     detail::ParseMember<&PlanSpec::refine_rounds>, detail::ShowMember<&PlanSpec::refine_rounds>},
    {"lookahead", SettingType::kInt, "Packing",
     "K in [0, 8], steps of prefetched arrivals it sees ahead", kUsesLookahead, nullptr, nullptr,
     kWlbPlanFlag | kPythonKeyword | kBenchFlag, "2", detail::ParseMember<&PlanSpec::lookahead>,
     detail::ShowMember<&PlanSpec::lookahead>},
    {"bound_delay", SettingType::kBool, "Packing",
     "plan each step within wlb-refine's token delay on the same stream (--bound_delay=false: "
     "the delay price alone steers, which can end above it)",
     kUsesDelayBound, nullptr, nullptr, kWlbPlanFlag | kPythonKeyword, "false",
     detail::ParseMember<&PlanSpec::bound_delay>, detail::ShowMember<&PlanSpec::bound_delay>},
    {"attention_range", SettingType::kRange, "Packing",
     "LOW,HIGH (0 <= LOW <= 1 <= HIGH) or 'exact': a refinement change must not make a step "
     "worse under the cost with attention weighed LOW..HIGH x the planning cost's; empty = "
     "[1, 2.5] for a FLOP preset, exact for a measured cost",
     kUsesAttentionRange, nullptr, nullptr, kWlbPlanFlag | kPythonKeyword | kBenchFlag, "0.5,3",
     detail::ParseRange, detail::ShowRange},
    {"cost", SettingType::kString, "Cost model",
     "cost model: a FLOP preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m), a shipped "
     "calibration (fwd+bwd ms measured on a GPU: h100-flash-llama2-7b-tp8, "
     "h100-cudnn-wlb-550m-tp2; --list costs), a masked preset (llama2-7b-swa4k, "
     "llama2-7b-chunk8k, llama2-7b-causal: FLOPs under a layer mix of attention masks; "
     "doc-degree CP plans for its masks too), a micro-batch measurement CSV (header with a "
     "'lengths' column: docs/guides/calibration.md) or a profile CSV of length -> latency to fit",
     0, nullptr, nullptr, kWlbPlanFlag | kPythonKeyword | kBenchFlag, "llama2-13b",
     detail::ParseMember<&PlanSpec::cost>, detail::ShowMember<&PlanSpec::cost>},
    {"profile_cost", SettingType::kString, "Cost model",
     "with a profile CSV in --cost: 'fit' (least-squares quadratic) or 'table' (tile-aware "
     "interpolation of the measured points)",
     0, nullptr, nullptr, kWlbPlanFlag | kPythonKeyword, "table",
     detail::ParseMember<&PlanSpec::profile_cost>, detail::ShowMember<&PlanSpec::profile_cost>},
    {"cp", SettingType::kInt, "CP shard plans",
     "context-parallel size C in [1, 4096]: add CP shard plans to every micro-batch (omit for "
     "none)",
     0, nullptr, nullptr, kWlbPlanFlag, "8", detail::ParseMember<&PlanSpec::cp>,
     detail::ShowMember<&PlanSpec::cp>},
    {"sharding", SettingType::kString, "CP shard plans", "with --cp or --estimate: {strategies}", 0,
     nullptr, nullptr, kWlbPlanFlag, "per-doc", detail::ParseMember<&PlanSpec::sharding>,
     detail::ShowMember<&PlanSpec::sharding>},
    {"cp_link_gbps", SettingType::kNumber, "CP shard plans",
     "K/V link bandwidth per rank and direction in GB/s, for --sharding {cp_link_strategies} "
     "(default 450: NVLink 4, 900 GB/s both ways); in (0, 1e6]",
     0, nullptr, nullptr, kWlbPlanFlag | kBenchFlag, "100",
     detail::ParseMember<&PlanSpec::cp_link_gbps>, detail::ShowMember<&PlanSpec::cp_link_gbps>},
    {"cp_gather_gbps", SettingType::kNumber, "CP shard plans",
     "GB/s at which a CP rank copies its segments' key rows into one varlen call's contiguous "
     "layout (read and written once; flash-style varlen executors such as wlb.torch.cp_attention "
     "do), for --sharding {key_copy_strategies}; 0 (default): the copy is not priced, as for a "
     "kernel that reads keys in place; in [0, 1e6]",
     0, nullptr, nullptr, kWlbPlanFlag, "3350", detail::ParseMember<&PlanSpec::cp_gather_gbps>,
     detail::ShowMember<&PlanSpec::cp_gather_gbps>},
    {"cp_memory_cap_percent", SettingType::kInt, "CP shard plans",
     "the most tokens one CP rank may hold, in percent of T / C, for --sharding "
     "{memory_cap_strategies} (default 101: 1.01 x T / C; a larger cap lets adaptive trade memory "
     "for time, e.g. on a slow link); in [100, 409700]",
     0, nullptr, nullptr, kWlbPlanFlag | kBenchFlag, "125",
     detail::ParseMember<&PlanSpec::cp_memory_cap_percent>,
     detail::ShowMember<&PlanSpec::cp_memory_cap_percent>},
    {"kernel_profile", SettingType::kString, "CP shard plans",
     "with --cp or --estimate: kernel profile CSV (q_len,kv_len,ms) for the kernel model; empty "
     "= the default (CP plans: the measured H100 flash table; --estimate: the analytic curve for "
     "the model's heads)",
     0, nullptr, nullptr, kWlbPlanFlag, "kernels.csv",
     detail::ParseMember<&PlanSpec::kernel_profile>, detail::ShowMember<&PlanSpec::kernel_profile>},
};

static_assert(kMaxCpMemoryCapPercent == 409700,
              "kPlanSettings: cp_memory_cap_percent's help names the range");

// The row of `key` (spelled with '_' or '-'), or nullptr.
inline const PlanSetting* FindPlanSetting(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '-', '_');
  for (const PlanSetting& row : kPlanSettings) {
    if (k == row.key) return &row;
  }
  return nullptr;
}

// The keys of the rows a front end offers (`front`: SettingFront bits; 0: every row).
inline std::vector<std::string> PlanSettingKeys(unsigned front = 0) {
  std::vector<std::string> keys;
  for (const PlanSetting& row : kPlanSettings) {
    if (front == 0 || (row.fronts & front) != 0) keys.push_back(row.key);
  }
  return keys;
}

// The names of the packers that read a packer option (`readers`: PackerOption bits), in the
// registry's order: "wlb-refine, wlb-lookahead".
inline std::string PackerNamesReading(unsigned readers, const char* separator = ", ") {
  std::vector<const char*> names;
  for (const PackerInfo& p : kPackers) {
    if ((p.options & readers) != 0) names.push_back(p.name);
  }
  return absl::StrJoin(names, separator);
}

inline std::string PlanSettingReaders(const PlanSetting& row) {
  return PackerNamesReading(row.readers);
}

// The row's help text with the registries' names in place of "{packers}", "{strategies}",
// "{cp_link_strategies}", "{key_copy_strategies}" and "{memory_cap_strategies}", after the names
// of the packers that read a packer option.
inline std::string PlanSettingHelp(const PlanSetting& row) {
  std::string help = absl::StrReplaceAll(
      row.help,
      {{"{packers}", absl::StrJoin(kPackerNames, ", ")},
       {"{strategies}", ShardStrategyNameList(" or ")},
       {"{cp_link_strategies}",
        ShardStrategyNameList(" or ", [](const ShardStrategyInfo& i) { return i.uses.cp_link; })},
       {"{key_copy_strategies}",
        ShardStrategyNameList(" or ", [](const ShardStrategyInfo& i) { return i.uses.key_copy; })},
       {"{memory_cap_strategies}", ShardStrategyNameList(" or ", [](const ShardStrategyInfo& i) {
          return i.uses.memory_cap;
        })}});
  if (row.readers == 0) return help;
  std::string readers = PackerNamesReading(row.readers, "/");
  if (row.also_read_by != nullptr && std::string_view(row.also_read_by) == "--tune") {
    readers = absl::StrCat("--tune, ", readers);
  }
  return absl::StrCat(readers, ": ", help);
}

// A setting's key as a flag, the way the README spells flags: "cp_link_gbps" -> "--cp-link-gbps".
inline std::string FlagSpelling(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

// "--flag is not used by this run: why": a setting the run would not use is an error, never
// silently ignored. `key` is spelled with '_' or '-'. Every front end's check words it so.
inline absl::Status UnusedOption(std::string key, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is not used by this run: %s", FlagSpelling(std::move(key)), why));
}

// The one "not used by this run" check of packer options: the first given packer option of
// `spec` that `packer` does not read (nor anything else of the run, PlanSetting::also_used) is an
// error naming the option, the packers that read it and `packer`.
inline absl::Status CheckPackerOptionsUsed(const PlanSpec& spec, const PackerInfo& packer) {
  for (const PlanSetting& row : kPlanSettings) {
    if (row.readers == 0 || !spec.Given(row.key) || row.Reads(packer)) continue;
    if (row.also_used != nullptr && row.also_used(spec, packer)) continue;
    const std::string readers = PlanSettingReaders(row);
    const bool one = readers.find(',') == std::string::npos && row.also_read_by == nullptr;
    return UnusedOption(
        row.key,
        absl::StrFormat("only %s%s read%s it, and the packer is %s", readers,
                        row.also_read_by != nullptr ? absl::StrCat(" and ", row.also_read_by) : "",
                        one ? "s" : "", QuoteForMessage(packer.name)));
  }
  return absl::OkStatus();
}

}  // namespace wlb
