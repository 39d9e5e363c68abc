// cp_model_check: the kernel model's per-rank forward prediction against rows that
// wlb_cuda_cp_bench measured on a GPU, offline (no device needed).
//
//   wlb_cuda_cp_model_check --json=docs/results/gpu/h100_cp_bench_cudnn.jsonl
//       --profile=docs/results/gpu/h100_kernel_profile_cudnn.csv [--heads=32] [--head_dim=128]
//       [--seed=1] [--packed_profile=PATH] [--max_held_out_gap=PERCENT]
//       [--write_packed_calls=PATH]
//
// Each JSON row (kernel, cp, mb, tokens, strategy, fwd_ms per rank, max_ms) is re-planned here
// exactly as cp_bench planned it (WlbLikeMicroBatch(tokens, seed + mb), PlanShards with the
// profile model); a row whose re-planned prediction differs from the one it recorded (the
// planner changed since) is counted and left out. Readings of the same profile table:
//  - summed: the planner's PredictRankMs, each segment's time as a single-segment call;
//  - packed: each segment's padded FLOPs at the throughput the table gives for the rank's
//    total query rows (all its segments share one varlen call and fill the GPU together);
//  - packed fwd+bwd (when the table has the profiler's bwd_ms column): the packed reading of
//    the forward plus the same reading of the backward column.
// Per (C, strategy) it prints the forward readings' mean relative error against the measured
// forward ms and the fwd+bwd reading's against the measured fwd + bwd ms, and per C the
// measured cost (sum over micro-batches of the slowest rank's fwd + bwd) of picking, per
// micro-batch, the measured strategy each reading predicts fastest, beside the oracle.
//
// Then adaptive ranked by a packed-call fit (KernelModel::WithPackedCalls: per-call forward +
// backward ms from padded and masked GFLOPs, query and key rows, segments; FitPackedCalls): every
// measured rank is one packed call with its measured fwd and bwd ms. Held out by micro-batch:
// the fit of the even micro-batches' calls ranks the odd micro-batches and vice versa (no
// micro-batch is ranked by a fit that saw it); the in-sample fit of all rows is printed for its
// weights only. The same fit of the --profile table's rows (single-segment calls with bwd_ms)
// ranks every row too: can single-segment calls rank packed ones? With --packed_profile=PATH
// (wlb_cuda_kernel_profiler --packed_micro_batches=N, on other micro-batches) that profile's fit
// ranks every row as well. Per C it prints adaptive's picks and measured cost (sum over
// micro-batches of the slowest rank's fwd + bwd) under each ranking beside today's ranking (summed
// single-segment forward) and the oracle, and per (C, strategy) the held-out fit's per-rank error
// on fwd, bwd and fwd+bwd.
// With --write_packed_calls=PATH it also writes every measured rank call of the re-planned rows as
// a packed-call profile (segments, ms, bwd_ms; ReadPackedCallProfile reads it): what other tools
// (bench/sharding_table --packed_profile) fit and score plans with, without a GPU.
// Exit status: 0; 1 when no row could be re-planned, or (with --max_held_out_gap) when adaptive
// under the held-out fit lands more than PERCENT behind the oracle at some C; 2 for bad arguments
// or files.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/cp_bench_util.h"
#include "nlohmann/json.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cuda/cp_workload.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/strategies/adaptive.hpp"

