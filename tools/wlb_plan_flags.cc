// wlb-plan's flags: their declarations, ParseArgs, SettingsFromFlags (the plan's flags become a
// wlb::PlanSpec, checked by its Validate(); the rest are the program's own) and --help.
#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/plan_spec.hpp"
#include "wlb/wlb.hpp"
#include "wlb_plan.h"

// The plan's flags are not Abseil flags: they are the rows of wlb::kPlanSettings
// (plan_settings.hpp), read by ParseArgs and ParsePlanSpec; a key not given keeps PlanSpec's
// default.
ABSL_FLAG(std::string, docs, "",
          "lengths file (one integer per line, or a JSON array); '-' reads stdin; empty samples "
          "the embedded distribution named by --distribution");
ABSL_FLAG(std::string, distribution, "default",
          "when --docs is empty: default (the embedded WLB-LLM-like histogram), heavy-tail, or a "
          "generated shape: rare-long, bimodal, pile-like, prolong-like");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the default distribution");
ABSL_FLAG(int64_t, steps, 0,
          "steps to plan: default distribution samples this many (0 = 100); a file is cut after "
          "this many (0 = all)");
ABSL_FLAG(std::string, estimate, "",
          "TP,CP,PP,DP: estimate step time with the 1F1B step-time model (wlb/sim) for this "
          "job, against Plain-4D (original packing, per-seq CP) on the same stream; needs a "
          "preset --cost and --micro-batches = PP x DP; CP shards with --sharding");
ABSL_FLAG(double, gemm_tflops, 500.0,
          "--estimate: achieved GEMM TFLOP/s per GPU for the linear part (> 0)");
ABSL_FLAG(bool, dp_assign, false,
          "with --estimate: also place each step's micro-batches on the DP ranks by the 1F1B "
          "model (wlb/sim/dp_assign.hpp) and report the step time against round-robin");
ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(std::string, out, "", "write the output to this file instead of stdout");
ABSL_FLAG(bool, timing, true, "json: include planning times in the summary (they vary run to run)");
ABSL_FLAG(bool, compare, true, "table: also run original and wlb packing on the same stream");
ABSL_FLAG(std::string, list, "",
          "packers, sharding or costs: print the registry's packer, CP strategy or cost preset "
          "names, one per line, and plan nothing (takes no other flag)");
ABSL_FLAG(std::string, fit_cost, "",
          "a micro-batch measurement CSV: print the micro-batch cost fitted to it (a*sum d^2 + "
          "b*sum d + c*documents + per call), its in-sample and held-out errors beside the FLOP "
          "preset --cost's at its best time scale, and plan nothing (takes only --cost)");

namespace wlb::cli {
namespace {

// wlb-plan's own flags by group, as --help lists them (Abseil registers others, e.g. --flagfile,
// that wlb-plan does not offer).
struct FlagGroup {
  const char* title;
  std::vector<const char*> flags;
};
const std::vector<FlagGroup>& FlagGroups() {
  static const std::vector<FlagGroup> groups = {
      {"Input", {"docs", "distribution", "seed", "steps"}},
      {"Packing", {}},
      {"Cost model", {}},
      {"CP shard plans", {}},
      {"Step-time estimate", {"estimate", "gemm_tflops", "dp_assign"}},
      {"Output", {"format", "out", "timing", "compare", "list"}},
      {"Calibration", {"fit_cost"}},
  };
  return groups;
}

// A plan setting wlb-plan offers as a flag, or nullptr.
const PlanSetting* PlanFlag(const std::string& name) {
  const PlanSetting* row = FindPlanSetting(name);
  return row != nullptr && (row->fronts & kWlbPlanFlag) != 0 ? row : nullptr;
}

bool IsOurFlag(const std::string& name) {
  for (const FlagGroup& g : FlagGroups()) {
    for (const char* f : g.flags) {
      if (name == f) return true;
    }
  }
  return false;
}

// The plan flags given on the command line, as ParsePlanSpec reads them (set by ParseArgs).
std::vector<std::pair<std::string, std::string>>& PlanFlags() {
  static std::vector<std::pair<std::string, std::string>> given;
  return given;
}

// The flags given on the command line (set by ParseArgs).
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}
bool Given(const char* name) { return GivenFlags().count(name) > 0; }

}  // namespace

