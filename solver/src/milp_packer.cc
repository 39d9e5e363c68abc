// The fixed-length MILP baseline on COIN-OR CBC (formulation in milp_packer.hpp).
#include "wlb/solver/milp_packer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "Cbc_C_Interface.h"
#include "absl/strings/str_format.h"

namespace wlb {
namespace {

// Owns a Cbc_Model (the C interface is CBC's stable API; CbcMain's C++ entry points change).
struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};
using CbcModelPtr = std::unique_ptr<Cbc_Model, CbcDeleter>;

// The heaviest bin's attention work of an assignment, and its carried tokens.
struct Evaluation {
  double heaviest = 0.0;
  int64_t carried = 0;
};

Evaluation Evaluate(const MilpInstance& in, const std::vector<int>& bin, const DocumentCost& cost) {
  std::vector<double> load(static_cast<size_t>(in.bins), 0.0);
  Evaluation e;
  for (size_t i = 0; i < bin.size(); ++i) {
    if (bin[i] < 0) {
      e.carried += in.lengths[i];
    } else {
      load[static_cast<size_t>(bin[i])] += cost.Attention(in.lengths[i]);
    }
  }
  for (double l : load) e.heaviest = std::max(e.heaviest, l);
  return e;
}

// Checks an assignment against every constraint of the instance.
absl::Status CheckAssignment(const MilpInstance& in, const std::vector<int>& bin,
                             std::string_view what) {
  if (bin.size() != in.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s assigns %d documents, the instance has %d", what, bin.size(), in.lengths.size()));
  }
  std::vector<int64_t> tokens(static_cast<size_t>(in.bins), 0);
  int64_t carried = 0;
  for (size_t i = 0; i < bin.size(); ++i) {
    if (bin[i] < -1 || bin[i] >= in.bins) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s puts document %d into micro-batch %d of %d", what, i, bin[i], in.bins));
    }
    if (bin[i] < 0) {
      if (!in.must_place.empty() && in.must_place[i]) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s carries document %d, which must be placed", what, i));
      }
      carried += in.lengths[i];
    } else if ((tokens[static_cast<size_t>(bin[i])] += in.lengths[i]) > in.capacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s overfills micro-batch %d beyond %d tokens", what, bin[i], in.capacity));
    }
  }
  if (carried > in.carry_budget) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s carries %d tokens, over the budget of %d", what, carried, in.carry_budget));
  }
  return absl::OkStatus();
}

// The fixed-length greedy rule (as wlb::FixedGreedyPacker): in the given order, each document
// goes to the micro-batch with the least attention work that has room, else it is carried.
std::vector<int> GreedyAssign(std::span<const Document> docs, int bins, int64_t capacity,
                              const DocumentCost& cost) {
  std::vector<int> bin(docs.size(), -1);
  std::vector<int64_t> tokens(static_cast<size_t>(bins), 0);
  std::vector<double> attention(static_cast<size_t>(bins), 0.0);
  for (size_t i = 0; i < docs.size(); ++i) {
    int best = -1;
    for (int b = 0; b < bins; ++b) {
      if (tokens[b] + docs[i].length <= capacity && (best < 0 || attention[b] < attention[best])) {
        best = b;
      }
    }
    if (best < 0) continue;
    bin[i] = best;
    tokens[best] += docs[i].length;
    attention[best] += cost.Attention(docs[i].length);
  }
  return bin;
}

}  // namespace

