// wlb-plan as a library: flag parsing and validation (what the CLI fuzz harness exercises) and
// the whole program.
//
//   wlb-plan                                   # 100 steps of the embedded default distribution
//   wlb-plan --docs lengths.txt --packer wlb-refine --format json --out plan.json
//   cat lengths.txt | wlb-plan --docs - --micro-batches 8 --thresholds 32768,65536
//
// On any error wlb-plan prints one line "wlb-plan: error: ..." naming the problem, exits 1 and
// writes no output file.
//
// The program is split by concept: wlb_plan_flags.cc (flags -> Settings, through wlb::PlanSpec,
// and --help), wlb_plan_run.cc (read, plan, estimate) and wlb_plan_output.cc (the table, the JSON
// and the output file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/plan_spec.hpp"
#include "wlb/wlb.hpp"

namespace wlb::cli {

// Sets wlb-plan's flags from `args` (without the program name): --name=value, --name value,
// --bool, --nobool; '-' may replace '_' in names. Unknown flags, a flag given twice, a missing or
// malformed value and positional arguments are errors naming them.
absl::Status ParseArgs(const std::vector<std::string>& args);

// What the flags ask for, checked against each other and wlb's limits before any input is read:
// the plan (a PlanSpec, checked by its Validate()) and what only the program does with it.
struct Settings {
  PlanSpec spec;      // the plan's flags (--packer, --context, --cost, --cp, ...)
  PlanSettings plan;  // spec.Validate()
  std::string format;
  int64_t steps = 0;
  // The input: --docs, or --distribution sampled with --seed.
  std::string docs;
  std::string distribution;
  uint64_t seed = 1;
  std::string out;      // --out; empty: stdout
  bool timing = true;   // --format json: planning times in the summary
  bool compare = true;  // --format table: original and wlb rows on the same stream
  std::optional<ParallelSizes> estimate;  // --estimate TP,CP,PP,DP
  double gemm_tflops = 0.0;
  bool dp_assign = false;
  std::string list;      // --list packers|sharding|costs: print the registry's names, plan nothing
  std::string fit_cost;  // --fit-cost CSV: print the micro-batch fit against --cost, plan nothing
};
absl::StatusOr<Settings> SettingsFromFlags();

// wlb-plan --list: the names of the registry `registry` ("packers": kPackers; "sharding": the CP
// strategies; "costs": CostPresetNames, then the masked presets), one per line, for scripts
// (test/golden_plans.py checks its cases cover them).
std::string RegistryNames(const std::string& registry);

// Writes `text` to stdout and flushes it, as the plan output does (Output): a full disk, a closed
// stdout or a broken pipe is an error, never rc 0.
absl::Status WriteStdout(std::string_view text);

// wlb-plan --fit-cost: the micro-batch fit of the measurement CSV `path`, its coefficients and
// errors beside the FLOP preset `flop_preset`'s at its best time scale (a markdown table).
absl::StatusOr<std::string> FitCostReport(const std::string& path, const std::string& flop_preset);

// wlb-plan --help: its own flags by group, and the packers with their summaries.
std::string HelpText();

// wlb-plan --helpfull: HelpText() and then Abseil's own flags.
std::string HelpFullText();

// The whole program: parse, validate, read, plan, write. Returns the exit status.
int Main(int argc, char** argv);

}  // namespace wlb::cli
