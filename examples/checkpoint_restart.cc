// Plans a document stream with WLB packing, checkpoints the packer mid-stream, restarts from the
// checkpoint and checks that the resumed run plans exactly what an uninterrupted run plans.
//
//   build/examples/example_checkpoint_restart [steps]
#include <cstdio>
#include <cstdlib>

#include "wlb/wlb.hpp"

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 40;
  const wlb::PackerConfig config{.context = 131072, .max_tokens = 163840, .micro_batches = 4};
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  const wlb::PackerOptions options{.thresholds = wlb::DefaultThresholds(config.context, 2)};

  // The loader: document lengths -> pieces of <= S tokens -> one vector of arrivals per step.
  std::vector<int64_t> lengths =
      wlb::SampleDefaultLengths(steps * config.context * config.micro_batches, /*seed=*/7);
  absl::StatusOr<std::vector<wlb::Document>> pieces = wlb::MakeDocuments(lengths, config.context);
  if (!pieces.ok()) {
    std::fprintf(stderr, "%s\n", pieces.status().ToString().c_str());
    return 1;
  }
  auto split = wlb::SplitIntoSteps(*pieces, config.context * config.micro_batches);
  if (!split.ok()) {
    std::fprintf(stderr, "%s\n", split.status().ToString().c_str());
    return 1;
  }
  const std::vector<std::vector<wlb::Document>>& arrivals = *split;

  auto reference = *wlb::MakePacker("wlb-refine", config, cost, options);
  const std::vector<wlb::StepPlan> expected = wlb::RunPacker(*reference, arrivals)->steps;

  // Train half the steps, checkpoint, "crash", restore into a fresh packer, finish.
  const size_t half = arrivals.size() / 2;
  auto first = *wlb::MakePacker("wlb-refine", config, cost, options);
  std::vector<wlb::StepPlan> got =
      wlb::RunPacker(*first, {arrivals.begin(), arrivals.begin() + half}, /*flush=*/false)->steps;
  const std::string checkpoint = first->SaveState();
  std::printf("checkpoint after %zu steps: %zu bytes, %zu documents held back\n", half,
              checkpoint.size(), first->Pending().size());

  auto resumed = *wlb::MakePacker("wlb-refine", config, cost, options);
  if (absl::Status s = resumed->RestoreState(checkpoint); !s.ok()) {
    std::fprintf(stderr, "restore failed: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<wlb::PackRun> rest =
      wlb::RunPacker(*resumed, {arrivals.begin() + half, arrivals.end()});
  got.insert(got.end(), rest->steps.begin(), rest->steps.end());

  const bool same = wlb::PlanToJson(got, {}, cost) == wlb::PlanToJson(expected, {}, cost);
  const wlb::StreamSummary summary = wlb::Summarize(got, cost);
  std::printf("%zu steps, mean imbalance %.3f (lower bound %.3f), mean token delay %.2f steps\n",
              got.size(), summary.imbalance_mean, summary.lower_bound_mean, summary.delay.mean);
  std::printf("resumed plan %s the uninterrupted plan\n", same ? "matches" : "DIFFERS FROM");
  return same ? 0 : 1;
}
