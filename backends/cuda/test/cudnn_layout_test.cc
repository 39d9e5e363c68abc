// Host-side parts of the cudnn engine (label cpu): shape classes and graph-cache keys, the
// ragged layout cuDNN reads, the LSE layout conversion, kernel names, and the Statuses of
// Create without a device or with an unsupported configuration.
#include "wlb/cuda/cudnn_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test/test_util.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/varlen_attention.h"

namespace wlb::cuda {
namespace {

using testing::DocumentsProblem;
using testing::SegmentsProblem;

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "message '" << s.message() << "' lacks '" << needle << "'";
}

TEST(CudnnBucket, SmallestPowerOfTwoAtLeastFloor) {
  EXPECT_EQ(CudnnBucket(0), 1);
  EXPECT_EQ(CudnnBucket(1), 1);
  EXPECT_EQ(CudnnBucket(2), 2);
  EXPECT_EQ(CudnnBucket(3), 4);
  EXPECT_EQ(CudnnBucket(128), 128);
  EXPECT_EQ(CudnnBucket(129), 256);
  EXPECT_EQ(CudnnBucket(1, 64), 64);
  EXPECT_EQ(CudnnBucket(65, 64), 128);
  EXPECT_EQ(CudnnBucket(int64_t{1} << 40), int64_t{1} << 40);
}

TEST(CudnnTokenBucket, EightClassesPerPowerOfTwo) {
  EXPECT_EQ(CudnnTokenBucket(0), 1);
  EXPECT_EQ(CudnnTokenBucket(7), 7);
  EXPECT_EQ(CudnnTokenBucket(9), 9);   // step 1 below 16
  EXPECT_EQ(CudnnTokenBucket(17), 18);  // step 2
  EXPECT_EQ(CudnnTokenBucket(131072), 131072);
  EXPECT_EQ(CudnnTokenBucket(131073), 131072 + 16384);
  EXPECT_EQ(CudnnTokenBucket(139000), 147456);
  EXPECT_EQ(CudnnTokenBucket(int64_t{1} << 62), int64_t{1} << 62);
  // Every n: the smallest multiple of the step at or above n, at most 12.5% above it.
  for (int64_t n = 1; n <= (int64_t{1} << 16); ++n) {
    const int64_t b = CudnnTokenBucket(n);
    const int64_t step = std::max<int64_t>(std::bit_floor(uint64_t(n)) / 8, 1);
    ASSERT_GE(b, n);
    ASSERT_EQ(b % step, 0) << n;
    ASSERT_LT(b - step, n) << n;
    ASSERT_LE(b * 8, n * 9) << n;
  }
}

TEST(CudnnShapeClass, WorkedExample) {
  // Segments (q, k): (64, 300), (0, 50) dropped, (129, 1000), (5, 5).
  const AttentionProblem p = SegmentsProblem({{64, 300}, {0, 50}, {129, 1000}, {5, 5}}, 8, 2, 128);
  const CudnnShapeClass c = CudnnShapeClassOf(p);
  EXPECT_EQ(c.batch, 4);  // 3 segments with queries
  EXPECT_EQ(c.max_seqlen_q, 256);
  EXPECT_EQ(c.max_seqlen_k, 1024);
  EXPECT_EQ(c.total_q, 208);   // 198: a multiple of 128 / 8
  EXPECT_EQ(c.total_k, 1408);  // 1355: a multiple of 1024 / 8
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.ToString(), "b4 sq256 sk1024 tq208 tk1408 h8 hk2 d128 causal scale=0x1.6a09e6p-4");
}

