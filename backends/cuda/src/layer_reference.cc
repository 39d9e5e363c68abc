#include "wlb/cuda/layer_reference.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"

namespace wlb::cuda {
namespace {

using Vec = std::vector<double>;

// Rounds to the nearest bf16 value (round to nearest even on the upper 16 bits of the float).
double RoundToBf16(double v) {
  float f = static_cast<float>(v);
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// C (n, m) = A (n, k) B (k, m).
Vec MatMul(const Vec& a, const Vec& b, int64_t n, int64_t k, int64_t m) {
  Vec c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double av = a[i * k + p];
      for (int64_t j = 0; j < m; ++j) c[i * m + j] += av * b[p * m + j];
    }
  }
  return c;
}

// A (n, k)^T B (n, m) -> (k, m): a weight gradient.
Vec MatMulTransA(const Vec& a, const Vec& b, int64_t n, int64_t k, int64_t m) {
  Vec c(static_cast<size_t>(k * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double av = a[i * k + p];
      for (int64_t j = 0; j < m; ++j) c[p * m + j] += av * b[i * m + j];
    }
  }
  return c;
}

// A (n, m) B (k, m)^T -> (n, k): an input gradient, added to `c`.
void AddMatMulTransB(const Vec& a, const Vec& b, int64_t n, int64_t k, int64_t m, Vec& c) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      double s = 0.0;
      for (int64_t j = 0; j < m; ++j) s += a[i * m + j] * b[p * m + j];
      c[i * k + p] += s;
    }
  }
}

// y = x / rms(x) * g per row; returns y and stores 1 / rms per row.
Vec RmsNorm(const Vec& x, const Vec& g, int64_t rows, int64_t width, double eps, Vec& rstd) {
  Vec y(x.size());
  rstd.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < width; ++j) ss += x[r * width + j] * x[r * width + j];
    rstd[r] = 1.0 / std::sqrt(ss / static_cast<double>(width) + eps);
    for (int64_t j = 0; j < width; ++j) y[r * width + j] = x[r * width + j] * rstd[r] * g[j];
  }
  return y;
}

// Adds dL/dx to `dx` and dL/dg to `dg` for y = RmsNorm(x) g.
void RmsNormBackward(const Vec& x, const Vec& g, const Vec& rstd, const Vec& dy, int64_t rows,
                     int64_t width, Vec& dx, Vec& dg) {
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0.0;  // sum_j (dy_j g_j) x_j
    for (int64_t j = 0; j < width; ++j) {
      dot += dy[r * width + j] * g[j] * x[r * width + j];
      dg[j] += dy[r * width + j] * x[r * width + j] * rstd[r];
    }
    const double c = dot * rstd[r] * rstd[r] * rstd[r] / static_cast<double>(width);
    for (int64_t j = 0; j < width; ++j) {
      dx[r * width + j] += dy[r * width + j] * g[j] * rstd[r] - x[r * width + j] * c;
    }
  }
}

// Rotates pairs (j, j + d/2) of every head by position * theta^(-2j/d); `sign` -1 rotates back
// (the backward of the rotation is its transpose).
void Rope(Vec& t, const PackedDocuments& mb, int64_t heads, int64_t d, double theta, int sign) {
  const int64_t half = d / 2;
  for (int64_t tok = 0; tok < mb.tokens(); ++tok) {
    for (int64_t j = 0; j < half; ++j) {
      const double angle = mb.positions[tok] *
                           std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
      const double c = std::cos(angle), s = sign * std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        double& a = t[(tok * heads + h) * d + j];
        double& b = t[(tok * heads + h) * d + j + half];
        const double a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
    }
  }
}

