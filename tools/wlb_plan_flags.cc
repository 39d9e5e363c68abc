// wlb-plan's flags: their declarations, ParseArgs, SettingsFromFlags (the plan's flags become a
// wlb::PlanSpec, checked by its Validate(); the rest are the program's own) and --help.
#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/plan_spec.hpp"
#include "wlb/wlb.hpp"
#include "wlb_plan.h"

// Defaults of the plan's flags are PlanSpec's (a key not given keeps them).
ABSL_FLAG(std::string, docs, "",
          "lengths file (one integer per line, or a JSON array); '-' reads stdin; empty samples "
          "the embedded distribution named by --distribution");
ABSL_FLAG(std::string, distribution, "default",
          "when --docs is empty: default (the embedded WLB-LLM-like histogram) or heavy-tail");
ABSL_FLAG(int64_t, context, wlb::PlanSpec{}.context, "context window S in tokens (longest piece)");
ABSL_FLAG(int64_t, max_tokens, wlb::PlanSpec{}.max_tokens,
          "variable-length cap S_max per micro-batch; 0 = S + S/4");
ABSL_FLAG(int32_t, micro_batches, wlb::PlanSpec{}.micro_batches,
          "micro-batches per step N (= PP x DP)");
ABSL_FLAG(std::string, packer, wlb::PlanSpec{}.packer,
          absl::StrCat(absl::StrJoin(wlb::kPackerNames, ", "), " (listed below)"));
ABSL_FLAG(int32_t, lookahead, wlb::PlanSpec{}.lookahead,
          "wlb-lookahead: K in [0, 8], steps of prefetched arrivals it sees ahead");
ABSL_FLAG(int32_t, window, wlb::PlanSpec{}.window, "fixed-greedy: steps packed together");
ABSL_FLAG(std::string, thresholds, "",
          "wlb/wlb-refine/wlb-lookahead: comma-separated outlier thresholds L_1<L_2<... in tokens, "
          "or 'none'");
ABSL_FLAG(int32_t, queues, wlb::PlanSpec{}.queues,
          "wlb/wlb-refine/wlb-lookahead: number of outlier queues with default thresholds "
          "(instead of --thresholds)");
ABSL_FLAG(bool, tune, wlb::PlanSpec{}.tune,
          "wlb/wlb-refine/wlb-lookahead: pick thresholds with the tuner on the planned stream "
          "itself, within --delay-budget");
ABSL_FLAG(double, delay_budget, wlb::PlanSpec{}.delay_budget,
          "--tune, wlb-lookahead: max mean token delay in steps (wlb-lookahead: default none "
          "beyond wlb's delay, 1 with --tune)");
ABSL_FLAG(bool, bound_delay, wlb::PlanSpec{}.bound_delay,
          "wlb-lookahead: plan each step within wlb-refine's token delay on the same stream "
          "(--bound_delay=false: the delay price alone steers, which can end above it)");
ABSL_FLAG(std::string, cost, wlb::PlanSpec{}.cost,
          "cost model: a preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m), a masked preset "
          "(llama2-7b-swa4k, llama2-7b-chunk8k, llama2-7b-causal: FLOPs under a layer mix of "
          "attention masks; doc-degree CP plans for its masks too) or a profile CSV of length -> "
          "latency to fit");
ABSL_FLAG(std::string, profile_cost, wlb::PlanSpec{}.profile_cost,
          "with a profile CSV in --cost: 'fit' (least-squares quadratic) or 'table' (tile-aware "
          "interpolation of the measured points)");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the default distribution");
ABSL_FLAG(int64_t, steps, 0,
          "steps to plan: default distribution samples this many (0 = 100); a file is cut after "
          "this many (0 = all)");
ABSL_FLAG(int32_t, cp, wlb::PlanSpec{}.cp,
          "context-parallel size C in [1, 4096]: add CP shard plans to every micro-batch (omit "
          "for none)");
ABSL_FLAG(std::string, sharding, wlb::PlanSpec{}.sharding,
          "with --cp or --estimate: " + wlb::ShardStrategyNameList(" or "));
