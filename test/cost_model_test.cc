#include "wlb/cost/cost_model.hpp"

#include <cmath>
#include <optional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/cost/cost_fit.hpp"

namespace wlb {
namespace cost_model_test {

using ::testing::HasSubstr;

TEST(CostModelFromPreset, Llama7bLinearFlopsAreTwicePerTokenBlockParameters) {
  absl::StatusOr<CostModel> m = CostModelFromPreset("llama2-7b");
  ASSERT_TRUE(m.ok()) << m.status();
  // Block parameters of LLaMA-2 7B, counted independently: 4 h^2 attention + 3 h f MLP per layer.
  const double h = 4096, f = 11008, layers = 32;
  const double block_params = layers * (4 * h * h + 3 * h * f);
  EXPECT_DOUBLE_EQ(m->Linear(1), 2 * block_params);
  EXPECT_DOUBLE_EQ(m->Linear(1000), 1000 * 2 * block_params);
  // Causal attention: 4 h FLOPs per (query, key) pair per layer, d(d+1)/2 pairs.
  EXPECT_DOUBLE_EQ(m->Attention(3), layers * 4 * h * 6);
  EXPECT_DOUBLE_EQ((*m)(128), m->Attention(128) + m->Linear(128));
  EXPECT_EQ(m->unit, "flop");
}

TEST(CostModelFromPreset, GroupedQueryAttentionShrinksOnlyKvProjections) {
  absl::StatusOr<CostModel> m = CostModelFromPreset("llama2-70b");
  ASSERT_TRUE(m.ok()) << m.status();
  const double h = 8192, kv = 8 * 128, f = 28672, layers = 80;
  EXPECT_DOUBLE_EQ(m->Linear(1), layers * (2 * h * (h + 2 * kv) + 2 * h * h + 6 * h * f));
}

TEST(CostModelFromPreset, The550mPresetHasAbout550mParameters) {
  const TransformerShape& s = TransformerPresets().back();
  ASSERT_EQ(s.name, "wlb-550m");
  const double blocks = s.layers * (4.0 * s.hidden * s.hidden + 3.0 * s.hidden * s.ffn);
  const double embeddings = 2.0 * 32000 * s.hidden;
  EXPECT_NEAR((blocks + embeddings) / 1e6, 550, 10);
}

TEST(CostModelFromPreset, UnknownPresetListsTheKnownOnes) {
  absl::StatusOr<CostModel> m = CostModelFromPreset("gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("'gpt-5'"));
  EXPECT_THAT(m.status().message(), HasSubstr("llama2-7b"));
}

TEST(CostModelFromShape, RejectsBadShapes) {
  EXPECT_THAT(CostModelFromShape({"x", 4096, 0, 32, 32, 32}).status().message(),
              HasSubstr("ffn must be > 0, got 0"));
  EXPECT_THAT(CostModelFromShape({"x", 4096, 100, 32, 5, 32}).status().message(),
              HasSubstr("kv_heads (5)"));
}

TEST(FitCostModel, RecoversAnExactQuadratic) {
  std::vector<ProfilePoint> pts;
  for (int64_t d : {64, 256, 1024, 4096, 16384, 65536}) {
    pts.push_back({d, 2e-7 * d * d + 3e-4 * d + 0.02});
  }
  absl::StatusOr<ProfileFit> fit = FitCostModel(pts);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->model.attn_quadratic, 2e-7, 1e-12);
  EXPECT_NEAR(fit->model.attn_linear, 3e-4, 1e-9);
  EXPECT_NEAR(fit->model.per_document, 0.02, 1e-7);
  EXPECT_LT(fit->max_relative_error, 1e-6);
  EXPECT_EQ(fit->model.unit, "ms");
}

TEST(FitCostModel, KeepsCoefficientsNonNegative) {
  // A decreasing linear term would fit these best; the constrained fit must clamp it at zero.
  std::vector<ProfilePoint> pts;
  for (int64_t d : {100, 200, 400, 800, 1600}) pts.push_back({d, 1e-5 * d * d - 1e-3 * d + 5});
  absl::StatusOr<ProfileFit> fit = FitCostModel(pts);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GE(fit->model.attn_quadratic, 0);
  EXPECT_GE(fit->model.attn_linear, 0);
  EXPECT_GE(fit->model.per_document, 0);
  EXPECT_GT(fit->max_relative_error, 0);
}

TEST(FitCostModel, RejectsPointsBeyondTheLimits) {
  const std::vector<ProfilePoint> slow = {{64, 1e308}, {128, 1e308}, {256, 1e308}};
  EXPECT_THAT(FitCostModel(slow).status().message(), HasSubstr("latency in [1e-06, 1e+07] ms"));
  // At the limits the fit and every cost stay finite.
  const std::vector<ProfilePoint> edge = {
      {1, kMinProfileMs}, {4096, 1.0}, {kMaxContext, kMaxProfileMs}};
  absl::StatusOr<ProfileFit> fit = FitCostModel(edge);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(std::isfinite(fit->model(kMaxMaxTokens)));
}

TEST(FitCostModel, RejectsTooFewOrBadPoints) {
  std::vector<ProfilePoint> two = {{1, 1.0}, {2, 2.0}};
  EXPECT_THAT(FitCostModel(two).status().message(), HasSubstr("at least 3"));
  std::vector<ProfilePoint> bad = {{1, 1.0}, {2, -2.0}, {3, 3.0}};
  EXPECT_THAT(FitCostModel(bad).status().message(), HasSubstr("-2"));
}

TEST(NonNegativeLeastSquares, MatchesBruteForceOverRandomProblems) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> value(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const Eigen::Index cols = 1 + trial % 4, rows = cols + 3;
    const Eigen::MatrixXd a = Eigen::MatrixXd::NullaryExpr(rows, cols, [&] { return value(rng); });
    const Eigen::VectorXd y = Eigen::VectorXd::NullaryExpr(rows, [&] { return value(rng); });
    const std::optional<Eigen::VectorXd> x = NonNegativeLeastSquares(a, y);
    // nullopt: no free set has a non-negative solution, so x = 0 is the optimum.
    const Eigen::VectorXd solution = x.value_or(Eigen::VectorXd::Zero(cols));
    EXPECT_TRUE((solution.array() >= 0.0).all()) << trial;
    // No non-negative random point does better (the exact optimum is at least as good).
    const double best = (a * solution - y).squaredNorm();
    std::uniform_real_distribution<double> probe(0.0, 3.0);
    for (int k = 0; k < 200; ++k) {
      const Eigen::VectorXd z = Eigen::VectorXd::NullaryExpr(cols, [&] { return probe(rng); });
      EXPECT_LE(best, (a * z - y).squaredNorm() + 1e-9) << trial;
    }
  }
}

TEST(NonNegativeLeastSquares, RecoversAnExactNonNegativeSolution) {
  Eigen::MatrixXd a(4, 2);
  a << 1, 0, 0, 1, 1, 1, 2, 1;
  const Eigen::VectorXd y = a * Eigen::Vector2d(0.5, 2.0);
  const std::optional<Eigen::VectorXd> x = NonNegativeLeastSquares(a, y);
  ASSERT_TRUE(x.has_value());
  EXPECT_NEAR((*x)(0), 0.5, 1e-12);
  EXPECT_NEAR((*x)(1), 2.0, 1e-12);
}

TEST(NonNegativeLeastSquares, RejectsBadShapes) {
  EXPECT_FALSE(NonNegativeLeastSquares(Eigen::MatrixXd(3, 0), Eigen::VectorXd::Ones(3)));
  EXPECT_FALSE(NonNegativeLeastSquares(Eigen::MatrixXd::Ones(20, 17), Eigen::VectorXd::Ones(20)));
  EXPECT_FALSE(NonNegativeLeastSquares(Eigen::MatrixXd::Ones(3, 2), Eigen::VectorXd::Ones(4)));
}

}  // namespace cost_model_test
}  // namespace wlb