namespace {

// One re-planned measured row.
struct Row {
  int cp = 0, mb = 0;
  std::string strategy;
  wlb::ShardPlan plan;
  std::vector<double> fwd, bwd;
};

std::vector<wlb::CallSegment> CallOf(const wlb::RankShard& rank) {
  std::vector<wlb::CallSegment> call;
  for (const wlb::Segment& s : rank.segments) call.push_back({s.q_len(), s.q_end});
  return call;
}

struct Errors {
  double summed = 0.0, packed = 0.0, both = 0.0;  // both: packed fwd+bwd against fwd + bwd
  int ranks = 0;
};

using Cost = std::map<std::pair<int, int>, std::map<std::string, double>>;

// The measured calls (one per rank) of the rows whose micro-batch passes `keep`.
template <typename Keep>
std::vector<wlb::PackedCallPoint> CallsOf(const std::vector<Row>& rows, Keep&& keep) {
  std::vector<wlb::PackedCallPoint> calls;
  for (const Row& r : rows) {
    if (!keep(r.mb)) continue;
    for (size_t i = 0; i < r.plan.ranks.size(); ++i) {
      if (r.fwd[i] > 0.0 && r.bwd[i] > 0.0) {
        calls.push_back({CallOf(r.plan.ranks[i]), r.fwd[i], r.bwd[i]});
      }
    }
  }
  return calls;
}

std::string Weights(const wlb::PackedCallFit& f) {
  std::string out;
  for (int j = 0; j < wlb::kPackedCallFeatureCount; ++j) {
    out += absl::StrFormat(" %s %.4g/%.4g", wlb::kPackedCallFeatureNames[j], f.fwd[j], f.bwd[j]);
  }
  return absl::StrFormat("fwd/bwd ms per unit:%s (%d calls, rms rel. error fwd %.1f%%, bwd %.1f%%)",
                         out, f.points, 100 * f.fwd_rms_relative, 100 * f.bwd_rms_relative);
}

// Adaptive ranked by packed-call fits (see the file comment). Returns the exit status.
int PackedCallRanking(const std::vector<Row>& rows, const Cost& cost,
                      const std::map<std::pair<int, int>, int64_t>& tokens_of,
                      const wlb::KernelModel& model, const std::string& profile_path,
                      const std::string& packed_profile, int64_t seed, double max_held_out_gap) {
  // Ranking models: the summed single-segment forward (today), the held-out fits (fold k ranks
  // micro-batches with mb % 2 == k, fitted on the others), the --packed_profile fit.
  std::vector<std::string> names = {"summed fwd (today)", "held-out packed fwd+bwd"};
  std::array<std::optional<wlb::KernelModel>, 2> fold;
  for (int k = 0; k < 2; ++k) {
    const std::vector<wlb::PackedCallPoint> train =
        CallsOf(rows, [k](int mb) { return mb % 2 != k; });
    absl::StatusOr<wlb::PackedCallFit> fit = wlb::FitPackedCalls(train, model);
    if (!fit.ok()) {
      std::printf("\nno packed-call fit of the micro-batches with mb %% 2 != %d: %s\n", k,
                  std::string(fit.status().message()).c_str());
      return 0;
    }
    std::printf("%sfit on mb %% 2 != %d, ranks mb %% 2 == %d: %s\n", k == 0 ? "\n" : "", k, k,
                Weights(*fit).c_str());
    fold[k] = *model.WithPackedCalls(*fit);
  }
  absl::StatusOr<wlb::PackedCallFit> all =
      wlb::FitPackedCalls(CallsOf(rows, [](int) { return true; }), model);
  if (all.ok())
    std::printf("in-sample fit of every row (weights only): %s\n", Weights(*all).c_str());
  // The same fit of the single-segment table (--profile, each row a call of one segment), when
  // it has the backward column: out of sample for every row.
  std::optional<wlb::KernelModel> single;
  {
    absl::StatusOr<std::vector<wlb::KernelProfilePoint>> f =
        wlb::ReadKernelProfilePoints(profile_path);
    absl::StatusOr<std::vector<wlb::KernelProfilePoint>> b =
        wlb::ReadKernelProfilePoints(profile_path, wlb::kBackwardMsColumn);
    if (f.ok() && b.ok() && f->size() == b->size()) {
      std::vector<wlb::PackedCallPoint> calls;
      for (size_t i = 0; i < f->size(); ++i) {
        calls.push_back({{{(*f)[i].q_len, (*f)[i].kv_len}}, (*f)[i].ms, (*b)[i].ms});
      }
      absl::StatusOr<wlb::PackedCallFit> fit = wlb::FitPackedCalls(calls, model);
      if (fit.ok()) {
        single = *model.WithPackedCalls(*fit);
        names.push_back("single-segment table fit fwd+bwd");
        std::printf("fit of the single-segment table's rows: %s\n", Weights(*fit).c_str());
      }
    }
  }
  std::optional<wlb::KernelModel> profiled;
  if (!packed_profile.empty()) {
    absl::StatusOr<wlb::KernelModel> m = wlb::WithPackedCallProfile(model, packed_profile);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 2;
    }
    profiled = *m;
    names.push_back("packed profile fwd+bwd");
    std::printf("fit of %s: %s\n", packed_profile.c_str(),
                Weights(profiled->packed_calls()).c_str());
  }
  // Per-rank error of the held-out fit per (C, strategy): fwd, bwd, fwd+bwd.
  std::map<std::pair<int, std::string>, std::array<double, 4>> err;  // sums, then ranks
  for (const Row& r : rows) {
    const wlb::KernelModel& m = *fold[size_t(r.mb % 2)];
    std::array<double, 4>& e = err[{r.cp, r.strategy}];
    for (size_t i = 0; i < r.plan.ranks.size(); ++i) {
      if (!(r.fwd[i] > 0.0) || !(r.bwd[i] > 0.0)) continue;
      const std::vector<wlb::CallSegment> call = CallOf(r.plan.ranks[i]);
      const double f = m.CallForwardMs(call), b = m.CallBackwardMs(call);
      e[0] += std::abs(f - r.fwd[i]) / r.fwd[i];
      e[1] += std::abs(b - r.bwd[i]) / r.bwd[i];
      e[2] += std::abs(f + b - r.fwd[i] - r.bwd[i]) / (r.fwd[i] + r.bwd[i]);
      e[3] += 1;
    }
  }
  std::printf(
      "\nheld-out packed-call fit, error per rank (mean |predicted - measured| / "
      "measured):\n| C | strategy | ranks | fwd | bwd | fwd+bwd |\n|---|---|---|---|---|---|\n");
  for (const auto& [key, e] : err) {
    const double n = std::max(e[3], 1.0);
    std::printf("| %d | %s | %.0f | %.1f%% | %.1f%% | %.1f%% |\n", key.first, key.second.c_str(),
                e[3], 100 * e[0] / n, 100 * e[1] / n, 100 * e[2] / n);
  }
  // Adaptive's pick per (C, mb) under each ranking, and its measured cost.
  std::map<int, std::vector<double>> total;                       // C -> per ranking, then oracle
  std::map<int, std::vector<std::map<std::string, int>>> picked;  // C -> per ranking: counts
  for (const auto& [key, measured] : cost) {
    const auto [cp, mb_index] = key;
    const wlb::MicroBatch mb =
        wlb::cuda::WlbLikeMicroBatch(tokens_of.at(key), uint64_t(seed + mb_index));
    std::vector<const wlb::KernelModel*> rank_by = {&model, &*fold[size_t(mb_index % 2)]};
    if (single) rank_by.push_back(&*single);
    if (profiled) rank_by.push_back(&*profiled);
    std::vector<double>& t = total[cp];
    t.resize(rank_by.size() + 1, 0.0);
    picked[cp].resize(rank_by.size());
    for (size_t k = 0; k < rank_by.size(); ++k) {
      absl::StatusOr<wlb::AdaptiveChoice> c =
          wlb::ChooseAdaptive(mb, cp, *rank_by[k], wlb::cuda::bench::KernelTimeOnly());
      // Adaptive's ranking among the strategies the GPU measured: its candidates added since
      // (doc-degree's greedy plan, balanced-chunks, contiguous) have no measured row to be scored
      // by. A candidate adaptive did not price (over the memory cap) has a maximum of 0.
      std::string name;
      if (c.ok()) {
        double best_ms = INFINITY;
        for (const auto& [candidate, ms] : std::initializer_list<std::pair<const char*, double>>{
                 {"per-seq", c->per_seq_max_ms},
                 {"per-seq-ordered", c->per_seq_ordered_max_ms},
                 {"per-doc", c->per_doc_max_ms},
                 {"hybrid", c->hybrid_max_ms},
                 {"doc-degree", c->doc_degree_max_ms},
                 {"balanced-chunks", c->balanced_chunks_max_ms},
                 {"contiguous", c->contiguous_max_ms}}) {
          if (ms > 0.0 && ms < best_ms && measured.contains(candidate)) {
            best_ms = ms;
            name = candidate;
          }
        }
      }
      if (!c.ok() || !measured.contains(name)) {
        std::fprintf(stderr, "C %d mb %d: adaptive under %s picked %s, not measured\n", cp,
                     mb_index, names[k].c_str(), c.ok() ? name.c_str() : "nothing");
        return 2;
      }
      t[k] += measured.at(name);
      ++picked[cp][k][name];
    }
    double best = INFINITY;
    for (const auto& [name, ms] : measured) best = std::min(best, ms);
    t.back() += best;
  }
  std::printf(
      "\nadaptive's measured cost by ranking (sum over micro-batches of the slowest rank's "
      "fwd+bwd ms; picks per strategy):\n| C | ranking | cost | vs oracle | picks |\n"
      "|---|---|---|---|---|\n");
  for (const auto& [cp, t] : total) {
    for (size_t k = 0; k + 1 < t.size(); ++k) {
      std::string picks;
      for (const auto& [name, n] : picked[cp][k]) picks += absl::StrFormat(" %s %d", name, n);
      std::printf("| %d | %s | %.1f | %+.1f%% |%s |\n", cp, names[k].c_str(), t[k],
                  100 * (t[k] / t.back() - 1), picks.c_str());
    }
    std::printf("| %d | oracle | %.1f | | |\n", cp, t.back());
  }
  int status = 0;
  for (const auto& [cp, t] : total) {
    const double gap = 100 * (t[1] / t.back() - 1);
    if (max_held_out_gap >= 0 && gap > max_held_out_gap) {
      std::printf(
          "FAIL: C = %d: adaptive under the held-out fit is %.2f%% behind the oracle "
          "(--max_held_out_gap=%g)\n",
          cp, gap, max_held_out_gap);
      status = 1;
    }
  }
  return status;
}

