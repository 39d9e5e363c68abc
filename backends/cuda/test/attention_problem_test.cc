#include "wlb/cuda/attention_problem.h"

#include <gtest/gtest.h>

#include <string>

#include "test/test_util.h"

namespace wlb::cuda {
namespace {

using testing::DocumentsProblem;
using testing::SegmentsProblem;

void ExpectInvalid(const AttentionProblem& p, AttentionKernel kernel, const std::string& needle) {
  const absl::Status s = ValidateProblem(p, kernel);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "message '" << s.message() << "' lacks '" << needle << "'";
}

TEST(ValidateProblem, AcceptsDocumentsAndCpSegments) {
  EXPECT_TRUE(ValidateProblem(DocumentsProblem({1, 127, 128, 129}, 8, 2, 128),
                              AttentionKernel::kFlash).ok());
  EXPECT_TRUE(ValidateProblem(SegmentsProblem({{64, 300}, {0, 5}, {1, 1}}, 4, 4, 64),
                              AttentionKernel::kFlash).ok());
  EXPECT_TRUE(ValidateProblem(DocumentsProblem({3}, 2, 1, 40), AttentionKernel::kReference).ok());
}

TEST(ValidateProblem, RejectsHeadDimNotSupportedByKernel) {
  ExpectInvalid(DocumentsProblem({8}, 2, 2, 96), AttentionKernel::kFlash, "head_dim = 96");
  ExpectInvalid(DocumentsProblem({8}, 2, 2, 0), AttentionKernel::kReference, "head_dim = 0");
  ExpectInvalid(DocumentsProblem({8}, 2, 2, 257), AttentionKernel::kReference, "head_dim = 257");
}

TEST(ValidateProblem, RejectsHeadCounts) {
  ExpectInvalid(DocumentsProblem({8}, 0, 1, 64), AttentionKernel::kFlash, "num_heads = 0");
  ExpectInvalid(DocumentsProblem({8}, 4, 0, 64), AttentionKernel::kFlash, "num_kv_heads = 0");
  ExpectInvalid(DocumentsProblem({8}, 6, 4, 64), AttentionKernel::kFlash,
                "num_kv_heads = 4 does not divide num_heads = 6");
}

TEST(ValidateProblem, RejectsBadCuSeqlens) {
  AttentionProblem p = DocumentsProblem({8, 8}, 2, 2, 64);
  p.cu_seqlens_q = {0};
  ExpectInvalid(p, AttentionKernel::kFlash, "cu_seqlens_q has 1 entries");
  p = DocumentsProblem({8, 8}, 2, 2, 64);
  p.cu_seqlens_k[0] = 1;
  ExpectInvalid(p, AttentionKernel::kFlash, "cu_seqlens_k[0] = 1");
  p = DocumentsProblem({8, 8}, 2, 2, 64);
  p.cu_seqlens_q = {0, 9, 8};
  ExpectInvalid(p, AttentionKernel::kFlash, "cu_seqlens_q decreases at segment 1");
  p = DocumentsProblem({8, 8}, 2, 2, 64);
  p.cu_seqlens_k.push_back(20);
  ExpectInvalid(p, AttentionKernel::kFlash, "cu_seqlens_q has 3 entries but cu_seqlens_k has 4");
}

TEST(ValidateProblem, RejectsMaxLengthsBelowASegment) {
  AttentionProblem p = DocumentsProblem({8, 20}, 2, 2, 64);
  p.max_seqlen_q = 19;
  ExpectInvalid(p, AttentionKernel::kFlash, "segment 1 has 20 queries > max_seqlen_q = 19");
  p = DocumentsProblem({8, 20}, 2, 2, 64);
  p.max_seqlen_k = 10;
  ExpectInvalid(p, AttentionKernel::kFlash, "segment 1 has 20 keys > max_seqlen_k = 10");
}

TEST(ValidateProblem, RejectsCausalSegmentWithFewerKeysThanQueries) {
  ExpectInvalid(SegmentsProblem({{4, 4}, {10, 9}}, 2, 2, 64), AttentionKernel::kFlash,
                "causal segment 1 has 10 queries but only 9 keys");
  // Without the causal mask, fewer keys are fine, but not none.
  EXPECT_TRUE(ValidateProblem(SegmentsProblem({{10, 9}}, 2, 2, 64, /*causal=*/false),
                              AttentionKernel::kFlash).ok());
  ExpectInvalid(SegmentsProblem({{10, 0}}, 2, 2, 64, /*causal=*/false), AttentionKernel::kFlash,
                "segment 0 has 10 queries and no keys");
}

TEST(ValidateProblem, RejectsSoftmaxScale) {
  AttentionProblem p = DocumentsProblem({8}, 2, 2, 64);
  p.softmax_scale = 0.0f;
  ExpectInvalid(p, AttentionKernel::kFlash, "softmax_scale = 0");
  p.softmax_scale = std::nanf("");
  ExpectInvalid(p, AttentionKernel::kFlash, "softmax_scale = nan");
}

TEST(VisiblePairs, CountsCausalBottomRightAndFull) {
  // Whole document of 4: 1 + 2 + 3 + 4.
  EXPECT_EQ(VisiblePairs(DocumentsProblem({4}, 1, 1, 64)), 10);
  // Queries [2, 4) of a document of 4 (keys [0, 4)): rows see 3 and 4 keys.
  EXPECT_EQ(VisiblePairs(SegmentsProblem({{2, 4}}, 1, 1, 64)), 7);
  EXPECT_EQ(VisiblePairs(SegmentsProblem({{2, 4}}, 1, 1, 64, false)), 8);
  const AttentionProblem p = DocumentsProblem({4, 2}, 8, 2, 128);
  EXPECT_DOUBLE_EQ(ForwardFlops(p), 4.0 * 128 * 8 * (10 + 3));
}

}  // namespace
}  // namespace wlb::cuda
