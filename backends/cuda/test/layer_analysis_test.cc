// layer_analysis.h on synthetic measurements: CSV round trips and rejections, Table 2 from known
// costs, prediction errors, a cost fit that recovers a known model from noisy single-document
// timings and is read back by wlb-plan's loader (ResolveCostModel), measured times through the
// 1F1B model agreeing with the model when the "measurements" are the model's own stage times,
// and the CP table's oracle.
#include "wlb/cuda/layer_analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "wlb/cost/cost_fit.hpp"
#include "wlb/io/profile.hpp"

namespace wlb::cuda {
namespace {

using ::testing::HasSubstr;

std::vector<MicroBatchMeasurement> RandomMeasurements(std::mt19937_64& rng, int steps, int n) {
  std::vector<MicroBatchMeasurement> rows;
  std::uniform_int_distribution<int64_t> len(1, 70000), docs(1, 6);
  std::uniform_real_distribution<double> ms(0.01, 90.0);
  for (const char* method : {"original", "wlb"}) {
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < n; ++i) {
        MicroBatchMeasurement m{.method = method, .step = s, .index = i};
        for (int64_t d = docs(rng); d > 0; --d) m.lengths.push_back(len(rng));
        m.predicted = ms(rng) * 1e12;
        m.forward_ms = ms(rng);
        m.backward_ms = rng() % 4 == 0 ? 0.0 : ms(rng);
        m.attention_forward_ms = m.forward_ms / 2;
        m.attention_backward_ms = m.backward_ms / 3;
        rows.push_back(m);
      }
    }
  }
  return rows;
}

TEST(LayerAnalysisTest, CsvRoundTripsRandomMeasurements) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<MicroBatchMeasurement> rows = RandomMeasurements(rng, 1 + trial % 3, 4);
    const std::string csv = MeasurementsCsv(rows, "H100, driver 1, 2026, layer_bench --x=1");
    absl::StatusOr<std::vector<MicroBatchMeasurement>> back = ParseMeasurementsCsv(csv, "t");
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ((*back)[i].method, rows[i].method);
      EXPECT_EQ((*back)[i].lengths, rows[i].lengths);
      EXPECT_NEAR((*back)[i].forward_ms, rows[i].forward_ms, 1e-6);
      EXPECT_NEAR((*back)[i].predicted, rows[i].predicted, 1e-9 * rows[i].predicted);
    }
  }
}

TEST(LayerAnalysisTest, CsvRejectsBadRows) {
  const std::string header = MeasurementsCsv({}, "p");
  auto parse = [&](const std::string& row) {
    return ParseMeasurementsCsv(header + row + "\n", "m.csv").status();
  };
  EXPECT_THAT(parse("wlb,0,0,5,1,1,1,1,1,1").message(), HasSubstr("m.csv:3: 10 fields"));
  EXPECT_THAT(parse("wlb,0,0,5,1,1,-1,1,1,1,5").message(), HasSubstr("forward_ms '-1'"));
  EXPECT_THAT(parse("wlb,0,0,5,1,1,nan,1,1,1,5").message(), HasSubstr("forward_ms 'nan'"));
  EXPECT_THAT(parse("wlb,x,0,5,1,1,1,1,1,1,5").message(), HasSubstr("step 'x'"));
  EXPECT_THAT(parse("wlb,0,0,5,1,1,1,1,1,1,0").message(), HasSubstr("length '0'"));
  EXPECT_THAT(parse("wlb,0,0,6,1,1,1,1,1,1,5").message(),
              HasSubstr("1 documents of 5 tokens listed, the row says 1 documents of 6"));
  EXPECT_THAT(ParseMeasurementsCsv("a,b\n", "m.csv").status().message(), HasSubstr("header"));
  EXPECT_THAT(ParseMeasurementsCsv("", "m.csv").status().message(), HasSubstr("no header"));
}