TEST(CudnnShapeClass, TopLeftCausalOnlyWhenEverySegmentWithQueriesIsSquare) {
  EXPECT_TRUE(CudnnShapeClassOf(DocumentsProblem({100, 7, 1}, 4, 2, 64)).causal_top_left);
  EXPECT_EQ(CudnnShapeClassOf(DocumentsProblem({100}, 4, 2, 64)).ToString(),
            "b1 sq128 sk128 tq104 tk104 h4 hk2 d64 causal-top-left scale=0x1p-3");
  // A query-less segment is dropped from the batch, so its keys do not matter.
  EXPECT_TRUE(CudnnShapeClassOf(SegmentsProblem({{5, 5}, {0, 9}}, 4, 2, 64)).causal_top_left);
  // One CP segment (more keys than queries) needs the bottom-right mask.
  EXPECT_FALSE(CudnnShapeClassOf(SegmentsProblem({{5, 5}, {3, 9}}, 4, 2, 64)).causal_top_left);
  EXPECT_FALSE(
      CudnnShapeClassOf(DocumentsProblem({100}, 4, 2, 64, /*causal=*/false)).causal_top_left);
  // A top-left class never serves a problem that needs the bottom-right mask.
  const CudnnShapeClass square = CudnnShapeClassOf(DocumentsProblem({60, 4}, 4, 2, 64));
  const absl::StatusOr<CudnnRaggedLayout> l =
      BuildCudnnRaggedLayout(SegmentsProblem({{60, 60}, {3, 4}}, 4, 2, 64), square);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), ::testing::HasSubstr("bottom-right"));
}

TEST(CudnnShapeClass, ShortSegmentsShareTheMinimumBucket) {
  const CudnnShapeClass c = CudnnShapeClassOf(DocumentsProblem({1, 3}, 2, 1, 64));
  EXPECT_EQ(c.batch, 2);
  EXPECT_EQ(c.max_seqlen_q, kCudnnMinSeqBucket);
  EXPECT_EQ(c.max_seqlen_k, kCudnnMinSeqBucket);
}

TEST(CudnnShapeClass, NoQueriesMeansNoBatch) {
  const CudnnShapeClass c = CudnnShapeClassOf(SegmentsProblem({{0, 10}, {0, 0}}, 2, 1, 64));
  EXPECT_EQ(c.batch, 0);
  EXPECT_EQ(c.max_seqlen_q, 0);
}

// Property: over random problems, the class covers the problem, every bucketed dimension is the
// smallest power of two that does, problems with the same class have the same key and problems
// with different classes different keys.
TEST(CudnnShapeClass, KeysIdentifyClassesOverRandomProblems) {
  std::mt19937_64 rng(20260101);
  std::vector<std::pair<CudnnShapeClass, std::string>> seen;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::pair<int32_t, int32_t>> segs;
    for (int i = std::uniform_int_distribution<int>(1, 12)(rng); i > 0; --i) {
      const int32_t lk = std::uniform_int_distribution<int32_t>(0, 3000)(rng);
      segs.push_back({std::uniform_int_distribution<int32_t>(0, lk)(rng), lk});
    }
    const int kv = std::uniform_int_distribution<int>(1, 2)(rng);
    AttentionProblem p = SegmentsProblem(segs, kv * 2, kv, trial % 2 ? 64 : 128, trial % 3 != 0);
    const CudnnShapeClass c = CudnnShapeClassOf(p);
    int64_t batch = 0, max_q = 0, max_k = 0;
    for (int b = 0; b < p.batch(); ++b) {
      if (p.seqlen_q(b) == 0) continue;
      ++batch;
      max_q = std::max<int64_t>(max_q, p.seqlen_q(b));
      max_k = std::max<int64_t>(max_k, p.seqlen_k(b));
    }
    if (batch == 0) {
      EXPECT_EQ(c.batch, 0);
      continue;
    }
    for (auto [bucket, need, floor] : {std::tuple{c.batch, batch, int64_t{1}},
                                       std::tuple{c.max_seqlen_q, max_q, kCudnnMinSeqBucket},
                                       std::tuple{c.max_seqlen_k, max_k, kCudnnMinSeqBucket}}) {
      EXPECT_GE(bucket, std::max(need, floor));
      EXPECT_EQ(bucket & (bucket - 1), 0) << bucket << " is not a power of two";
      EXPECT_TRUE(bucket == floor || bucket / 2 < need) << bucket << " for " << need;
    }
    EXPECT_EQ(c.total_q, CudnnTokenBucket(p.total_q()));
    EXPECT_EQ(c.total_k, CudnnTokenBucket(p.total_k()));
    seen.push_back({c, c.ToString()});
  }
  for (size_t i = 0; i < seen.size(); i += 7) {
    for (size_t j = 0; j < seen.size(); j += 5) {
      EXPECT_EQ(seen[i].first == seen[j].first, seen[i].second == seen[j].second)
          << seen[i].second << " vs " << seen[j].second;
    }
  }
}

