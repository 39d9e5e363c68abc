// --help for wlb's command-line programs: Abseil's default lists only flags declared in a file
// named after the program (wlb-plan has none: its flags live in wlb_plan_flags.cc), so it printed
// "No flags matched". This lists every flag the program declares itself (Abseil's own flags
// stay under --helpfull).
#pragma once

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace wlb::cli {

inline void ShowOwnFlagsInHelp() {
  absl::FlagsUsageConfig config;
  const auto own = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_help_flags = own;
  config.contains_helpshort_flags = own;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace wlb::cli