TEST(LayerAnalysisTest, ImbalanceTableOfKnownSteps) {
  std::vector<MicroBatchMeasurement> rows;
  // Step 0: FLOP 1, 3 (imbalance 1.5); measured 2, 2 (1.0). Step 1: FLOP 2, 2; measured 1, 3.
  const double flop[2][2] = {{1, 3}, {2, 2}}, fwd[2][2] = {{2, 2}, {1, 3}};
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < 2; ++i) {
      rows.push_back({.method = "m",
                      .step = s,
                      .index = i,
                      .lengths = {10},
                      .predicted = flop[s][i],
                      .forward_ms = fwd[s][i],
                      .backward_ms = 2 * fwd[s][i]});
    }
  }
  absl::StatusOr<std::vector<ImbalanceRow>> t = ImbalanceTable(rows);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].steps, 2);
  EXPECT_DOUBLE_EQ((*t)[0].flop_model, 1.25);
  EXPECT_DOUBLE_EQ((*t)[0].measured_forward, 1.25);
  EXPECT_DOUBLE_EQ((*t)[0].measured_forward_backward, 1.25);
  EXPECT_FALSE(ImbalanceTable({}).ok());
}

TEST(LayerAnalysisTest, MeasuredProportionalToFlopsHasTheFlopImbalanceAndNoError) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<MicroBatchMeasurement> rows = RandomMeasurements(rng, 3, 4);
    const double rate = 1e-12 * (1 + trial);
    std::vector<double> p, m;
    for (MicroBatchMeasurement& r : rows) {
      r.forward_ms = r.predicted * rate;
      p.push_back(r.predicted);
      m.push_back(r.forward_ms);
    }
    absl::StatusOr<std::vector<ImbalanceRow>> t = ImbalanceTable(rows);
    ASSERT_TRUE(t.ok());
    for (const ImbalanceRow& row : *t) EXPECT_NEAR(row.flop_model, row.measured_forward, 1e-12);
    absl::StatusOr<PredictionError> e = ComparePredictions(p, m, true);
    ASSERT_TRUE(e.ok());
    EXPECT_NEAR(e->scale, rate, 1e-9 * rate);
    EXPECT_LT(e->max_relative, 1e-9);
  }
}

TEST(LayerAnalysisTest, PredictionErrorOfNoisyMeasurements) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> noise(-0.05, 0.05), value(1, 100);
  std::vector<double> p, m;
  for (int i = 0; i < 500; ++i) {
    p.push_back(value(rng));
    m.push_back(p.back() * 2.0 * (1 + noise(rng)));
  }
  absl::StatusOr<PredictionError> fitted = ComparePredictions(p, m, true);
  ASSERT_TRUE(fitted.ok());
  EXPECT_NEAR(fitted->scale, 2.0, 0.02);
  EXPECT_LT(fitted->max_relative, 0.06);
  EXPECT_GT(fitted->mean_relative, 0.01);  // the noise is seen
  absl::StatusOr<PredictionError> raw = ComparePredictions(p, m, false);
  ASSERT_TRUE(raw.ok());
  EXPECT_NEAR(raw->mean_relative, 0.5, 0.03);  // off by 2x without a scale
  EXPECT_THAT(ComparePredictions(p, std::vector<double>{1.0}, true).status().message(),
              HasSubstr("500 predictions"));
  EXPECT_THAT(ComparePredictions(std::vector<double>{1.0}, std::vector<double>{0.0}, true)
                  .status()
                  .message(),
              HasSubstr("point 0: prediction 1 and measurement 0"));
}