// Causal softmax weights of query `i` (global row) of head `h` over keys [doc_begin, i].
Vec Probabilities(const Vec& q, const Vec& k, const LayerShape& s, int64_t i, int64_t h,
                  int64_t doc_begin) {
  const int64_t d = s.head_dim, kvh = h / (s.heads / s.kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec p(static_cast<size_t>(i - doc_begin + 1));
  double mx = -INFINITY;
  for (int64_t j = doc_begin; j <= i; ++j) {
    double dot = 0.0;
    for (int64_t e = 0; e < d; ++e)
      dot += q[(i * s.heads + h) * d + e] * k[(j * s.kv_heads + kvh) * d + e];
    p[j - doc_begin] = dot * scale;
    mx = std::max(mx, p[j - doc_begin]);
  }
  double sum = 0.0;
  for (double& v : p) sum += (v = std::exp(v - mx));
  for (double& v : p) v /= sum;
  return p;
}

struct Activations {
  Vec rstd1, a, q, k, v, o, h, rstd2, b, gu, s, y;
};

Activations Forward(const LayerShape& s, const LayerParams& w, const PackedDocuments& mb,
                    absl::Span<const double> x_span) {
  const int64_t t = mb.tokens(), hd = s.head_dim, f = s.ffn;
  const Vec x(x_span.begin(), x_span.end());
  Activations a;
  a.a = RmsNorm(x, w.norm1, t, s.hidden, s.norm_eps, a.rstd1);
  a.q = MatMul(a.a, w.wq, t, s.hidden, s.q_width());
  a.k = MatMul(a.a, w.wk, t, s.hidden, s.kv_width());
  a.v = MatMul(a.a, w.wv, t, s.hidden, s.kv_width());
  Rope(a.q, mb, s.heads, hd, s.rope_theta, 1);
  Rope(a.k, mb, s.kv_heads, hd, s.rope_theta, 1);
  a.o.assign(static_cast<size_t>(t * s.q_width()), 0.0);
  for (int doc = 0; doc < mb.documents(); ++doc) {
    for (int64_t i = mb.cu_seqlens[doc]; i < mb.cu_seqlens[doc + 1]; ++i) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const Vec p = Probabilities(a.q, a.k, s, i, h, mb.cu_seqlens[doc]);
        const int64_t kvh = h / (s.heads / s.kv_heads);
        for (size_t j = 0; j < p.size(); ++j) {
          const int64_t key = mb.cu_seqlens[doc] + static_cast<int64_t>(j);
          for (int64_t e = 0; e < hd; ++e) {
            a.o[(i * s.heads + h) * hd + e] += p[j] * a.v[(key * s.kv_heads + kvh) * hd + e];
          }
        }
      }
    }
  }
  a.h = MatMul(a.o, w.wo, t, s.q_width(), s.hidden);
  for (size_t i = 0; i < a.h.size(); ++i) a.h[i] += x[i];
  a.b = RmsNorm(a.h, w.norm2, t, s.hidden, s.norm_eps, a.rstd2);
  a.gu = MatMul(a.b, w.wgu, t, s.hidden, 2 * f);
  a.s.assign(static_cast<size_t>(t * f), 0.0);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double g = a.gu[r * 2 * f + j], u = a.gu[r * 2 * f + f + j];
      a.s[r * f + j] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  a.y = MatMul(a.s, w.wd, t, f, s.hidden);
  for (size_t i = 0; i < a.y.size(); ++i) a.y[i] += a.h[i];
  return a;
}

absl::Status CheckSize(size_t got, int64_t want, const char* name) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer tensor %s has %d values, the shape needs %d", name, got, want));
  }
  return absl::OkStatus();
}

absl::Status CheckInputs(const LayerShape& s, const LayerParams& w, const PackedDocuments& mb,
                         absl::Span<const double> x) {
  if (absl::Status st = ValidateLayerShape(s); !st.ok()) return st;
  if (absl::Status st = ValidateLayerParams(s, w); !st.ok()) return st;
  if (mb.cu_seqlens.size() < 2 || mb.positions.size() != static_cast<size_t>(mb.tokens())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "packed micro-batch: %d offsets and %d positions for %d tokens (use PackDocuments)",
        mb.cu_seqlens.size(), mb.positions.size(), mb.cu_seqlens.empty() ? 0 : mb.tokens()));
  }
  return CheckSize(x.size(), int64_t{mb.tokens()} * s.hidden, "x");
}

}  // namespace

std::vector<double> RandomValues(int64_t n, uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = RoundToBf16(u(rng));
  return v;
}

LayerParams RandomLayerParams(const LayerShape& s, uint64_t seed) {
  auto matrix = [&](int64_t in, int64_t out, uint64_t k) {
    return RandomValues(in * out, seed * 16 + k, 1.0 / std::sqrt(static_cast<double>(in)));
  };
  auto gain = [&](uint64_t k) {
    Vec g = RandomValues(s.hidden, seed * 16 + k, 0.5);
    for (double& x : g) x = RoundToBf16(1.0 + x);
    return g;
  };
  LayerParams w;
  w.norm1 = gain(0);
  w.wq = matrix(s.hidden, s.q_width(), 1);
  w.wk = matrix(s.hidden, s.kv_width(), 2);
  w.wv = matrix(s.hidden, s.kv_width(), 3);
  w.wo = matrix(s.q_width(), s.hidden, 4);
  w.norm2 = gain(5);
  w.wgu = matrix(s.hidden, 2 * s.ffn, 6);
  w.wd = matrix(s.ffn, s.hidden, 7);
  return w;
}

