// Tests of include/wlb/cost/document_cost.hpp: the type-erased cost, the tile-aware table cost
// against the table's own points, and packers driven by a custom cost.
#include "wlb/cost/document_cost.hpp"

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/io/profile.hpp"
#include "wlb/wlb.hpp"

namespace wlb {
namespace document_cost_test {

using ::testing::HasSubstr;

TEST(DocumentCostTest, PolynomialIsTheFastPath) {
  const CostModel poly{.attn_quadratic = 2.0,
                       .attn_linear = 3.0,
                       .linear_per_token = 5.0,
                       .per_document = 7.0,
                       .unit = "flop",
                       .description = "p"};
  const DocumentCost cost = poly;  // implicit
  ASSERT_NE(cost.polynomial(), nullptr);
  for (int64_t d : {1, 2, 100, 131072}) {
    EXPECT_EQ(cost.Attention(d), poly.Attention(d));
    EXPECT_EQ(cost.Linear(d), poly.Linear(d));
    EXPECT_EQ(cost(d), poly(d));
  }
  EXPECT_EQ(cost.unit(), "flop");
  EXPECT_EQ(cost.description(), "p");
}

struct Cubic {
  double Attention(int64_t d) const { return static_cast<double>(d) * d * d; }
  double Linear(int64_t d) const { return 10.0 * static_cast<double>(d); }
};
static_assert(CostFunction<Cubic>);
static_assert(CostFunction<CostModel>);
static_assert(CostFunction<TabulatedCost>);

TEST(DocumentCostTest, CustomFunctionIsCalled) {
  const DocumentCost cost = DocumentCost::From(Cubic{}, "ms", "cubic");
  EXPECT_EQ(cost.polynomial(), nullptr);
  EXPECT_EQ(cost.Attention(3), 27.0);
  EXPECT_EQ(cost.Linear(3), 30.0);
  EXPECT_EQ(cost(3), 57.0);
  EXPECT_EQ(cost.unit(), "ms");
  EXPECT_EQ(cost.description(), "cubic");
  const DocumentCost copy = cost;  // shares the function
  EXPECT_EQ(copy(4), 104.0);
}

TEST(TabulatedCostTest, ReproducesItsPointsFlatBelowStepwiseAbove) {
  const std::vector<ProfilePoint> points = {{256, 0.04}, {64, 0.03}, {1024, 0.13}, {4096, 1.0}};
  absl::StatusOr<TabulatedCost> t = TabulatedCost::Create(points, 128);
  ASSERT_TRUE(t.ok()) << t.status();
  for (const ProfilePoint& p : points) EXPECT_DOUBLE_EQ(t->Attention(p.length), p.ms);
  // Flat below the shortest measured length.
  for (int64_t d : {1, 17, 63}) EXPECT_DOUBLE_EQ(t->Attention(d), 0.03);
  // One value per 128-token tile: 1025..1152 all cost what 1152 costs.
  EXPECT_DOUBLE_EQ(t->Attention(1025), t->Attention(1152));
  EXPECT_DOUBLE_EQ(t->Attention(1100), t->Attention(1152));
  EXPECT_LT(t->Attention(1152), t->Attention(1153));
  // 65..128 share one value; 200 rounds up to the tile end 256, which is the 256 point (a tile
  // never rounds past the next measured length).
  EXPECT_DOUBLE_EQ(t->Attention(65), t->Attention(128));
  EXPECT_DOUBLE_EQ(t->Attention(200), 0.04);
  // Log-log interpolation: 2048 is the geometric mean of the 1024 and 4096 latencies.
  EXPECT_NEAR(t->Attention(2048), std::sqrt(0.13 * 1.0), 1e-12);
  // Beyond the table: the last segment's power law (1024 -> 4096: 0.13 -> 1.0).
  const double exponent = std::log(1.0 / 0.13) / std::log(4.0);
  EXPECT_NEAR(t->Attention(8192), std::pow(2.0, exponent), 1e-9);
  // Non-decreasing everywhere for an increasing table.
  double previous = 0.0;
  for (int64_t d = 1; d < 20000; d += 7) {
    const double v = t->Attention(d);
    EXPECT_GE(v, previous) << d;
    previous = v;
  }
  EXPECT_EQ(t->Linear(100), 0.0);
  absl::StatusOr<TabulatedCost> linear = TabulatedCost::Create(points, 128, 0.5);
  ASSERT_TRUE(linear.ok());
  EXPECT_EQ(linear->Linear(100), 50.0);
  // One point: quadratic growth beyond it.
  const std::vector<ProfilePoint> one = {{1000, 2.0}};
  absl::StatusOr<TabulatedCost> single = TabulatedCost::Create(one, 1);
  ASSERT_TRUE(single.ok());
  EXPECT_DOUBLE_EQ(single->Attention(2000), 8.0);
  EXPECT_DOUBLE_EQ(single->Attention(10), 2.0);
}

TEST(TabulatedCostTest, BadTablesNameTheValue) {
  const std::vector<ProfilePoint> none;
  EXPECT_THAT(std::string(TabulatedCost::Create(none).status().message()),
              HasSubstr("at least one"));
  const std::vector<ProfilePoint> twice = {{64, 1.0}, {64, 2.0}};
  EXPECT_THAT(std::string(TabulatedCost::Create(twice).status().message()),
              HasSubstr("length 64 twice"));
  const std::vector<ProfilePoint> negative = {{64, -1.0}};
  EXPECT_THAT(std::string(TabulatedCost::Create(negative).status().message()), HasSubstr("-1 ms"));
  const std::vector<ProfilePoint> ok = {{64, 1.0}};
  EXPECT_THAT(std::string(TabulatedCost::Create(ok, 0).status().message()), HasSubstr("got 0"));
  EXPECT_THAT(std::string(TabulatedCost::Create(ok, 128, NAN).status().message()),
              HasSubstr("linear_ms_per_token"));
}

// The H100 profile (../shared/data): the table reproduces every measured point exactly, where the
// least-squares quadratic misses them by several percent.
TEST(TabulatedCostTest, H100ProfileAgainstTheFit) {
  const std::string path = std::string(WLB_SHARED_DATA_DIR) + "/h100/compute-attn-H100.csv";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  absl::StatusOr<std::vector<ProfilePoint>> points = ReadProfileCsv(path);
  ASSERT_TRUE(points.ok()) << points.status();
  absl::StatusOr<TabulatedCost> table = TabulatedCost::Create(*points);
  ASSERT_TRUE(table.ok()) << table.status();
  absl::StatusOr<ProfileFit> fit = FitCostModel(*points);
  ASSERT_TRUE(fit.ok());
  for (const ProfilePoint& p : *points) EXPECT_DOUBLE_EQ(table->Attention(p.length), p.ms);
  EXPECT_GT(fit->max_relative_error, 0.05);
}

// Packers take any cost: every token once, micro-batch costs are sums of the custom W(d).
TEST(DocumentCostTest, PackersRunOnACustomCost) {
  const std::vector<ProfilePoint> points = {{64, 0.03}, {1024, 0.13}, {16384, 13.5}};
  const DocumentCost cost =
      DocumentCost::From(*TabulatedCost::Create(points, 128, 1e-4), "ms", "table");
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200; ++i) {
    const PackerConfig config{.context = 4096, .max_tokens = 5120, .micro_batches = 1 + i % 5};
    const std::vector<int64_t> lengths = testing::RandomLengths(rng, config.context, i, 40);
    const std::vector<std::vector<Document>> arrivals = *SplitIntoSteps(
        *MakeDocuments(lengths, config.context), config.context * config.micro_batches);
    for (const char* name : {"original", "fixed-greedy", "wlb", "wlb-refine"}) {
      auto packer = MakePacker(name, config, cost, {.thresholds = {2048}});
      ASSERT_TRUE(packer.ok()) << packer.status();
      absl::StatusOr<PackRun> run = RunPacker(**packer, arrivals);
      ASSERT_TRUE(run.ok()) << run.status();
      ASSERT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(run->steps))) << name;
      for (const StepPlan& step : run->steps) {
        for (const MicroBatch& mb : step.micro_batches) {
          double sum = 0.0;
          for (const Document& d : mb.documents) sum += cost(d.length);
          ASSERT_NEAR(mb.cost, sum, 1e-9 * std::max(1.0, sum));
        }
        ASSERT_GE(ImbalanceDegree(step.micro_batches), LowerBound(step.micro_batches, cost) - 1e-9);
      }
    }
  }
}

}  // namespace document_cost_test
}  // namespace wlb
