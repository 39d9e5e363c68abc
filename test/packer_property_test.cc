// Property tests: thousands of seeded random streams through every packer.
#include <random>

#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace packer_property_test {

struct Case {
  std::string packer;
  PackerOptions options;
};

std::vector<Case> AllPackers(int64_t context, std::mt19937_64& rng) {
  const int64_t t1 = std::uniform_int_distribution<int64_t>(1, context)(rng);
  const int64_t t2 = std::uniform_int_distribution<int64_t>(t1, context)(rng);
  std::vector<int64_t> two = {t1};
  if (t2 > t1) two.push_back(t2);
  // Every packer of the registry with default options, then a variant per option it uses.
  std::vector<Case> cases;
  for (const PackerInfo& p : kPackers) {
    cases.push_back({p.name, {}});
    if (p.Uses(kUsesWindow)) cases.push_back({p.name, {.window = 3}});
    if (p.Uses(kUsesThresholds)) cases.push_back({p.name, {.thresholds = two}});
    if (p.Uses(kUsesRefineRounds)) {
      cases.push_back({p.name, {.thresholds = {context / 2 + 1}, .refine_rounds = 3}});
    }
    if (p.Uses(kUsesLookahead)) {
      cases.push_back(
          {p.name, {.thresholds = {std::max<int64_t>(1, context / 2)}, .lookahead = 2}});
      cases.push_back({p.name, {.thresholds = two, .refine_rounds = 3, .lookahead = 0}});
    }
    if (p.Uses(kUsesDelayBudget))
      cases.push_back({p.name, {.thresholds = two, .delay_budget = 0.3}});
    if (p.Uses(kUsesDelayBound))
      cases.push_back({p.name, {.thresholds = two, .bound_delay = true}});
  }
  return cases;
}

struct Stream {
  PackerConfig config;
  std::vector<int64_t> lengths;
  std::vector<std::vector<Document>> arrivals;
};

Stream RandomStream(std::mt19937_64& rng, int index) {
  Stream s;
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  s.config.context = uniform(1, 4) == 1 ? uniform(1, 8) : uniform(16, 512);
  s.config.max_tokens = s.config.context + uniform(0, s.config.context);
  s.config.micro_batches = static_cast<int32_t>(uniform(1, 6));
  s.lengths =
      testing::RandomLengths(rng, s.config.context, index, static_cast<int>(uniform(0, 80)));
  auto pieces = *MakeDocuments(s.lengths, s.config.context);
  s.arrivals = *SplitIntoSteps(pieces, s.config.context * s.config.micro_batches);
  return s;
}

const CostModel kCost{.attn_quadratic = 1.0,
                      .attn_linear = 1.0,
                      .linear_per_token = 64.0,
                      .per_document = 3.0,
                      .unit = "test"};

