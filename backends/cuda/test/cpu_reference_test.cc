#include "wlb/cuda/cpu_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test/test_util.h"

namespace wlb::cuda {
namespace {

using testing::DocumentsProblem;
using testing::Inputs;
using testing::RandomInputs;
using testing::RandomBf16Values;
using testing::SegmentsProblem;


// Dense formula over the whole packed batch: a (total_q x total_k) mask matrix built from global
// indices, softmax without max subtraction (inputs are small), out = softmax(S) V.
std::vector<double> DenseForward(const AttentionProblem& p, const Inputs& in,
                                 std::vector<double>* lse) {
  const int d = p.head_dim, hq = p.num_heads, hk = p.num_kv_heads;
  std::vector<double> out(size_t(p.total_q()) * hq * d, 0.0);
  lse->assign(size_t(p.total_q()) * hq, 0.0);
  for (int h = 0; h < hq; ++h) {
    for (int qi = 0; qi < p.total_q(); ++qi) {
      int b = 0;
      while (p.cu_seqlens_q[b + 1] <= qi) ++b;
      const int i = qi - p.cu_seqlens_q[b];
      double z = 0;
      std::vector<double> w(p.total_k(), 0.0);
      for (int kj = 0; kj < p.total_k(); ++kj) {
        const bool same = kj >= p.cu_seqlens_k[b] && kj < p.cu_seqlens_k[b + 1];
        const int j = kj - p.cu_seqlens_k[b];
        const bool visible = !p.causal || j - i <= p.seqlen_k(b) - p.seqlen_q(b);
        if (!same || !visible) continue;
        double s = 0;
        for (int x = 0; x < d; ++x) {
          s += in.q[(size_t(qi) * hq + h) * d + x] * in.k[(size_t(kj) * hk + h * hk / hq) * d + x];
        }
        w[kj] = std::exp(s * p.softmax_scale);
        z += w[kj];
      }
      for (int kj = 0; kj < p.total_k(); ++kj) {
        for (int x = 0; x < d; ++x) {
          out[(size_t(qi) * hq + h) * d + x] +=
              w[kj] / z * in.v[(size_t(kj) * hk + h * hk / hq) * d + x];
        }
      }
      (*lse)[size_t(h) * p.total_q() + qi] = std::log(z);
    }
  }
  return out;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(CpuReference, OneKeyGivesItsValue) {
  const AttentionProblem p = DocumentsProblem({1}, 1, 1, 2);
  const Inputs in{{1, 2}, {3, -1}, {0.5f, -4}, {}};
  absl::StatusOr<CpuForward> f = CpuAttentionForward(p, in.q, in.k, in.v);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_DOUBLE_EQ(f->out[0], 0.5);
  EXPECT_DOUBLE_EQ(f->out[1], -4);
  EXPECT_NEAR(f->lse[0], (1 * 3 + 2 * -1) / std::sqrt(2.0), 1e-7);
}

TEST(CpuReference, TwoKeysByHand) {
  // Query 2 of a 2-token document sees both keys: weights e^{s1}, e^{s2}.
  AttentionProblem p = DocumentsProblem({2}, 1, 1, 1);
  p.softmax_scale = 1.0f;
  const Inputs in{{0, 1}, {1, 2}, {10, 20}, {}};
  absl::StatusOr<CpuForward> f = CpuAttentionForward(p, in.q, in.k, in.v);
  ASSERT_TRUE(f.ok());
  EXPECT_DOUBLE_EQ(f->out[0], 10);  // row 0 sees key 0 only (score 0)
  const double w1 = std::exp(1.0), w2 = std::exp(2.0);
  EXPECT_NEAR(f->out[1], (10 * w1 + 20 * w2) / (w1 + w2), 1e-12);
  EXPECT_NEAR(f->lse[0], 0.0, 1e-12);
  EXPECT_NEAR(f->lse[1], std::log(w1 + w2), 1e-12);
}

TEST(CpuReference, MatchesDenseMaskedFormula) {
  std::mt19937_64 rng(7);
  const AttentionProblem cases[] = {
      DocumentsProblem({1, 5, 3}, 2, 1, 8),
      SegmentsProblem({{3, 7}, {0, 4}, {2, 2}}, 4, 2, 4),
      SegmentsProblem({{3, 7}, {5, 2}}, 2, 2, 4, /*causal=*/false),
  };
  for (const AttentionProblem& p : cases) {
    const Inputs in = RandomInputs(p, rng);
    absl::StatusOr<CpuForward> f = CpuAttentionForward(p, in.q, in.k, in.v);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<double> lse;
    const std::vector<double> out = DenseForward(p, in, &lse);
    EXPECT_LT(MaxAbsDiff(f->out, out), 1e-12);
    EXPECT_LT(MaxAbsDiff(f->lse, lse), 1e-12);
  }
}

TEST(CpuReference, CpSegmentEqualsRowsOfTheWholeDocument) {
  // Queries [6, 11) of an 11-token document with keys [0, 11) give rows 6..10 of the full pass.
  std::mt19937_64 rng(8);
  const AttentionProblem whole = DocumentsProblem({11}, 2, 2, 8);
  const Inputs in = RandomInputs(whole, rng);
  const AttentionProblem seg = SegmentsProblem({{5, 11}}, 2, 2, 8);
  const size_t row = 2 * 8;
  const std::vector<float> q_seg(in.q.begin() + 6 * row, in.q.end());
  absl::StatusOr<CpuForward> fw = CpuAttentionForward(whole, in.q, in.k, in.v);
  absl::StatusOr<CpuForward> fs = CpuAttentionForward(seg, q_seg, in.k, in.v);
  ASSERT_TRUE(fw.ok() && fs.ok());
  for (size_t i = 0; i < fs->out.size(); ++i) EXPECT_DOUBLE_EQ(fs->out[i], fw->out[6 * row + i]);
}

TEST(CpuReference, GqaEqualsMhaWithRepeatedKv) {
  std::mt19937_64 rng(9);
  const AttentionProblem gqa = DocumentsProblem({4, 6}, 4, 2, 8);
  const AttentionProblem mha = DocumentsProblem({4, 6}, 4, 4, 8);
  const Inputs in = RandomInputs(gqa, rng);
  std::vector<float> k4, v4;
  for (int t = 0; t < 10; ++t) {
    for (int h = 0; h < 4; ++h) {
      for (int x = 0; x < 8; ++x) {
        k4.push_back(in.k[(t * 2 + h / 2) * 8 + x]);
        v4.push_back(in.v[(t * 2 + h / 2) * 8 + x]);
      }
    }
  }
  absl::StatusOr<CpuForward> a = CpuAttentionForward(gqa, in.q, in.k, in.v);
  absl::StatusOr<CpuForward> b = CpuAttentionForward(mha, in.q, k4, v4);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(MaxAbsDiff(a->out, b->out), 1e-12);
  // GQA gradients of K/V are the sums over the group of the MHA ones.
  absl::StatusOr<CpuGradients> ga = CpuAttentionBackward(gqa, in.q, in.k, in.v, in.dout);
  absl::StatusOr<CpuGradients> gb = CpuAttentionBackward(mha, in.q, k4, v4, in.dout);
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_LT(MaxAbsDiff(ga->dq, gb->dq), 1e-12);
  for (int t = 0; t < 10; ++t) {
    for (int hk = 0; hk < 2; ++hk) {
      for (int x = 0; x < 8; ++x) {
        const double sum = gb->dk[(t * 4 + 2 * hk) * 8 + x] + gb->dk[(t * 4 + 2 * hk + 1) * 8 + x];
        EXPECT_NEAR(ga->dk[(t * 2 + hk) * 8 + x], sum, 1e-12);
      }
    }
  }
}

// Central finite differences of L = sum(out * dout) against the analytic gradients.
TEST(CpuReference, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(10);
  const AttentionProblem cases[] = {
      SegmentsProblem({{3, 5}, {2, 2}}, 2, 1, 4),
      SegmentsProblem({{3, 2}, {1, 4}}, 2, 2, 4, /*causal=*/false),
  };
  for (const AttentionProblem& p : cases) {
    Inputs in = RandomInputs(p, rng);
    absl::StatusOr<CpuGradients> g = CpuAttentionBackward(p, in.q, in.k, in.v, in.dout);
    ASSERT_TRUE(g.ok()) << g.status();
    auto loss = [&](const Inputs& x) {
      absl::StatusOr<CpuForward> f = CpuAttentionForward(p, x.q, x.k, x.v);
      double l = 0;
      for (size_t i = 0; i < f->out.size(); ++i) l += f->out[i] * x.dout[i];
      return l;
    };
    auto check = [&](std::vector<float> Inputs::*field, const std::vector<double>& grad,
                     const char* name) {
      for (size_t i = 0; i < grad.size(); ++i) {
        const float h = 1.0f / 1024;  // exact in float: the perturbed inputs are exact too
        Inputs plus = in, minus = in;
        (plus.*field)[i] += h;
        (minus.*field)[i] -= h;
        const double fd = (loss(plus) - loss(minus)) / (2.0 * h);
        EXPECT_NEAR(grad[i], fd, 2e-4 * (1 + std::abs(fd))) << name << "[" << i << "]";
      }
    };
    check(&Inputs::q, g->dq, "dq");
    check(&Inputs::k, g->dk, "dk");
    check(&Inputs::v, g->dv, "dv");
  }
}

// Largest |a - b| over the largest |b|.
double MaxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (double x : b) m = std::max(m, std::abs(x));
  return MaxAbsDiff(a, b) / std::max(m, 1e-300);
}

std::vector<float> ToFloat(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// Random rows of the packed tensor (repeats allowed), always with the first and last.
std::vector<int64_t> RandomRows(int64_t total, std::mt19937_64& rng) {
  if (total == 0) return {};
  std::vector<int64_t> rows = {0, total - 1};
  for (int i = std::uniform_int_distribution<int>(0, 6)(rng); i > 0; --i) {
    rows.push_back(std::uniform_int_distribution<int64_t>(0, total - 1)(rng));
  }
  return rows;
}

// The chosen rows' values of the whole reference, (rows, heads, dim) or (rows, heads) for LSE.
std::vector<double> PickRows(const std::vector<double>& t, const std::vector<int64_t>& rows,
                             size_t row_size) {
  std::vector<double> out;
  for (int64_t r : rows) {
    out.insert(out.end(), t.begin() + r * row_size, t.begin() + (r + 1) * row_size);
  }
  return out;
}

TEST(CpuReference, RowsMatchTheWholeReferenceOnRandomProblems) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::pair<int32_t, int32_t>> segs;
    const bool causal = std::bernoulli_distribution(0.8)(rng);
    for (int i = std::uniform_int_distribution<int>(1, 5)(rng); i > 0; --i) {
      const int32_t lk = std::uniform_int_distribution<int32_t>(0, 20)(rng);
      int32_t lq = std::uniform_int_distribution<int32_t>(0, lk)(rng);
      if (!causal && lk > 0) lq = std::uniform_int_distribution<int32_t>(0, 20)(rng);
      segs.push_back({lq, lk});
    }
    const int kv_heads = std::uniform_int_distribution<int>(1, 2)(rng);
    const int heads = kv_heads * std::uniform_int_distribution<int>(1, 3)(rng);
    const AttentionProblem p = SegmentsProblem(segs, heads, kv_heads, 4, causal);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Inputs in = RandomInputs(p, rng);
    absl::StatusOr<CpuForward> f = CpuAttentionForward(p, in.q, in.k, in.v);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<CpuGradients> g = CpuAttentionBackward(p, in.q, in.k, in.v, in.dout);
    ASSERT_TRUE(g.ok()) << g.status();
    const std::vector<int64_t> qrows = RandomRows(p.total_q(), rng);
    const std::vector<int64_t> krows = RandomRows(p.total_k(), rng);
    absl::StatusOr<CpuRows> fr = CpuAttentionForwardRows(p, in.q, in.k, in.v, qrows);
    ASSERT_TRUE(fr.ok()) << fr.status();
    const size_t d = p.head_dim;
    EXPECT_LT(MaxAbsDiff(fr->out, PickRows(f->out, qrows, heads * d)), 1e-12);
    // The whole reference lays LSE out (heads, total_q); the rows API (rows, heads).
    std::vector<double> lse_rows;
    for (int64_t r : qrows) {
      for (int h = 0; h < heads; ++h) lse_rows.push_back(f->lse[h * p.total_q() + r]);
    }
    EXPECT_LT(MaxAbsDiff(fr->lse, lse_rows), 1e-12);
    // Given the forward's out and LSE (rounded to float as a kernel's would be), the rows'
    // gradients are the whole backward's up to that rounding.
    absl::StatusOr<CpuRows> br = CpuAttentionBackwardRows(p, in.q, in.k, in.v, ToFloat(f->out),
                                                          in.dout, ToFloat(f->lse), qrows, krows);
    ASSERT_TRUE(br.ok()) << br.status();
    if (!qrows.empty()) EXPECT_LT(MaxRelDiff(br->dq, PickRows(g->dq, qrows, heads * d)), 1e-5);
    if (!krows.empty()) {
      EXPECT_LT(MaxRelDiff(br->dk, PickRows(g->dk, krows, kv_heads * d)), 1e-5);
      EXPECT_LT(MaxRelDiff(br->dv, PickRows(g->dv, krows, kv_heads * d)), 1e-5);
    }
  }
}

TEST(CpuReference, RowsRejectRowsOutOfRangeAndWrongSizes) {
  const AttentionProblem p = DocumentsProblem({3, 2}, 2, 1, 4);
  std::mt19937_64 rng(3);
  const Inputs in = RandomInputs(p, rng);
  const std::vector<float> lse(2 * 5, 0.f), short_lse(9, 0.f);
  const std::vector<int64_t> bad_q = {0, 5}, bad_k = {-1}, ok_rows = {4};
  absl::StatusOr<CpuRows> r = CpuAttentionForwardRows(p, in.q, in.k, in.v, bad_q);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("query row 5 is outside [0, 5)"),
            std::string::npos)
      << r.status();
  r = CpuAttentionBackwardRows(p, in.q, in.k, in.v, in.q, in.dout, lse, ok_rows, bad_k);
  EXPECT_NE(std::string(r.status().message()).find("key row -1 is outside [0, 5)"),
            std::string::npos)
      << r.status();
  r = CpuAttentionBackwardRows(p, in.q, in.k, in.v, in.q, in.dout, short_lse, ok_rows, ok_rows);
  EXPECT_NE(std::string(r.status().message()).find("lse has 9 elements; expected 10"),
            std::string::npos)
      << r.status();
}

