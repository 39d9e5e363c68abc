// Planning time per step (target: <= 0.5 ms per step at N = 64, S = 128K on one core, for wlb,
// wlb-refine and wlb-lookahead).
//
//   build/bench/plan_step_benchmark --benchmark_filter=N64
//
// BM_PlanStep/<packer>/N (every packer of wlb::kPackers, configured by a wlb::PlanSpec as
// wlb-plan would): one Push() of a step of the embedded default distribution (N x 128K
// tokens, about 33 documents per micro-batch); the packer keeps its state across iterations, as in
// training (wlb-lookahead, K = 1, returns the plan of the step pushed one call earlier, so every
// Push() after the first plans one step). BM_Scaling/<packer>/N: the same for N = 4 ... 4,096 at
// S = 128K (a step holds about 33 x N documents), to show that planning time is linear in the
// step's documents at every N: the counter ns/doc, the time per document of the step, should stay
// flat from N = 4 to N = 4,096. BM_ScalingDocs/<packer>/docs: N = 64 with S chosen so a step holds
// about `docs` documents (the counter docs/step says how many it really held).
//
//   build/bench/plan_step_benchmark --benchmark_filter='BM_Scaling/' --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <string>

#include "wlb/wlb.hpp"

namespace {

struct Stream {
  wlb::PackerConfig config;
  std::vector<std::vector<wlb::Document>> steps;
};

// `steps` steps of the default distribution at N = n and window S = context.
Stream MakeStream(int32_t n, int64_t context, int64_t steps) {
  Stream s;
  s.config = {.context = context, .max_tokens = wlb::DefaultMaxTokens(context), .micro_batches = n};
  std::vector<int64_t> lengths = wlb::SampleDefaultLengths(steps * n * context, /*seed=*/1);
  s.steps = *wlb::SplitIntoSteps(*wlb::MakeDocuments(lengths, context), n * context);
  s.steps.resize(std::min<size_t>(s.steps.size(), steps));
  return s;
}

void RunSteps(benchmark::State& state, const std::string& packer, const Stream& s,
              const wlb::DocumentCost& cost = *wlb::CostModelFromPreset("llama2-7b")) {
  // wlb-plan's defaults for this packer, S and N (two default outlier queues, S_max = S + S/4).
  const wlb::PlanSpec spec{
      .packer = packer, .context = s.config.context, .micro_batches = s.config.micro_batches};
  absl::StatusOr<wlb::PlanSettings> plan = spec.Validate();
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  auto p = wlb::MakePacker(plan->packer, plan->config, cost, plan->options);
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return;
  }
  size_t next = 0;
  int64_t docs = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<wlb::Document> arrivals = s.steps[next];
    docs += static_cast<int64_t>(arrivals.size());
    next = (next + 1) % s.steps.size();
    state.ResumeTiming();
    auto ready = (*p)->Push(std::move(arrivals));
    benchmark::DoNotOptimize(ready);
  }
  state.counters["docs/step"] =
      benchmark::Counter(static_cast<double>(docs), benchmark::Counter::kAvgIterations);
  // Time per document planned, in nanoseconds (the inverse of a rate of 10^-9 documents/s).
  state.counters["ns/doc"] = benchmark::Counter(
      static_cast<double>(docs) * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_PlanStep(benchmark::State& state, std::string packer) {
  static std::map<int64_t, Stream> streams;
  const int32_t n = static_cast<int32_t>(state.range(0));
  if (!streams.count(n)) streams[n] = MakeStream(n, 131072, 16);
  RunSteps(state, packer, streams[n]);
}

void BM_Scaling(benchmark::State& state, std::string packer) {
  static std::map<int64_t, Stream> streams;
  const int32_t n = static_cast<int32_t>(state.range(0));
  // 16 steps, fewer at large N (at least 4, so wlb-lookahead's queues fill and release): about
  // 33 x N documents a step, 135,000 at N = 4,096.
  const int64_t steps = std::clamp<int64_t>(16384 / n, 4, 16);
  if (!streams.count(n)) streams[n] = MakeStream(n, 131072, steps);
  RunSteps(state, packer, streams[n]);
}

void BM_ScalingDocs(benchmark::State& state, std::string packer) {
  static std::map<int64_t, Stream> streams;
  const int64_t docs = state.range(0);
  // The default distribution averages ~3,960 tokens per document: pick S so that a step of N = 64
  // micro-batches holds about `docs` documents (S < 128K splits the longest ones into pieces).
  const int64_t context = std::max<int64_t>(64, docs * 3962 / 64);
  const int64_t steps = std::clamp<int64_t>(2000000 / docs, 2, 16);
  if (!streams.count(docs)) streams[docs] = MakeStream(64, context, steps);
  RunSteps(state, packer, streams[docs]);
}

// The FLOP polynomial behind the type-erased path (DocumentCost::From), to compare with its
// inline fast path.
struct ErasedPolynomial {
  wlb::CostModel model;
  double Attention(int64_t d) const { return model.Attention(d); }
  double Linear(int64_t d) const { return model.Linear(d); }
};

// BM_PlanStepCost/<cost>/N: wlb's Push() with the cost given as the polynomial (the fast path
// every CostModel caller gets), as the same polynomial through the type-erased path, and as a
// tile-aware table of the polynomial's values at powers of two (64 .. 128K tokens).
void BM_PlanStepCost(benchmark::State& state, std::string kind) {
  static std::map<int64_t, Stream> streams;
  const int32_t n = static_cast<int32_t>(state.range(0));
  if (!streams.count(n)) streams[n] = MakeStream(n, 131072, 16);
  const wlb::CostModel poly = *wlb::CostModelFromPreset("llama2-7b");
  std::vector<wlb::ProfilePoint> points;
  for (int64_t d = 64; d <= 131072; d *= 2) points.push_back({d, poly(d)});
  const wlb::DocumentCost cost =
      kind == "polynomial" ? wlb::DocumentCost(poly)
      : kind == "erased"
          ? wlb::DocumentCost::From(ErasedPolynomial{poly}, "flop", "erased")
          : wlb::DocumentCost::From(*wlb::TabulatedCost::Create(points), "flop", "table");
  RunSteps(state, "wlb", streams[n], cost);
}

}  // namespace

