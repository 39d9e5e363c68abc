// Shard planning time per micro-batch (issue targets: <= 50 us for a 128K micro-batch at C = 8,
// <= 30 us for adaptive).
//
//   build/bench/shard_benchmark --benchmark_filter=BM_Shard/
//
// BM_Shard/<strategy>/C: PlanShards on 128K-token micro-batches drawn from the embedded default
// distribution (about 33 documents each; the last document is cut to fill exactly 131072 tokens),
// cycling through 16 of them; the counters say how many documents and segments a plan had.
// BM_ShardManyDocs/<strategy>/C: the same for 1024 documents of 128 tokens, the worst case for
// per-document sharding (2C segments per document). BM_ShardKeyCopy/adaptive/C: adaptive with
// the gathered key rows' copy priced (CommModel::gather_gbps = 3350).
// BM_ShardStreams/adaptive/<distribution>/<link>/C: adaptive on 16 micro-batches of each registered
// distribution (wlb::kDistributions) at 450 and 25 GB/s, since its planning time depends on the
// documents (how many, how long) and the link (which candidates a bound rules out).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace {

constexpr int64_t kContext = 131072;

wlb::MicroBatch FromLengths(const std::vector<int64_t>& lengths) {
  wlb::MicroBatch mb;
  for (int64_t length : lengths) {
    const int64_t take = std::min(length, kContext - mb.tokens);
    if (take <= 0) break;
    mb.documents.push_back(
        wlb::Document{.id = static_cast<int64_t>(mb.documents.size()), .length = take});
    mb.tokens += take;
  }
  return mb;
}

// 16 micro-batches of 128K tokens from the registered distribution `name`.
std::vector<wlb::MicroBatch> DistributionMicroBatches(std::string_view name) {
  std::vector<wlb::MicroBatch> out;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    std::optional<std::vector<int64_t>> lengths = wlb::SampleNamedLengths(name, kContext, seed);
    if (!lengths.has_value()) std::abort();  // a registered name
    out.push_back(FromLengths(*lengths));
  }
  return out;
}

const std::vector<wlb::MicroBatch>& RealisticMicroBatches() {
  static const std::vector<wlb::MicroBatch> mbs = [] {
    std::vector<wlb::MicroBatch> out;
    for (uint64_t seed = 1; seed <= 16; ++seed) {
      out.push_back(FromLengths(wlb::SampleDefaultLengths(kContext, seed)));
    }
    return out;
  }();
  return mbs;
}

void Run(benchmark::State& state, wlb::ShardStrategy strategy,
         const std::vector<wlb::MicroBatch>& mbs, const wlb::CpPlanOptions& options = {}) {
  const int cp = static_cast<int>(state.range(0));
  const wlb::KernelModel model = wlb::KernelModel::Default();
  size_t i = 0;
  int64_t docs = 0, segments = 0, plans = 0;
  for (auto _ : state) {
    const wlb::MicroBatch& mb = mbs[i];
    absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, cp, strategy, model, options);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(plan->ranks.data());
    docs += static_cast<int64_t>(mb.documents.size());
    for (const wlb::RankShard& r : plan->ranks) segments += static_cast<int64_t>(r.segments.size());
    ++plans;
    i = (i + 1) % mbs.size();
  }
  state.counters["docs/mb"] = static_cast<double>(docs) / static_cast<double>(plans);
  state.counters["segments/mb"] = static_cast<double>(segments) / static_cast<double>(plans);
}

void Register() {
  for (const wlb::ShardStrategy s : wlb::ShardStrategy::All()) {
    const std::string name(wlb::ShardStrategyName(s));
    benchmark::RegisterBenchmark(("BM_Shard/" + name).c_str(),
                                 [s](benchmark::State& st) { Run(st, s, RealisticMicroBatches()); })
        ->ArgName("C")
        ->Arg(2)
        ->Arg(4)
        ->Arg(8)
        ->Arg(16)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_ShardManyDocs/" + name).c_str(),
                                 [s](benchmark::State& st) {
                                   static const std::vector<wlb::MicroBatch> many = {
                                       FromLengths(std::vector<int64_t>(1024, 128))};
                                   Run(st, s, many);
                                 })
        ->ArgName("C")
        ->Arg(8)
        ->Arg(16)
        ->Unit(benchmark::kMicrosecond);
  }
  // adaptive ranking with the gathered key rows' copy priced (CommModel::gather_gbps, here an
  // H100's HBM3 peak), the candidate a GPU measurement may make the default.
  benchmark::RegisterBenchmark("BM_ShardKeyCopy/adaptive",
                               [](benchmark::State& st) {
                                 Run(st, wlb::ShardStrategy("adaptive"), RealisticMicroBatches(),
                                     {.comm = {.gather_gbps = 3350.0}});
                               })
      ->ArgName("C")
      ->Arg(2)
      ->Arg(4)
      ->Arg(8)
      ->Unit(benchmark::kMicrosecond);
  for (const wlb::NamedDistribution& d : wlb::kDistributions) {
    const auto mbs =
        std::make_shared<const std::vector<wlb::MicroBatch>>(DistributionMicroBatches(d.name));
    for (const double gbps : {450.0, 25.0}) {
      const std::string name = absl::StrFormat("BM_ShardStreams/adaptive/%s/%gGBps", d.name, gbps);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [mbs, gbps](benchmark::State& st) {
                                     Run(st, wlb::ShardStrategy("adaptive"), *mbs,
                                         {.comm = {.link_gbps = gbps}});
                                   })
          ->ArgName("C")
          ->Arg(4)
          ->Arg(8)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

const int registered = (Register(), 0);

}  // namespace
