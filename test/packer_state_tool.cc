// The C++ side of the Python package's checkpoint interchange test (python/tests): packs the
// first K steps of a lengths file and writes the packer's SaveState() blob, or restores a blob
// and packs the rest. Prints the plan JSON of the steps it planned (wlb::PlanToJson).
//
//   packer_state_tool save   LENGTHS PACKER S N K STATE_OUT   # steps [0, K), then SaveState
//   packer_state_tool resume LENGTHS PACKER S N K STATE_IN    # RestoreState, steps [K, end), Flush
//
// S_max is S + S/4 and thresholds are the two-queue defaults, as wlb.Packer's defaults.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "wlb/wlb.hpp"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "packer_state_tool: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    return Fail("usage: packer_state_tool save|resume LENGTHS PACKER S N K STATE_FILE");
  }
  const std::string mode = argv[1];
  int64_t context = 0, k = 0;
  int32_t n = 0;
  if (!absl::SimpleAtoi(argv[4], &context) || !absl::SimpleAtoi(argv[5], &n) ||
      !absl::SimpleAtoi(argv[6], &k) || k < 0 || (mode != "save" && mode != "resume")) {
    return Fail("bad arguments (mode save|resume, S, N and K integers, K >= 0)");
  }
  const wlb::PackerConfig config{
      .context = context, .max_tokens = wlb::DefaultMaxTokens(context), .micro_batches = n};
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  auto packer =
      wlb::MakePacker(argv[3], config, cost, {.thresholds = wlb::DefaultThresholds(context, 2)});
  if (!packer.ok()) return Fail(std::string(packer.status().message()));
  auto lengths = wlb::ReadLengthsFile(argv[2]);
  if (!lengths.ok()) return Fail(std::string(lengths.status().message()));
  auto pieces = wlb::MakeDocuments(*lengths, context);
  if (!pieces.ok()) return Fail(std::string(pieces.status().message()));
  auto split_steps = wlb::SplitIntoSteps(*pieces, context * n);
  if (!split_steps.ok()) return Fail(std::string(split_steps.status().message()));
  const std::vector<std::vector<wlb::Document>>& steps = *split_steps;
  const size_t split = std::min<size_t>(static_cast<size_t>(k), steps.size());

  absl::StatusOr<wlb::PackRun> run;
  if (mode == "save") {
    run = wlb::RunPacker(**packer, {steps.begin(), steps.begin() + split}, /*flush=*/false);
    if (!run.ok()) return Fail(std::string(run.status().message()));
    std::ofstream out(argv[7], std::ios::binary | std::ios::trunc);
    out << (*packer)->SaveState();
    if (!out.flush()) return Fail(std::string("cannot write ") + argv[7]);
  } else {
    std::ifstream in(argv[7], std::ios::binary);
    std::stringstream blob;
    blob << in.rdbuf();
    if (!in) return Fail(std::string("cannot read ") + argv[7]);
    if (absl::Status s = (*packer)->RestoreState(blob.str()); !s.ok()) {
      return Fail(std::string(s.message()));
    }
    run = wlb::RunPacker(**packer, {steps.begin() + split, steps.end()});
    if (!run.ok()) return Fail(std::string(run.status().message()));
  }
  std::cout << wlb::PlanToJson(run->steps, (*packer)->Pending(), cost, config.max_tokens).dump()
            << "\n";
  return 0;
}
