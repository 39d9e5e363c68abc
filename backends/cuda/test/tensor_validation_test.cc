// Host-side argument checks of the device API; no device is touched (fake pointers are never
// dereferenced because validation fails, or succeeds, before any launch).
#include <gtest/gtest.h>

#include <string>

#include "test/test_util.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/varlen_attention.h"

namespace wlb::cuda {
namespace {

using testing::SegmentsProblem;

// Distinct, 16-byte aligned fake addresses far apart.
template <typename T>
T* Fake(uintptr_t slot) {
  return reinterpret_cast<T*>(uintptr_t{1} << 40 | slot << 32);
}

class TensorValidation : public ::testing::Test {
 protected:
  // Segments of (20 queries, 50 keys) and (7, 7): total_q 27, total_k 57; 8 heads, 2 kv heads.
  AttentionProblem p_ = SegmentsProblem({{20, 50}, {7, 7}}, 8, 2, 128);

  ForwardTensors GoodForward() const {
    ForwardTensors t;
    t.q = {Fake<const __nv_bfloat16>(1), 27, 8, 128};
    t.k = {Fake<const __nv_bfloat16>(2), 57, 2, 128};
    t.v = {Fake<const __nv_bfloat16>(3), 57, 2, 128};
    t.out = {Fake<__nv_bfloat16>(4), 27, 8, 128};
    t.lse = {Fake<float>(5), 8, 27};
    return t;
  }

  BackwardTensors GoodBackward() const {
    BackwardTensors t;
    t.q = {Fake<const __nv_bfloat16>(1), 27, 8, 128};
    t.k = {Fake<const __nv_bfloat16>(2), 57, 2, 128};
    t.v = {Fake<const __nv_bfloat16>(3), 57, 2, 128};
    t.out = {Fake<const __nv_bfloat16>(4), 27, 8, 128};
    t.dout = {Fake<const __nv_bfloat16>(5), 27, 8, 128};
    t.lse = {Fake<const float>(6), 8, 27};
    t.dq = {Fake<__nv_bfloat16>(7), 27, 8, 128};
    t.dk = {Fake<__nv_bfloat16>(8), 57, 2, 128};
    t.dv = {Fake<__nv_bfloat16>(9), 57, 2, 128};
    return t;
  }
};

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "message '" << s.message() << "' lacks '" << needle << "'";
}

TEST_F(TensorValidation, AcceptsConsistentTensors) {
  EXPECT_TRUE(ValidateForwardTensors(p_, GoodForward()).ok());
  EXPECT_TRUE(ValidateBackwardTensors(p_, GoodBackward()).ok());
}

TEST_F(TensorValidation, RejectsShapes) {
  ForwardTensors f = GoodForward();
  f.k.heads = 8;
  ExpectInvalid(ValidateForwardTensors(p_, f),
                "k has shape (57, 8, 128); expected (tokens=57, heads=2, head_dim=128)");
  f = GoodForward();
  f.out.tokens = 28;
  ExpectInvalid(ValidateForwardTensors(p_, f), "out has shape (28, 8, 128)");
  f = GoodForward();
  f.lse = {Fake<float>(5), 27, 8};
  ExpectInvalid(ValidateForwardTensors(p_, f), "lse has shape (27, 8); expected (heads=8");
  BackwardTensors b = GoodBackward();
  b.dv.head_dim = 64;
  ExpectInvalid(ValidateBackwardTensors(p_, b), "dv has shape (57, 2, 64)");
}

TEST_F(TensorValidation, RejectsNullAndMisaligned) {
  ForwardTensors f = GoodForward();
  f.v.data = nullptr;
  ExpectInvalid(ValidateForwardTensors(p_, f), "v is null");
  f = GoodForward();
  f.q.data = reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<uintptr_t>(f.q.data) + 2);
  ExpectInvalid(ValidateForwardTensors(p_, f), "is not 16-byte aligned");
  BackwardTensors b = GoodBackward();
  b.lse.data = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(b.lse.data) + 4);
  ExpectInvalid(ValidateBackwardTensors(p_, b), "lse = ");
}

