// Shared helpers of the wlb::cuda tests: random problems and inputs (host only).
#ifndef WLB_CUDA_TEST_TEST_UTIL_H_
#define WLB_CUDA_TEST_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "wlb/cuda/attention_problem.h"

namespace wlb::cuda::testing {

// A problem of (query length, key length) segments, e.g. CP segments [a, b) with keys [0, b).
inline AttentionProblem SegmentsProblem(const std::vector<std::pair<int32_t, int32_t>>& segs,
                                        int heads, int kv_heads, int head_dim,
                                        bool causal = true) {
  AttentionProblem p;
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  for (auto [lq, lk] : segs) {
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + lq);
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + lk);
    p.max_seqlen_q = std::max(p.max_seqlen_q, lq);
    p.max_seqlen_k = std::max(p.max_seqlen_k, lk);
  }
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.causal = causal;
  return p;
}

// A problem whose segments are whole documents of the given lengths (q = k).
inline AttentionProblem DocumentsProblem(const std::vector<int32_t>& lengths, int heads,
                                         int kv_heads, int head_dim, bool causal = true) {
  std::vector<std::pair<int32_t, int32_t>> segs;
  for (int32_t l : lengths) segs.push_back({l, l});
  return SegmentsProblem(segs, heads, kv_heads, head_dim, causal);
}

// Values exactly representable in bf16 (8 significant bits), uniform-ish in [-scale, scale].
inline std::vector<float> RandomBf16Values(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> x(n);
  for (float& v : x) {
    const float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;  // round to nearest even
    std::memcpy(&v, &bits, 4);
  }
  return x;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};

// Random q, k in [-2, 2] and v, dout in [-1, 1], all bf16-exact, sized for `p`.
inline Inputs RandomInputs(const AttentionProblem& p, std::mt19937_64& rng) {
  const size_t nq = size_t(p.total_q()) * p.num_heads * p.head_dim;
  const size_t nk = size_t(p.total_k()) * p.num_kv_heads * p.head_dim;
  return {RandomBf16Values(nq, rng, 2.0f), RandomBf16Values(nk, rng, 2.0f),
          RandomBf16Values(nk, rng), RandomBf16Values(nq, rng)};
}

// ||a - b|| / max(||b||, rms_floor * sqrt(n)): relative L2 error, except that a reference whose
// root-mean-square is under rms_floor (a one-token document's dQ and dK are exactly zero) turns
// it into an absolute bound on the error's RMS. 0 for empty vectors, never NaN; +inf when b is
// zero, rms_floor is 0 and a differs.
template <typename A, typename B>
double RelativeError(const std::vector<A>& a, const std::vector<B>& b, double rms_floor = 0) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  den = std::max(den, rms_floor * rms_floor * double(a.size()));
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace wlb::cuda::testing

#endif  // WLB_CUDA_TEST_TEST_UTIL_H_