TEST(CudnnShapeClass, ScaleAndMaskAreInTheKey) {
  AttentionProblem a = DocumentsProblem({100}, 4, 2, 64);
  AttentionProblem b = a;
  b.softmax_scale *= 0.5f;
  AttentionProblem c = DocumentsProblem({100}, 4, 2, 64, /*causal=*/false);
  const std::set<std::string> keys = {CudnnShapeClassOf(a).ToString(),
                                      CudnnShapeClassOf(b).ToString(),
                                      CudnnShapeClassOf(c).ToString()};
  EXPECT_EQ(keys.size(), 3u);
}

TEST(CudnnRaggedLayout, WorkedExample) {
  // heads 4, kv_heads 2, head_dim 64: a Q row is 256 elements, a K row 128, a stats row 4.
  const AttentionProblem p = SegmentsProblem({{3, 10}, {0, 7}, {5, 5}}, 4, 2, 64);
  const CudnnShapeClass c = CudnnShapeClassOf(p);
  ASSERT_EQ(c.batch, 2);
  absl::StatusOr<CudnnRaggedLayout> l = BuildCudnnRaggedLayout(p, c);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->segments, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(l->seq_len_q, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(l->seq_len_k, (std::vector<int32_t>{10, 5}));
  EXPECT_EQ(l->q_offsets, (std::vector<int32_t>{0, 3 * 256, 8 * 256}));
  EXPECT_EQ(l->kv_offsets, (std::vector<int32_t>{0, 17 * 128, 22 * 128}));
  EXPECT_EQ(l->stats_offsets, (std::vector<int32_t>{0, 3 * 4, 8 * 4}));
  EXPECT_TRUE(l->has_unvisited_keys);
}

TEST(CudnnRaggedLayout, PaddingSlotsAreEmptyAndStartAtTheEnd) {
  const AttentionProblem p = DocumentsProblem({7, 9, 2}, 2, 1, 128);
  CudnnShapeClass c = CudnnShapeClassOf(p);
  ASSERT_EQ(c.batch, 4);
  c.batch = 8;  // a larger class of the same shape serves it too
  absl::StatusOr<CudnnRaggedLayout> l = BuildCudnnRaggedLayout(p, c);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->seq_len_q.size(), 8u);
  ASSERT_EQ(l->q_offsets.size(), 9u);
  for (int slot = 3; slot < 8; ++slot) {
    EXPECT_EQ(l->seq_len_q[slot], 0);
    EXPECT_EQ(l->seq_len_k[slot], 0);
    EXPECT_EQ(l->q_offsets[slot], 18 * 256);
    EXPECT_EQ(l->kv_offsets[slot], 18 * 128);
    EXPECT_EQ(l->stats_offsets[slot], 18 * 2);
  }
  EXPECT_FALSE(l->has_unvisited_keys);
}

// Property: every slot with queries addresses exactly its segment's rows; lengths and offsets
// agree (offset[i] + len[i] rows <= offset[i + 1]); unvisited keys are flagged exactly.
TEST(CudnnRaggedLayout, SlotsAddressTheirSegmentsOverRandomProblems) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::pair<int32_t, int32_t>> segs;
    for (int i = std::uniform_int_distribution<int>(1, 20)(rng); i > 0; --i) {
      const int32_t lk = std::uniform_int_distribution<int32_t>(0, 500)(rng);
      segs.push_back({std::uniform_int_distribution<int32_t>(0, lk)(rng), lk});
    }
    const AttentionProblem p = SegmentsProblem(segs, 8, 2, trial % 2 ? 64 : 128);
    const CudnnShapeClass c = CudnnShapeClassOf(p);
    absl::StatusOr<CudnnRaggedLayout> l = BuildCudnnRaggedLayout(p, c);
    ASSERT_TRUE(l.ok()) << l.status();
    const int64_t q_row = 8 * p.head_dim, kv_row = 2 * p.head_dim;
    bool unvisited = false;
    size_t slot = 0;
    for (int b = 0; b < p.batch(); ++b) {
      if (p.seqlen_q(b) == 0) {
        unvisited |= p.seqlen_k(b) > 0;
        continue;
      }
      ASSERT_LT(slot, l->segments.size());
      EXPECT_EQ(l->segments[slot], b);
      EXPECT_EQ(l->seq_len_q[slot], p.seqlen_q(b));
      EXPECT_EQ(l->seq_len_k[slot], p.seqlen_k(b));
      EXPECT_EQ(l->q_offsets[slot], p.cu_seqlens_q[b] * q_row);
      EXPECT_EQ(l->kv_offsets[slot], p.cu_seqlens_k[b] * kv_row);
      EXPECT_EQ(l->stats_offsets[slot], p.cu_seqlens_q[b] * 8);
      ++slot;
    }
    EXPECT_EQ(slot, l->segments.size());
    EXPECT_EQ(l->has_unvisited_keys, unvisited);
    ASSERT_EQ(static_cast<int64_t>(l->seq_len_q.size()), c.batch);
    for (int64_t i = 0; i < c.batch; ++i) {
      EXPECT_LE(l->q_offsets[i] + l->seq_len_q[i] * q_row, l->q_offsets[i + 1]);
      EXPECT_LE(l->kv_offsets[i] + l->seq_len_k[i] * kv_row, l->kv_offsets[i + 1]);
      EXPECT_LE(l->stats_offsets[i] + l->seq_len_q[i] * 8, l->stats_offsets[i + 1]);
    }
    EXPECT_EQ(l->q_offsets.back(), p.total_q() * q_row);
    EXPECT_EQ(l->kv_offsets.back(), p.total_k() * kv_row);
  }
}