absl::Status ValidateLayerParams(const LayerShape& s, const LayerParams& w) {
  const std::pair<const char*, std::pair<size_t, int64_t>> checks[] = {
      {"norm1", {w.norm1.size(), s.hidden}},
      {"wq", {w.wq.size(), s.hidden * s.q_width()}},
      {"wk", {w.wk.size(), s.hidden * s.kv_width()}},
      {"wv", {w.wv.size(), s.hidden * s.kv_width()}},
      {"wo", {w.wo.size(), s.q_width() * s.hidden}},
      {"norm2", {w.norm2.size(), s.hidden}},
      {"wgu", {w.wgu.size(), s.hidden * 2 * s.ffn}},
      {"wd", {w.wd.size(), s.ffn * s.hidden}}};
  for (const auto& [name, sizes] : checks) {
    if (absl::Status st = CheckSize(sizes.first, sizes.second, name); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerForwardResult> LayerForward(const LayerShape& s, const LayerParams& w,
                                                const PackedDocuments& mb,
                                                absl::Span<const double> x) {
  if (absl::Status st = CheckInputs(s, w, mb, x); !st.ok()) return st;
  return LayerForwardResult{Forward(s, w, mb, x).y};
}

absl::StatusOr<LayerGradients> LayerBackward(const LayerShape& s, const LayerParams& w,
                                             const PackedDocuments& mb, absl::Span<const double> x,
                                             absl::Span<const double> dy_span) {
  if (absl::Status st = CheckInputs(s, w, mb, x); !st.ok()) return st;
  const int64_t t = mb.tokens(), hd = s.head_dim, f = s.ffn, hidden = s.hidden;
  if (absl::Status st = CheckSize(dy_span.size(), t * hidden, "dy"); !st.ok()) return st;
  const Activations a = Forward(s, w, mb, x);
  const Vec dy(dy_span.begin(), dy_span.end());
  LayerGradients g;
  LayerParams& dw = g.dparams;
  // y = h + s Wd.
  Vec dh = dy;
  dw.wd = MatMulTransA(a.s, dy, t, f, hidden);
  Vec ds(static_cast<size_t>(t * f), 0.0);
  AddMatMulTransB(dy, w.wd, t, f, hidden, ds);
  // s = silu(gate) * up.
  Vec dgu(static_cast<size_t>(t * 2 * f));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double gate = a.gu[r * 2 * f + j], up = a.gu[r * 2 * f + f + j];
      const double sig = 1.0 / (1.0 + std::exp(-gate));
      dgu[r * 2 * f + j] = ds[r * f + j] * up * sig * (1.0 + gate * (1.0 - sig));
      dgu[r * 2 * f + f + j] = ds[r * f + j] * gate * sig;
    }
  }
  dw.wgu = MatMulTransA(a.b, dgu, t, hidden, 2 * f);
  Vec db(static_cast<size_t>(t * hidden), 0.0);
  AddMatMulTransB(dgu, w.wgu, t, hidden, 2 * f, db);
  dw.norm2.assign(static_cast<size_t>(hidden), 0.0);
  RmsNormBackward(a.h, w.norm2, a.rstd2, db, t, hidden, dh, dw.norm2);
  // h = x + o Wo.
  g.dx = dh;
  dw.wo = MatMulTransA(a.o, dh, t, s.q_width(), hidden);
  Vec dout(static_cast<size_t>(t * s.q_width()), 0.0);
  AddMatMulTransB(dh, w.wo, t, s.q_width(), hidden, dout);
  // Attention: dV = P^T dO, dS = P (dO.v - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
  Vec dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int doc = 0; doc < mb.documents(); ++doc) {
    const int64_t begin = mb.cu_seqlens[doc];
    for (int64_t i = begin; i < mb.cu_seqlens[doc + 1]; ++i) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t kvh = h / (s.heads / s.kv_heads);
        const Vec p = Probabilities(a.q, a.k, s, i, h, begin);
        const double* do_row = &dout[(i * s.heads + h) * hd];
        double delta = 0.0;
        for (int64_t e = 0; e < hd; ++e) delta += do_row[e] * a.o[(i * s.heads + h) * hd + e];
        for (size_t jj = 0; jj < p.size(); ++jj) {
          const int64_t j = begin + static_cast<int64_t>(jj);
          double dp = 0.0;
          for (int64_t e = 0; e < hd; ++e) {
            dp += do_row[e] * a.v[(j * s.kv_heads + kvh) * hd + e];
            dv[(j * s.kv_heads + kvh) * hd + e] += p[jj] * do_row[e];
          }
          const double dsc = p[jj] * (dp - delta) * scale;
          for (int64_t e = 0; e < hd; ++e) {
            dq[(i * s.heads + h) * hd + e] += dsc * a.k[(j * s.kv_heads + kvh) * hd + e];
            dk[(j * s.kv_heads + kvh) * hd + e] += dsc * a.q[(i * s.heads + h) * hd + e];
          }
        }
      }
    }
  }
  Rope(dq, mb, s.heads, hd, s.rope_theta, -1);
  Rope(dk, mb, s.kv_heads, hd, s.rope_theta, -1);
  dw.wq = MatMulTransA(a.a, dq, t, hidden, s.q_width());
  dw.wk = MatMulTransA(a.a, dk, t, hidden, s.kv_width());
  dw.wv = MatMulTransA(a.a, dv, t, hidden, s.kv_width());
  Vec da(static_cast<size_t>(t * hidden), 0.0);
  AddMatMulTransB(dq, w.wq, t, hidden, s.q_width(), da);
  AddMatMulTransB(dk, w.wk, t, hidden, s.kv_width(), da);
  AddMatMulTransB(dv, w.wv, t, hidden, s.kv_width(), da);
  dw.norm1.assign(static_cast<size_t>(hidden), 0.0);
  const Vec xv(x.begin(), x.end());
  RmsNormBackward(xv, w.norm1, a.rstd1, da, t, hidden, g.dx, dw.norm1);
  return g;
}

}  // namespace wlb::cuda