TEST(LayerAnalysisTest, MicroBatchFitRecoversKnownModelsUnderNoise) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> noise(-0.02, 0.02), coef(0.2, 3.0);
  for (int trial = 0; trial < 20; ++trial) {
    // ms = a sum d^2 + b sum d + c docs + e, with a known model of the 7B layer's magnitude.
    const double a = coef(rng) * 3e-9, b = coef(rng) * 1e-4, c = coef(rng) * 0.01,
                 e = coef(rng) * 0.1;
    std::vector<MicroBatchMeasurement> rows = RandomMeasurements(rng, 4, 8);
    for (MicroBatchMeasurement& m : rows) {
      double truth = e;
      for (int64_t d : m.lengths) truth += a * double(d) * double(d) + b * double(d) + c;
      m.forward_ms = truth * (1 + noise(rng));
    }
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(rows);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_LT(fit->in_sample.max_relative, 0.05) << trial;
    EXPECT_LT(fit->held_out.mean_relative, 0.03) << trial;
    EXPECT_EQ(fit->held_out.points, int64_t(rows.size()));
    EXPECT_NEAR(fit->model.attn_quadratic, a, 0.1 * a) << trial;
    // A one-document micro-batch of length d costs W(d) + per_call.
    const MicroBatchMeasurement one{.lengths = {50000}};
    EXPECT_NEAR(PredictMicroBatch(*fit, one),
                a * 2.5e9 + b * 5e4 + c + e, 0.05 * (a * 2.5e9 + b * 5e4 + c + e));
    EXPECT_EQ(fit->model.unit, "ms");
  }
  std::vector<MicroBatchMeasurement> few = RandomMeasurements(rng, 1, 1);
  EXPECT_THAT(FitMicroBatchCost(few).status().message(),
              HasSubstr("2 micro-batches for 4 unknowns"));
  std::vector<MicroBatchMeasurement> one_step = RandomMeasurements(rng, 1, 8);
  EXPECT_THAT(FitMicroBatchCost(one_step).status().message(),
              HasSubstr("odd half: 0 micro-batches"));
  std::vector<MicroBatchMeasurement> bad = RandomMeasurements(rng, 2, 4);
  bad[3].forward_ms = 0.0;
  EXPECT_THAT(FitMicroBatchCost(bad).status().message(),
              HasSubstr("original step 0 micro-batch 3 forward_ms: time 0 ms"));
}

TEST(LayerAnalysisTest, FitRecoversKnownModelAndWlbPlanReadsTheProfile) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> noise(-0.01, 0.01);
  for (int trial = 0; trial < 20; ++trial) {
    // A layer: quadratic attention, linear GEMMs, a per-document overhead.
    const double a = 2e-9 * (1 + trial), b = 3e-4 * (1 + trial % 5), c = 0.02;
    std::vector<ProfilePoint> sweep;
    for (int64_t d = 128; d <= 131072; d *= 2) {
      sweep.push_back({d, (a * d * d + b * d + c) * (1 + noise(rng))});
    }
    absl::StatusOr<ProfileFit> fit = FitCostModel(sweep);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_NEAR(fit->model.attn_quadratic, a, 0.03 * a);
    EXPECT_NEAR(fit->model.attn_linear, b, 0.05 * b);
    absl::StatusOr<std::string> csv = LayerProfileCsv(sweep, "fitted, layer_bench, H100, x\ny");
    ASSERT_TRUE(csv.ok()) << csv.status();
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("wlb_layer_profile_" + std::to_string(trial));
    std::ofstream(path) << *csv;
    absl::StatusOr<ProfileFit> loaded = ResolveCostModel(path.string());
    std::filesystem::remove(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_NEAR(loaded->model.attn_quadratic, fit->model.attn_quadratic, 1e-6 * a);
    EXPECT_NEAR(loaded->model.attn_linear, fit->model.attn_linear, 1e-6 * b);
    // Micro-batches of several documents: the fitted model predicts their sum within the noise.
    MicroBatchMeasurement mb{.lengths = {70000, 3000, 300, 5}};
    const double truth = 4 * c + b * 73305 + a * (70000.0 * 70000 + 3000.0 * 3000 + 300 * 300 + 25);
    EXPECT_NEAR(PredictMicroBatch(fit->model, mb), truth, 0.02 * truth);
  }
  EXPECT_THAT(LayerProfileCsv({{ProfilePoint{0, 1.0}}}, "p").status().message(),
              HasSubstr("length 0"));
  EXPECT_FALSE(LayerProfileCsv({}, "p").ok());
}

