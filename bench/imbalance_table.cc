// imbalance_table: the WLB-LLM paper's Table 2 (packing methods on a 7B-128K job) reproduced with
// wlb's packers on a document stream.
//
//   build/bench/imbalance_table                                   # embedded distribution
//   build/bench/imbalance_table --docs ../shared/data/doc_lengths_wlbllm_like.json \
//       --csv docs/results/packing/imbalance_wlbllm_like.csv \
//       --step_csv docs/results/packing/step_costs_wlbllm_like.csv
//
// Rows: original packing; fixed-length greedy over windows of W steps; the fixed-length MILP
// solver (COIN-OR CBC, time-limited) over windows of W steps; WLB-LLM variable-length packing with
// 1/2/3 outlier-queue levels; wlb-refine (WLB plus refinement) and wlb-lookahead (refinement plus
// look-ahead selection, --lookahead steps) with the same queues. Columns:
//   imbalance mean / p90  over the steady steps (drain steps and the partial last step of the
//                         input left out);
//   gap to lower bound    mean imbalance minus the mean per-step lower bound (wlb::LowerBound);
//   gap to cap-aware bound  the same against wlb::CapLowerBound, which also uses S_max;
//   delay                 mean token delay in steps (negative: a window trained it early);
//   overhead              median planning wall time per step: each Push() that returned steps,
//                         divided by how many it returned (a window of W steps is planned at once).
// Markdown goes to stdout, progress to stderr; --csv and --step_csv write machine-readable copies.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench_plan_flags.hpp"
#include "wlb/solver/milp_packer.hpp"
#include "wlb/wlb.hpp"

ABSL_FLAG(int64_t, steps, 200,
          "steps of input for the non-solver rows (a file is cut after this many; 0 = all of it)");
ABSL_FLAG(std::string, greedy_windows, "1,2,4,8", "fixed-length greedy windows (steps)");
ABSL_FLAG(std::string, queue_levels, "1,2,3", "WLB outlier-queue levels (default thresholds)");
ABSL_FLAG(bool, solver, true, "run the fixed-length MILP solver rows (CBC; slow on purpose)");
ABSL_FLAG(std::string, solver_windows, "1,2,4", "fixed-length solver windows (steps)");
ABSL_FLAG(double, solver_seconds, 2.0, "CBC wall-clock limit per solver window, in seconds");
ABSL_FLAG(double, solver_gap, 1e-3,
          "CBC stops when (objective - bound) / objective is below this (relative MIP gap)");
ABSL_FLAG(int64_t, solver_steps, 100, "steps of input for the solver rows (the first ones)");
ABSL_FLAG(std::string, csv, "", "also write the table as CSV to this file");
ABSL_FLAG(std::string, step_csv, "",
          "write per-micro-batch costs of one step (--plot_step) for original, fixed-greedy W=1, "
          "wlb and wlb-refine (2 queue levels) to this CSV");
ABSL_FLAG(int64_t, plot_step, 10, "the step --step_csv describes");

namespace {

// The rows' packers (wlb::kPackers names, checked at compile time).
constexpr const char* kOriginal = wlb::bench::Packer("original");
constexpr const char* kFixedGreedy = wlb::bench::Packer("fixed-greedy");
constexpr const char* kQueueRowPackers[] = {wlb::bench::Packer("wlb"),
                                            wlb::bench::Packer("wlb-refine"),
                                            wlb::bench::Packer("wlb-lookahead")};

// The paper's Table 2 (7B-128K) for the rows it has, keyed by "method/config".
const std::map<std::string, double>& PaperImbalance() {
  static const std::map<std::string, double> paper = {{"original/-", 1.44},
                                                      {"fixed-greedy/window 1", 1.41},
                                                      {"fixed-greedy/window 2", 1.22},
                                                      {"fixed-greedy/window 4", 1.11},
                                                      {"fixed-greedy/window 8", 1.08},
                                                      {"fixed-solver/window 1", 1.40},
                                                      {"fixed-solver/window 2", 1.18},
                                                      {"fixed-solver/window 4", 1.09},
                                                      {"wlb/1 queue", 1.24},
                                                      {"wlb/2 queues", 1.05},
                                                      {"wlb/3 queues", 1.05}};
  return paper;
}

absl::StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const std::string& text,
                                              int min_value, int max_value) {
  std::vector<int> values;
  if (text.empty()) return values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < min_value || v > max_value) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s: '%s' is not an integer in [%d, %d]",
                                                        flag, std::string(part), min_value,
                                                        max_value));
    }
    values.push_back(v);
  }
  return values;
}

