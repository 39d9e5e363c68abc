// Tests of include/wlb/cost/attention_mask.hpp.
#include "wlb/cost/attention_mask.hpp"

#include <cstdint>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/pack/make_packer.hpp"

namespace wlb {
namespace attention_mask_test {

using ::testing::HasSubstr;

// Pairs by enumeration: every query q of [q_begin, q_end), every key k <= q it may see.
int64_t BrutePairs(const AttentionMask& m, int64_t q_begin, int64_t q_end) {
  int64_t pairs = 0;
  for (int64_t q = q_begin; q < q_end; ++q) {
    for (int64_t k = 0; k <= q; ++k) {
      bool sees = true;
      if (m.kind() == MaskKind::kSlidingWindow) sees = q - k < m.size();
      if (m.kind() == MaskKind::kChunkedLocal) sees = q / m.size() == k / m.size();
      pairs += sees ? 1 : 0;
    }
  }
  return pairs;
}

TEST(AttentionMaskTest, PairsMatchEnumeration) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 400; ++iter) {
    const int64_t size = std::uniform_int_distribution<int64_t>(1, 70)(rng);
    const int64_t q_end = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    const int64_t q_begin = q_end == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, q_end)(rng);
    for (const AttentionMask& m : {AttentionMask::Causal(), *AttentionMask::SlidingWindow(size),
                                   *AttentionMask::ChunkedLocal(size)}) {
      ASSERT_EQ(m.Pairs(q_begin, q_end), BrutePairs(m, q_begin, q_end))
          << m.Name() << " [" << q_begin << ", " << q_end << ")";
      for (int64_t q = q_begin; q < q_end; ++q) {
        // Query q sees exactly the keys [KeyBegin(q), q].
        ASSERT_EQ(m.Pairs(q, q + 1), q - m.KeyBegin(q) + 1) << m.Name() << " q " << q;
        ASSERT_LE(m.KeyBegin(q), q);
        if (q > 0) ASSERT_LE(m.KeyBegin(q - 1), m.KeyBegin(q));  // monotone
      }
    }
  }
}

TEST(AttentionMaskTest, ExactAtTheLargestContext) {
  const int64_t n = kMaxContext;
  EXPECT_EQ(AttentionMask::Causal().Pairs(0, n), n * (n + 1) / 2);
  EXPECT_EQ(AttentionMask::SlidingWindow(n)->Pairs(0, n), n * (n + 1) / 2);
  EXPECT_EQ(AttentionMask::ChunkedLocal(n)->Pairs(0, n), n * (n + 1) / 2);
  EXPECT_EQ(AttentionMask::SlidingWindow(1)->Pairs(0, n), n);
  EXPECT_EQ(AttentionMask::ChunkedLocal(1)->Pairs(0, n), n);
  EXPECT_EQ(AttentionMask::SlidingWindow(4096)->Pairs(0, n),
            int64_t{4096} * 4097 / 2 + (n - 4096) * 4096);
  EXPECT_EQ(AttentionMask::ChunkedLocal(8192)->Pairs(0, n), n / 8192 * (int64_t{8192} * 8193 / 2));
  // A full mix of kMaxMixLayers causal layers stays inside int64.
  LayerMix mix{{{AttentionMask::Causal(), kMaxMixLayers}}};
  EXPECT_EQ(mix.Pairs(0, n), kMaxMixLayers * (n * (n + 1) / 2));
}

TEST(AttentionMaskTest, ParseAndErrorsNameTheValue) {
  EXPECT_EQ(AttentionMask::Parse("causal")->Name(), "causal");
  EXPECT_EQ(AttentionMask::Parse("window:4096")->Name(), "window:4096");
  EXPECT_EQ(AttentionMask::Parse("chunk:8192")->size(), 8192);
  for (const char* bad :
       {"", "window", "window:", "window:0", "chunk:-3", "sliding:5", "window:99999999999"}) {
    absl::StatusOr<AttentionMask> m = AttentionMask::Parse(bad);
    ASSERT_FALSE(m.ok()) << bad;
  }
  EXPECT_THAT(std::string(AttentionMask::Parse("sliding:5").status().message()),
              HasSubstr("'sliding:5'"));
  EXPECT_THAT(std::string(AttentionMask::SlidingWindow(0).status().message()), HasSubstr("got 0"));

  absl::StatusOr<LayerMix> mix = LayerMix::Parse("window:4096x27,causalx5");
  ASSERT_TRUE(mix.ok()) << mix.status();
  EXPECT_EQ(mix->total_layers(), 32);
  EXPECT_EQ(mix->Name(), "window:4096x27,causalx5");
  EXPECT_FALSE(mix->all_causal());
  EXPECT_TRUE(LayerMix::Parse("causal")->all_causal());
  EXPECT_EQ(LayerMix::Parse("chunk:8,causal")->Pairs(0, 20),
            AttentionMask::ChunkedLocal(8)->Pairs(0, 20) + 20 * 21 / 2);
  for (const char* bad : {"window:4096x0", "window:4096xabc", "causalx5000", "causal,,causal",
                          "window:4096x3000,causalx3000"}) {
    absl::StatusOr<LayerMix> m = LayerMix::Parse(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(std::string("'") + bad + "'"));
  }
}

TEST(AttentionMaskTest, MaskedModelCost) {
  absl::StatusOr<MaskedModel> causal = FindMaskedModel("llama2-7b-causal");
  ASSERT_TRUE(causal.ok()) << causal.status();
  const DocumentCost blind = *CostModelFromPreset("llama2-7b");
  const DocumentCost all_causal = *causal->MakeCost();
  for (int64_t d : {1, 100, 4096, 65536, 131072}) {
    EXPECT_DOUBLE_EQ(all_causal.Attention(d), blind.Attention(d)) << d;
    EXPECT_DOUBLE_EQ(all_causal.Linear(d), blind.Linear(d)) << d;
  }
  absl::StatusOr<MaskedModel> swa = FindMaskedModel("llama2-7b-swa4k");
  ASSERT_TRUE(swa.ok());
  const DocumentCost mixed = *swa->MakeCost();
  // Up to the window every layer is causal; beyond it the local layers grow linearly.
  EXPECT_DOUBLE_EQ(mixed.Attention(4096), blind.Attention(4096));
  const double h4 = 4.0 * 4096;
  EXPECT_DOUBLE_EQ(
      mixed.Attention(131072),
      h4 * static_cast<double>(27 * AttentionMask::SlidingWindow(4096)->Pairs(0, 131072) +
                               5 * AttentionMask::Causal().Pairs(0, 131072)));
  EXPECT_LT(mixed.Attention(131072), 0.25 * blind.Attention(131072));
  EXPECT_TRUE(ValidateCost(mixed).ok());
  EXPECT_THAT(std::string(FindMaskedModel("gemma").status().message()),
              HasSubstr("llama2-7b-swa4k"));
  MaskedModel wrong = *swa;
  wrong.mix.layers.pop_back();
  EXPECT_THAT(std::string(wrong.MakeCost().status().message()), HasSubstr("27 layers"));
}

}  // namespace attention_mask_test
}  // namespace wlb