// --write_packed_calls: every measured rank call of `rows` (both times measured) as a
// packed-call profile. Returns the exit status.
int WritePackedCalls(const std::vector<Row>& rows, const std::string& json,
                     const std::string& profile, int64_t seed, const std::string& path) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "cp_model_check: cannot write %s\n", path.c_str());
    return 2;
  }
  // File names only, so the file is the same from any working directory (a test compares it).
  out << "# packed calls: the per-rank fwd/bwd ms of " << std::filesystem::path(json).filename()
      << " with the segments of its rows re-planned (profile "
      << std::filesystem::path(profile).filename() << ", seed " << seed
      << ") by wlb_cuda_cp_model_check --write_packed_calls\n"
      << "cp,mb,strategy,rank,ms,bwd_ms,segments\n";
  int64_t calls = 0;
  for (const Row& r : rows) {
    for (size_t i = 0; i < r.plan.ranks.size(); ++i) {
      if (!(r.fwd[i] > 0.0) || !(r.bwd[i] > 0.0)) continue;
      std::string segments;
      for (const wlb::CallSegment& c : CallOf(r.plan.ranks[i])) {
        segments += absl::StrFormat("%s%d:%d", segments.empty() ? "" : " ", c.q_len, c.kv_len);
      }
      out << absl::StrFormat("%d,%d,%s,%d,%.6g,%.6g,%s\n", r.cp, r.mb, r.strategy, i, r.fwd[i],
                             r.bwd[i], segments);
      ++calls;
    }
  }
  out.close();
  if (!out) {
    std::fprintf(stderr, "cp_model_check: cannot write %s\n", path.c_str());
    return 2;
  }
  std::printf("wrote %lld packed calls to %s\n", static_cast<long long>(calls), path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wlb::cuda::bench::Flags flags(argc, argv);
  std::string json, profile, packed_profile, gap_text, write_packed_calls;
  int64_t heads = 32, head_dim = 128, seed = 1;
  double max_held_out_gap = -1;  // percent; negative: no check
  if (!(flags.Str("json", &json) && flags.Str("profile", &profile) && flags.Int("heads", &heads) &&
        flags.Int("head_dim", &head_dim) && flags.Int("seed", &seed) &&
        flags.Str("packed_profile", &packed_profile) && flags.Str("max_held_out_gap", &gap_text) &&
        flags.Str("write_packed_calls", &write_packed_calls) && flags.AllUsed()) ||
      json.empty() || profile.empty() ||
      !(gap_text.empty() || (absl::SimpleAtod(gap_text, &max_held_out_gap) &&
                             max_held_out_gap >= 0 && std::isfinite(max_held_out_gap)))) {
    std::fprintf(stderr,
                 "usage: see the comment at the top of cp_model_check.cc (--json and "
                 "--profile are required; --max_held_out_gap a percent >= 0)\n");
    return 2;
  }
  wlb::KernelShape shape;
  shape.heads = heads;
  shape.head_dim = head_dim;
  absl::StatusOr<wlb::KernelModel> model = wlb::ReadKernelProfileCsv(profile, shape);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 2;
  }
  // The backward column is optional (older tables have none): without it the fwd+bwd reading
  // is left out.
  absl::StatusOr<wlb::KernelModel> backward =
      wlb::ReadKernelProfileCsv(profile, shape, 0.0, wlb::kBackwardMsColumn);
  if (!backward.ok()) {
    std::printf("no fwd+bwd reading: %s\n", std::string(backward.status().message()).c_str());
  }
  std::ifstream in(json);
  if (!in) {
    std::fprintf(stderr, "cp_model_check: cannot read %s\n", json.c_str());
    return 2;
  }
  std::map<std::pair<int, std::string>, Errors> errors;               // (C, strategy)
  std::map<std::pair<int, int>, std::map<std::string, double>> cost;  // (C, mb) -> measured
  // (C, mb) -> strategy -> predicted slowest rank per reading: summed, packed, packed fwd+bwd.
  std::map<std::pair<int, int>, std::map<std::string, std::array<double, 3>>> slowest;
  std::vector<Row> rows;
  std::map<std::pair<int, int>, int64_t> tokens_of;  // (C, mb) -> tokens
  int used = 0, replanned_differently = 0, adaptive_rows = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    try {
      const nlohmann::json r = nlohmann::json::parse(line);
      const int cp = r.at("cp").get<int>(), mb_index = r.at("mb").get<int>();
      const std::string name = r.at("strategy").get<std::string>();
      // cp_bench's adaptive row is the executed default, planned with kernel time alone; its plan
      // is one of the candidates', whose rows this check re-plans and ranks.
      if (name == "adaptive") {
        ++adaptive_rows;
        continue;
      }
      const std::vector<double> fwd = r.at("fwd_ms").get<std::vector<double>>();
      const std::vector<double> bwd = r.at("bwd_ms").get<std::vector<double>>();
      const std::vector<double> recorded = r.at("predicted_fwd_ms").get<std::vector<double>>();
      absl::StatusOr<wlb::ShardStrategy> strategy = wlb::ParseShardStrategy(name);
      if (!strategy.ok()) throw std::invalid_argument(std::string(strategy.status().message()));
      const wlb::MicroBatch mb = wlb::cuda::WlbLikeMicroBatch(
          r.at("tokens").get<int64_t>(), static_cast<uint64_t>(seed + mb_index));
      absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, cp, *strategy, *model);
      if (!plan.ok()) throw std::invalid_argument(std::string(plan.status().message()));
      const std::vector<double> summed = wlb::PredictRankMs(*plan, *model);
      bool same = summed.size() == recorded.size() && fwd.size() == summed.size() &&
                  bwd.size() == summed.size();
      for (size_t i = 0; same && i < summed.size(); ++i) {
        same = std::abs(summed[i] - recorded[i]) <= 1e-3 * std::max(recorded[i], 1e-3);
      }
      if (!same) {
        ++replanned_differently;
        continue;
      }
      ++used;
      Errors& e = errors[{cp, name}];
      std::array<double, 3> worst{0.0, 0.0, 0.0};
      for (size_t i = 0; i < summed.size(); ++i) {
        const double packed = model->PackedMs(CallOf(plan->ranks[i]));
        const double both =
            backward.ok() ? packed + backward->PackedMs(CallOf(plan->ranks[i])) : 0.0;
        worst = {std::max(worst[0], summed[i]), std::max(worst[1], packed),
                 std::max(worst[2], both)};
        if (!(fwd[i] > 0.0) || !(bwd[i] > 0.0)) continue;
        e.summed += std::abs(summed[i] - fwd[i]) / fwd[i];
        e.packed += std::abs(packed - fwd[i]) / fwd[i];
        e.both += std::abs(both - (fwd[i] + bwd[i])) / (fwd[i] + bwd[i]);
        ++e.ranks;
      }
      cost[{cp, mb_index}][name] = r.at("max_ms").get<double>();
      tokens_of[{cp, mb_index}] = mb.tokens;
      rows.push_back(Row{cp, mb_index, name, *plan, fwd, bwd});
      slowest[{cp, mb_index}][name] = worst;
    } catch (const std::exception& ex) {  // nlohmann's and the re-planning errors above
      std::fprintf(stderr, "cp_model_check: %s line %d: %s\n", json.c_str(), line_no, ex.what());
      return 2;
    }
  }
  std::printf(
      "%s against %s: %d rows re-planned as measured, %d planned differently (left "
      "out)%s\n",
      profile.c_str(), json.c_str(), used, replanned_differently,
      adaptive_rows > 0
          ? absl::StrFormat(", %d adaptive rows not re-planned", adaptive_rows).c_str()
          : "");
  if (used == 0) return 1;
  std::printf(
      "\nprediction error per rank (mean |predicted - measured| / measured; the forward "
      "readings against the measured forward ms):\n");
  std::printf(
      "| C | strategy | ranks | summed single-segment calls | packed (rank's query rows) "
      "| packed fwd+bwd against fwd+bwd |\n|---|---|---|---|---|---|\n");
  for (const auto& [key, e] : errors) {
    const double n = std::max(e.ranks, 1);
    std::printf("| %d | %s | %d | %.1f%% | %.1f%% | %s |\n", key.first, key.second.c_str(), e.ranks,
                100 * e.summed / n, 100 * e.packed / n,
                backward.ok() ? absl::StrFormat("%.1f%%", 100 * e.both / n).c_str() : "-");
  }
  std::printf(
      "\npicking per micro-batch the measured strategy each reading predicts fastest "
      "(sum of the slowest rank's measured fwd+bwd ms):\n");
  std::printf(
      "| C | micro-batches | summed pick | packed pick | packed fwd+bwd pick | oracle |\n"
      "|---|---|---|---|---|---|\n");
  std::map<int, std::array<double, 4>> picks;  // the three readings' picks, then the oracle
  std::map<int, int> micro_batches;
  for (const auto& [key, measured] : cost) {
    const auto& predicted = slowest[key];
    std::array<std::string, 3> pick;
    double best = INFINITY;
    for (const auto& [name, ms] : measured) {
      best = std::min(best, ms);
      for (size_t k = 0; k < pick.size(); ++k) {
        if (pick[k].empty() || predicted.at(name)[k] < predicted.at(pick[k])[k]) pick[k] = name;
      }
    }
    std::array<double, 4>& p = picks[key.first];
    for (size_t k = 0; k < pick.size(); ++k) p[k] += measured.at(pick[k]);
    p[3] += best;
    ++micro_batches[key.first];
  }
  for (const auto& [cp, p] : picks) {
    std::printf("| %d | %d | %.1f | %.1f | %s | %.1f |\n", cp, micro_batches[cp], p[0], p[1],
                backward.ok() ? absl::StrFormat("%.1f", p[2]).c_str() : "-", p[3]);
  }
  if (!write_packed_calls.empty()) {
    if (int status = WritePackedCalls(rows, json, profile, seed, write_packed_calls); status != 0) {
      return status;
    }
  }
  return PackedCallRanking(rows, cost, tokens_of, *model, profile, packed_profile, seed,
                           max_held_out_gap);
}
