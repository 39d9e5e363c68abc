// Tests of micro-batch measurements as a cost: wlb/cost/micro_batch_fit.hpp (the fit, its
// held-out rule, a fixed model's errors), wlb/io/micro_batch_csv.hpp (the CSV and every bad-file
// error), --cost / PlanSpec taking the CSV, and the shipped calibrations (CalibratedPresets)
// refitted from the committed H100 measurements.
#include "wlb/cost/micro_batch_fit.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/io/micro_batch_csv.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/plan_spec.hpp"

namespace wlb {
namespace micro_batch_fit_test {

using ::testing::HasSubstr;

// `rows` micro-batches of 1..10 documents whose time is a known curve times (1 + noise), the
// steps 0, 0, 0, 0, 1, ... when `steps`.
std::vector<MicroBatchSample> Synthetic(std::mt19937_64& rng, int rows, double a, double b,
                                        double c, double per_call, double noise,
                                        bool steps = true) {
  // Log-uniform lengths (as real length distributions, many short documents): the constant terms
  // are seen in both held-out halves.
  std::uniform_real_distribution<double> log_len(std::log(32.0), std::log(120000.0));
  std::uniform_int_distribution<int64_t> docs(1, 10);
  std::uniform_real_distribution<double> jitter(-noise, noise);
  std::vector<MicroBatchSample> out;
  for (int i = 0; i < rows; ++i) {
    MicroBatchSample s;
    double truth = per_call;
    for (int64_t k = docs(rng); k > 0; --k) {
      const int64_t d = static_cast<int64_t>(std::exp(log_len(rng)));
      s.lengths.push_back(d);
      truth += a * static_cast<double>(d) * static_cast<double>(d) + b * d + c;
    }
    s.ms = truth * (1 + jitter(rng));
    if (steps) s.step = i / 4;
    out.push_back(std::move(s));
  }
  return out;
}

TEST(FitMicroBatchCost, RecoversKnownCurvesUnderSeededNoise) {
  std::mt19937_64 rng(45);
  std::uniform_real_distribution<double> coef(0.3, 3.0);
  for (int trial = 0; trial < 30; ++trial) {
    const double a = coef(rng) * 3e-9, b = coef(rng) * 1e-4, c = coef(rng) * 0.01,
                 per_call = coef(rng) * 0.1;
    const std::vector<MicroBatchSample> rows =
        Synthetic(rng, 64, a, b, c, per_call, 0.02, trial % 2 == 0);
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(rows);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_NEAR(fit->model.attn_quadratic, a, 0.05 * a) << trial;
    EXPECT_LT(fit->in_sample.max_relative, 0.05) << trial;
    EXPECT_LT(fit->held_out.mean_relative, 0.03) << trial;
    EXPECT_GT(fit->held_out.mean_relative, 0.0) << trial;  // the noise is seen
    EXPECT_EQ(fit->held_out.points, 64);
    EXPECT_EQ(fit->held_out_rule, trial % 2 == 0 ? "by step parity" : "by position parity");
    EXPECT_EQ(fit->model.unit, "ms");
    EXPECT_EQ(fit->model.attn_linear, 0.0);
    for (double x : {fit->model.attn_quadratic, fit->model.linear_per_token,
                     fit->model.per_document, fit->per_call_ms}) {
      EXPECT_GE(x, 0.0);
    }
    // One document of 40K tokens: W(d) + per_call.
    const std::vector<int64_t> one = {40000};
    const double want = a * 1.6e9 + b * 4e4 + c + per_call;
    EXPECT_NEAR(PredictMicroBatchMs(*fit, one), want, 0.05 * want) << trial;
    EXPECT_THAT(fit->model.description, HasSubstr("fitted to 64 measured micro-batches"));
  }
}

TEST(FitMicroBatchCost, NoiseFreeCurvesAreRecoveredExactlyAndTermsStayNonNegative) {
  std::mt19937_64 rng(7);
  // Every subset of the four terms present: a zero term comes back 0, never negative.
  for (int mask = 1; mask < 16; ++mask) {
    const double a = mask & 1 ? 2e-9 : 0, b = mask & 2 ? 1e-4 : 0, c = mask & 4 ? 0.02 : 0,
                 per_call = mask & 8 ? 0.3 : 0;
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(Synthetic(rng, 24, a, b, c, per_call, 0));
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_NEAR(fit->model.attn_quadratic, a, 1e-6 * 2e-9) << mask;
    EXPECT_NEAR(fit->model.linear_per_token, b, 1e-6 * 1e-4) << mask;
    EXPECT_NEAR(fit->model.per_document, c, 1e-6 * 0.02) << mask;
    EXPECT_NEAR(fit->per_call_ms, per_call, 1e-6 * 0.3) << mask;
    EXPECT_LT(fit->held_out.max_relative, 1e-8) << mask;
  }
  // Times that fall with the work (no non-negative curve fits well): coefficients stay >= 0.
  std::vector<MicroBatchSample> falling;
  for (int i = 1; i <= 12; ++i) {  // one or two documents: the design identifies the terms
    falling.push_back({.lengths = i % 3 == 0 ? std::vector<int64_t>{1000 * i}
                                             : std::vector<int64_t>{600 * i, 400 * i},
                       .ms = 20.0 / i});
  }
  absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(falling);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GE(fit->model.attn_quadratic, 0.0);
  EXPECT_GE(fit->model.linear_per_token, 0.0);
  EXPECT_GE(fit->model.per_document, 0.0);
  EXPECT_GE(fit->per_call_ms, 0.0);
}

TEST(FitMicroBatchCost, HeldOutHalvesFollowTheStatedRule) {
  // Two regimes: even steps (or even positions) follow one curve, odd ones another, so a fit on
  // one half mispredicts the other by a known amount only when the halves are split that way.
  std::vector<MicroBatchSample> rows;
  for (int i = 0; i < 16; ++i) {
    const int64_t d = 1000 + 997 * i;
    const double scale = (i / 2) % 2 == 0 ? 1.0 : 2.0;  // by step i / 2
    // One document or two of the same total (each half then tells the four terms apart).
    rows.push_back(
        {.lengths = i % 3 == 0 ? std::vector<int64_t>{d} : std::vector<int64_t>{d / 3, d - d / 3},
         .ms = scale * 1e-4 * d,
         .step = i / 2});
  }
  absl::StatusOr<MicroBatchFit> by_step = FitMicroBatchCost(rows);
  ASSERT_TRUE(by_step.ok()) << by_step.status();
  // Fit on 1e-4 d predicts 2e-4 d: 50% off; the other way 100% off: mean 75%.
  EXPECT_NEAR(by_step->held_out.mean_relative, 0.75, 1e-6);
  for (MicroBatchSample& s : rows) s.step.reset();
  absl::StatusOr<MicroBatchFit> by_position = FitMicroBatchCost(rows);
  ASSERT_TRUE(by_position.ok()) << by_position.status();
  EXPECT_EQ(by_position->held_out_rule, "by position parity");
  EXPECT_LT(by_position->held_out.mean_relative, 0.5);  // each half holds both regimes
}

TEST(FitMicroBatchCost, BadSamplesNameTheSampleAndValue) {
  std::mt19937_64 rng(3);
  const std::vector<MicroBatchSample> good = Synthetic(rng, 12, 2e-9, 1e-4, 0, 0.1, 0.01);
  EXPECT_THAT(FitMicroBatchCost({}).status().message(), HasSubstr("needs measurements, got none"));
  const auto error = [&](auto mutate) {
    std::vector<MicroBatchSample> rows = good;
    mutate(rows);
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(rows);
    EXPECT_FALSE(fit.ok());
    return std::string(fit.status().message());
  };
  EXPECT_THAT(error([](auto& r) { r[5].ms = NAN; }), HasSubstr("micro-batch 5: time nan ms"));
  EXPECT_THAT(error([](auto& r) { r[5].ms = -2; }), HasSubstr("micro-batch 5: time -2 ms"));
  EXPECT_THAT(error([](auto& r) { r[5].ms = 0; }), HasSubstr("micro-batch 5: time 0 ms"));
  EXPECT_THAT(error([](auto& r) { r[5].ms = INFINITY; }), HasSubstr("time inf ms"));
  EXPECT_THAT(error([](auto& r) { r[2].lengths.clear(); }),
              HasSubstr("micro-batch 2: no document lengths"));
  EXPECT_THAT(error([](auto& r) { r[2].lengths.push_back(0); }),
              HasSubstr("micro-batch 2: document length 0 is not in [1, 16777216]"));
  EXPECT_THAT(error([](auto& r) { r[2].lengths.push_back(kMaxContext + 1); }),
              HasSubstr("document length 16777217"));
  EXPECT_THAT(error([](auto& r) { r[4].step = -1; }), HasSubstr("micro-batch 4: step -1"));
  EXPECT_THAT(error([](auto& r) { r[4].step.reset(); }),
              HasSubstr("micro-batch 4 has no step but micro-batch 0 has one"));
  EXPECT_THAT(error([](auto& r) {
                r[4].where = "f.csv:9";
                r[4].ms = 0;
              }),
              HasSubstr("f.csv:9: time 0 ms"));
  EXPECT_THAT(error([](auto& r) { r.resize(3); }),
              HasSubstr("micro-batch fit: 3 micro-batches for 4 unknowns"));
  EXPECT_THAT(error([](auto& r) {
                for (auto& s : r) s.step = 2 * (s.step.value_or(0));
              }),
              HasSubstr("held-out check (by step parity), odd half: 0 micro-batches"));
  EXPECT_THAT(error([](auto& r) {
                for (auto& s : r) s.step.reset();
                r.resize(7);
              }),
              HasSubstr("held-out check (by position parity), odd half: 3 micro-batches"));
}

// Measurements whose design cannot identify the four terms are refused, naming the terms that
// cannot be told apart, whether all of them or only one held-out half is deficient; the same
// measurements plus rows that break the dependence fit. Seeded random designs of each kind.
TEST(FitMicroBatchCost, RefusesMeasurementsThatCannotTellTheTermsApart) {
  std::mt19937_64 rng(59);
  std::uniform_int_distribution<int64_t> len(16, 100000);
  std::uniform_real_distribution<double> ms(0.5, 50.0);
  const auto refused = [](const std::vector<MicroBatchSample>& rows) {
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(rows);
    EXPECT_FALSE(fit.ok()) << fit->model.description;
    return std::string(fit.status().message());
  };
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 8 + trial;
    // Every micro-batch the same lengths (times differ: noise): nothing can be told apart.
    std::vector<int64_t> same = {len(rng), len(rng), len(rng)};
    std::vector<MicroBatchSample> alike, single, fixed_count;
    for (int i = 0; i < n; ++i) {
      alike.push_back({.lengths = same, .ms = ms(rng)});
      single.push_back({.lengths = {len(rng)}, .ms = ms(rng)});
      fixed_count.push_back({.lengths = {len(rng), len(rng)}, .ms = ms(rng)});
    }
    EXPECT_THAT(refused(alike),
                HasSubstr("micro-batch fit: the " + std::to_string(n) +
                          " micro-batches cannot tell apart the terms a (sum of d^2), b (sum of "
                          "d), c (documents), per call (the measurement design has rank 1 of 4"));
    // One document each (or always two): documents and calls move together.
    for (const auto* rows : {&single, &fixed_count}) {
      const std::string message = refused(*rows);
      EXPECT_THAT(message, HasSubstr("cannot tell apart the terms c (documents), per call (the "
                                     "measurement design has rank 3 of 4"));
      EXPECT_THAT(message, HasSubstr("measure micro-batches that vary the number of documents"));
    }
    // Only the odd half deficient: that half's fit is refused, not a 0% held-out error.
    std::vector<MicroBatchSample> half = Synthetic(rng, 2 * n, 2e-9, 1e-4, 0.01, 0.1, 0.01,
                                                   /*steps=*/false);
    for (size_t i = 1; i < half.size(); i += 2) half[i].lengths = same;
    EXPECT_THAT(refused(half), HasSubstr("held-out check (by position parity), odd half: the"));
    // Adding micro-batches of other document counts identifies the terms.
    for (int k = 1; k <= 4; ++k) {
      std::vector<int64_t> lengths(static_cast<size_t>(k) + 2, len(rng));
      for (int64_t& d : lengths) d = len(rng);
      single.push_back({.lengths = lengths, .ms = ms(rng)});
      single.push_back({.lengths = {len(rng), len(rng), len(rng), len(rng)}, .ms = ms(rng)});
    }
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(single);
    EXPECT_TRUE(fit.ok()) << fit.status();
  }
}

TEST(CostModelErrors, AFlopModelGetsItsBestScaleFittedOnEachHalf) {
  std::mt19937_64 rng(11);
  const CostModel flop = *CostModelFromPreset("llama2-7b");
  // Measured = the FLOP model at 2 ms per TFLOP, with noise: the best scale finds it.
  std::vector<MicroBatchSample> rows = Synthetic(rng, 40, 1e-9, 1e-4, 0, 0, 0);
  std::uniform_real_distribution<double> jitter(-0.01, 0.01);
  for (MicroBatchSample& s : rows) {
    double w = 0.0;
    for (int64_t d : s.lengths) w += flop(d);
    s.ms = 2e-12 * w * (1 + jitter(rng));
  }
  absl::StatusOr<ModelErrors> e = CostModelErrors(flop, rows, /*fit_scale=*/true);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_NEAR(e->in_sample.scale, 2e-12, 0.01 * 2e-12);
  EXPECT_LT(e->in_sample.max_relative, 0.02);
  EXPECT_LT(e->held_out.max_relative, 0.03);
  EXPECT_EQ(e->held_out.points, 40);
  absl::StatusOr<ModelErrors> raw = CostModelErrors(flop, rows, /*fit_scale=*/false);
  ASSERT_TRUE(raw.ok());
  EXPECT_GT(raw->in_sample.mean_relative, 1e6);  // FLOPs read as ms
  EXPECT_EQ(raw->held_out.mean_relative, raw->in_sample.mean_relative);
  rows[1].ms = -1;
  EXPECT_THAT(CostModelErrors(flop, rows, true).status().message(),
              HasSubstr("micro-batch 1: time -1 ms"));
}

// ---- the CSV ------------------------------------------------------------------------------

constexpr const char* kGoodCsv =
    "# provenance line, with, commas\n"
    "method,step,forward_ms,backward_ms,lengths\n"
    "a,0,1.0,2.0,100;200\n"
    "\n"
    "a,1,1.5,2.5,300\n"
    "a,2,1.0,2.0,100;50;50\n"
    "a,3,4.0,8.0,3000;1000\n"
    "a,4,1.0,2.0,10;20\n"
    "a,5,1.5,2.5,600\n"
    "a,6,1.0,2.0,100;9\n"
    "a,7,4.0,8.5,4100\n";

TEST(ParseMicroBatchCsv, ReadsLengthsSummedTimesAndSteps) {
  absl::StatusOr<std::vector<MicroBatchSample>> rows = ParseMicroBatchCsv(kGoodCsv, "m.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 8u);
  EXPECT_EQ((*rows)[0].lengths, (std::vector<int64_t>{100, 200}));
  EXPECT_DOUBLE_EQ((*rows)[0].ms, 3.0);
  EXPECT_EQ((*rows)[1].step, 1);
  EXPECT_EQ((*rows)[1].where, "m.csv:5");
  absl::StatusOr<std::vector<MicroBatchSample>> plain =
      ParseMicroBatchCsv("lengths , ms\n 7;8 , 0.5 \n", "p.csv");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)[0].lengths, (std::vector<int64_t>{7, 8}));
  EXPECT_DOUBLE_EQ((*plain)[0].ms, 0.5);
  EXPECT_FALSE((*plain)[0].step.has_value());
  EXPECT_TRUE(IsMicroBatchCsv(kGoodCsv));
  EXPECT_FALSE(IsMicroBatchCsv("length,ms\n128,1\n"));
  EXPECT_FALSE(IsMicroBatchCsv("# only a comment\n"));
}