TEST(LayerAnalysisTest, MeasuredModelTimesGiveTheModelsStepTime) {
  absl::StatusOr<TransformerShape> shape = FindTransformerShape("llama2-7b");
  const ParallelSizes sizes{8, 1, 4, 1};
  absl::StatusOr<PipelineJob> job = MakePipelineJob(*shape, sizes);
  ASSERT_TRUE(job.ok());
  absl::StatusOr<StepTimeModel> model = StepTimeModel::Create(*job);
  ASSERT_TRUE(model.ok());
  const CpPolicy policy{.candidates = {ShardStrategy("per-seq")}};
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<MicroBatchMeasurement> rows = RandomMeasurements(rng, 2, 4);
    for (MicroBatchMeasurement& r : rows) {
      MicroBatch mb;
      for (int64_t d : r.lengths) {
        mb.documents.push_back({.id = static_cast<int64_t>(mb.documents.size()), .length = d});
      }
      mb.tokens = r.tokens();
      absl::StatusOr<StageTimes> t = model->MicroBatchTimes(mb, policy);
      ASSERT_TRUE(t.ok()) << t.status();
      // One layer's time = stage time / (layers per stage).
      r.forward_ms = t->forward * 1e3 * sizes.pp / shape->layers;
      r.backward_ms = t->backward * 1e3 * sizes.pp / shape->layers;
    }
    const std::vector<MicroBatchMeasurement> wlb = RowsOf(rows, "wlb");
    absl::StatusOr<double> measured = MeasuredSecondsPerToken(wlb, sizes, shape->layers);
    absl::StatusOr<double> modelled = ModelSecondsPerToken(wlb, *model, policy);
    ASSERT_TRUE(measured.ok() && modelled.ok()) << measured.status() << modelled.status();
    EXPECT_NEAR(*measured, *modelled, 1e-9 * *modelled);
  }
}

