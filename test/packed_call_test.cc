// Tests of the kernel model's packed-call readings (include/wlb/cost/kernel_model.hpp: PackedMs,
// PackedCallFeatures, WithPackedCalls, CallMs), their fit (FitPackedCalls, wlb/cost/cost_fit.hpp),
// the packed-call profile CSV (ParsePackedCallProfile, wlb/io/kernel_profile.hpp) and adaptive
// ranked by a fit (wlb/shard/strategies/adaptive.hpp).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/strategies/adaptive.hpp"
#include "wlb/shard/validate_plan.hpp"

namespace wlb {
namespace packed_call_test {

using ::testing::HasSubstr;

// A random packed call: 1-12 segments, q_len 1..9000, kv_len q_len..q_len+40000.
std::vector<CallSegment> RandomCall(std::mt19937_64& rng) {
  std::vector<CallSegment> call(std::uniform_int_distribution<int>(1, 12)(rng));
  for (CallSegment& s : call) {
    s.q_len = std::uniform_int_distribution<int64_t>(1, 9000)(rng);
    s.kv_len = s.q_len + std::uniform_int_distribution<int64_t>(0, 40000)(rng);
  }
  return call;
}

// A fit whose every weight is used (positive), for ranking and exact-recovery tests.
PackedCallFit SomeFit() {
  PackedCallFit f;
  f.fwd = {2.5e-3, 0.0, 1e-3, 2e-4, 5e-3, 2e-2};
  f.bwd = {6e-3, 4e-3, 3e-3, 5e-4, 1e-2, 4e-2};
  f.has_backward = true;
  return f;
}

TEST(PackedCallTest, FeaturesCountTilesMaskRowsAndSegments) {
  absl::StatusOr<KernelModel> m =
      KernelModel::Analytic({.shape = {.heads = 1, .head_dim = 1, .tile_q = 1, .tile_k = 1}});
  ASSERT_TRUE(m.ok());
  // Queries [3, 11) of a document (8 queries, 11 keys) and a whole 4-token document.
  const std::vector<CallSegment> call = {{8, 11}, {4, 4}, {0, 5}};
  const auto f = m->PackedCallFeatures(call);
  EXPECT_DOUBLE_EQ(f[0], 4.0 * (60 + 10) / 1e9);                // causal pairs at tile 1
  EXPECT_DOUBLE_EQ(f[1], 4.0 * (8 * 7 / 2 + 4 * 3 / 2) / 1e9);  // masked pairs in the rectangle
  EXPECT_DOUBLE_EQ(f[2], 12.0 / 1e3);
  EXPECT_DOUBLE_EQ(f[3], 15.0 / 1e3);
  EXPECT_DOUBLE_EQ(f[4], 2.0);  // the empty segment adds nothing
  EXPECT_DOUBLE_EQ(f[5], 1.0);
  // Visible + masked = the q_len x kv_len rectangle.
  EXPECT_DOUBLE_EQ(f[0] + f[1], 4.0 * (8 * 11 + 4 * 4) / 1e9);
}

TEST(PackedCallTest, PackedReadingOfOneSegmentIsSegmentMsAndPackingIsNeverSlower) {
  const KernelModel m = KernelModel::DefaultAnalytic();
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    const std::vector<CallSegment> call = RandomCall(rng);
    const CallSegment& s = call.front();
    EXPECT_DOUBLE_EQ(m.PackedMs(std::span(call.data(), 1)), m.SegmentMs(s.q_len, s.kv_len));
    double summed = 0.0;
    for (const CallSegment& x : call) summed += m.SegmentMs(x.q_len, x.kv_len);
    // More query rows in the call: the analytic throughput only rises.
    EXPECT_LE(m.PackedMs(call), summed * (1 + 1e-12));
    // Without a fit, CallMs is today's summed reading.
    EXPECT_FALSE(m.has_packed_calls());
    EXPECT_DOUBLE_EQ(m.CallMs(call), summed);
    EXPECT_EQ(m.CallForwardMs(call), 0.0);
  }
}

TEST(PackedCallTest, CallMsWithAFitIsForwardPlusBackward) {
  const KernelModel base = KernelModel::Default();
  absl::StatusOr<KernelModel> m = base.WithPackedCalls(SomeFit());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->has_packed_calls());
  std::mt19937_64 rng(8);
  for (int iter = 0; iter < 100; ++iter) {
    const std::vector<CallSegment> call = RandomCall(rng);
    const auto f = m->PackedCallFeatures(call);
    double fwd = 0.0, bwd = 0.0;
    for (int j = 0; j < kPackedCallFeatureCount; ++j) {
      fwd += SomeFit().fwd[j] * f[j];
      bwd += SomeFit().bwd[j] * f[j];
    }
    EXPECT_NEAR(m->CallForwardMs(call), fwd, 1e-12 * fwd);
    EXPECT_NEAR(m->CallBackwardMs(call), bwd, 1e-12 * bwd);
    EXPECT_DOUBLE_EQ(m->CallMs(call), m->CallForwardMs(call) + m->CallBackwardMs(call));
    // SegmentMs (what the strategies plan with) is unchanged by the fit.
    EXPECT_EQ(m->SegmentMs(call[0].q_len, call[0].kv_len),
              base.SegmentMs(call[0].q_len, call[0].kv_len));
  }
  PackedCallFit forward_only = SomeFit();
  forward_only.has_backward = false;
  forward_only.bwd[0] = -1.0;  // unused without backward
  absl::StatusOr<KernelModel> f = base.WithPackedCalls(forward_only);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::vector<CallSegment> call = {{1000, 5000}};
  EXPECT_EQ(f->CallBackwardMs(call), 0.0);
  EXPECT_DOUBLE_EQ(f->CallMs(call), f->CallForwardMs(call));
}