struct Row {
  std::string method;
  std::string config;
  wlb::StreamSummary summary;
  double overhead_ms = 0.0;
  std::vector<wlb::StepPlan> steps;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

// Pushes every step into `packer` (timing each Push), flushes, and summarises.
absl::StatusOr<Row> RunRow(wlb::Packer& packer, std::vector<std::vector<wlb::Document>> arrivals,
                           const wlb::DocumentCost& cost, std::string method, std::string config) {
  const int64_t max_tokens = packer.config().max_tokens;
  using Clock = std::chrono::steady_clock;
  Row row{.method = std::move(method), .config = std::move(config)};
  std::vector<double> per_step_ms;
  const Clock::time_point begin = Clock::now();
  Clock::time_point last_report = begin;
  const size_t total = arrivals.size();
  for (size_t k = 0; k < total; ++k) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::vector<wlb::StepPlan>> ready = packer.Push(std::move(arrivals[k]));
    const Clock::time_point t1 = Clock::now();
    if (!ready.ok()) return ready.status();
    if (!ready->empty()) {
      per_step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() /
                            static_cast<double>(ready->size()));
    }
    for (wlb::StepPlan& s : *ready) row.steps.push_back(std::move(s));
    if (t1 - last_report > std::chrono::seconds(5)) {
      std::fprintf(stderr, "imbalance_table: %s %s: step %zu/%zu (%.0f s)\n", row.method.c_str(),
                   row.config.c_str(), k + 1, total,
                   std::chrono::duration<double>(t1 - begin).count());
      last_report = t1;
    }
  }
  for (wlb::StepPlan& s : packer.Flush()) row.steps.push_back(std::move(s));
  row.summary = wlb::Summarize(row.steps, cost, max_tokens);
  row.overhead_ms = Median(per_step_ms);
  return row;
}

// One Markdown table row / CSV line.
std::string MarkdownRow(const Row& r) {
  const auto paper = PaperImbalance().find(r.method + "/" + r.config);
  return absl::StrFormat(
      "| %s | %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.4g | %s |", r.method,
      r.config, r.summary.steps, r.summary.imbalance_mean, r.summary.imbalance_p90,
      r.summary.imbalance_p99, r.summary.imbalance_max,
      r.summary.imbalance_mean - r.summary.lower_bound_mean,
      r.summary.imbalance_mean - r.summary.cap_lower_bound_mean, r.summary.delay.mean,
      r.overhead_ms, paper == PaperImbalance().end() ? "" : absl::StrFormat("%.2f", paper->second));
}

std::string CsvRow(const Row& r) {
  return absl::StrFormat("%s,%s,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6g", r.method, r.config,
                         r.summary.imbalance_mean, r.summary.imbalance_p90, r.summary.imbalance_p99,
                         r.summary.imbalance_max,
                         r.summary.imbalance_mean - r.summary.lower_bound_mean,
                         r.summary.imbalance_mean - r.summary.cap_lower_bound_mean,
                         r.summary.delay.mean, r.overhead_ms);
}

// The solver's per-window statistics, aggregated, next to the greedy packing of the same steps.
std::string SolverLine(const wlb::MilpPacker& p, const Row& solver, const Row& greedy) {
  const auto& s = p.solves();
  int optimal = 0, limit = 0, improved = 0;
  double seconds = 0.0, max_seconds = 0.0, rel_obj = 0.0, gap = 0.0;
  for (const wlb::MilpSolveStats& x : s) {
    optimal += x.optimal;
    limit += x.time_limit_hit;
    improved += x.objective < x.start_objective * (1 - 1e-9);
    seconds += x.seconds;
    max_seconds = std::max(max_seconds, x.seconds);
    rel_obj += x.start_objective > 0 ? x.objective / x.start_objective : 1.0;
    gap += x.objective > 0 ? (x.objective - x.best_bound) / x.objective : 0.0;
  }
  const double n = std::max<double>(1.0, static_cast<double>(s.size()));
  return absl::StrFormat(
      "| %d | %d | %d | %d | %d | %.2f | %.2f | %.4f | %.4f | %.3f | %.3f | %d |",
      p.options().window, s.size(), optimal, limit, improved, seconds / n, max_seconds, rel_obj / n,
      gap / n, solver.summary.imbalance_mean, greedy.summary.imbalance_mean, p.fallbacks());
}

