// What wlb_plan_run.cc and wlb_plan_output.cc share: a planned run, the step-time estimate, and
// the writers of the table and the JSON.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/wlb.hpp"
#include "wlb_plan.h"

namespace wlb::cli {

// One packer's run over the stream.
struct Result {
  std::string packer;
  PackRun run;
  StreamSummary summary;
  std::vector<Document> pending;
};

// --estimate: modelled step time of the planned stream and of Plain-4D on the same stream.
struct Estimate {
  ParallelSizes sizes;
  double seconds = 0.0;           // the chosen packer with --sharding
  double baseline_seconds = 0.0;  // original packing, per-seq CP
  int64_t steps = 0;
  // --dp-assign: the chosen packer's steps with micro-batches placed on DP ranks by the model,
  // and with micro-batch k on rank k % DP.
  std::optional<double> dp_assigned_seconds;
  double dp_round_robin_seconds = 0.0;
};

// A streamed run (--docs X.idx): the chosen packer's steps are written as they are planned, as the
// output's JSON text (the whole document, by `json`) or table rows, to an unnamed temporary file
// (`spool`), and never kept; the writers copy the spool into the output.
struct StreamedSteps {
  std::FILE* spool = nullptr;
  int64_t arrival_steps = 0;  // the input's steps, as Input::steps counts them
  CpSummary cp_summary;       // --cp-size: over the steady steps written
  std::optional<PlanJsonWriter> json;  // --format json
};

// Starts a streamed run's output in `streamed.spool` (the JSON's pending documents).
absl::Status BeginStreamed(const Settings& settings, const DocumentCost& cost,
                           const KernelModel& kernel_model, StreamedSteps& streamed);

// Writes one planned step of the chosen packer to `streamed` (with its CP shard plans).
absl::Status AppendStreamedStep(const StepPlan& step, const Settings& settings,
                                const DocumentCost& cost, const KernelModel& kernel_model,
                                StreamedSteps& streamed);

// A run ready to write: the chosen packer's, its models and what the run adds to it.
struct Planned {
  const Settings& settings;
  const Input& input;
  const DocumentCost& cost;
  const KernelModel& kernel_model;
  const Result& main;
  PackerOptions options;             // the plan's, with --tune's thresholds
  std::string tune_note;             // " (tuned over ...)" with --tune
  std::vector<const Result*> rows;   // the table's summary rows, in order
  std::optional<Estimate> estimate;  // --estimate
  StreamedSteps* streamed = nullptr;  // a streamed run: main.run.steps is empty
};

// CP shard plans of one step's micro-batches, one at a time: each is added to `summary` (steady
// steps only) and, with `step_json`, written into its micro-batch there; none is kept, so a run
// at C = 4096 holds one shard plan at a time, not one per micro-batch of the run.
absl::Status PlanStepCp(const StepPlan& step, const PlanSettings& settings,
                        const KernelModel& model, CpSummary& summary, nlohmann::json* step_json);

double Median(std::vector<double> v);

// --out must not name a file the run reads: it would be replaced by the output.
absl::Status CheckOutputIsNotAnInput(const Settings& settings);

// Writes the JSON (planning the CP shard plans step by step as it writes them).
absl::Status WriteJson(const Planned& planned);

// Writes the table; `cp_summary` holds the CP shard plans of the steady steps.
absl::Status WriteTable(const Planned& planned, const CpSummary& cp_summary);

}  // namespace wlb::cli