TEST(PackedCallTest, BadFitWeightsAreRejectedByName) {
  PackedCallFit f = SomeFit();
  f.bwd[1] = -2.0;
  absl::StatusOr<KernelModel> m = KernelModel::Default().WithPackedCalls(f);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("backward weight of masked_gflop"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("-2"));
  f = SomeFit();
  f.fwd[5] = NAN;
  m = KernelModel::Default().WithPackedCalls(f);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("forward weight of call"));
}

// Calls timed exactly by a known fit are fitted back to it (relative error ~0), seed by seed.
TEST(PackedCallTest, FitRecoversKnownWeights) {
  const KernelModel model = KernelModel::Default();
  const KernelModel truth = *model.WithPackedCalls(SomeFit());
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<PackedCallPoint> points;
    for (int i = 0; i < 60; ++i) {
      std::vector<CallSegment> call = RandomCall(rng);
      const double fwd = truth.CallForwardMs(call), bwd = truth.CallBackwardMs(call);
      points.push_back({std::move(call), fwd, bwd});
    }
    absl::StatusOr<PackedCallFit> fit = FitPackedCalls(points, model);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_TRUE(fit->has_backward);
    EXPECT_EQ(fit->points, 60);
    EXPECT_LT(fit->fwd_rms_relative, 1e-9) << seed;
    EXPECT_LT(fit->bwd_rms_relative, 1e-9) << seed;
    const KernelModel fitted = *model.WithPackedCalls(*fit);
    for (const PackedCallPoint& p : points) {
      EXPECT_NEAR(fitted.CallForwardMs(p.segments), p.fwd_ms, 1e-7 * p.fwd_ms);
      EXPECT_NEAR(fitted.CallBackwardMs(p.segments), p.bwd_ms, 1e-7 * p.bwd_ms);
    }
    // Forward-only points give a forward-only fit.
    for (PackedCallPoint& p : points) p.bwd_ms = 0.0;
    fit = FitPackedCalls(points, model);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_FALSE(fit->has_backward);
  }
}

