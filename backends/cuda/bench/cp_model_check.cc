// cp_model_check: the kernel model's per-rank forward prediction against rows that
// wlb_cuda_cp_bench measured on a GPU, offline (no device needed).
//
//   wlb_cuda_cp_model_check --json=docs/results/gpu/h100_cp_bench_cudnn.jsonl
//       --profile=docs/results/gpu/h100_kernel_profile_cudnn.csv [--heads=32] [--head_dim=128]
//       [--seed=1]
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
// Exit status: 0; 1 when no row could be re-planned; 2 for bad arguments or files.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/cp_bench_util.h"
#include "nlohmann/json.hpp"
#include "wlb/cuda/cp_workload.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace {

// The packed reading of `model` for one rank (see the file comment).
double PackedRankMs(const wlb::RankShard& rank, const wlb::KernelModel& model) {
  int64_t rows = 0;
  for (const wlb::Segment& s : rank.segments) rows += s.q_len();
  double ms = 0.0;
  for (const wlb::Segment& s : rank.segments) {
    if (s.q_len() <= 0) continue;
    ms += model.PaddedFlops(s.q_len(), s.q_end) / model.FlopsPerMs(rows, s.q_end) +
          model.segment_overhead_ms();
  }
  return ms;
}

struct Errors {
  double summed = 0.0, packed = 0.0, both = 0.0;  // both: packed fwd+bwd against fwd + bwd
  int ranks = 0;
};

}  // namespace

int main(int argc, char** argv) {
  wlb::cuda::bench::Flags flags(argc, argv);
  std::string json, profile;
  int64_t heads = 32, head_dim = 128, seed = 1;
  if (!(flags.Str("json", &json) && flags.Str("profile", &profile) &&
        flags.Int("heads", &heads) && flags.Int("head_dim", &head_dim) &&
        flags.Int("seed", &seed) && flags.AllUsed()) ||
      json.empty() || profile.empty()) {
    std::fprintf(stderr, "usage: see the comment at the top of cp_model_check.cc (--json and "
                         "--profile are required)\n");
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
  int used = 0, replanned_differently = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    try {
      const nlohmann::json r = nlohmann::json::parse(line);
      const int cp = r.at("cp").get<int>(), mb_index = r.at("mb").get<int>();
      const std::string name = r.at("strategy").get<std::string>();
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
        const double packed = PackedRankMs(plan->ranks[i], *model);
        const double both =
            backward.ok() ? packed + PackedRankMs(plan->ranks[i], *backward) : 0.0;
        worst = {std::max(worst[0], summed[i]), std::max(worst[1], packed),
                 std::max(worst[2], both)};
        if (!(fwd[i] > 0.0) || !(bwd[i] > 0.0)) continue;
        e.summed += std::abs(summed[i] - fwd[i]) / fwd[i];
        e.packed += std::abs(packed - fwd[i]) / fwd[i];
        e.both += std::abs(both - (fwd[i] + bwd[i])) / (fwd[i] + bwd[i]);
        ++e.ranks;
      }
      cost[{cp, mb_index}][name] = r.at("max_ms").get<double>();
      slowest[{cp, mb_index}][name] = worst;
    } catch (const std::exception& ex) {  // nlohmann's and the re-planning errors above
      std::fprintf(stderr, "cp_model_check: %s line %d: %s\n", json.c_str(), line_no, ex.what());
      return 2;
    }
  }
  std::printf("%s against %s: %d rows re-planned as measured, %d planned differently (left "
              "out)\n",
              profile.c_str(), json.c_str(), used, replanned_differently);
  if (used == 0) return 1;
  std::printf("\nprediction error per rank (mean |predicted - measured| / measured; the forward "
              "readings against the measured forward ms):\n");
  std::printf("| C | strategy | ranks | summed single-segment calls | packed (rank's query rows) "
              "| packed fwd+bwd against fwd+bwd |\n|---|---|---|---|---|---|\n");
  for (const auto& [key, e] : errors) {
    const double n = std::max(e.ranks, 1);
    std::printf("| %d | %s | %d | %.1f%% | %.1f%% | %s |\n", key.first, key.second.c_str(),
                e.ranks, 100 * e.summed / n, 100 * e.packed / n,
                backward.ok() ? absl::StrFormat("%.1f%%", 100 * e.both / n).c_str() : "-");
  }
  std::printf("\npicking per micro-batch the measured strategy each reading predicts fastest "
              "(sum of the slowest rank's measured fwd+bwd ms):\n");
  std::printf("| C | micro-batches | summed pick | packed pick | packed fwd+bwd pick | oracle |\n"
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
  return 0;
}