absl::StatusOr<MilpSolution> SolveFixedLengthMilp(const MilpInstance& in, const DocumentCost& cost,
                                                  const MilpOptions& options) {
  const int n = static_cast<int>(in.lengths.size());
  const int bins = in.bins;
  if (bins < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("MILP needs >= 1 micro-batch, got %d", bins));
  }
  if (in.capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MILP capacity must be >= 1 token, got %d", in.capacity));
  }
  if (!in.must_place.empty() && in.must_place.size() != in.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "must_place has %d entries for %d documents", in.must_place.size(), n));
  }
  for (int i = 0; i < n; ++i) {
    if (in.lengths[i] < 1 || in.lengths[i] > in.capacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d: length %d is outside [1, %d]", i, in.lengths[i], in.capacity));
    }
  }
  if (!(options.time_limit_s > 0.0) || !(options.relative_gap >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MILP time limit must be > 0 s (got %g) and gap >= 0 (got %g)",
                        options.time_limit_s, options.relative_gap));
  }
  const bool has_start = !in.start.empty();
  if (has_start) {
    if (absl::Status s = CheckAssignment(in, in.start, "the start"); !s.ok()) return s;
  }

  MilpSolution out;
  out.stats.documents = n;
  out.stats.bins = bins;
  if (has_start) out.stats.start_objective = Evaluate(in, in.start, cost).heaviest;

  // Columns: x_ij at i*bins + j, then y_i, then z. Rows: assignment (n), capacity (bins),
  // objective (bins), carry budget (1), then z + W_a(d_i) y_i >= W_a(d_i) (n): valid, since a
  // placed document lands whole in one micro-batch, and it lifts the LP bound from the mean load to
  // the heaviest placed document, which often proves a window optimal at once. Work and tokens are
  // scaled to O(1) for CBC's tolerances: attention by the mean load, tokens by the capacity.
  std::vector<double> attention(n);
  double total_attention = 0.0;
  for (int i = 0; i < n; ++i) total_attention += attention[i] = cost.Attention(in.lengths[i]);
  const double work_scale = total_attention > 0.0 ? total_attention / bins : 1.0;
  const double token_scale = static_cast<double>(in.capacity);
  const int x0 = 0, y0 = n * bins, zc = n * bins + n, cols = zc + 1;
  const int assign_row = 0, cap_row = n, obj_row = n + bins, budget_row = n + 2 * bins;
  const int heavy_row = budget_row + 1, rows = heavy_row + n;

  std::vector<CoinBigIndex> start;
  std::vector<int> index;
  std::vector<double> value;
  start.reserve(cols + 1);
  auto entry = [&](int row, double v) {
    index.push_back(row);
    value.push_back(v);
  };
  for (int i = 0; i < n; ++i) {
    const double tokens = static_cast<double>(in.lengths[i]) / token_scale;
    const double work = attention[i] / work_scale;
    for (int j = 0; j < bins; ++j) {
      start.push_back(static_cast<CoinBigIndex>(index.size()));
      entry(assign_row + i, 1.0);
      entry(cap_row + j, tokens);
      if (work > 0.0) entry(obj_row + j, work);
    }
  }
  for (int i = 0; i < n; ++i) {
    start.push_back(static_cast<CoinBigIndex>(index.size()));
    entry(assign_row + i, 1.0);
    entry(budget_row, static_cast<double>(in.lengths[i]) / token_scale);
    entry(heavy_row + i, attention[i] / work_scale);
  }
  start.push_back(static_cast<CoinBigIndex>(index.size()));
  for (int j = 0; j < bins; ++j) entry(obj_row + j, -1.0);
  for (int i = 0; i < n; ++i) entry(heavy_row + i, 1.0);
  start.push_back(static_cast<CoinBigIndex>(index.size()));

  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> col_lb(cols, 0.0), col_ub(cols, 1.0), obj(cols, 0.0);
  for (int i = 0; i < n; ++i) {
    if (!in.must_place.empty() && in.must_place[i]) col_ub[y0 + i] = 0.0;
  }
  col_ub[zc] = inf;
  obj[zc] = 1.0;
  std::vector<double> row_lb(rows), row_ub(rows);
  for (int i = 0; i < n; ++i) {
    row_lb[assign_row + i] = row_ub[assign_row + i] = 1.0;
    row_lb[heavy_row + i] = attention[i] / work_scale, row_ub[heavy_row + i] = inf;
  }
  for (int j = 0; j < bins; ++j) {
    row_lb[cap_row + j] = -inf, row_ub[cap_row + j] = 1.0;
    row_lb[obj_row + j] = -inf, row_ub[obj_row + j] = 0.0;
  }
  row_lb[budget_row] = -inf;
  row_ub[budget_row] = static_cast<double>(in.carry_budget) / token_scale;

  CbcModelPtr model(Cbc_newModel());
  Cbc_loadProblem(model.get(), cols, rows, start.data(), index.data(), value.data(), col_lb.data(),
                  col_ub.data(), obj.data(), row_lb.data(), row_ub.data());
  for (int c = 0; c < zc; ++c) Cbc_setInteger(model.get(), c);
  Cbc_setLogLevel(model.get(), 0);
  Cbc_setMaximumSeconds(model.get(), options.time_limit_s);
  Cbc_setAllowableFractionGap(model.get(), options.relative_gap);
  if (has_start && options.greedy_start) {
    std::vector<int> idx;
    std::vector<double> val;
    for (int i = 0; i < n; ++i) {
      idx.push_back(in.start[i] < 0 ? y0 + i : x0 + i * bins + in.start[i]);
      val.push_back(1.0);
    }
    idx.push_back(zc);
    val.push_back(out.stats.start_objective / work_scale);
    Cbc_setMIPStartI(model.get(), static_cast<int>(idx.size()), idx.data(), val.data());
  }

  const auto t0 = std::chrono::steady_clock::now();
  Cbc_solve(model.get());
  out.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.stats.time_limit_hit = Cbc_isSecondsLimitReached(model.get()) != 0;
  out.stats.optimal = Cbc_isProvenOptimal(model.get()) != 0;
  out.stats.best_bound = std::max(0.0, Cbc_getBestPossibleObjValue(model.get()) * work_scale);

  // Read back the incumbent (rounded: CBC's integers are within its tolerance of 0 or 1) and
  // check it ourselves; keep the start when CBC has nothing valid or nothing better.
  std::vector<int> bin;
  if (const double* x = Cbc_bestSolution(model.get()); x != nullptr) {
    bin.assign(n, -1);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < bins; ++j) {
        if (x[x0 + i * bins + j] > 0.5) bin[i] = j;
      }
    }
    if (!CheckAssignment(in, bin, "CBC's solution").ok()) bin.clear();
  }
  const bool compare_to_start = has_start && options.greedy_start;
  if (!bin.empty() &&
      (!compare_to_start || Evaluate(in, bin, cost).heaviest <= out.stats.start_objective)) {
    out.bin = std::move(bin);
    out.stats.solver_solution = true;
  } else if (has_start) {
    out.bin = in.start;
  } else {
    return absl::NotFoundError(absl::StrFormat(
        "CBC found no feasible packing of %d documents into %d micro-batches in %.1f s", n, bins,
        out.stats.seconds));
  }
  const Evaluation e = Evaluate(in, out.bin, cost);
  out.stats.objective = e.heaviest;
  out.stats.carried_tokens = e.carried;
  out.stats.best_bound = std::min(out.stats.best_bound, out.stats.objective);
  return out;
}

