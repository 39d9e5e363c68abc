// Cutting the input stream into steps, and running a packer over it.
//
//   auto pieces = wlb::MakeDocuments(lengths, S);                 // split at the context window
//   auto arrivals = wlb::SplitIntoSteps(*pieces, N * S);          // one vector per step
//   absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(*packer, arrivals);  // Push each, then Flush
//
// A step is the next N x S tokens of the stream. A piece belongs to the step in which its first
// token lies: a piece straddling the boundary goes wholly to the earlier step, so a step's arrivals
// hold more than N x S - S tokens (fewer only at the end of input) and less than N x S + S.
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include "wlb/pack/packer.hpp"

namespace wlb {

// Groups pieces (in stream order) into steps of `tokens_per_step` tokens by their first token.
inline std::vector<std::vector<Document>> SplitIntoSteps(std::span<const Document> pieces,
                                                         int64_t tokens_per_step) {
  std::vector<std::vector<Document>> steps;
  int64_t offset = 0;
  for (const Document& d : pieces) {
    const size_t step = static_cast<size_t>(offset / tokens_per_step);
    if (steps.size() <= step) steps.resize(step + 1);
    steps[step].push_back(d);
    offset += d.length;
  }
  return steps;
}

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
