// The GPU layer runner (layer_runner.h) against the float64 layer reference (layer_reference.h):
// forward output, input gradient and every weight gradient on small packed micro-batches (a few
// documents, a few hundred tokens), with the flash, cudnn and reference attention engines, MHA and
// GQA, head_dim 64 and 128, the 7B TP = 8 slice; plus run-order and capacity errors. Skips with
// the reason when no CUDA device is present.
//
// Tolerances (relative L2, RMS floor 1e-3, as the attention tests measure): y 1e-2, dx 2e-2,
// weight and gain gradients 3e-2. bf16 rounding of every intermediate activation (~2^-9
// relative each) compounds through the layer's dozen steps; the attention tests allow out 1e-2
// and gradients 2e-2 for one of those steps.
#include <gtest/gtest.h>

#include <random>

#include "test/test_util.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/layer_reference.h"
#include "wlb/cuda/layer_runner.h"

namespace wlb::cuda {
namespace {

using testing::RelativeError;

constexpr double kRmsFloor = 1e-3;

class LayerGpu : public ::testing::TestWithParam<AttentionKernel> {
 protected:
  void SetUp() override {
    const absl::Status s = CudaDeviceAvailable();
    if (!s.ok()) GTEST_SKIP() << "no usable CUDA device: " << s;
  }
};

// The cudnn engine may be compiled out of this build (no cuDNN or frontend headers).
#define WLB_SKIP_UNLESS_COMPILED_IN(kernel)                              \
  if ((kernel) == AttentionKernel::kCudnn && !CudnnEngineCompiledIn()) { \
    GTEST_SKIP() << "the cudnn engine is compiled out of this build";   \
  }

void CheckAgainstReference(const LayerShape& shape, const std::vector<int64_t>& lengths,
                           AttentionKernel kernel, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << shape.name << " seed " << seed);
  absl::StatusOr<PackedDocuments> mb = PackDocuments(lengths);
  ASSERT_TRUE(mb.ok()) << mb.status();
  const LayerParams w = RandomLayerParams(shape, seed);
  const std::vector<double> x = RandomValues(mb->tokens() * shape.hidden, seed + 1, 1.0);
  const std::vector<double> dy = RandomValues(mb->tokens() * shape.hidden, seed + 2, 1.0);
  LayerRunnerOptions options;
  options.attention.kernel = kernel;
  auto runner = LayerRunner::Create(shape, w, mb->tokens() + 17, options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->SetInputs(x, dy).ok());
  ASSERT_TRUE((*runner)->Plan(*mb).ok());
  ASSERT_TRUE((*runner)->Forward().ok());
  ASSERT_TRUE((*runner)->Backward().ok());
  absl::StatusOr<LayerForwardResult> got_y = (*runner)->DownloadOutput();
  absl::StatusOr<LayerGradients> got = (*runner)->DownloadGradients();
  ASSERT_TRUE(got_y.ok() && got.ok());
  absl::StatusOr<LayerForwardResult> want_y = LayerForward(shape, w, *mb, x);
  absl::StatusOr<LayerGradients> want = LayerBackward(shape, w, *mb, x, dy);
  ASSERT_TRUE(want_y.ok() && want.ok());
  EXPECT_LT(RelativeError(got_y->y, want_y->y, kRmsFloor), 1e-2);
  EXPECT_LT(RelativeError(got->dx, want->dx, kRmsFloor), 2e-2);
  const LayerParams& g = got->dparams;
  const LayerParams& r = want->dparams;
  const std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<double>*>>
      grads[] = {{"norm1", {&g.norm1, &r.norm1}}, {"wq", {&g.wq, &r.wq}},
                 {"wk", {&g.wk, &r.wk}},          {"wv", {&g.wv, &r.wv}},
                 {"wo", {&g.wo, &r.wo}},          {"norm2", {&g.norm2, &r.norm2}},
                 {"wgu", {&g.wgu, &r.wgu}},       {"wd", {&g.wd, &r.wd}}};
  for (const auto& [name, pair] : grads) {
    EXPECT_LT(RelativeError(*pair.first, *pair.second, kRmsFloor), 3e-2) << name;
  }
  absl::StatusOr<LayerTimes> t = (*runner)->Times();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->forward_ms, 0.0);
  EXPECT_GE(t->forward_ms, t->attention_forward_ms);
  EXPECT_GE(t->backward_ms, t->attention_backward_ms);
}

TEST_P(LayerGpu, MatchesFloat64ReferenceOnRandomMicroBatches) {
  WLB_SKIP_UNLESS_COMPILED_IN(GetParam());
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 6; ++trial) {
    LayerShape s{.name = "small",
                 .hidden = 256,
                 .heads = 4,
                 .kv_heads = trial % 2 ? 2 : 4,
                 .head_dim = trial % 3 == 2 ? 128 : 64,
                 .ffn = 384};
    std::uniform_int_distribution<int64_t> len(1, 200);
    std::vector<int64_t> lengths(1 + trial % 4);
    for (int64_t& l : lengths) l = len(rng);
    CheckAgainstReference(s, lengths, GetParam(), 40 + trial);
  }
}

TEST_P(LayerGpu, MatchesFloat64ReferenceAt7bTp8Shape) {
  WLB_SKIP_UNLESS_COMPILED_IN(GetParam());
  absl::StatusOr<LayerShape> s = LayerShapeFromPreset("llama2-7b", 8);
  ASSERT_TRUE(s.ok());
  CheckAgainstReference(*s, {129, 64, 1, 90}, GetParam(), 7);
}

// wlb-550m's attention shape (head_dim 96) on the engines that take it (flash does not: see
// RejectsRunOrderAndCapacityErrors).
TEST_F(LayerGpu, MatchesFloat64ReferenceAtHeadDim96) {
  LayerShape s{.name = "d96", .hidden = 192, .heads = 2, .kv_heads = 2, .head_dim = 96, .ffn = 256};
  for (AttentionKernel kernel : {AttentionKernel::kCudnn, AttentionKernel::kReference}) {
    WLB_SKIP_UNLESS_COMPILED_IN(kernel);
    SCOPED_TRACE(AttentionKernelName(kernel));
    CheckAgainstReference(s, {129, 64, 1, 90}, kernel, 96);
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, LayerGpu,
                         ::testing::Values(AttentionKernel::kFlash, AttentionKernel::kCudnn,
                                           AttentionKernel::kReference),
                         [](const auto& info) { return AttentionKernelName(info.param); });

TEST_F(LayerGpu, RejectsRunOrderAndCapacityErrors) {
  LayerShape s{
      .name = "small", .hidden = 128, .heads = 2, .kv_heads = 2, .head_dim = 64, .ffn = 64};
  auto runner = LayerRunner::Create(s, RandomLayerParams(s, 1), 100, {});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->Forward().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PackedDocuments> big = PackDocuments({60, 41});
  EXPECT_EQ((*runner)->Plan(*big).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PackedDocuments> ok = PackDocuments({60, 40});
  ASSERT_TRUE((*runner)->Plan(*ok).ok());
  EXPECT_EQ((*runner)->Backward().code(), absl::StatusCode::kFailedPrecondition);
  LayerShape d96 = s;
  d96.head_dim = 96;
  auto flash96 = LayerRunner::Create(d96, RandomLayerParams(d96, 1), 100, {});
  ASSERT_TRUE(flash96.ok()) << flash96.status();
  EXPECT_EQ((*flash96)->Plan(*ok).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wlb::cuda