MilpPacker::MilpPacker(PackerConfig config, DocumentCost cost, MilpOptions options)
    : WindowedPacker(config, std::move(cost), options.window), options_(options) {}

nlohmann::json MilpPacker::ConfigJson() const {
  nlohmann::json j = WindowedPacker::ConfigJson();
  j["time_limit_s"] = options_.time_limit_s;
  j["greedy_start"] = options_.greedy_start;
  j["relative_gap"] = options_.relative_gap;
  return j;
}

std::vector<MicroBatch> MilpPacker::PackWindow(const std::vector<Document>& carry,
                                               const std::vector<Document>& fresh, int steps,
                                               std::vector<Document>& leftover) {
  std::vector<Document> docs = carry;
  const size_t carried_in = docs.size();
  docs.insert(docs.end(), fresh.begin(), fresh.end());
  const int bins = steps * config_.micro_batches;

  MilpInstance in;
  in.bins = bins;
  in.capacity = config_.context;
  in.start = GreedyAssign(docs, bins, config_.context, cost_);
  in.must_place.assign(docs.size(), false);
  for (size_t i = 0; i < docs.size(); ++i) {
    in.lengths.push_back(docs[i].length);
    if (in.start[i] < 0) {
      in.carry_budget += docs[i].length;
    } else if (i < carried_in) {
      in.must_place[i] = true;
    }
  }
  std::vector<int> bin = in.start;
  if (!docs.empty()) {
    absl::StatusOr<MilpSolution> solution = SolveFixedLengthMilp(in, cost_, options_);
    if (solution.ok()) {
      bin = std::move(solution->bin);
      solves_.push_back(solution->stats);
    } else {
      ++fallbacks_;  // CBC failed: keep the (valid) greedy packing so no document is lost
    }
  }
  std::vector<MicroBatch> micro_batches(static_cast<size_t>(bins));
  for (size_t i = 0; i < docs.size(); ++i) {
    if (bin[i] < 0) {
      leftover.push_back(docs[i]);
    } else {
      Add(micro_batches[static_cast<size_t>(bin[i])], docs[i]);
    }
  }
  return micro_batches;
}

absl::StatusOr<std::unique_ptr<MilpPacker>> MakeMilpPacker(const PackerConfig& config,
                                                           DocumentCost cost,
                                                           const MilpOptions& options) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (options.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fixed-solver window must be >= 1 step, got %d", options.window));
  }
  if (!(options.time_limit_s > 0.0) || !std::isfinite(options.time_limit_s)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fixed-solver time limit must be a positive number of seconds, got %g",
        options.time_limit_s));
  }
  if (!(options.relative_gap >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fixed-solver relative gap must be >= 0, got %g", options.relative_gap));
  }
  return std::make_unique<MilpPacker>(config, std::move(cost), options);
}

}  // namespace wlb