TEST(LayerAnalysisTest, BalancedStepsAreFasterPerToken) {
  // Two steps of 4 micro-batches with the same total time; the balanced one finishes first.
  std::vector<MicroBatchMeasurement> skewed, even;
  for (int i = 0; i < 4; ++i) {
    skewed.push_back({.method = "original",
                      .index = i,
                      .lengths = {100},
                      .forward_ms = i == 0 ? 7.0 : 1.0,
                      .backward_ms = i == 0 ? 14.0 : 2.0});
    even.push_back(
        {.method = "wlb", .index = i, .lengths = {100}, .forward_ms = 2.5, .backward_ms = 5.0});
  }
  absl::StatusOr<double> a = MeasuredSecondsPerToken(skewed, {8, 1, 4, 1}, 32);
  absl::StatusOr<double> b = MeasuredSecondsPerToken(even, {8, 1, 4, 1}, 32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(*a / *b, 1.1);
  EXPECT_THAT(MeasuredSecondsPerToken(even, {8, 1, 4, 3}, 32).status().message(),
              HasSubstr("DP = 3"));
  EXPECT_THAT(MeasuredSecondsPerToken(even, {8, 1, 4, 1}, 0).status().message(),
              HasSubstr("layers must be >= 1, got 0"));
  EXPECT_FALSE(MeasuredSecondsPerToken({}, {8, 1, 4, 1}, 1).ok());
}

TEST(LayerAnalysisTest, CpTableAgainstTheOracle) {
  std::vector<CpMeasurement> rows = {
      {"wlb", 0, 0, 2, "per-seq", {4, 2}},  {"wlb", 0, 0, 2, "per-doc", {3, 3}},
      {"wlb", 0, 0, 2, "adaptive", {3, 3}}, {"wlb", 0, 1, 2, "per-seq", {2, 2}},
      {"wlb", 0, 1, 2, "per-doc", {1, 3}},  {"wlb", 0, 1, 2, "adaptive", {1, 3}}};
  absl::StatusOr<std::vector<CpRow>> t = CpTable(rows);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  // Oracle: 3 (per-doc) + 2 (per-seq) = 5.
  EXPECT_EQ((*t)[0].strategy, "per-seq");
  EXPECT_DOUBLE_EQ((*t)[0].total_ms, 6.0);
  EXPECT_DOUBLE_EQ((*t)[0].vs_oracle, 1.2);
  EXPECT_DOUBLE_EQ((*t)[0].mean_imbalance, (4.0 / 3 + 1.0) / 2);
  EXPECT_DOUBLE_EQ((*t)[1].vs_oracle, 1.2);
  EXPECT_DOUBLE_EQ((*t)[2].total_ms, 6.0);
  rows.push_back({"wlb", 0, 2, 2, "per-seq", {1, 1}});
  EXPECT_THAT(CpTable(rows).status().message(),
              HasSubstr("measured 2 micro-batches, the others 3"));
  EXPECT_THAT(
      CpTable(std::vector<CpMeasurement>{{"wlb", 0, 0, 4, "per-seq", {1, 1}}}).status().message(),
      HasSubstr("2 rank times for C = 4"));
  EXPECT_THAT(
      CpTable(std::vector<CpMeasurement>{{"wlb", 0, 0, 1, "per-seq", {-1}}}).status().message(),
      HasSubstr("rank time -1"));
}

TEST(LayerAnalysisTest, CpStageRowsChargeTheSlowestRankInTheMeasuredSplit) {
  std::vector<MicroBatchMeasurement> rows;
  for (int step : {0, 1}) {
    for (int i = 0; i < 2; ++i) {
      rows.push_back({.method = "wlb", .step = step, .index = i, .lengths = {100, 50},
                      .forward_ms = 1.0, .backward_ms = 3.0});
    }
    rows.push_back({.method = "wlb", .step = step, .index = 2});  // empty micro-batch
    rows.push_back({.method = "original", .step = step, .index = 0, .lengths = {150},
                    .forward_ms = 2.0, .backward_ms = 2.0});
  }
  // Step 0 measured at C = 2 under adaptive; step 1 not at all.
  const std::vector<CpMeasurement> cp = {{"wlb", 0, 0, 2, "adaptive", {1.0, 3.0}},
                                         {"wlb", 0, 1, 2, "adaptive", {2.0, 2.0}},
                                         {"wlb", 0, 0, 2, "per-seq", {9.0, 9.0}},
                                         {"original", 0, 0, 2, "per-seq", {1.5, 2.5}}};
  absl::StatusOr<std::vector<MicroBatchMeasurement>> w = CpStageRows(rows, cp, "wlb", "adaptive", 2);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->size(), 3u);  // step 0's three micro-batches, the empty one included
  EXPECT_DOUBLE_EQ((*w)[0].forward_ms, 0.75);  // 3 ms slowest rank, split 1 : 3
  EXPECT_DOUBLE_EQ((*w)[0].backward_ms, 2.25);
  EXPECT_DOUBLE_EQ((*w)[1].forward_ms + (*w)[1].backward_ms, 2.0);
  EXPECT_EQ((*w)[2].forward_ms, 0.0);
  EXPECT_EQ((*w)[0].lengths, rows[0].lengths);
  absl::StatusOr<std::vector<MicroBatchMeasurement>> o =
      CpStageRows(rows, cp, "original", "per-seq", 2);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->size(), 1u);
  EXPECT_DOUBLE_EQ((*o)[0].forward_ms, 1.25);
  // The simulated step under CP is faster than the whole micro-batch on one GPU.
  const std::vector<MicroBatchMeasurement> whole = {rows[0], rows[1], rows[2]};
  absl::StatusOr<double> on_one = MeasuredSecondsPerToken(whole, {8, 1, 3, 1}, 3);
  absl::StatusOr<double> on_cp = MeasuredSecondsPerToken(*w, {8, 2, 3, 1}, 3);
  ASSERT_TRUE(on_one.ok() && on_cp.ok());
  EXPECT_LT(*on_cp, *on_one);
  EXPECT_THAT(CpStageRows(rows, cp, "wlb", "per-doc", 2).status().message(),
              HasSubstr("no CP measurement of wlb under per-doc at C = 2"));
  EXPECT_THAT(CpStageRows(rows, cp, "wlb", "per-seq", 2).status().message(),
              HasSubstr("wlb step 0 micro-batch 1: no CP measurement under per-seq at C = 2"));
}

}  // namespace
}  // namespace wlb::cuda
