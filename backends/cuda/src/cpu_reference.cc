#include "wlb/cuda/cpu_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace wlb::cuda {
namespace {

template <typename T>
absl::Status CheckSize(absl::Span<const T> t, size_t expected, const char* name) {
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

// Adds row qi (segment b), head h of the forward output to `o` and returns its LSE.
double ForwardRow(const AttentionProblem& p, absl::Span<const float> q, absl::Span<const float> k,
                  absl::Span<const float> v, int b, int64_t qi, int h, double* o) {
  const int d = p.head_dim;
  const int hk = h / (p.num_heads / p.num_kv_heads);
  const int32_t n = VisibleKeys(p, b, static_cast<int32_t>(qi - p.cu_seqlens_q[b]));
  const Row row = SoftmaxRow(p, q, k, qi, h, p.cu_seqlens_k[b], n);
  for (int32_t j = 0; j < n; ++j) {
    const float* vrow = v.data() + ((p.cu_seqlens_k[b] + j) * p.num_kv_heads + hk) * d;
    for (int x = 0; x < d; ++x) o[x] += row.p[j] * double(vrow[x]);
  }
  return row.lse;
}

double Dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int x = 0; x < d; ++x) s += double(a[x]) * double(b[x]);
  return s;
}

// The segment holding global row `row` of the packed tensor with prefix offsets `cu` (empty
// segments repeat an offset; the last segment starting at or before `row` holds it).
int SegmentOf(const std::vector<int32_t>& cu, int64_t row) {
  return static_cast<int>(std::upper_bound(cu.begin(), cu.end(), row) - cu.begin()) - 1;
}