TEST(ParseMicroBatchCsv, EveryBadFileIsOneErrorNamingTheLineAndValue) {
  const std::string header = "step,ms,lengths\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"# nothing\n\n", "m.csv: empty micro-batch measurement (no header line"},
      {header, "m.csv: micro-batch measurement has a header but no rows (the header is line 1)"},
      {"# c\nstep,lengths\n0,5\n", "m.csv:2: a micro-batch measurement header needs"},
      {"ms,lengths2\n1,5\n", "needs a 'lengths' column"},
      {"ms,forward_ms,backward_ms,lengths\n1,1,1,5\n", "(not both forms)"},
      {"forward_ms,lengths\n1,5\n", "both 'forward_ms' and 'backward_ms'"},
      {header + "0,1.0,5\n1,nan,5\n", "m.csv:3: ms 'nan' is not a time in [1e-06, 1e+07] ms"},
      {header + "0,-1,5\n", "m.csv:2: ms '-1' is not a time"},
      {header + "0,0,5\n", "m.csv:2: ms '0' is not a time"},
      {header + "0,x,5\n", "m.csv:2: ms 'x' is not a time"},
      {"step,forward_ms,backward_ms,lengths\n0,1,0,5\n", "m.csv:2: backward_ms '0' is not a time"},
      {header + "0,1,\n", "m.csv:2: empty lengths"},
      {header + "0,1,5;;6\n", "m.csv:2: document length '' is not an integer in [1, 16777216]"},
      {header + "0,1,5;2.5\n", "m.csv:2: document length '2.5' is not an integer"},
      {header + "0,1,5;abc\n", "document length 'abc'"},
      {header + "0,1,0\n", "document length '0' is not an integer in [1, 16777216]"},
      {header + "0,1,16777217\n", "document length '16777217'"},
      {header + "0,1,-3\n", "document length '-3'"},
      {header + "x,1,5\n", "m.csv:2: step 'x' is not an integer in [0, "},
      {header + "-1,1,5\n", "m.csv:2: step '-1'"},
      {header + "0,1,5,9\n", "m.csv:2: 4 fields, the header has 3"},
      {header + "0,1\n", "m.csv:2: 2 fields, the header has 3"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<std::vector<MicroBatchSample>> rows = ParseMicroBatchCsv(text, "m.csv");
    ASSERT_FALSE(rows.ok()) << text;
    EXPECT_THAT(rows.status().message(), HasSubstr(want)) << text;
  }
  // Fewer rows than terms: the fit's error, naming the count.
  absl::StatusOr<std::vector<MicroBatchSample>> three =
      ParseMicroBatchCsv(header + "0,1,5\n1,2,6\n2,3,7\n", "m.csv");
  ASSERT_TRUE(three.ok());
  EXPECT_THAT(FitMicroBatchCost(*three).status().message(),
              HasSubstr("3 micro-batches for 4 unknowns"));
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/wlb_mbfit_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ResolveCostModel, TakesMicroBatchCsvsByTheirHeaderAndKeepsSingleDocumentProfiles) {
  const std::string csv = WriteTemp("good.csv", kGoodCsv);
  absl::StatusOr<ProfileFit> fit = ResolveCostModel(csv);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->model.unit, "ms");
  EXPECT_THAT(fit->model.description, HasSubstr("fitted to 8 measured micro-batches"));
  EXPECT_THAT(fit->model.description, HasSubstr("held out by step parity"));
  EXPECT_THAT(fit->model.description, HasSubstr(csv));
  absl::StatusOr<std::vector<MicroBatchSample>> rows = ReadMicroBatchCsv(csv);
  ASSERT_TRUE(rows.ok());
  absl::StatusOr<MicroBatchFit> direct = FitMicroBatchCost(*rows);
  ASSERT_TRUE(direct.ok());
  EXPECT_DOUBLE_EQ(fit->model.attn_quadratic, direct->model.attn_quadratic);
  EXPECT_DOUBLE_EQ(fit->max_relative_error, direct->in_sample.max_relative);
  // A single-document profile is fitted as before.
  const std::string profile =
      WriteTemp("profile.csv", "length,ms\n128,0.02\n1024,0.1\n8192,3.1\n65536,190\n");
  absl::StatusOr<ProfileFit> single = ResolveCostModel(profile);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_THAT(single->model.description, HasSubstr("rms rel. error"));
  // A UTF-8 byte-order mark changes nothing (it used to hide the first column: here the step
  // column, so the held-out split fell back to position parity).
  const std::string good = kGoodCsv;
  const std::string bom = WriteTemp("bom.csv", "\xEF\xBB\xBF" + good.substr(good.find('\n') + 1));
  absl::StatusOr<ProfileFit> with_bom = ResolveCostModel(bom);
  ASSERT_TRUE(with_bom.ok()) << with_bom.status();
  EXPECT_THAT(with_bom->model.description, HasSubstr("held out by step parity"));
  EXPECT_DOUBLE_EQ(with_bom->model.attn_quadratic, fit->model.attn_quadratic);
  // A time column named twice is ambiguous: refused, not "first wins".
  const std::string twice = WriteTemp("twice.csv", "step,ms,lengths,ms\n0,1,5,2\n");
  EXPECT_THAT(ResolveCostModel(twice).status().message(),
              HasSubstr("names column 'ms' twice (columns 2 and 4)"));
  // Measurements that cannot identify the terms are refused through --cost, as by the fit.
  std::string alike = "step,ms,lengths\n";
  for (int i = 0; i < 12; ++i) absl::StrAppend(&alike, i, ",", 1.0 + 0.01 * i, ",300;40;7\n");
  EXPECT_THAT(ResolveCostModel(WriteTemp("alike.csv", alike)).status().message(),
              HasSubstr("micro-batch fit: the 12 micro-batches cannot tell apart the terms"));
  // A bad row is the CSV's error, through --cost too.
  const std::string bad = WriteTemp("bad.csv", "step,ms,lengths\n0,1,5\n1,0,6\n");
  EXPECT_THAT(ResolveCostModel(bad).status().message(), HasSubstr(":3: ms '0' is not a time"));
}

