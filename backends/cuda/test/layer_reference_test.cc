// The float64 layer reference (layer_reference.h) on the CPU: its hand-written backward against
// central finite differences of its own forward, document isolation (a packed micro-batch equals
// its documents run alone, so RoPE positions restart per document), shapes from presets, and
// every error path.
#include "wlb/cuda/layer_reference.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "wlb/cuda/layer_shape.h"

namespace wlb::cuda {
namespace {

using ::testing::HasSubstr;

LayerShape Tiny(int64_t heads, int64_t kv_heads) {
  return {.name = "tiny",
          .hidden = 12,
          .heads = heads,
          .kv_heads = kv_heads,
          .head_dim = 4,
          .ffn = 10,
          .rope_theta = 10000.0,
          .norm_eps = 1e-5};
}

double Loss(const LayerShape& s, const LayerParams& w, const PackedDocuments& mb,
            const std::vector<double>& x, const std::vector<double>& dy) {
  absl::StatusOr<LayerForwardResult> f = LayerForward(s, w, mb, x);
  EXPECT_TRUE(f.ok()) << f.status();
  double l = 0.0;
  for (size_t i = 0; i < dy.size(); ++i) l += f->y[i] * dy[i];
  return l;
}

// Compares `analytic` with central differences of Loss at `count` random entries of `param`.
void ExpectMatchesFiniteDifferences(const char* name, std::vector<double>& param,
                                    const std::vector<double>& analytic,
                                    const std::function<double()>& loss, std::mt19937_64& rng) {
  ASSERT_EQ(param.size(), analytic.size()) << name;
  std::uniform_int_distribution<size_t> pick(0, param.size() - 1);
  for (int n = 0; n < 12; ++n) {
    const size_t i = pick(rng);
    const double h = 1e-5, saved = param[i];
    param[i] = saved + h;
    const double up = loss();
    param[i] = saved - h;
    const double down = loss();
    param[i] = saved;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << name << "[" << i << "]";
  }
}

TEST(LayerReferenceTest, BackwardMatchesFiniteDifferencesOverRandomLayers) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 8; ++trial) {
    const LayerShape s = trial % 2 == 0 ? Tiny(2, 2) : Tiny(4, 2);  // MHA and GQA
    std::uniform_int_distribution<int64_t> len(1, 9);
    std::vector<int64_t> lengths(1 + trial % 3);
    for (int64_t& l : lengths) l = len(rng);
    absl::StatusOr<PackedDocuments> mb = PackDocuments(lengths);
    ASSERT_TRUE(mb.ok()) << mb.status();
    LayerParams w = RandomLayerParams(s, 100 + trial);
    std::vector<double> x = RandomValues(mb->tokens() * s.hidden, 200 + trial, 1.0);
    const std::vector<double> dy = RandomValues(mb->tokens() * s.hidden, 300 + trial, 1.0);
    absl::StatusOr<LayerGradients> g = LayerBackward(s, w, *mb, x, dy);
    ASSERT_TRUE(g.ok()) << g.status();
    auto loss = [&] { return Loss(s, w, *mb, x, dy); };
    ExpectMatchesFiniteDifferences("x", x, g->dx, loss, rng);
    ExpectMatchesFiniteDifferences("norm1", w.norm1, g->dparams.norm1, loss, rng);
    ExpectMatchesFiniteDifferences("wq", w.wq, g->dparams.wq, loss, rng);
    ExpectMatchesFiniteDifferences("wk", w.wk, g->dparams.wk, loss, rng);
    ExpectMatchesFiniteDifferences("wv", w.wv, g->dparams.wv, loss, rng);
    ExpectMatchesFiniteDifferences("wo", w.wo, g->dparams.wo, loss, rng);
    ExpectMatchesFiniteDifferences("norm2", w.norm2, g->dparams.norm2, loss, rng);
    ExpectMatchesFiniteDifferences("wgu", w.wgu, g->dparams.wgu, loss, rng);
    ExpectMatchesFiniteDifferences("wd", w.wd, g->dparams.wd, loss, rng);
  }
}

TEST(LayerReferenceTest, PackedDocumentsEqualDocumentsAlone) {
  const LayerShape s = Tiny(4, 2);
  const LayerParams w = RandomLayerParams(s, 3);
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_int_distribution<int64_t> len(1, 12);
    std::vector<int64_t> lengths(1 + trial % 4);
    for (int64_t& l : lengths) l = len(rng);
    absl::StatusOr<PackedDocuments> mb = PackDocuments(lengths);
    ASSERT_TRUE(mb.ok());
    const std::vector<double> x = RandomValues(mb->tokens() * s.hidden, trial, 1.0);
    absl::StatusOr<LayerForwardResult> packed = LayerForward(s, w, *mb, x);
    ASSERT_TRUE(packed.ok()) << packed.status();
    for (int doc = 0; doc < mb->documents(); ++doc) {
      absl::StatusOr<PackedDocuments> one = PackDocuments({lengths[doc]});
      const auto first = x.begin() + mb->cu_seqlens[doc] * s.hidden;
      const std::vector<double> xd(first, first + lengths[doc] * s.hidden);
      absl::StatusOr<LayerForwardResult> alone = LayerForward(s, w, *one, xd);
      ASSERT_TRUE(alone.ok());
      for (size_t i = 0; i < xd.size(); ++i) {
        ASSERT_NEAR(alone->y[i], packed->y[mb->cu_seqlens[doc] * s.hidden + i], 1e-12);
      }
    }
  }
}