BENCHMARK_CAPTURE(BM_PlanStepCost, polynomial, std::string("polynomial"))
    ->Arg(4)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PlanStepCost, erased, std::string("erased"))
    ->Arg(4)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PlanStepCost, table, std::string("table"))
    ->Arg(4)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond);
// BM_PlanStep/<packer>/N and BM_Scaling/<packer>/N for every packer of the registry
// (wlb::kPackers; '-' in a name becomes '_').
[[maybe_unused]] const bool kPackerBenchmarks = [] {
  const auto label = [](const char* name) {
    std::string l = name;
    std::replace(l.begin(), l.end(), '-', '_');
    return l;
  };
  for (const wlb::PackerInfo& p : wlb::kPackers) {
    benchmark::RegisterBenchmark(("BM_PlanStep/" + label(p.name)).c_str(), BM_PlanStep,
                                 std::string(p.name))
        ->Arg(4)
        ->Arg(64)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const wlb::PackerInfo& p : wlb::kPackers) {
    benchmark::RegisterBenchmark(("BM_Scaling/" + label(p.name)).c_str(), BM_Scaling,
                                 std::string(p.name))
        ->RangeMultiplier(4)
        ->Range(4, 4096)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();
BENCHMARK_CAPTURE(BM_ScalingDocs, wlb, std::string("wlb"))
    ->RangeMultiplier(10)
    ->Range(100, 1000000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ScalingDocs, wlb_refine, std::string("wlb-refine"))
    ->RangeMultiplier(10)
    ->Range(100, 1000000)
    ->Unit(benchmark::kMicrosecond);