TEST(PackerProperties, NothingLostOrDuplicatedCapsHoldFlushEmpties) {
  std::mt19937_64 rng(20251121);
  int streams = 0;
  const int iterations = testing::PropertyIterations(1500);
  for (int i = 0; i < iterations; ++i) {
    Stream s = RandomStream(rng, i);
    for (const Case& c : AllPackers(s.config.context, rng)) {
      SCOPED_TRACE(::testing::Message() << "stream " << i << " packer " << c.packer << " S="
                                        << s.config.context << " N=" << s.config.micro_batches);
      auto packer = MakePacker(c.packer, s.config, kCost, c.options);
      ASSERT_TRUE(packer.ok()) << packer.status();
      absl::StatusOr<PackRun> run = RunPacker(**packer, s.arrivals);
      ASSERT_TRUE(run.ok()) << run.status();
      ASSERT_TRUE((*packer)->Pending().empty());
      ASSERT_TRUE(testing::CoversExactlyOnce(s.lengths, testing::Collect(run->steps)));
      if (c.packer == "original-nextfit") {  // whole pieces only, in arrival order
        size_t pieces = 0;
        for (const auto& a : s.arrivals) pieces += a.size();
        ASSERT_EQ(testing::Collect(run->steps).size(), pieces);
      }
      // Steady steps: those planned from steps of the input before its short last one.
      size_t first_short = s.arrivals.size();
      for (size_t k = 0; k < s.arrivals.size(); ++k) {
        if (TotalTokens(s.arrivals[k]) <= s.config.context * (s.config.micro_batches - 1)) {
          first_short = k;
          break;
        }
      }
      // Original packing fills every sequence to S, except in the last steps of the input.
      size_t last_steady = 0;
      for (size_t k = 0; k < run->steps.size(); ++k) {
        if (!run->steps[k].drain && !run->steps[k].partial) last_steady = k;
      }
      const bool fixed = !FindPacker(c.packer)->Uses(kUsesThresholds);  // not wlb's S_max
      const int64_t cap = fixed ? s.config.context : s.config.max_tokens;
      for (size_t k = 0; k < run->steps.size(); ++k) {
        const StepPlan& step = run->steps[k];
        ASSERT_EQ(step.step, static_cast<int64_t>(k));
        ASSERT_EQ(step.micro_batches.size(), static_cast<size_t>(s.config.micro_batches));
        const bool steady = !step.drain && !step.partial;
        for (const MicroBatch& mb : step.micro_batches) {
          ASSERT_LE(mb.tokens, cap);
          ASSERT_EQ(mb.tokens, TotalTokens(mb.documents));
          double cost = 0;
          for (const Document& d : mb.documents) cost += kCost(d.length);
          ASSERT_NEAR(mb.cost, cost, 1e-9 * std::max(1.0, cost));
          if (c.packer == "original" && steady && k + 1 < last_steady)
            ASSERT_EQ(mb.tokens, s.config.context);
          // A step cut from the stream has at least N pieces: no packer leaves a micro-batch of
          // a steady step empty (a model given 0 tokens raises; its ranks idle the step).
          if (steady) ASSERT_FALSE(mb.documents.empty()) << "an empty micro-batch in step " << k;
        }
        ASSERT_GE(ImbalanceDegree(step.micro_batches),
                  LowerBound(step.micro_batches, kCost) - 1e-9);
        // Every packing under S_max (fixed-length ones are under S <= S_max) respects the bound.
        const double cap_bound = CapLowerBound(step.micro_batches, kCost, s.config.max_tokens);
        ASSERT_GE(cap_bound, LowerBound(step.micro_batches, kCost) - 1e-12);
        ASSERT_GE(ImbalanceDegree(step.micro_batches), cap_bound - 1e-9);
        // Drain and partial steps come last. original-nextfit takes fewer than N x S tokens a
        // step, so it can emit steps ahead of the pushes; its full steps stay steady.
        if (k + 1 < run->steps.size() && !steady) {
          ASSERT_TRUE(run->steps[k + 1].drain || run->steps[k + 1].partial) << "step " << k;
        }
        if (c.packer != "original-nextfit") {
          ASSERT_EQ(steady, k < s.arrivals.size() && step.step < static_cast<int64_t>(first_short))
              << "step " << k << " drain " << step.drain << " partial " << step.partial;
        }
      }
      const DelayStats delay = TokenDelay(run->steps);
      if (c.packer != "fixed-greedy") ASSERT_GE(delay.mean, 0.0);
      ++streams;
    }
  }
  EXPECT_GT(streams, 10000 * iterations / 1500);
}

TEST(PackerProperties, RefineNeverWorseThanWlbWithTheSameDelay) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    Stream s = RandomStream(rng, i);
    const std::vector<int64_t> t = {std::max<int64_t>(1, s.config.context / 2)};
    auto wlb = *MakePacker("wlb", s.config, kCost, {.thresholds = t});
    auto refined = *MakePacker("wlb-refine", s.config, kCost, {.thresholds = t});
    auto a = *RunPacker(*wlb, s.arrivals);
    auto b = *RunPacker(*refined, s.arrivals);
    ASSERT_EQ(a.steps.size(), b.steps.size()) << "stream " << i;
    for (size_t k = 0; k < a.steps.size(); ++k) {
      ASSERT_LE(ImbalanceDegree(b.steps[k].micro_batches),
                ImbalanceDegree(a.steps[k].micro_batches) + 1e-9)
          << "stream " << i << " step " << k;
    }
    ASSERT_DOUBLE_EQ(TokenDelay(a.steps).mean, TokenDelay(b.steps).mean) << "stream " << i;
  }
}

