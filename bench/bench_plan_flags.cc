// The table benches' shared flags (bench_plan_flags.hpp). Plan defaults are wlb::PlanSpec's, as
// wlb-plan's are.
#include "bench_plan_flags.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli_help.h"

ABSL_FLAG(std::string, docs, "",
          "document lengths file (one per line or a JSON array); empty samples the embedded "
          "distribution named by --distribution. The paper-like case: "
          "../shared/data/doc_lengths_wlbllm_like.json");
ABSL_FLAG(std::string, distribution, "default",
          "when --docs is empty: default (embedded WLB-LLM-like histogram) or heavy-tail");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the embedded distribution");
ABSL_FLAG(std::string, packer, wlb::PlanSpec{}.packer,
          absl::StrCat("packer: ", absl::StrJoin(wlb::kPackerNames, ", "),
                       " (benches that sweep packers do not take it)"));
ABSL_FLAG(int64_t, context, wlb::PlanSpec{}.context,
          "context window S in tokens (benches that sweep or fix S do not take it)");
ABSL_FLAG(int64_t, max_tokens, wlb::PlanSpec{}.max_tokens,
          "variable-length cap S_max per micro-batch; 0 = S + S/4");
ABSL_FLAG(int32_t, micro_batches, wlb::PlanSpec{}.micro_batches,
          "micro-batches per step N (= PP x DP)");
ABSL_FLAG(std::string, cost, wlb::PlanSpec{}.cost,
          "cost model: a preset name (FLOPs or a shipped calibration), a masked preset, a "
          "micro-batch measurement CSV or a profile CSV to fit");
ABSL_FLAG(int32_t, queues, wlb::PlanSpec{}.queues, "WLB outlier-queue levels (default thresholds)");
ABSL_FLAG(int32_t, lookahead, wlb::PlanSpec{}.lookahead,
          "wlb-lookahead: K, steps of arrivals seen ahead");
ABSL_FLAG(std::string, attention_range, "",
          "wlb-refine/wlb-lookahead: LOW,HIGH or 'exact', the attention weights refinement must "
          "not worsen (empty: the cost's default)");
ABSL_FLAG(double, cp_link_gbps, wlb::PlanSpec{}.cp_link_gbps,
          "K/V link bandwidth per rank and direction (GB/s) of the CP predictions");

namespace wlb::bench {
namespace {

// The shared plan flags: PlanSpec keys, and the CP link (not a PlanSpec key here: the benches
// predict the exchange of every strategy with it, not only doc-degree's plans).
const char* const kPlanFlags[] = {"packer", "context",   "max_tokens",      "micro_batches", "cost",
                                  "queues", "lookahead", "attention_range", "cp_link_gbps"};
constexpr std::string_view kCpLink = "cp_link_gbps";

// The shared plan flags the program takes (ParseFlags).
std::vector<std::string>& Takes() {
  static std::vector<std::string> takes;
  return takes;
}

// Set on the command line to other than its default (Abseil keeps no public "given" bit).
bool Changed(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag->CurrentValue() != flag->DefaultValue();
}

// "--packer, --micro_batches": the shared plan flags the program takes.
std::string TakenList() {
  std::vector<std::string> flags;
  for (const std::string& key : Takes()) flags.push_back("--" + key);
  return flags.empty() ? "none" : absl::StrJoin(flags, ", ");
}

}  // namespace

void ParseFlags(int argc, char** argv, std::string_view usage,
                std::initializer_list<std::string_view> takes) {
  Takes().assign(takes.begin(), takes.end());
  cli::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(absl::StrFormat(
      "%s\n\nShared planning flags it takes: %s, and --docs, --distribution, --seed (the other "
      "shared flags must keep their defaults).",
      std::string(usage), TakenList()));
  absl::ParseCommandLine(argc, argv);
}

absl::StatusOr<BenchPlan> PlanFromFlags() {
  std::vector<std::pair<std::string, std::string>> given;
  for (const std::string key : kPlanFlags) {
    if (!Changed(key)) continue;
    if (std::find(Takes().begin(), Takes().end(), key) == Takes().end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--%s is not used by this bench (its shared planning flags: %s)", key, TakenList()));
    }
    if (key != kCpLink) given.emplace_back(key, absl::FindCommandLineFlag(key)->CurrentValue());
  }
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec(given);
  if (!spec.ok()) return spec.status();
  BenchPlan plan{.spec = *std::move(spec),
                 .input = {.docs = absl::GetFlag(FLAGS_docs),
                           .distribution = absl::GetFlag(FLAGS_distribution),
                           .seed = absl::GetFlag(FLAGS_seed)},
                 .cp = {.comm = {.link_gbps = absl::GetFlag(FLAGS_cp_link_gbps)}}};
  if (absl::Status s = ValidateCpPlanOptions(plan.cp); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--cp_link_gbps: ", s.message()));
  }
  return plan;
}

PlanSpec ForPacker(PlanSpec base, std::string packer) {
  const PackerInfo* info = FindPacker(packer);
  const auto uses = [&](PackerOption o) { return info != nullptr && info->Uses(o); };
  for (const PackerOptionKey& o : kPackerOptionKeys) {
    if (!uses(o.option)) base.given.erase(o.key);
  }
  base.packer = std::move(packer);
  return base;
}

}  // namespace wlb::bench