TEST(PackedCallTest, FitErrorsNameThePointAndValue) {
  const KernelModel model = KernelModel::Default();
  std::vector<PackedCallPoint> points(6, PackedCallPoint{{{100, 200}}, 1.0, 3.0});
  EXPECT_THAT(std::string(FitPackedCalls(std::span(points.data(), 5), model).status().message()),
              HasSubstr("at least 6 calls, got 5"));
  std::vector<PackedCallPoint> bad = points;
  bad[3].segments.push_back({300, 200});
  EXPECT_THAT(std::string(FitPackedCalls(bad, model).status().message()),
              HasSubstr("packed call 3 segment 1: need 0 < q_len <= kv_len"));
  bad = points;
  bad[4].bwd_ms = 0.0;
  EXPECT_THAT(std::string(FitPackedCalls(bad, model).status().message()),
              HasSubstr("packed call 4: bwd_ms must be in"));
  bad = points;
  for (PackedCallPoint& p : bad) p.bwd_ms = 0.0;
  bad[3].bwd_ms = 2.0;  // call 0 has none
  EXPECT_THAT(std::string(FitPackedCalls(bad, model).status().message()),
              HasSubstr("packed call 3: bwd_ms must be 0 (call 0 has no backward time"));
  bad = points;
  bad[2].fwd_ms = -1.0;
  EXPECT_THAT(std::string(FitPackedCalls(bad, model).status().message()),
              HasSubstr("packed call 2: fwd_ms must be in"));
  bad = points;
  bad[5].segments.clear();
  EXPECT_THAT(std::string(FitPackedCalls(bad, model).status().message()),
              HasSubstr("packed call 5 has no segments"));
}

TEST(PackedCallTest, ParsesProfileWithExtraColumns) {
  const std::string text =
      "cp,strategy,segments,ms,bwd_ms,note from the profiler\n"
      "2,per-doc,100:200 50:50,1.5,4.25,\n"
      "\n"
      "4,hybrid, 7:9 ,0.5,1,\n";
  absl::StatusOr<std::vector<PackedCallPoint>> p = ParsePackedCallProfile(text, "p.csv");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  ASSERT_EQ((*p)[0].segments.size(), 2u);
  EXPECT_EQ((*p)[0].segments[1].q_len, 50);
  EXPECT_EQ((*p)[0].segments[1].kv_len, 50);
  EXPECT_DOUBLE_EQ((*p)[0].fwd_ms, 1.5);
  EXPECT_DOUBLE_EQ((*p)[0].bwd_ms, 4.25);
  EXPECT_EQ((*p)[1].segments[0].kv_len, 9);
  // Without a bwd_ms column, no backward.
  p = ParsePackedCallProfile("segments,ms\n1:1,0.5\n", "p.csv");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0].bwd_ms, 0.0);
}

TEST(PackedCallTest, ProfileErrorsNameLineAndValue) {
  const struct {
    std::string text, message;
  } cases[] = {
      {"", "empty packed-call profile"},
      {"q_len,kv_len,ms\n1,1,1\n",
       "p.csv:1: header 'q_len,kv_len,ms' must name the columns "
       "segments and ms"},
      {"segments,ms\n", "header but no rows"},
      {"segments,ms\n1:1,1\n2:1,1\n", "p.csv:3: segment '2:1' is not q_len:kv_len"},
      {"segments,ms\n1:x,1\n", "p.csv:2: segment '1:x'"},
      {"segments,ms\n1:1:1,1\n", "p.csv:2: segment '1:1:1'"},
      {"segments,ms\n0:4,1\n", "segment '0:4'"},
      {"segments,ms\n1:9999999999,1\n", "segment '1:9999999999'"},
      {"segments,ms\n ,1\n", "p.csv:2: the segments cell lists no segment"},
      {"segments,ms\n1:1,fast\n", "p.csv:2: ms 'fast' is not a number"},
      {"segments,ms,bwd_ms\n1:1,1,nan\n", "p.csv:2: bwd_ms 'nan' is not a number"},
      {"segments,ms,bwd_ms\n1:1,1,-2\n", "p.csv:2: bwd_ms '-2'"},
      {"segments,ms\n1:1,1,3\n", "p.csv:2: 3 fields, the header has 2"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::vector<PackedCallPoint>> p = ParsePackedCallProfile(c.text, "p.csv");
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.message)) << c.text;
  }
}

TEST(PackedCallTest, ReadsProfileFileAndFitsIt) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("wlb_packed_call_test_" + std::to_string(::getpid()) + ".csv");
  const KernelModel model = KernelModel::Default();
  const KernelModel truth = *model.WithPackedCalls(SomeFit());
  {
    std::ofstream out(path);
    out << "segments,ms,bwd_ms\n";
    std::mt19937_64 rng(3);
    for (int i = 0; i < 20; ++i) {
      const std::vector<CallSegment> call = RandomCall(rng);
      std::string cell;
      for (const CallSegment& s : call)
        cell += std::to_string(s.q_len) + ":" + std::to_string(s.kv_len) + " ";
      out << cell << "," << truth.CallForwardMs(call) << "," << truth.CallBackwardMs(call) << "\n";
    }
  }
  absl::StatusOr<KernelModel> m = WithPackedCallProfile(model, path.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->has_packed_calls());
  EXPECT_EQ(m->packed_calls().points, 20);
  EXPECT_LT(m->packed_calls().bwd_rms_relative, 1e-4);  // 6 significant digits in the file
  std::filesystem::remove(path);
  absl::StatusOr<KernelModel> missing = WithPackedCallProfile(model, path.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("packed-call profile"));
}