TEST(PlanSpec, CostTakesMeasurementCsvsAndCalibrations) {
  const std::string csv = WriteTemp("spec.csv", kGoodCsv);
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec({{"cost", csv}});
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<DocumentCost> cost = spec->MakeCost();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->unit(), "ms");
  absl::StatusOr<PlanSpec> table = ParsePlanSpec({{"cost", csv}, {"profile_cost", "table"}});
  ASSERT_TRUE(table.ok() && table->Validate().ok());
  EXPECT_THAT(table->MakeCost().status().message(),
              HasSubstr("holds micro-batch measurements (a 'lengths' column)"));
  for (const CalibratedCost& c : CalibratedPresets()) {
    absl::StatusOr<PlanSpec> named = ParsePlanSpec({{"cost", std::string(c.name)}});
    ASSERT_TRUE(named.ok());
    ASSERT_TRUE(named->Validate().ok());
    absl::StatusOr<DocumentCost> m = named->MakeCost();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->unit(), "ms");
    EXPECT_THAT(m->description(), HasSubstr(std::string(c.source)));
    EXPECT_TRUE(ValidateCost(*m).ok());
    absl::StatusOr<PlanSpec> with_table =
        ParsePlanSpec({{"cost", std::string(c.name)}, {"profile_cost", "table"}});
    EXPECT_THAT(with_table->Validate().status().message(),
                HasSubstr("--profile-cost is not used by this run"));
  }
  EXPECT_THAT(CostModelFromPreset("h100-nope").status().message(),
              HasSubstr("known: llama2-7b, llama2-13b, llama2-70b, wlb-550m, "
                        "h100-flash-llama2-7b-tp8, h100-cudnn-wlb-550m-tp2"));
}