ABSL_FLAG(double, cp_link_gbps, wlb::PlanSpec{}.cp_link_gbps,
          "with --sharding doc-degree: K/V link bandwidth per rank and direction in GB/s "
          "(default 450: NVLink 4, 900 GB/s both ways); in (0, 1e6]");
ABSL_FLAG(std::string, kernel_profile, wlb::PlanSpec{}.kernel_profile,
          "with --cp or --estimate: kernel profile CSV (q_len,kv_len,ms) for the kernel model; "
          "empty = the analytic default (tile 128)");
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
          "packers or sharding: print the registry's packer or CP strategy names, one per line, "
          "and plan nothing (takes no other flag)");

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
      {"Packing (a plan: wlb::PlanSpec)",
       {"packer", "context", "max_tokens", "micro_batches", "thresholds", "queues", "tune",
        "delay_budget", "window", "lookahead", "bound_delay"}},
      {"Cost model", {"cost", "profile_cost"}},
      {"CP shard plans", {"cp", "sharding", "cp_link_gbps", "kernel_profile"}},
      {"Step-time estimate", {"estimate", "gemm_tflops", "dp_assign"}},
      {"Output", {"format", "out", "timing", "compare", "list"}},
  };
  return groups;
}

// The flags that are PlanSpec keys (ParsePlanSpec gets those given).
constexpr const char* kPlanFlags[] = {
    "packer", "context",     "max_tokens", "micro_batches", "cost",     "profile_cost",
    "thresholds", "queues",  "tune",       "window",        "lookahead", "delay_budget",
    "bound_delay", "cp",     "sharding",   "cp_link_gbps",  "kernel_profile"};

bool IsOurFlag(const std::string& name) {
  for (const FlagGroup& g : FlagGroups()) {
    for (const char* f : g.flags) {
      if (name == f) return true;
    }
  }
  return false;
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
    absl::CommandLineFlag* flag = IsOurFlag(name) ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr && name.size() > 2 && name.compare(0, 2, "no") == 0 && !value &&
        IsOurFlag(name.substr(2))) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) {
        name = name.substr(2);
        value = "false";
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown flag %s (--help prints the flags; docs/guides/cli.md)",
                          QuoteForMessage(arg.substr(0, eq))));
    }
    if (!GivenFlags().insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s is given more than once", name));
    }
    if (!value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
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
    if (s.list != "packers" && s.list != "sharding") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--list must be packers or sharding, got %s", QuoteForMessage(s.list)));
    }
    if (GivenFlags().size() > 1) {
      return absl::InvalidArgumentError(
          "--list prints the registry's names and takes no other flag");
    }
  }  // the rest: wlb-plan's defaults, checked as always
  // The plan: the given plan flags, as ParsePlanSpec reads them (a flag not given keeps its
  // default, which is PlanSpec's).
  std::vector<std::pair<std::string, std::string>> plan_flags;
  for (const char* name : kPlanFlags) {
    if (Given(name)) plan_flags.emplace_back(name, absl::FindCommandLineFlag(name)->CurrentValue());
  }
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec(plan_flags);
  if (!spec.ok()) return spec.status();
  s.spec = *std::move(spec);

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
    if (s.distribution != "default" && s.distribution != "heavy-tail") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--distribution must be default or heavy-tail, got %s", QuoteForMessage(s.distribution)));
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
    if (!CostModelFromPreset(s.spec.cost).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--estimate needs a model shape: --cost must be a preset (llama2-7b, llama2-13b, "
          "llama2-70b, wlb-550m), got %s",
          QuoteForMessage(s.spec.cost)));
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
    for (const char* name : g.flags) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      std::string spelled = name;
      std::replace(spelled.begin(), spelled.end(), '_', '-');
      absl::StrAppendFormat(&text, "  --%s (%s); default: %s;\n", spelled, flag->Help(),
                            flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue());
    }
    if (g.flags.front() == std::string_view("packer")) {
      absl::StrAppend(&text, "\n  Packers (--packer):\n");
      for (const PackerInfo& p : kPackers) {
        absl::StrAppendFormat(&text, "    %-17s %s\n", p.name, p.summary);
      }
    }
  }
  return text;
}

}  // namespace wlb::cli