TEST(PackerProperties, LookaheadZeroIsWlbRefine) {
  std::mt19937_64 rng(31);
  for (int i = 0; i < 1000; ++i) {
    Stream s = RandomStream(rng, i);
    const int64_t t1 = std::max<int64_t>(1, s.config.context / 3);
    const int64_t t2 = std::max<int64_t>(t1 + 1, s.config.context * 2 / 3);
    const PackerOptions options{.thresholds = t2 <= s.config.context ? std::vector<int64_t>{t1, t2}
                                                                     : std::vector<int64_t>{t1},
                                .lookahead = 0};
    auto refine = *MakePacker("wlb-refine", s.config, kCost, options);
    auto lookahead = *MakePacker("wlb-lookahead", s.config, kCost, options);
    const std::string a = PlanToJson(RunPacker(*refine, s.arrivals)->steps, {}, kCost).dump();
    const std::string b = PlanToJson(RunPacker(*lookahead, s.arrivals)->steps, {}, kCost).dump();
    ASSERT_EQ(a, b) << "stream " << i;
  }
}

TEST(PackerProperties, LookaheadNeverTrainsADocumentBeforeItArrives) {
  std::mt19937_64 rng(57);
  for (int i = 0; i < 500; ++i) {
    Stream s = RandomStream(rng, i);
    const int k = static_cast<int>(std::uniform_int_distribution<int>(1, 3)(rng));
    auto packer =
        *MakePacker("wlb-lookahead", s.config, kCost,
                    {.thresholds = {std::max<int64_t>(1, s.config.context / 2)}, .lookahead = k});
    size_t returned = 0;
    for (size_t t = 0; t < s.arrivals.size(); ++t) {
      auto ready = *packer->Push(s.arrivals[t]);
      // The plan of step t - K comes back with the push of step t.
      ASSERT_EQ(ready.size(), t >= static_cast<size_t>(k) ? 1u : 0u) << "stream " << i;
      for (const StepPlan& step : ready) {
        ASSERT_EQ(step.step, static_cast<int64_t>(returned++));
        for (const MicroBatch& mb : step.micro_batches) {
          for (const Document& d : mb.documents) ASSERT_LE(d.arrival_step, step.step);
        }
      }
    }
  }
}

TEST(PackerProperties, SameSeedGivesByteIdenticalJson) {
  const int iterations = testing::PropertyIterations(200);
  for (int i = 0; i < iterations; ++i) {
    std::string dumps[2];
    for (std::string& dump : dumps) {
      std::mt19937_64 rng(1000 + i);
      Stream s = RandomStream(rng, i);
      for (const Case& c : AllPackers(s.config.context, rng)) {
        auto packer = *MakePacker(c.packer, s.config, kCost, c.options);
        auto run = *RunPacker(*packer, s.arrivals);
        dump += PlanToJson(run.steps, packer->Pending(), kCost).dump();
      }
    }
    ASSERT_EQ(dumps[0], dumps[1]) << "seed " << 1000 + i;
  }
}