absl::Status ParseArgs(const std::vector<std::string>& args) {
  GivenFlags().clear();
  PlanFlags().clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unexpected argument %s (wlb-plan takes only flags; input goes in --docs)",
          QuoteForMessage(arg)));
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    std::string name = arg.substr(dashes, eq == std::string::npos ? eq : eq - dashes);
    std::replace(name.begin(), name.end(), '-', '_');
    std::optional<std::string> value;
    if (eq != std::string::npos) value = arg.substr(eq + 1);
    const PlanSetting* setting = PlanFlag(name);
    absl::CommandLineFlag* flag = IsOurFlag(name) ? absl::FindCommandLineFlag(name) : nullptr;
    if (setting == nullptr && flag == nullptr && name.size() > 2 && name.compare(0, 2, "no") == 0 &&
        !value) {  // --noflag: a bool flag set to false
      const std::string negated = name.substr(2);
      const PlanSetting* row = PlanFlag(negated);
      absl::CommandLineFlag* f = IsOurFlag(negated) ? absl::FindCommandLineFlag(negated) : nullptr;
      if ((row != nullptr && row->type == SettingType::kBool) ||
          (f != nullptr && f->IsOfType<bool>())) {
        name = negated;
        value = "false";
        setting = row;
        flag = f;
      }
    }
    if (setting == nullptr && flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown flag %s (--help prints the flags; docs/guides/cli.md)",
                          QuoteForMessage(arg.substr(0, eq))));
    }
    if (!GivenFlags().insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s is given more than once", name));
    }
    const bool is_bool =
        setting != nullptr ? setting->type == SettingType::kBool : flag->IsOfType<bool>();
    if (!value) {
      if (is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
    }
    if (setting != nullptr) {  // read by ParsePlanSpec, which names a bad value
      PlanFlags().emplace_back(name, *value);
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      const char* kind = flag->IsOfType<bool>()       ? "true or false"
                         : flag->IsOfType<double>()   ? "a number"
                         : flag->IsOfType<uint64_t>() ? "an integer in [0, 2^64)"
                         : flag->IsOfType<int64_t>()  ? "an integer in [-2^63, 2^63)"
                                                      : "an integer in [-2^31, 2^31)";
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: %s is not %s", name, QuoteForMessage(*value), kind));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Settings> SettingsFromFlags() {
  Settings s;
  if (Given("list")) {
    s.list = absl::GetFlag(FLAGS_list);
    if (s.list != "packers" && s.list != "sharding" && s.list != "costs") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--list must be packers, sharding or costs, got %s", QuoteForMessage(s.list)));
    }
    if (GivenFlags().size() > 1) {
      return absl::InvalidArgumentError(
          "--list prints the registry's names and takes no other flag");
    }
  }  // the rest: wlb-plan's defaults, checked as always
  // The plan: the given plan flags, as ParsePlanSpec reads them (a flag not given keeps its
  // default, which is PlanSpec's).
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec(PlanFlags());
  if (!spec.ok()) return spec.status();
  s.spec = *std::move(spec);
  if (Given("fit_cost")) {
    s.fit_cost = absl::GetFlag(FLAGS_fit_cost);
    for (const std::string& name : GivenFlags()) {
      if (name != "fit_cost" && name != "cost") {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--fit-cost prints a fit and plans nothing: it takes only --cost (the FLOP preset to "
            "compare with), not --%s",
            name));
      }
    }
    if (s.fit_cost.empty()) {
      return absl::InvalidArgumentError("--fit-cost needs a measurement CSV path");
    }
    if (!FindTransformerShape(s.spec.cost).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--fit-cost compares with a FLOP preset: --cost must be one of %s, got %s",
          absl::StrJoin(TransformerPresetNames(), ", "), QuoteForMessage(s.spec.cost)));
    }
  }
  s.format = absl::GetFlag(FLAGS_format);
  if (s.format != "table" && s.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--format must be table or json, got %s", QuoteForMessage(s.format)));
  }
  s.steps = absl::GetFlag(FLAGS_steps);
  if (s.steps < 0 || s.steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps must be in [0, %d] (0 = all), got %d", kMaxSteps, s.steps));
  }
  s.compare = absl::GetFlag(FLAGS_compare);
  s.timing = absl::GetFlag(FLAGS_timing);
  s.estimate = std::nullopt;
  const std::string estimate = absl::GetFlag(FLAGS_estimate);
  // The table's wlb comparison row uses the thresholds; --estimate the CP settings.
  s.spec.wlb_comparison = s.format == "table" && s.compare;
  s.spec.estimate = !estimate.empty();
  absl::StatusOr<PlanSettings> plan = s.spec.Validate();
  if (!plan.ok()) return plan.status();
  s.plan = *std::move(plan);

  s.docs = absl::GetFlag(FLAGS_docs);
  s.distribution = absl::GetFlag(FLAGS_distribution);
  s.seed = absl::GetFlag(FLAGS_seed);
  s.out = absl::GetFlag(FLAGS_out);
  if (s.docs.empty()) {
    absl::StatusOr<int64_t> tokens =
        StreamTokensForSteps(s.plan.config, s.steps > 0 ? s.steps : 100);
    if (!tokens.ok()) return tokens.status();
    if (!SampleNamedLengths(s.distribution, 0, s.seed)) {
      return absl::InvalidArgumentError(absl::StrFormat("--distribution must be one of %s, got %s",
                                                        DistributionNames(),
                                                        QuoteForMessage(s.distribution)));
    }
  } else {
    if (Given("seed")) {
      return UnusedOption("seed", "it seeds the sampled distribution, and --docs is given");
    }
    if (Given("distribution")) {
      return UnusedOption("distribution", "it picks the sampled distribution, and --docs is given");
    }
  }

  s.gemm_tflops = absl::GetFlag(FLAGS_gemm_tflops);
  s.dp_assign = absl::GetFlag(FLAGS_dp_assign);
  if (!(s.gemm_tflops >= kMinGemmTflops) || s.gemm_tflops > kMaxGemmTflops) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--gemm-tflops must be in [%g, %.0f] TFLOP/s per GPU, got %g",
                        kMinGemmTflops, kMaxGemmTflops, s.gemm_tflops));
  }
  if (!estimate.empty()) {
    absl::StatusOr<ParallelSizes> sizes = ParseParallelSizes(estimate);
    if (!sizes.ok())
      return absl::InvalidArgumentError(absl::StrCat("--estimate: ", sizes.status().message()));
    const int64_t pp_dp = int64_t{sizes->pp} * sizes->dp;
    if (pp_dp != s.plan.config.micro_batches) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--estimate %s needs --micro-batches = PP x DP = %d, got %d",
                          QuoteForMessage(estimate), pp_dp, s.plan.config.micro_batches));
    }
    if (Given("cp") && s.spec.cp != sizes->cp) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--cp %d differs from the CP size %d of --estimate %s", s.spec.cp,
                          sizes->cp, QuoteForMessage(estimate)));
    }
    if (!FindTransformerShape(s.spec.cost).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--estimate needs a model shape: --cost must be a FLOP preset (%s), got %s",
          absl::StrJoin(TransformerPresetNames(), ", "), QuoteForMessage(s.spec.cost)));
    }
    s.estimate = *sizes;
  } else if (Given("gemm_tflops")) {
    return UnusedOption("gemm-tflops", "it applies to --estimate, which is not given");
  } else if (s.dp_assign) {
    return UnusedOption("dp-assign", "it applies to --estimate, which is not given");
  }
  if (Given("timing") && s.format != "json") {
    return UnusedOption("timing", "it applies to --format json");
  }
  if (Given("compare") && s.format != "table") {
    return UnusedOption("compare", "it applies to --format table");
  }
  return s;
}