absl::Status CheckRows(absl::Span<const int64_t> rows, int64_t total, const char* what) {
  for (int64_t r : rows) {
    if (r < 0 || r >= total) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s row %d is outside [0, %d)", what, r, total));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CpuForward> CpuAttentionForward(const AttentionProblem& p,
                                               absl::Span<const float> q,
                                               absl::Span<const float> k,
                                               absl::Span<const float> v) {
  if (absl::Status s = CheckInputs(p, q, k, v); !s.ok()) return s;
  const int d = p.head_dim;
  CpuForward f;
  f.out.assign(size_t(p.total_q()) * p.num_heads * d, 0.0);
  f.lse.assign(size_t(p.total_q()) * p.num_heads, 0.0);
  for (int b = 0; b < p.batch(); ++b) {
    for (int64_t qi = p.cu_seqlens_q[b]; qi < p.cu_seqlens_q[b + 1]; ++qi) {
      for (int h = 0; h < p.num_heads; ++h) {
        f.lse[size_t(h) * p.total_q() + qi] =
            ForwardRow(p, q, k, v, b, qi, h, f.out.data() + (qi * p.num_heads + h) * d);
      }
    }
  }
  return f;
}

absl::StatusOr<CpuRows> CpuAttentionForwardRows(const AttentionProblem& p,
                                                absl::Span<const float> q,
                                                absl::Span<const float> k,
                                                absl::Span<const float> v,
                                                absl::Span<const int64_t> query_rows) {
  if (absl::Status s = CheckInputs(p, q, k, v); !s.ok()) return s;
  if (absl::Status s = CheckRows(query_rows, p.total_q(), "query"); !s.ok()) return s;
  const int d = p.head_dim, heads = p.num_heads;
  CpuRows r;
  r.out.assign(query_rows.size() * heads * d, 0.0);
  r.lse.assign(query_rows.size() * heads, 0.0);
  for (size_t s = 0; s < query_rows.size(); ++s) {
    const int64_t qi = query_rows[s];
    const int b = SegmentOf(p.cu_seqlens_q, qi);
    for (int h = 0; h < heads; ++h) {
      r.lse[s * heads + h] = ForwardRow(p, q, k, v, b, qi, h, r.out.data() + (s * heads + h) * d);
    }
  }
  return r;
}

namespace {

// CpuAttentionBackwardRows for out and lse given as float or double.
template <typename T>
absl::StatusOr<CpuRows> BackwardRows(const AttentionProblem& p, absl::Span<const float> q,
                                     absl::Span<const float> k, absl::Span<const float> v,
                                     absl::Span<const T> out, absl::Span<const float> dout,
                                     absl::Span<const T> lse, absl::Span<const int64_t> query_rows,
                                     absl::Span<const int64_t> key_rows) {
  if (absl::Status s = CheckInputs(p, q, k, v); !s.ok()) return s;
  if (absl::Status s = CheckSize(out, q.size(), "out"); !s.ok()) return s;
  if (absl::Status s = CheckSize(dout, q.size(), "dout"); !s.ok()) return s;
  if (absl::Status s = CheckSize(lse, size_t(p.total_q()) * p.num_heads, "lse"); !s.ok()) return s;
  if (absl::Status s = CheckRows(query_rows, p.total_q(), "query"); !s.ok()) return s;
  if (absl::Status s = CheckRows(key_rows, p.total_k(), "key"); !s.ok()) return s;
  const int d = p.head_dim, heads = p.num_heads, kv_heads = p.num_kv_heads;
  const int group = heads / kv_heads;
  const double scale = p.softmax_scale;
  auto qkv = [&](absl::Span<const float> t, int64_t row, int head, int row_heads) {
    return t.data() + (row * row_heads + head) * d;
  };
  auto big_d = [&](int64_t qi, int h) {
    const float* o = qkv(dout, qi, h, heads);
    const T* x = out.data() + (qi * heads + h) * d;
    double sum = 0;
    for (int c = 0; c < d; ++c) sum += double(o[c]) * double(x[c]);
    return sum;
  };
  // P and dS of query qi, head h (D = big_d(qi, h)) against global key row kj.
  auto p_ds = [&](int64_t qi, int h, double dd, int64_t kj, double* ds) {
    const double pij =
        std::exp(scale * Dot(qkv(q, qi, h, heads), qkv(k, kj, h / group, kv_heads), d) -
                 double(lse[size_t(h) * p.total_q() + qi]));
    *ds = pij * (Dot(qkv(dout, qi, h, heads), qkv(v, kj, h / group, kv_heads), d) - dd);
    return pij;
  };
  CpuRows r;
  r.dq.assign(query_rows.size() * heads * d, 0.0);
  for (size_t s = 0; s < query_rows.size(); ++s) {
    const int64_t qi = query_rows[s];
    const int b = SegmentOf(p.cu_seqlens_q, qi);
    const int32_t n = VisibleKeys(p, b, static_cast<int32_t>(qi - p.cu_seqlens_q[b]));
    for (int h = 0; h < heads; ++h) {
      double* dq = r.dq.data() + (s * heads + h) * d;
      const double dd = big_d(qi, h);
      for (int64_t kj = p.cu_seqlens_k[b]; kj < p.cu_seqlens_k[b] + n; ++kj) {
        double ds;
        p_ds(qi, h, dd, kj, &ds);
        const float* krow = qkv(k, kj, h / group, kv_heads);
        for (int x = 0; x < d; ++x) dq[x] += scale * ds * double(krow[x]);
      }
    }
  }
  r.dk.assign(key_rows.size() * kv_heads * d, 0.0);
  r.dv.assign(key_rows.size() * kv_heads * d, 0.0);
  for (size_t s = 0; s < key_rows.size(); ++s) {
    const int64_t kj = key_rows[s];
    const int b = SegmentOf(p.cu_seqlens_k, kj);
    const int32_t j = static_cast<int32_t>(kj - p.cu_seqlens_k[b]);
    // Query i of the segment sees key j iff VisibleKeys(i) > j.
    const int32_t i_first = p.causal ? std::max(0, j - (p.seqlen_k(b) - p.seqlen_q(b))) : 0;
    for (int hk = 0; hk < kv_heads; ++hk) {
      double* dk = r.dk.data() + (s * kv_heads + hk) * d;
      double* dv = r.dv.data() + (s * kv_heads + hk) * d;
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t qi = p.cu_seqlens_q[b] + i_first; qi < p.cu_seqlens_q[b + 1]; ++qi) {
          double ds;
          const double pij = p_ds(qi, h, big_d(qi, h), kj, &ds);
          const float* qrow = qkv(q, qi, h, heads);
          const float* dorow = qkv(dout, qi, h, heads);
          for (int x = 0; x < d; ++x) {
            dk[x] += scale * ds * double(qrow[x]);
            dv[x] += pij * double(dorow[x]);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace

absl::StatusOr<CpuRows> CpuAttentionBackwardRows(
    const AttentionProblem& p, absl::Span<const float> q, absl::Span<const float> k,
    absl::Span<const float> v, absl::Span<const float> out, absl::Span<const float> dout,
    absl::Span<const float> lse, absl::Span<const int64_t> query_rows,
    absl::Span<const int64_t> key_rows) {
  return BackwardRows<float>(p, q, k, v, out, dout, lse, query_rows, key_rows);
}

absl::StatusOr<CpuRows> CpuAttentionBackwardRows(
    const AttentionProblem& p, absl::Span<const float> q, absl::Span<const float> k,
    absl::Span<const float> v, absl::Span<const double> out, absl::Span<const float> dout,
    absl::Span<const double> lse, absl::Span<const int64_t> query_rows,
    absl::Span<const int64_t> key_rows) {
  return BackwardRows<double>(p, q, k, v, out, dout, lse, query_rows, key_rows);
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