TEST(CudnnRaggedLayout, RejectsATooSmallOrMismatchedClass) {
  const AttentionProblem p = DocumentsProblem({100, 300}, 4, 2, 64);
  const CudnnShapeClass c = CudnnShapeClassOf(p);
  CudnnShapeClass small = c;
  small.max_seqlen_q = 128;
  ExpectError(BuildCudnnRaggedLayout(p, small).status(), absl::StatusCode::kInvalidArgument,
              "max_seqlen_q = 512 but the shape class has 128");
  small = c;
  small.batch = 1;
  ExpectError(BuildCudnnRaggedLayout(p, small).status(), absl::StatusCode::kInvalidArgument,
              "batch = 2 but the shape class has 1");
  small = c;
  small.total_k = 256;
  ExpectError(BuildCudnnRaggedLayout(p, small).status(), absl::StatusCode::kInvalidArgument,
              "total_k = 400 but the shape class has 256");
  CudnnShapeClass other = c;
  other.num_kv_heads = 4;
  ExpectError(BuildCudnnRaggedLayout(p, other).status(), absl::StatusCode::kInvalidArgument,
              "does not match the problem's heads 4, kv_heads 2");
}

TEST(CudnnRaggedLayout, OffsetsBeyondInt32AreOutOfRange) {
  // 2^20 tokens x 32 heads x 128 = 2^32 elements: past cuDNN's int32 ragged offsets.
  AttentionProblem p = DocumentsProblem({1 << 19, 1 << 19}, 32, 8, 128);
  ExpectError(BuildCudnnRaggedLayout(p, CudnnShapeClassOf(p)).status(),
              absl::StatusCode::kOutOfRange, "q/out offset 1048576 rows x 4096 elements");
  // 2^19 tokens x 32 heads x 128 = 2^31 is one past the largest int32 offset.
  p = DocumentsProblem({1 << 18, 1 << 18}, 32, 8, 128);
  ExpectError(BuildCudnnRaggedLayout(p, CudnnShapeClassOf(p)).status(),
              absl::StatusCode::kOutOfRange, "q/out offset 524288 rows x 4096 elements");
  p = DocumentsProblem({1 << 18, (1 << 18) - 1}, 32, 8, 128);
  EXPECT_TRUE(BuildCudnnRaggedLayout(p, CudnnShapeClassOf(p)).ok());
}

TEST(LseLayout, ConversionMovesEveryElementAndRoundTrips) {
  std::mt19937_64 rng(3);
  for (auto [heads, tokens] :
       {std::pair{1, 1}, std::pair{4, 3}, std::pair{32, 1000}, std::pair{7, 0}}) {
    std::vector<float> stats(size_t(heads) * tokens);
    for (float& x : stats) x = std::uniform_real_distribution<float>(-50, 50)(rng);
    std::vector<float> lse(stats.size(), -1.0f), back(stats.size(), -1.0f);
    ASSERT_TRUE(CudnnStatsToLse(stats, heads, tokens, absl::MakeSpan(lse)).ok());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        ASSERT_EQ(lse[h * tokens + t], stats[t * heads + h]) << "token " << t << " head " << h;
      }
    }
    ASSERT_TRUE(LseToCudnnStats(lse, heads, tokens, absl::MakeSpan(back)).ok());
    EXPECT_EQ(back, stats);
  }
}