// ---- the shipped calibrations ---------------------------------------------------------------

TEST(CalibratedPresets, RefittingTheCommittedMeasurementsGivesTheShippedNumbers) {
  ASSERT_EQ(CalibratedPresets().size(), 2u);  // only these two engine / layer pairs were measured
  for (const CalibratedCost& c : CalibratedPresets()) {
    SCOPED_TRACE(std::string(c.name));
    absl::StatusOr<std::vector<MicroBatchSample>> rows =
        ReadMicroBatchCsv(std::string(WLB_SOURCE_DIR) + "/" + std::string(c.source));
    ASSERT_TRUE(rows.ok()) << rows.status();
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(*rows);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_EQ(fit->samples, c.micro_batches);
    EXPECT_EQ(fit->held_out_rule, "by step parity");
    // Shipped to 9 significant digits.
    EXPECT_NEAR(fit->model.attn_quadratic, c.quadratic, 1e-8 * c.quadratic);
    EXPECT_NEAR(fit->model.linear_per_token, c.linear, 1e-8 * c.linear);
    EXPECT_NEAR(fit->model.per_document, c.per_document, 1e-12);
    EXPECT_NEAR(fit->per_call_ms, c.per_call_ms, 1e-12);
    EXPECT_NEAR(fit->held_out.mean_relative, c.held_out_mean, 1e-8);
    EXPECT_NEAR(fit->held_out.max_relative, c.held_out_max, 1e-8);
    const CostModel shipped = *CostModelFromPreset(c.name);
    EXPECT_EQ(shipped.attn_quadratic, c.quadratic);
    EXPECT_EQ(shipped.linear_per_token, c.linear);
    EXPECT_EQ(shipped.unit, "ms");
    // The calibration predicts its measurements better than the FLOP preset at its best scale.
    absl::StatusOr<ModelErrors> flop =
        CostModelErrors(*CostModelFromPreset(c.flop_preset), *rows, /*fit_scale=*/true);
    ASSERT_TRUE(flop.ok()) << flop.status();
    EXPECT_LT(fit->held_out.mean_relative, flop->held_out.mean_relative);
  }
}

