// The fixed-length MILP baseline (the WLB-LLM paper's Eq. 1), solved by COIN-OR CBC.
//
//   wlb::MilpOptions options{.window = 2, .time_limit_s = 5.0};
//   absl::StatusOr<std::unique_ptr<wlb::MilpPacker>> packer =
//       wlb::MakeMilpPacker(config, cost, options);
//   auto run = wlb::RunPacker(**packer, arrivals);              // like any other wlb::Packer
//   for (const wlb::MilpSolveStats& s : (*packer)->solves()) { /* objective, wall time, ... */ }
//
// Every W steps the packer solves, over the window's documents (carried ones and arrivals) and
// the W x N micro-batches of the window,
//
//   minimise z  subject to  z >= sum_i W_a(d_i) x_ij           for every micro-batch j
//                           sum_i d_i x_ij <= S                 for every micro-batch j
//                           sum_j x_ij + y_i = 1                for every document i
//                           sum_i d_i y_i <= B                  (tokens carried to the next window)
//                           x_ij, y_i binary,
//
// i.e. Eq. 1 (minimise the heaviest micro-batch's attention work, each document exactly once,
// tokens <= S) with a carry option y_i, because a window's arrivals hold more than W x N x S tokens
// and cannot all fit. The carry is held to what the fixed-length greedy packer (wlb/pack/
// fixed_greedy_packer.hpp) carries on the same window, B = its carried tokens, and a carried-in
// document the greedy places must be placed: so the solver never delays more tokens than the
// greedy baseline, and the greedy packing is a feasible start (passed to CBC unless disabled).
// CBC runs under a wall-clock limit; the best solution found by then is used.
//
// This is a baseline, slow on purpose: it lives in its own library (wlb::solver, linked with CBC)
// and not in the header-only wlb::wlb.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/pack/windowed_packer.hpp"

namespace wlb {

// Settings of the solver.
struct MilpOptions {
  int window = 1;               // W: steps packed together (>= 1)
  double time_limit_s = 10.0;   // CBC wall-clock limit per window (> 0)
  bool greedy_start = true;     // give CBC the greedy packing as its first incumbent
  double relative_gap = 1e-6;   // stop when (objective - bound) / objective falls below this
};

// One bin-assignment instance: documents, bins and limits.
struct MilpInstance {
  std::vector<int64_t> lengths;     // d_i, each in [1, capacity]
  std::vector<bool> must_place;     // y_i fixed to 0 where true (empty = none)
  int bins = 1;                     // micro-batches
  int64_t capacity = 1;             // S: tokens per micro-batch
  int64_t carry_budget = 0;         // B: tokens that may be left unplaced
  std::vector<int> start;           // optional feasible start: bin per document, -1 = carried
};

// What one solve did. Costs are attention work W_a in the cost model's unit.
struct MilpSolveStats {
  int documents = 0;
  int bins = 0;
  double objective = 0.0;         // heaviest micro-batch attention of the solution used
  double best_bound = 0.0;        // CBC's proven lower bound on the optimum
  double start_objective = 0.0;   // the start's heaviest micro-batch (0 without a start)
  double seconds = 0.0;           // wall time of the CBC solve
  bool optimal = false;           // proven optimal (within relative_gap)
  bool time_limit_hit = false;    // CBC stopped on the time limit
  bool solver_solution = false;   // false: CBC found nothing better than the start, start used
  int64_t carried_tokens = 0;     // sum of d_i over carried documents
};

// A solution: the bin of each document (-1 = carried), and the solve's statistics.
struct MilpSolution {
  std::vector<int> bin;
  MilpSolveStats stats;
};

// Solves the instance with CBC. Errors name the bad value (a length outside [1, capacity],
// mismatched sizes, an infeasible start, bins < 1) or say that CBC found no feasible solution.
absl::StatusOr<MilpSolution> SolveFixedLengthMilp(const MilpInstance& instance,
                                                  const DocumentCost& cost,
                                                  const MilpOptions& options);

// The fixed-length solver packer ("fixed-solver"): the MILP above over windows of W steps.
class MilpPacker final : public WindowedPacker {
 public:
  MilpPacker(PackerConfig config, DocumentCost cost, MilpOptions options);
  std::string_view name() const override { return "fixed-solver"; }

  nlohmann::json ConfigJson() const override;

  const MilpOptions& options() const { return options_; }
  // Statistics of every window solved so far, in order.
  const std::vector<MilpSolveStats>& solves() const { return solves_; }
  // Windows where CBC failed and the greedy packing was used instead (should stay 0).
  int fallbacks() const { return fallbacks_; }

 protected:
  std::vector<MicroBatch> PackWindow(const std::vector<Document>& carry,
                                     const std::vector<Document>& fresh, int steps,
                                     std::vector<Document>& leftover) override;

 private:
  MilpOptions options_;
  std::vector<MilpSolveStats> solves_;
  int fallbacks_ = 0;
};

absl::StatusOr<std::unique_ptr<MilpPacker>> MakeMilpPacker(const PackerConfig& config,
                                                           DocumentCost cost,
                                                           const MilpOptions& options);

}  // namespace wlb
