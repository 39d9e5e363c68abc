// Fuzzes wlb-plan's flag parsing and validation: the input is the argument list, one argument per
// line. Whatever it is, ParseArgs() and SettingsFromFlags() return (no crash, no hang) with a
// bounded one-line error, and accepted settings are within wlb's limits. No input is read.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_split.h"
#include "fuzz_check.hpp"
#include "wlb_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> args = absl::StrSplit(text, '\n', absl::SkipEmpty());
  absl::FlagSaver restore_flags_afterwards;
  absl::Status parsed = wlb::cli::ParseArgs(args);
  if (!parsed.ok()) {
    WLB_FUZZ_CHECK(parsed.message().size() < 1024);
    return 0;
  }
  absl::StatusOr<wlb::cli::Settings> settings = wlb::cli::SettingsFromFlags();
  if (!settings.ok()) {
    WLB_FUZZ_CHECK(settings.status().message().size() < 1024);
    return 0;
  }
  const wlb::PlanSettings& plan = settings->plan;
  WLB_FUZZ_CHECK(wlb::ValidateConfig(plan.config).ok());
  WLB_FUZZ_CHECK(settings->steps >= 0 && settings->steps <= wlb::kMaxSteps);
  WLB_FUZZ_CHECK(plan.cp_size == -1 || (plan.cp_size >= 1 && plan.cp_size <= wlb::kMaxCpSize));
  WLB_FUZZ_CHECK(wlb::MakePacker(plan.packer, plan.config, wlb::CostModel{}, plan.options).ok());
  if (settings->estimate) {
    const wlb::ParallelSizes& e = *settings->estimate;
    for (int v : {e.tp, e.cp, e.pp, e.dp}) WLB_FUZZ_CHECK(v >= 1 && v <= wlb::kMaxPipelineSize);
    WLB_FUZZ_CHECK(int64_t{e.pp} * e.dp == plan.config.micro_batches);
  }
  return 0;
}