// The dense family: ms = a T^2 + b T + c documents + per_call, T = sum d (issue 58).
TEST(FitMicroBatchCost, DenseFamilyRecoversATokensSquaredCurveThatThePerDocumentFitCannot) {
  std::mt19937_64 rng(58);
  std::uniform_real_distribution<double> coef(0.3, 3.0);
  std::uniform_int_distribution<int64_t> length(1, 20000), docs(1, 8);
  for (int trial = 0; trial < 12; ++trial) {
    const double a = coef(rng) * 1e-9, b = coef(rng) * 1e-4, c = coef(rng) * 0.01,
                 per_call = coef(rng) * 0.1;
    std::vector<MicroBatchSample> rows;
    for (int i = 0; i < 40; ++i) {
      MicroBatchSample s{.step = i / 4};
      for (int64_t k = docs(rng); k > 0; --k) s.lengths.push_back(length(rng));
      double t = 0;
      for (int64_t d : s.lengths) t += static_cast<double>(d);
      s.ms = a * t * t + b * t + c * static_cast<double>(s.lengths.size()) + per_call;
      rows.push_back(std::move(s));
    }
    absl::StatusOr<MicroBatchFit> dense = FitMicroBatchCost(rows, AttentionFamily::kDense);
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_EQ(dense->model.family(), AttentionFamily::kDense);
    EXPECT_EQ(dense->model.attn_quadratic, 0.0);
    EXPECT_NEAR(dense->model.dense_quadratic, a, 1e-6 * a) << trial;
    EXPECT_NEAR(dense->model.linear_per_token, b, 1e-6 * b) << trial;
    EXPECT_LT(dense->held_out.max_relative, 1e-8) << trial;
    EXPECT_THAT(dense->model.description, HasSubstr("T^2 per micro-batch"));
    EXPECT_NEAR(PredictMicroBatchMs(*dense, rows[3].lengths), rows[3].ms, 1e-6 * rows[3].ms);
    absl::StatusOr<MicroBatchFit> per_document = FitMicroBatchCost(rows);
    ASSERT_TRUE(per_document.ok()) << per_document.status();
    EXPECT_EQ(per_document->model.dense_quadratic, 0.0);
    EXPECT_GT(per_document->held_out.mean_relative, 1e-3) << trial;
    // A fixed model is scored with its dense term: on the times less per_call (which W leaves
    // out) the dense fit's model is exact.
    std::vector<MicroBatchSample> without_call = rows;
    for (MicroBatchSample& s : without_call) s.ms -= per_call;
    absl::StatusOr<ModelErrors> errors =
        CostModelErrors(dense->model, without_call, /*fit_scale=*/false);
    ASSERT_TRUE(errors.ok()) << errors.status();
    EXPECT_LT(errors->in_sample.max_relative, 1e-6) << trial;
  }
}