TEST_F(TensorValidation, RejectsOverlappingOutputs) {
  ForwardTensors f = GoodForward();
  f.out.data = reinterpret_cast<__nv_bfloat16*>(const_cast<__nv_bfloat16*>(f.q.data) + 16);
  ExpectInvalid(ValidateForwardTensors(p_, f), "output out overlaps q");
  BackwardTensors b = GoodBackward();
  b.dk.data = b.dv.data;
  ExpectInvalid(ValidateBackwardTensors(p_, b), "output dk overlaps dv");
  b = GoodBackward();
  b.dq.data = const_cast<__nv_bfloat16*>(b.dout.data);
  ExpectInvalid(ValidateBackwardTensors(p_, b), "output dq overlaps dout");
}

TEST(VarlenAttentionCreate, RejectsInvalidProblemBeforeTouchingTheDevice) {
  AttentionProblem p = SegmentsProblem({{8, 8}}, 4, 4, 80);
  absl::StatusOr<VarlenAttention> a = VarlenAttention::Create(p);
  ExpectInvalid(a.status(), "head_dim = 80 is not supported by the flash kernel");
  p.head_dim = 80;
  AttentionOptions ref;
  ref.kernel = AttentionKernel::kReference;
  p.num_kv_heads = 3;
  ExpectInvalid(VarlenAttention::Create(p, ref).status(), "num_kv_heads = 3");
}

TEST(VarlenAttentionCreate, RejectsUnknownFlashBackwardConfigBeforeTouchingTheDevice) {
  AttentionOptions o;
  o.flash_backward = static_cast<FlashBackwardConfig>(4);
  ExpectInvalid(VarlenAttention::Create(SegmentsProblem({{8, 8}}, 4, 4, 64), o).status(),
                "flash_backward = 4 is not a FlashBackwardConfig");
  o.flash_backward = static_cast<FlashBackwardConfig>(-1);
  ExpectInvalid(VarlenAttention::Create(SegmentsProblem({{8, 8}}, 4, 4, 64), o).status(),
                "flash_backward = -1 is not a FlashBackwardConfig");
}

TEST(FlashBackwardConfigNames, ParseAndNameRoundTrip) {
  for (FlashBackwardConfig c : {FlashBackwardConfig::kQ64, FlashBackwardConfig::kQ64Pass32,
                                FlashBackwardConfig::kQ32, FlashBackwardConfig::kQ64Warps8}) {
    EXPECT_TRUE(ValidateFlashBackwardConfig(c).ok()) << FlashBackwardConfigName(c);
    absl::StatusOr<FlashBackwardConfig> parsed =
        ParseFlashBackwardConfig(FlashBackwardConfigName(c));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_EQ(AttentionOptions{}.flash_backward, FlashBackwardConfig::kQ64) << "default changed";
  ExpectInvalid(ParseFlashBackwardConfig("Q32").status(),
                "unknown flash backward config 'Q32'; allowed: q64, q64_pass32, q32, q64_w8");
  ExpectInvalid(ParseFlashBackwardConfig("").status(), "unknown flash backward config ''");
  EXPECT_STREQ(FlashBackwardConfigName(static_cast<FlashBackwardConfig>(7)), "unknown");
}

TEST(VarlenAttentionCreate, ReportsMissingDeviceAsStatus) {
  if (CudaDeviceAvailable().ok()) {
    GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  }
  absl::StatusOr<VarlenAttention> a =
      VarlenAttention::Create(SegmentsProblem({{8, 8}}, 4, 4, 64));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(std::string(a.status().message()).find("CUDA error"), std::string::npos) << a.status();
  EXPECT_NE(std::string(a.status().message()).find("varlen_attention.cc:"), std::string::npos)
      << a.status();
}

TEST(CudaStatus, NamesErrorExpressionAndLocation) {
  const absl::Status s = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.cc", 12);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(s.message()).find("cudaErrorMemoryAllocation"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("`cudaMalloc(&p, n)` at f.cc:12"), std::string::npos)
      << s;
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x", "f.cc", 1).ok());
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x", "f.cc", 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace wlb::cuda