absl::Status WriteStepCsv(const std::string& path, int64_t step, const std::vector<Row>& rows) {
  std::ofstream out(path);
  if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --step_csv '%s'", path));
  out << "method,config,step,micro_batch,tokens,cost,cost_over_mean\n";
  for (const Row& r : rows) {
    const bool wanted = r.method == kOriginal ||
                        (r.method == kFixedGreedy && r.config == "window 1") ||
                        ((r.method == kQueueRowPackers[0] || r.method == kQueueRowPackers[1]) &&
                         r.config == "2 queues");
    if (!wanted) continue;
    if (step < 0 || step >= static_cast<int64_t>(r.steps.size()) || r.steps[step].drain) {
      return absl::OutOfRangeError(absl::StrFormat(
          "--plot_step %d is not a steady step of %s (%d steps)", step, r.method, r.summary.steps));
    }
    const auto& mbs = r.steps[step].micro_batches;
    double mean = 0.0;
    for (const wlb::MicroBatch& mb : mbs) mean += mb.cost / static_cast<double>(mbs.size());
    for (size_t j = 0; j < mbs.size(); ++j) {
      out << absl::StrFormat("%s,%s,%d,%d,%d,%.6g,%.6f\n", r.method, r.config, step, j,
                             mbs[j].tokens, mbs[j].cost, mean > 0 ? mbs[j].cost / mean : 1.0);
    }
  }
  return out ? absl::OkStatus()
             : absl::DataLossError(absl::StrFormat("error writing --step_csv '%s'", path));
}

