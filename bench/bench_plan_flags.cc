// The table benches' shared flags (bench_plan_flags.hpp). The plan flags are the rows of
// wlb::kPlanSettings a bench may take (SettingFront kBenchFlag): read here, parsed by
// ParsePlanSpec, their defaults PlanSpec's, as wlb-plan's are. The input flags are Abseil flags.
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
          "when --docs is empty: default (embedded WLB-LLM-like histogram), heavy-tail, or a "
          "generated shape: rare-long, bimodal, pile-like, prolong-like");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the embedded distribution");

namespace wlb::bench {
namespace {

// The CP link and memory cap: plan keys, but here not of the spec (the benches plan and predict
// every strategy with them, not only the spec's strategy). Each moves the spec's value into the
// options and back to the default in the spec.
struct BenchCpKey {
  std::string_view key;
  void (*move)(PlanSpec& spec, CpPlanOptions& options);
};
constexpr BenchCpKey kBenchCpKeys[] = {
    {"cp_link_gbps",
     [](PlanSpec& spec, CpPlanOptions& options) {
       options.comm.link_gbps = std::exchange(spec.cp_link_gbps, PlanSpec{}.cp_link_gbps);
     }},
    {"cp_memory_cap_percent",
     [](PlanSpec& spec, CpPlanOptions& options) {
       options.memory_cap_percent =
           std::exchange(spec.cp_memory_cap_percent, PlanSpec{}.cp_memory_cap_percent);
     }},
};

// The shared plan flags the program takes (ParseFlags).
std::vector<std::string>& Takes() {
  static std::vector<std::string> takes;
  return takes;
}

// The shared plan flags on the command line, in order (ParseFlags), and a malformed one.
std::vector<std::pair<std::string, std::string>>& GivenPlanFlags() {
  static std::vector<std::pair<std::string, std::string>> given;
  return given;
}
absl::Status& ParseError() {
  static absl::Status error;
  return error;
}

// "--packer, --micro_batches": the shared plan flags the program takes.
std::string TakenList() {
  std::vector<std::string> flags;
  for (const std::string& key : Takes()) flags.push_back("--" + key);
  return flags.empty() ? "none" : absl::StrJoin(flags, ", ");
}

bool Taken(std::string_view key) {
  return std::find(Takes().begin(), Takes().end(), key) != Takes().end();
}

}  // namespace

void ParseFlags(int argc, char** argv, std::string_view usage,
                std::initializer_list<std::string_view> takes) {
  Takes().assign(takes.begin(), takes.end());
  GivenPlanFlags().clear();
  ParseError() = absl::OkStatus();
  cli::ShowOwnFlagsInHelp();
  std::string shared;
  for (const PlanSetting& row : kPlanSettings) {
    if ((row.fronts & kBenchFlag) == 0) continue;
    const std::string default_value = row.show(PlanSpec{});
    absl::StrAppendFormat(&shared, "\n  --%s (%s); default: %s%s", row.key, PlanSettingHelp(row),
                          default_value.empty() ? "\"\"" : default_value,
                          Taken(row.key) ? "" : " (not taken)");
  }
  absl::SetProgramUsageMessage(absl::StrFormat(
      "%s\n\nShared planning flags it takes: %s, and --docs, --distribution, --seed (the other "
      "shared flags must not be given). The shared planning flags (wlb::kPlanSettings):%s",
      std::string(usage), TakenList(), shared));
  // The shared plan flags out of argv (ParsePlanSpec reads them); the rest go to Abseil.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      rest.insert(rest.end(), argv + i, argv + argc);
      break;
    }
    const size_t dashes = arg.starts_with("--") ? 2 : arg.starts_with("-") ? 1 : 0;
    const size_t eq = arg.find('=');
    const PlanSetting* row =
        dashes == 0 ? nullptr
                    : FindPlanSetting(arg.substr(dashes, eq == arg.npos ? arg.npos : eq - dashes));
    if (row == nullptr || (row->fronts & kBenchFlag) == 0) {
      rest.push_back(argv[i]);
      continue;
    }
    if (eq != arg.npos) {
      GivenPlanFlags().emplace_back(row->key, std::string(arg.substr(eq + 1)));
    } else if (i + 1 < argc) {
      GivenPlanFlags().emplace_back(row->key, argv[++i]);
    } else if (ParseError().ok()) {
      ParseError() = absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", row->key));
    }
  }
  absl::ParseCommandLine(static_cast<int>(rest.size()), rest.data());
}

absl::StatusOr<BenchPlan> PlanFromFlags() {
  if (!ParseError().ok()) return ParseError();
  for (const auto& [key, value] : GivenPlanFlags()) {
    if (!Taken(key)) {
      return UnusedOption(
          key, absl::StrFormat("this bench's shared planning flags are %s", TakenList()));
    }
  }
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec(GivenPlanFlags());
  if (!spec.ok()) return spec.status();
  BenchPlan plan{.spec = *std::move(spec),
                 .input = {.docs = absl::GetFlag(FLAGS_docs),
                           .distribution = absl::GetFlag(FLAGS_distribution),
                           .seed = absl::GetFlag(FLAGS_seed)},
                 .cp = {}};
  // One key at a time: the keys before it are valid and the ones after it still the defaults, so
  // an error is about this key's value.
  for (const BenchCpKey& k : kBenchCpKeys) {
    k.move(plan.spec, plan.cp);
    if (absl::Status s = ValidateCpPlanOptions(plan.cp); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", std::string(k.key), ": ", s.message()));
    }
    plan.spec.given.erase(std::string(k.key));
  }
  return plan;
}

PlanSpec ForPacker(PlanSpec base, std::string packer) {
  if (const PackerInfo* info = FindPacker(packer); info != nullptr) {
    for (const PlanSetting& row : kPlanSettings) {
      if (row.readers != 0 && !row.Reads(*info)) base.given.erase(row.key);
    }
  }
  base.packer = std::move(packer);
  return base;
}

}  // namespace wlb::bench