// The tests' error measure: relative L2, with an RMS floor for (near-)zero references.
TEST(RelativeError, FloorTurnsZeroReferencesIntoAnAbsoluteBound) {
  const std::vector<double> zero(4, 0.0), ref = {1, -1, 1, -1};
  const std::vector<float> small(4, 1e-4f), off = {1.5f, -1, 1, -1};
  EXPECT_EQ(testing::RelativeError(std::vector<float>{}, std::vector<double>{}), 0.0);
  EXPECT_EQ(testing::RelativeError(std::vector<float>(4, 0.f), zero), 0.0);
  EXPECT_TRUE(std::isinf(testing::RelativeError(small, zero)));  // no floor: never passes
  EXPECT_NEAR(testing::RelativeError(small, zero, 1e-3), 0.1, 1e-6);
  EXPECT_NEAR(testing::RelativeError(off, ref, 1e-3), 0.25, 1e-12);  // floor below ||ref||
}

TEST(CpuReference, RejectsWrongTensorSizes) {
  const AttentionProblem p = DocumentsProblem({3}, 2, 1, 4);
  std::vector<float> q(24), k(12), v(11);
  absl::StatusOr<CpuForward> f = CpuAttentionForward(p, q, k, v);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(f.status().message()).find("v has 11 elements; expected 12"),
            std::string::npos)
      << f.status();
}

}  // namespace
}  // namespace wlb::cuda
