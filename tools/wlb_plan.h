// wlb-plan as a library: flag parsing and validation (what the CLI fuzz harness exercises) and
// the whole program.
//
//   wlb-plan                                   # 100 steps of the embedded default distribution
//   wlb-plan --docs lengths.txt --packer wlb-refine --format json --out plan.json
//   cat lengths.txt | wlb-plan --docs - --micro-batches 8 --thresholds 32768,65536
//
// On any error wlb-plan prints one line "wlb-plan: error: ..." naming the problem, exits 1 and
// writes no output file.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/wlb.hpp"

namespace wlb::cli {

// Sets wlb-plan's flags from `args` (without the program name): --name=value, --name value,
// --bool, --nobool; '-' may replace '_' in names. Unknown flags, a flag given twice, a missing or
// malformed value and positional arguments are errors naming them.
absl::Status ParseArgs(const std::vector<std::string>& args);

// What the flags ask for, checked against each other and wlb's limits before any input is read.
struct Settings {
  PackerConfig config;
  std::string packer;
  PackerOptions options;
  std::string format;
  int64_t steps = 0;
  int32_t cp_size = -1;  // -1: no shard plans
  ShardStrategy strategy = ShardStrategy::kAdaptive;
  CpPlanOptions cp_options;               // --cp-link-gbps
  std::optional<ParallelSizes> estimate;  // --estimate TP,CP,PP,DP
};
absl::StatusOr<Settings> SettingsFromFlags();

// The whole program: parse, validate, read, plan, write. Returns the exit status.
int Main(int argc, char** argv);

}  // namespace wlb::cli