// Seeded micro-batches of 8-40 documents with lengths 1..20000.
MicroBatch RandomBatch(std::mt19937_64& rng) {
  MicroBatch mb;
  const int docs = std::uniform_int_distribution<int>(8, 40)(rng);
  for (int i = 0; i < docs; ++i) {
    const int64_t len = std::uniform_int_distribution<int64_t>(1, 20000)(rng);
    mb.documents.push_back(Document{.id = i, .length = len});
    mb.tokens += len;
  }
  return mb;
}

// With a fit, adaptive picks the candidate whose plan has the lowest slowest rank of CallMs + its
// exchange per pass; the candidate plans but balanced-chunks' (which deals by the fit) are the
// same as without a fit.
TEST(PackedCallTest, AdaptiveRanksCandidatePlansByCallMs) {
  const KernelModel base = KernelModel::Default();
  // Two fits that disagree: one charges masked tiles in backward (cuDNN-like), one does not.
  PackedCallFit masked = SomeFit();
  masked.bwd[1] = 0.05;
  PackedCallFit unmasked = SomeFit();
  unmasked.bwd[1] = 0.0;
  std::mt19937_64 rng(11);
  int differs = 0;
  for (int iter = 0; iter < 24; ++iter) {
    const MicroBatch mb = RandomBatch(rng);
    const int cp = 2 << (iter % 3);
    std::vector<ShardStrategy> picks;
    for (const PackedCallFit& fit : {masked, unmasked}) {
      const KernelModel m = *base.WithPackedCalls(fit);
      absl::StatusOr<AdaptiveChoice> c = ChooseAdaptive(mb, cp, m);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_TRUE(c->packed_calls);
      // The candidates whose plans PlanShards gives as adaptive builds them (doc-degree's greedy
      // plan is checked in shard_plan_test).
      const std::pair<ShardStrategy, double*> candidates[] = {
          {ShardStrategy("per-seq-ordered"), &c->per_seq_ordered_max_ms},
          {ShardStrategy("per-doc"), &c->per_doc_max_ms},
          {ShardStrategy("hybrid"), &c->hybrid_max_ms},
          {ShardStrategy("per-seq"), &c->per_seq_max_ms},
          {ShardStrategy("balanced-chunks"), &c->balanced_chunks_max_ms},
          {ShardStrategy("contiguous"), &c->contiguous_max_ms}};
      double best = INFINITY;
      ShardStrategy argmin = ShardStrategy("per-seq-ordered");
      for (const auto& [s, reported] : candidates) {
        absl::StatusOr<ShardPlan> plan = PlanShards(mb, cp, s, m);
        ASSERT_TRUE(plan.ok());
        absl::StatusOr<ShardPlan> plain = PlanShards(mb, cp, s, base);
        ASSERT_TRUE(plain.ok());
        // balanced-chunks deals by the fit (SegmentCallMs); the others plan as without one.
        if (s != ShardStrategy("balanced-chunks")) {
          EXPECT_EQ(*plan, *plain) << ShardStrategyName(s);
        }
        if (plan->rank_capacity > CpRankTokenCap(mb.tokens, cp)) continue;  // never chosen
        // Each rank's CallMs + its exchange (default link) once per pass: forward and backward.
        std::vector<double> exchange = PredictCp(*plan, m).rank_exchange_ms;
        for (double& x : exchange) x *= 2.0;
        const double ms = MaxRankCallMs(*plan, m, exchange);
        EXPECT_DOUBLE_EQ(*reported, ms) << ShardStrategyName(s);
        EXPECT_DOUBLE_EQ(AdaptivePriceMs(*plan, m, CpPlanOptions{}), ms) << ShardStrategyName(s);
        if (ms < best) {
          best = ms;
          argmin = s;
        }
      }
      if (c->doc_degree_max_ms < best) argmin = ShardStrategy("doc-degree");  // capped by design
      EXPECT_EQ(c->chosen, argmin);
      absl::StatusOr<ShardPlan> adaptive = PlanShards(mb, cp, ShardStrategy("adaptive"), m);
      ASSERT_TRUE(adaptive.ok());
      EXPECT_EQ(adaptive->strategy, argmin);
      EXPECT_EQ(adaptive->requested, ShardStrategy("adaptive"));
      picks.push_back(c->chosen);
    }
    differs += picks[0] != picks[1];
    // Without a fit, the maxima are today's summed forward reading.
    absl::StatusOr<AdaptiveChoice> plain = ChooseAdaptive(mb, cp, base);
    ASSERT_TRUE(plain.ok());
    EXPECT_FALSE(plain->packed_calls);
  }
  // The masked-tile charge must change some pick, or the ranking would not be by CallMs.
  EXPECT_GT(differs, 0);
}

