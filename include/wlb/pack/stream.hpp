// Running a packer over a stream cut into steps (wlb/core/steps.hpp).
//
//   auto pieces = wlb::MakeDocuments(lengths, S);                 // split at the context window
//   auto arrivals = wlb::SplitIntoSteps(*pieces, N * S);          // StatusOr: one vector per step
//   absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(*packer, arrivals);  // Push each, then Flush
#pragma once

#include <chrono>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/core/document.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {

// A packer's plans for a whole stream, and how long planning took.
struct PackRun {
  std::vector<StepPlan> steps;
  std::vector<double> plan_ms;  // wall time of each Push() / the Flush(), in milliseconds
};

// Pushes every step's arrivals into `packer`, then flushes it (unless `flush` is false).
inline absl::StatusOr<PackRun> RunPacker(Packer& packer,
                                         std::vector<std::vector<Document>> arrivals,
                                         bool flush = true) {
  PackRun run;
  using Clock = std::chrono::steady_clock;
  for (std::vector<Document>& step : arrivals) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::vector<StepPlan>> ready = packer.Push(std::move(step));
    run.plan_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (!ready.ok()) return ready.status();
    for (StepPlan& s : *ready) run.steps.push_back(std::move(s));
  }
  if (flush) {
    const Clock::time_point start = Clock::now();
    for (StepPlan& s : packer.Flush()) run.steps.push_back(std::move(s));
    run.plan_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return run;
}

}  // namespace wlb