TEST(CostModel, MicroBatchCostAndThePackingFormOfADenseCost) {
  absl::StatusOr<CostModel> dense = CostModelFromShape(
      {.name = "t", .hidden = 64, .ffn = 96, .heads = 4, .kv_heads = 2, .layers = 3},
      AttentionFamily::kDense);
  ASSERT_TRUE(dense.ok()) << dense.status();
  absl::StatusOr<CostModel> per_document = CostModelFromShape(
      {.name = "t", .hidden = 64, .ffn = 96, .heads = 4, .kv_heads = 2, .layers = 3});
  ASSERT_TRUE(per_document.ok());
  EXPECT_EQ(dense->dense_quadratic, 3 * 4 * 64);
  EXPECT_EQ(dense->attn_quadratic, 0.0);
  EXPECT_EQ(dense->linear_per_token, per_document->linear_per_token);
  EXPECT_EQ(per_document->family(), AttentionFamily::kPerDocument);
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int64_t> length(1, 4000), docs(1, 4);
  const int64_t cap = 16000;  // >= any micro-batch drawn here (4 x 4000)
  const CostModel packing = dense->ForPacking(cap);
  EXPECT_EQ(packing.dense_quadratic, 0.0);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<int64_t> lengths;
    double t = 0, sum = 0;
    for (int64_t k = docs(rng); k > 0; --k) {
      lengths.push_back(length(rng));
      t += static_cast<double>(lengths.back());
      sum += (*dense)(lengths.back());
    }
    EXPECT_DOUBLE_EQ(dense->MicroBatch(lengths), sum + dense->dense_quadratic * t * t);
    EXPECT_DOUBLE_EQ(per_document->MicroBatch(lengths), [&] {
      double w = 0;
      for (int64_t d : lengths) w += (*per_document)(d);
      return w;
    }());
    // The packing form bounds the micro-batch's cost from above (T <= cap), equal at T = cap.
    EXPECT_GE(packing.MicroBatch(lengths), dense->MicroBatch(lengths) * (1 - 1e-12));
  }
  const std::vector<int64_t> full = {cap / 2, cap / 2};
  EXPECT_DOUBLE_EQ(packing.MicroBatch(full), dense->MicroBatch(full));
  EXPECT_EQ(FindAttentionFamily("dense").value(), AttentionFamily::kDense);
  EXPECT_EQ(FindAttentionFamily("per-document").value(), AttentionFamily::kPerDocument);
  EXPECT_THAT(FindAttentionFamily("sdpa").status().message(),
              HasSubstr("unknown attention family 'sdpa' (known: per-document, dense)"));
}

}  // namespace micro_batch_fit_test
}  // namespace wlb