// Plans `arrivals` with one packer, and with one saved after the first `cut` pushes and restored
// into a fresh packer; the two plans as JSON, uninterrupted first.
std::pair<std::string, std::string> RoundTripPlans(
    const std::string& name, const PackerConfig& config, const CostModel& cost,
    const PackerOptions& options, const std::vector<std::vector<Document>>& arrivals, size_t cut) {
  auto uninterrupted = *MakePacker(name, config, cost, options);
  auto first = *MakePacker(name, config, cost, options);
  auto resumed = *MakePacker(name, config, cost, options);
  std::vector<StepPlan> expected = RunPacker(*uninterrupted, arrivals)->steps;
  std::vector<std::vector<Document>> head(arrivals.begin(), arrivals.begin() + cut);
  std::vector<std::vector<Document>> tail(arrivals.begin() + cut, arrivals.end());
  std::vector<StepPlan> got = RunPacker(*first, head, /*flush=*/false)->steps;
  if (!resumed->RestoreState(first->SaveState()).ok()) return {"restore failed", ""};
  std::vector<StepPlan> rest = RunPacker(*resumed, tail)->steps;
  got.insert(got.end(), rest.begin(), rest.end());
  return {PlanToJson(expected, {}, cost).dump(), PlanToJson(got, {}, cost).dump()};
}

TEST(PackerProperties, StateRoundTripMidStreamGivesTheSameFuture) {
  std::mt19937_64 rng(99);
  const int streams = testing::PropertyIterations(1000);
  for (int i = 0; i < streams; ++i) {
    Stream s = RandomStream(rng, i);
    if (s.arrivals.empty()) continue;
    const size_t cut = std::uniform_int_distribution<size_t>(0, s.arrivals.size())(rng);
    for (const Case& c : AllPackers(s.config.context, rng)) {
      SCOPED_TRACE(::testing::Message() << "stream " << i << " packer " << c.packer);
      const auto [expected, got] =
          RoundTripPlans(c.packer, s.config, kCost, c.options, s.arrivals, cut);
      ASSERT_EQ(got, expected);
    }
  }
}

// Large N (16 ... 1,024), where wlb-lookahead's even releases and overdue rule apply: few streams
// (CI time), each with a heavy tail, checked for every packer as the small streams above are,
// plus the overdue rule (no outlier queued longer than kMaxOutlierWait steps, read from the saved
// state after every push) and the checkpoint round trip.
struct LargeStream {
  PackerConfig config;
  std::vector<int64_t> lengths;
  std::vector<std::vector<Document>> arrivals;
  std::vector<int64_t> thresholds;
};

LargeStream HeavyTailStream(std::mt19937_64& rng, int32_t n, int64_t steps, int64_t tail_permille) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  LargeStream s;
  s.config.context = uniform(64, 256);
  s.config.max_tokens = s.config.context + uniform(0, s.config.context / 2);
  s.config.micro_batches = n;
  // Short documents, `tail_permille` uniform in [S/2, S] (the heavy tail; at 2 per mille its
  // level takes about 20 steps to hold N), 1% in [S/4, 2S] (some longer than S: pieces).
  int64_t tokens = 0;
  while (tokens < steps * n * s.config.context) {
    const int64_t r = uniform(0, 999);
    const int64_t length = r < tail_permille ? uniform(s.config.context / 2, s.config.context)
                           : r < tail_permille + 10
                               ? uniform(s.config.context / 4, 2 * s.config.context)
                               : uniform(1, s.config.context / 12);
    s.lengths.push_back(length);
    tokens += length;
  }
  s.arrivals = *SplitIntoSteps(*MakeDocuments(s.lengths, s.config.context),
                               s.config.context * s.config.micro_batches);
  s.thresholds = {s.config.context / 4, s.config.context / 2};
  return s;
}

// Attention-dominated at these small S (as the FLOP model is at 128K): an outlier alone in a step
// of short documents unbalances it, so the look-ahead holds outliers back.
const CostModel kLongCost = [] {
  CostModel c = kCost;
  c.attn_quadratic = 16.0;
  c.linear_per_token = 16.0;
  return c;
}();