std::string RegistryNames(const std::string& registry) {
  std::string text;
  if (registry == "packers") {
    for (const char* name : kPackerNames) absl::StrAppend(&text, name, "\n");
  } else if (registry == "costs") {
    for (const std::string& name : CostPresetNames()) absl::StrAppend(&text, name, "\n");
    for (const MaskedModel& m : MaskedModelPresets()) absl::StrAppend(&text, m.name, "\n");
  } else {
    for (const ShardStrategyInfo& s : ShardStrategies()) {
      absl::StrAppend(&text, std::string(s.name), "\n");
    }
  }
  return text;
}

std::string HelpText() {
  std::string text =
      "wlb-plan: plans balanced micro-batches for a document stream and reports their balance.\n"
      "Usage: wlb-plan [--flag=value ...]   (docs/guides/cli.md has the flags and JSON schema; "
      "--helpfull also lists Abseil's flags)\n";
  for (const FlagGroup& g : FlagGroups()) {
    absl::StrAppend(&text, "\n", g.title, ":\n");
    const auto line = [&](std::string name, std::string_view help, std::string default_value) {
      std::replace(name.begin(), name.end(), '_', '-');
      absl::StrAppendFormat(&text, "  --%s (%s); default: %s;\n", name, help,
                            default_value.empty() ? "\"\"" : default_value);
    };
    for (const char* name : g.flags) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      line(name, flag->Help(), flag->DefaultValue());
    }
    for (const PlanSetting& row : kPlanSettings) {  // the plan's flags of this group
      if ((row.fronts & kWlbPlanFlag) == 0 || g.title != std::string_view(row.group)) continue;
      line(row.key, PlanSettingHelp(row), row.show(PlanSpec{}));
    }
    if (g.title == std::string_view("Packing")) {
      absl::StrAppend(&text, "\n  Packers (--packer):\n");
      for (const PackerInfo& p : kPackers) {
        absl::StrAppendFormat(&text, "    %-17s %s\n", p.name, p.summary);
      }
    }
  }
  return text;
}

std::string HelpFullText() {
  std::string text = HelpText();
  // Abseil's own flags (--flagfile, --fromenv, ...): Abseil's --helpfull would list them but none
  // of the plan settings, which are wlb-plan's flags without being Abseil flags.
  std::map<std::string, const absl::CommandLineFlag*> absl_flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "absl/")) absl_flags[std::string(name)] = flag;
  }
  absl::StrAppend(&text, "\nAbseil's flags:\n");
  for (const auto& [name, flag] : absl_flags) {
    absl::StrAppendFormat(&text, "  --%s (%s); default: %s;\n", name, flag->Help(),
                          flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue());
  }
  return text;
}

}  // namespace wlb::cli