TEST(PackedCallTest, SegmentCallMsIsWhatOneMoreSegmentAddsToCallMs) {
  const KernelModel base = KernelModel::Default();
  const KernelModel m = *base.WithPackedCalls(SomeFit());
  PackedCallFit forward_only = SomeFit();
  forward_only.has_backward = false;
  const KernelModel f = *base.WithPackedCalls(forward_only);
  EXPECT_EQ(base.passes(), 1);
  EXPECT_EQ(m.passes(), 2);
  EXPECT_EQ(f.passes(), 1);
  std::mt19937_64 rng(21);
  for (int iter = 0; iter < 100; ++iter) {
    std::vector<CallSegment> call = RandomCall(rng);
    const CallSegment s = call.back();
    // Without a fit: SegmentMs, bit for bit (plans without a fit are unchanged).
    EXPECT_EQ(base.SegmentCallMs(s.q_len, s.kv_len), base.SegmentMs(s.q_len, s.kv_len));
    for (const KernelModel* model : {&m, &f}) {
      const double with = model->CallMs(call);
      call.pop_back();
      const double without = model->CallMs(call);
      call.push_back(s);
      if (call.size() > 1) {
        EXPECT_NEAR(model->SegmentCallMs(s.q_len, s.kv_len), with - without, 1e-9 * with);
      }
    }
  }
  EXPECT_EQ(m.SegmentCallMs(0, 100), 0.0);
}

TEST(PackedCallTest, BalancedChunksDealsByTheFitAdaptiveRanksBy) {
  // A fit that charges masked tiles heavily (long segments cost more than their FLOPs say): the
  // deal by SegmentCallMs balances what AdaptivePriceMs prices, the deal by SegmentMs does not.
  const KernelModel base = KernelModel::Default();
  PackedCallFit fit = SomeFit();
  fit.bwd[1] = 0.05;
  const KernelModel m = *base.WithPackedCalls(fit);
  std::mt19937_64 rng(5);
  double by_fit = 0.0, by_segment_ms = 0.0;
  int not_worse = 0, batches = 0;
  for (int iter = 0; iter < 36; ++iter) {
    const MicroBatch mb = RandomBatch(rng);
    const int cp = 2 << (iter % 3);
    absl::StatusOr<ShardPlan> dealt = PlanShards(mb, cp, ShardStrategy("balanced-chunks"), m);
    absl::StatusOr<ShardPlan> plain = PlanShards(mb, cp, ShardStrategy("balanced-chunks"), base);
    ASSERT_TRUE(dealt.ok() && plain.ok());
    ASSERT_TRUE(ValidateShardPlan(*dealt, mb).ok());
    EXPECT_LE(dealt->rank_capacity, CpRankTokenCap(mb.tokens, cp));
    const double a = AdaptivePriceMs(*dealt, m, CpPlanOptions{});
    const double b = AdaptivePriceMs(*plain, m, CpPlanOptions{});
    by_fit += a;
    by_segment_ms += b;
    not_worse += a <= b * (1 + 1e-9);
    ++batches;
  }
  EXPECT_LT(by_fit, by_segment_ms);
  EXPECT_GE(2 * not_worse, batches);
}

}  // namespace packed_call_test
}  // namespace wlb