TEST(PackerProperties, LargeNNothingLostCapsHoldOutliersLeaveTheirQueuesInTime) {
  std::mt19937_64 rng(4096);
  int rule_steps = 0, checked_steps = 0;  // wlb-lookahead's steps under wlb's rule, and the others
  const std::vector<std::pair<int32_t, int>> sizes = {{16, 6}, {64, 4}, {256, 2}, {1024, 2}};
  for (const auto& [n, count] : sizes) {
    const int streams = testing::PropertyIterations(count);
    for (int i = 0; i < streams; ++i) {
      // Dense tails (queues fill every few steps) and sparse ones (the overdue rule binds).
      const LargeStream s = i % 2 ? HeavyTailStream(rng, n, /*steps=*/24, /*tail_permille=*/2)
                                  : HeavyTailStream(rng, n, /*steps=*/14, /*tail_permille=*/40);
      for (const std::string packer :
           {"original", "fixed-greedy", "wlb", "wlb-refine", "wlb-lookahead"}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " stream " << i << " packer " << packer
                                          << " S=" << s.config.context);
        const PackerOptions options{.thresholds = s.thresholds};
        auto p = *MakePacker(packer, s.config, kLongCost, options);
        std::vector<StepPlan> steps;
        for (const std::vector<Document>& arrivals : s.arrivals) {
          absl::StatusOr<std::vector<StepPlan>> ready = p->Push(arrivals);
          ASSERT_TRUE(ready.ok()) << ready.status();
          for (StepPlan& step : *ready) steps.push_back(std::move(step));
          if (packer != "wlb-lookahead") continue;
          // An outlier still queued arrived at most kMaxOutlierWait steps before the next step
          // to plan (which releases it if it waited that long), unless the step was planned
          // under wlb's rule (candidates.hpp).
          const auto& check = static_cast<const LookaheadPacker&>(*p).last_step_check();
          if (check.checked && check.rule_chosen) {
            ++rule_steps;
            continue;
          }
          const int64_t next = static_cast<int64_t>(steps.size());
          const nlohmann::json state = p->StateJson();  // outlives the loop over its queues
          for (const nlohmann::json& queue : state.at("queues")) {
            for (const nlohmann::json& d : queue) {
              ASSERT_GE(d[4].get<int64_t>() + lookahead::kMaxOutlierWait, next)
                  << "document " << d[0] << " queued since step " << d[4];
            }
          }
          ++checked_steps;
        }
        for (StepPlan& step : p->Flush()) steps.push_back(std::move(step));
        ASSERT_TRUE(p->Pending().empty());
        ASSERT_TRUE(testing::CoversExactlyOnce(s.lengths, testing::Collect(steps)));
        const bool fixed = packer == "original" || packer == "fixed-greedy";
        const int64_t cap = fixed ? s.config.context : s.config.max_tokens;
        for (size_t k = 0; k < steps.size(); ++k) {
          ASSERT_EQ(steps[k].step, static_cast<int64_t>(k));
          ASSERT_EQ(steps[k].micro_batches.size(), static_cast<size_t>(n));
          for (const MicroBatch& mb : steps[k].micro_batches) {
            ASSERT_LE(mb.tokens, cap);
            ASSERT_EQ(mb.tokens, TotalTokens(mb.documents));
            for (const Document& d : mb.documents) {
              if (packer != "fixed-greedy") ASSERT_LE(d.arrival_step, steps[k].step);
            }
          }
          ASSERT_GE(ImbalanceDegree(steps[k].micro_batches),
                    CapLowerBound(steps[k].micro_batches, kLongCost, s.config.max_tokens) - 1e-9);
        }
      }
    }
  }
  // The wait bound was checked after most steps.
  EXPECT_GT(checked_steps, rule_steps);
}

TEST(PackerProperties, LargeNStateRoundTripGivesTheSameFuture) {
  std::mt19937_64 rng(1024);
  for (const int32_t n : {16, 64, 256}) {
    const LargeStream s = HeavyTailStream(rng, n, /*steps=*/12, /*tail_permille=*/20);
    const size_t cut = std::uniform_int_distribution<size_t>(2, s.arrivals.size() - 2)(rng);
    const auto [expected, got] = RoundTripPlans("wlb-lookahead", s.config, kLongCost,
                                                {.thresholds = s.thresholds}, s.arrivals, cut);
    ASSERT_EQ(got, expected) << "N=" << n;
  }
}

}  // namespace packer_property_test
}  // namespace wlb
