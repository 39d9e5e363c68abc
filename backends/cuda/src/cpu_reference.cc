#include "wlb/cuda/cpu_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace wlb::cuda {
namespace {

absl::Status CheckSize(absl::Span<const float> t, size_t expected, const char* name) {
  if (t.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has %d elements; expected %d", name, t.size(), expected));
  }
  return absl::OkStatus();
}

absl::Status CheckInputs(const AttentionProblem& p, absl::Span<const float> q,
                         absl::Span<const float> k, absl::Span<const float> v) {
  if (absl::Status s = ValidateProblem(p, AttentionKernel::kReference); !s.ok()) return s;
  const size_t d = p.head_dim;
  if (absl::Status s = CheckSize(q, size_t(p.total_q()) * p.num_heads * d, "q"); !s.ok()) return s;
  if (absl::Status s = CheckSize(k, size_t(p.total_k()) * p.num_kv_heads * d, "k"); !s.ok()) {
    return s;
  }
  return CheckSize(v, size_t(p.total_k()) * p.num_kv_heads * d, "v");
}

// Softmax row of one (query, head): probabilities over the visible keys [0, n) and the LSE.
struct Row {
  std::vector<double> p;
  double lse;
};

Row SoftmaxRow(const AttentionProblem& p, absl::Span<const float> q, absl::Span<const float> k,
               int64_t qi, int h, int64_t k0, int32_t n) {
  const int d = p.head_dim;
  const int hk = h / (p.num_heads / p.num_kv_heads);
  const float* qrow = q.data() + (qi * p.num_heads + h) * d;
  Row row;
  row.p.resize(n);
  double mx = -std::numeric_limits<double>::infinity();
  for (int32_t j = 0; j < n; ++j) {
    const float* krow = k.data() + ((k0 + j) * p.num_kv_heads + hk) * d;
    double s = 0;
    for (int x = 0; x < d; ++x) s += double(qrow[x]) * double(krow[x]);
    row.p[j] = s * p.softmax_scale;
    mx = std::max(mx, row.p[j]);
  }
  double sum = 0;
  for (double& s : row.p) sum += (s = std::exp(s - mx));
  for (double& s : row.p) s /= sum;
  row.lse = mx + std::log(sum);
  return row;
}

// Keys visible to query i (0-based in its segment): [0, n).
int32_t VisibleKeys(const AttentionProblem& p, int b, int32_t i) {
  return p.causal ? i + (p.seqlen_k(b) - p.seqlen_q(b)) + 1 : p.seqlen_k(b);
}

}  // namespace

absl::StatusOr<CpuForward> CpuAttentionForward(const AttentionProblem& p,
                                               absl::Span<const float> q,
                                               absl::Span<const float> k,
                                               absl::Span<const float> v) {
  if (absl::Status s = CheckInputs(p, q, k, v); !s.ok()) return s;
  const int d = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  CpuForward f;
  f.out.assign(size_t(p.total_q()) * p.num_heads * d, 0.0);
  f.lse.assign(size_t(p.total_q()) * p.num_heads, 0.0);
  for (int b = 0; b < p.batch(); ++b) {
    for (int32_t i = 0; i < p.seqlen_q(b); ++i) {
      const int64_t qi = p.cu_seqlens_q[b] + i;
      const int32_t n = VisibleKeys(p, b, i);
      for (int h = 0; h < p.num_heads; ++h) {
        const Row row = SoftmaxRow(p, q, k, qi, h, p.cu_seqlens_k[b], n);
        double* o = f.out.data() + (qi * p.num_heads + h) * d;
        for (int32_t j = 0; j < n; ++j) {
          const float* vrow = v.data() + ((p.cu_seqlens_k[b] + j) * p.num_kv_heads + h / group) * d;
          for (int x = 0; x < d; ++x) o[x] += row.p[j] * double(vrow[x]);
        }
        f.lse[size_t(h) * p.total_q() + qi] = row.lse;
      }
    }
  }
  return f;
}

absl::StatusOr<CpuGradients> CpuAttentionBackward(const AttentionProblem& p,
                                                  absl::Span<const float> q,
                                                  absl::Span<const float> k,
                                                  absl::Span<const float> v,
                                                  absl::Span<const float> dout) {
  if (absl::Status s = CheckInputs(p, q, k, v); !s.ok()) return s;
  if (absl::Status s = CheckSize(dout, q.size(), "dout"); !s.ok()) return s;
  const int d = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  CpuGradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  std::vector<double> dp;
  for (int b = 0; b < p.batch(); ++b) {
    const int64_t k0 = p.cu_seqlens_k[b];
    for (int32_t i = 0; i < p.seqlen_q(b); ++i) {
      const int64_t qi = p.cu_seqlens_q[b] + i;
      const int32_t n = VisibleKeys(p, b, i);
      for (int h = 0; h < p.num_heads; ++h) {
        const int hk = h / group;
        const Row row = SoftmaxRow(p, q, k, qi, h, k0, n);
        const float* qrow = q.data() + (qi * p.num_heads + h) * d;
        const float* dorow = dout.data() + (qi * p.num_heads + h) * d;
        // dP_j = dout . v_j;  D = sum_j P_j dP_j;  dS_j = P_j (dP_j - D).
        dp.assign(n, 0.0);
        double big_d = 0;
        for (int32_t j = 0; j < n; ++j) {
          const float* vrow = v.data() + ((k0 + j) * p.num_kv_heads + hk) * d;
          for (int x = 0; x < d; ++x) dp[j] += double(dorow[x]) * double(vrow[x]);
          big_d += row.p[j] * dp[j];
        }
        double* dqrow = g.dq.data() + (qi * p.num_heads + h) * d;
        for (int32_t j = 0; j < n; ++j) {
          const double ds = row.p[j] * (dp[j] - big_d) * p.softmax_scale;
          const size_t kv = ((k0 + j) * p.num_kv_heads + hk) * d;
          const float* krow = k.data() + kv;
          for (int x = 0; x < d; ++x) {
            dqrow[x] += ds * double(krow[x]);
            g.dk[kv + x] += ds * double(qrow[x]);
            g.dv[kv + x] += row.p[j] * double(dorow[x]);
          }
        }
      }
    }
  }
  return g;
}

}  // namespace wlb::cuda