absl::Status Run() {
  absl::StatusOr<wlb::bench::BenchPlan> shared = wlb::bench::PlanFromFlags();
  if (!shared.ok()) return shared.status();
  const wlb::PlanSpec& spec = shared->spec;
  absl::StatusOr<wlb::PlanSettings> original = wlb::bench::ForPacker(spec, kOriginal).Validate();
  if (!original.ok()) return original.status();
  const wlb::PackerConfig config = original->config;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t solver_steps = absl::GetFlag(FLAGS_solver_steps);
  if (steps < 0 || solver_steps < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--steps must be >= 0 (got %d) and --solver_steps >= 1 (got %d)", steps, solver_steps));
  }
  const double solver_seconds = absl::GetFlag(FLAGS_solver_seconds);
  if (!(solver_seconds > 0.0) || !std::isfinite(solver_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--solver_seconds must be > 0, got %g", solver_seconds));
  }
  absl::StatusOr<std::vector<int>> greedy_windows =
      ParseIntList("greedy_windows", absl::GetFlag(FLAGS_greedy_windows), 1, wlb::kMaxWindow);
  absl::StatusOr<std::vector<int>> solver_windows =
      ParseIntList("solver_windows", absl::GetFlag(FLAGS_solver_windows), 1, wlb::kMaxWindow);
  absl::StatusOr<std::vector<int>> levels =
      ParseIntList("queue_levels", absl::GetFlag(FLAGS_queue_levels), 0, wlb::kMaxOutlierQueues);
  for (const auto* list : {&greedy_windows, &solver_windows, &levels}) {
    if (!list->ok()) return list->status();
  }
  absl::StatusOr<wlb::DocumentCost> made_cost = spec.MakeCost();
  if (!made_cost.ok()) return made_cost.status();
  const wlb::DocumentCost& cost = *made_cost;

  // The input stream (wlb::LoadInput, as wlb-plan reads it): a sample holds enough full steps
  // for the non-solver and the solver rows.
  const int64_t sample_steps = std::max<int64_t>(steps > 0 ? steps : 200, solver_steps);
  absl::StatusOr<wlb::Input> input =
      wlb::LoadInput({.docs = shared->input.docs,
                      .distribution = shared->input.distribution,
                      .seed = shared->input.seed,
                      .steps = shared->input.docs.empty() ? sample_steps : 0},
                     config.context, config.micro_batches);
  if (!input.ok()) return input.status();
  const std::string source = input->name;
  std::vector<std::vector<wlb::Document>> arrivals = input->steps;
  if (steps > 0 && static_cast<int64_t>(arrivals.size()) > steps) arrivals.resize(steps);
  if (arrivals.size() < 100) {
    std::fprintf(stderr,
                 "imbalance_table: note: only %zu steps of input (the table wants >= 100)\n",
                 arrivals.size());
  }
  std::vector<std::vector<wlb::Document>> solver_arrivals(
      arrivals.begin(),
      arrivals.begin() + std::min<int64_t>(solver_steps, static_cast<int64_t>(arrivals.size())));

  // A row's packer: the spec's settings with this window and queue level, checked by
  // PlanSpec::Validate as wlb-plan checks them.
  auto make = [&](const char* packer, int window,
                  int queues) -> absl::StatusOr<std::unique_ptr<wlb::Packer>> {
    wlb::PlanSpec row = wlb::bench::ForPacker(spec, packer);
    row.window = window;
    row.queues = queues;
    absl::StatusOr<wlb::PlanSettings> settings = row.Validate();
    if (!settings.ok()) return settings.status();
    return wlb::MakePacker(settings->packer, settings->config, cost, settings->options);
  };
  std::vector<Row> rows;
  std::vector<std::string> solver_lines;
  auto add = [&](absl::StatusOr<std::unique_ptr<wlb::Packer>> packer, const std::string& method,
                 const std::string& cfg,
                 const std::vector<std::vector<wlb::Document>>& input) -> absl::Status {
    if (!packer.ok()) return packer.status();
    std::fprintf(stderr, "imbalance_table: %s %s (%zu steps)\n", method.c_str(), cfg.c_str(),
                 input.size());
    absl::StatusOr<Row> row = RunRow(**packer, input, cost, method, cfg);
    if (!row.ok()) return row.status();
    rows.push_back(*std::move(row));
    if (const auto* milp = dynamic_cast<const wlb::MilpPacker*>(packer->get())) {
      // The greedy of the same window on the same steps, for a like-for-like comparison.
      absl::StatusOr<std::unique_ptr<wlb::Packer>> greedy =
          make(kFixedGreedy, milp->options().window, 0);
      if (!greedy.ok()) return greedy.status();
      absl::StatusOr<Row> same = RunRow(**greedy, input, cost, kFixedGreedy, cfg);
      if (!same.ok()) return same.status();
      solver_lines.push_back(SolverLine(*milp, rows.back(), *same));
    }
    return absl::OkStatus();
  };

  absl::Status status = add(make(kOriginal, 1, 0), kOriginal, "-", arrivals);
  for (int w : *greedy_windows) {
    if (!status.ok()) break;
    status = add(make(kFixedGreedy, w, 0), kFixedGreedy, absl::StrFormat("window %d", w), arrivals);
  }
  for (int w : absl::GetFlag(FLAGS_solver) ? *solver_windows : std::vector<int>{}) {
    if (!status.ok()) break;
    absl::StatusOr<std::unique_ptr<wlb::MilpPacker>> milp =
        wlb::MakeMilpPacker(config, cost,
                            {.window = w,
                             .time_limit_s = solver_seconds,
                             .relative_gap = absl::GetFlag(FLAGS_solver_gap)});
    if (!milp.ok()) return milp.status();
    status = add(std::unique_ptr<wlb::Packer>(std::move(*milp)), "fixed-solver",
                 absl::StrFormat("window %d", w), solver_arrivals);
  }
  for (const char* method : kQueueRowPackers) {
    for (int l : *levels) {
      if (!status.ok()) break;
      status = add(make(method, 1, l), method, absl::StrFormat("%d queue%s", l, l == 1 ? "" : "s"),
                   arrivals);
    }
  }
  if (!status.ok()) return status;

  std::printf(
      "Packing balance on %s: N = %d, S = %d, S_max = %d, cost %s; %zu steps (solver "
      "rows: the first %zu, CBC limit %g s per window, relative gap %g).\n\n",
      source.c_str(), config.micro_batches, config.context, config.max_tokens, spec.cost.c_str(),
      arrivals.size(), solver_arrivals.size(), solver_seconds, absl::GetFlag(FLAGS_solver_gap));
  std::printf(
      "| method | config | steps | imbalance mean | imbalance p90 | imbalance p99 | worst step | "
      "gap to lower bound | "
      "gap to cap-aware bound | delay (steps) | overhead (ms/step) | paper 7B-128K |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) std::printf("%s\n", MarkdownRow(r).c_str());
  if (!solver_lines.empty()) {
    std::printf(
        "\nFixed-length solver (CBC) per window: objective = heaviest micro-batch "
        "attention; start = the greedy packing of the same window; bound = CBC's proven "
        "lower bound.\n\n");
    std::printf(
        "| window | windows | proven optimal | time limit hit | better than greedy | "
        "mean wall (s) | max wall (s) | objective / greedy | (objective - bound) / "
        "objective | imbalance | greedy imbalance, same steps | fallbacks |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& line : solver_lines) std::printf("%s\n", line.c_str());
  }

  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    if (!out) return absl::NotFoundError(absl::StrFormat("cannot write --csv '%s'", path));
    out << "method,config,imbalance_mean,imbalance_p90,imbalance_p99,imbalance_max,"
           "lower_bound_gap,cap_lower_bound_gap,"
           "delay_mean,overhead_ms\n";
    for (const Row& r : rows) out << CsvRow(r) << "\n";
    if (!out) return absl::DataLossError(absl::StrFormat("error writing --csv '%s'", path));
  }
  if (const std::string path = absl::GetFlag(FLAGS_step_csv); !path.empty()) {
    return WriteStepCsv(path, absl::GetFlag(FLAGS_plot_step), rows);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  wlb::bench::ParseFlags(
      argc, argv, "Reproduces the WLB-LLM paper's Table 2 (packing imbalance) with wlb's packers.",
      {"context", "max_tokens", "micro_batches", "cost", "lookahead", "attention_range"});
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "imbalance_table: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