TEST(LayerReferenceTest, PositionsMatter) {
  // RoPE changes the output (theta enters), so the isolation test above is not vacuous: a layer
  // that numbered positions across the packed micro-batch would fail it.
  LayerShape s = Tiny(2, 2);
  const LayerParams w = RandomLayerParams(s, 5);
  absl::StatusOr<PackedDocuments> mb = PackDocuments({6});
  const std::vector<double> x = RandomValues(6 * s.hidden, 9, 1.0);
  absl::StatusOr<LayerForwardResult> a = LayerForward(s, w, *mb, x);
  s.rope_theta = 7.0;
  absl::StatusOr<LayerForwardResult> b = LayerForward(s, w, *mb, x);
  ASSERT_TRUE(a.ok() && b.ok());
  double diff = 0.0;
  for (size_t i = 0; i < a->y.size(); ++i) diff = std::max(diff, std::abs(a->y[i] - b->y[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(LayerReferenceTest, PresetShapesAreTpSlices) {
  absl::StatusOr<LayerShape> s7 = LayerShapeFromPreset("llama2-7b", 8);
  ASSERT_TRUE(s7.ok()) << s7.status();
  EXPECT_EQ(s7->hidden, 4096);
  EXPECT_EQ(s7->heads, 4);
  EXPECT_EQ(s7->kv_heads, 4);
  EXPECT_EQ(s7->head_dim, 128);
  EXPECT_EQ(s7->ffn, 1376);
  absl::StatusOr<LayerShape> s550 = LayerShapeFromPreset("wlb-550m", 1);
  ASSERT_TRUE(s550.ok());
  EXPECT_EQ(s550->heads, 16);
  EXPECT_EQ(s550->head_dim, 96);
  EXPECT_EQ(s550->ffn, 4096);
  EXPECT_THAT(LayerShapeFromPreset("llama2-7b", 3).status().message(), HasSubstr("TP = 3"));
  EXPECT_EQ(LayerShapeFromPreset("gpt-5", 1).status().code(), absl::StatusCode::kNotFound);
}

TEST(LayerReferenceTest, RejectsBadInput) {
  const LayerShape s = Tiny(2, 2);
  LayerShape bad = s;
  bad.head_dim = 5;
  EXPECT_THAT(ValidateLayerShape(bad).message(), HasSubstr("head_dim must be even"));
  bad = s;
  bad.kv_heads = 3;
  EXPECT_THAT(ValidateLayerShape(bad).message(), HasSubstr("kv_heads (3)"));
  bad = s;
  bad.ffn = 0;
  EXPECT_THAT(ValidateLayerShape(bad).message(), HasSubstr("ffn must be in [1, 2^20], got 0"));
  bad = s;
  bad.norm_eps = NAN;
  EXPECT_THAT(ValidateLayerShape(bad).message(), HasSubstr("norm_eps"));
  EXPECT_THAT(PackDocuments({3, 0}).status().message(), HasSubstr("document 1: length 0"));
  EXPECT_THAT(PackDocuments({}).status().message(), HasSubstr("at least one document"));
  EXPECT_THAT(PackDocuments({int64_t{1} << 30, int64_t{1} << 30}).status().message(),
              HasSubstr("below 2^31"));
  absl::StatusOr<PackedDocuments> mb = PackDocuments({3});
  LayerParams w = RandomLayerParams(s, 1);
  std::vector<double> x(3 * s.hidden, 0.5);
  EXPECT_THAT(LayerForward(s, w, *mb, std::vector<double>(7)).status().message(),
              HasSubstr("x has 7 values, the shape needs 36"));
  EXPECT_THAT(LayerBackward(s, w, *mb, x, std::vector<double>(2)).status().message(),
              HasSubstr("dy has 2 values"));
  w.wd.pop_back();
  EXPECT_THAT(LayerForward(s, w, *mb, x).status().message(), HasSubstr("wd has 119 values"));
}

TEST(LayerReferenceTest, RandomValuesAreBf16AndNonZero) {
  const std::vector<double> v = RandomValues(1000, 1, 0.75);
  int nonzero = 0;
  for (double x : v) {
    const float f = static_cast<float>(x);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    EXPECT_EQ(bits & 0xFFFFu, 0u);
    EXPECT_LE(std::abs(x), 0.75 * (1 + 1.0 / 128));
    nonzero += x != 0.0;
  }
  EXPECT_GT(nonzero, 990);
}

}  // namespace
}  // namespace wlb::cuda