TEST(LseLayout, RejectsMismatchedSizes) {
  std::vector<float> a(12), b(11);
  ExpectError(CudnnStatsToLse(a, 4, 3, absl::MakeSpan(b)), absl::StatusCode::kInvalidArgument,
              "needs 12 elements on both sides; got 12 and 11");
  ExpectError(LseToCudnnStats(a, 0, 3, absl::MakeSpan(a)), absl::StatusCode::kInvalidArgument,
              "heads = 0");
}

TEST(AttentionKernelNames, ParseAndNameRoundTrip) {
  for (AttentionKernel k :
       {AttentionKernel::kFlash, AttentionKernel::kReference, AttentionKernel::kCudnn}) {
    absl::StatusOr<AttentionKernel> parsed = ParseAttentionKernel(AttentionKernelName(k));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, k);
  }
  ExpectError(ParseAttentionKernel("cuDNN").status(), absl::StatusCode::kInvalidArgument,
              "unknown attention kernel 'cuDNN'; allowed: flash, reference, cudnn");
  ExpectError(ParseAttentionKernel("").status(), absl::StatusCode::kInvalidArgument,
              "unknown attention kernel ''");
}

TEST(CudnnEngine, HeadDimIsCheckedBeforeAnyDeviceWork) {
  for (int d : {4, 100, 136}) {
    const absl::Status s = VarlenAttention::Create(DocumentsProblem({10}, 2, 1, d),
                                                   {.kernel = AttentionKernel::kCudnn})
                               .status();
    ExpectError(s, absl::StatusCode::kInvalidArgument,
                "head_dim = " + std::to_string(d) +
                    " is not supported by the cudnn kernel; allowed: multiples of 8 in [8, 128]");
  }
  // wlb-550m's head_dim 96 is the cudnn engine's (flash takes 64 and 128 only).
  for (int d : {8, 96, 120}) {
    EXPECT_TRUE(ValidateProblem(DocumentsProblem({10}, 2, 1, d), AttentionKernel::kCudnn).ok());
  }
  EXPECT_FALSE(ValidateProblem(DocumentsProblem({10}, 2, 1, 96), AttentionKernel::kFlash).ok());
}

TEST(CudnnEngine, RuntimeVersionMatchesTheBuild) {
  absl::StatusOr<int64_t> v = CudnnRuntimeVersion();
  if (!CudnnEngineCompiledIn()) {
    ExpectError(v.status(), absl::StatusCode::kFailedPrecondition,
                "built without the cudnn attention engine");
    return;
  }
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GE(*v, 90000) << "cuDNN 9 is linked";
}

// Without a device (this machine), Create reports a Status, never crashes; with one it plans.
TEST(CudnnEngine, CreateWithoutDeviceIsAStatus) {
  const AttentionProblem p = DocumentsProblem({100, 30}, 4, 2, 128);
  absl::StatusOr<VarlenAttention> a =
      VarlenAttention::Create(p, {.kernel = AttentionKernel::kCudnn});
  if (!CudnnEngineCompiledIn()) {
    ExpectError(a.status(), absl::StatusCode::kFailedPrecondition, "built without");
  } else if (!CudaDeviceAvailable().ok()) {
    EXPECT_FALSE(a.ok());
    std::printf("Create without a device: %s\n", a.status().ToString().c_str());
    EXPECT_FALSE(a.status().message().empty());
  } else if (a.ok()) {
    EXPECT_EQ(a->options().kernel, AttentionKernel::kCudnn);
  } else {
    // A device that cuDNN refuses (too old cuDNN, pre-Hopper GPU) must say so.
    EXPECT_TRUE(a.status().code() == absl::StatusCode::kFailedPrecondition ||
                a.status().code() == absl::StatusCode::kUnimplemented)
        << a.status();
  }
}

}  // namespace
}  // namespace wlb::cuda
