#include "wlb/cuda/cp_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <tuple>
#include <limits>

#include "absl/strings/str_format.h"
#include "wlb/cuda/cpu_reference.h"

namespace wlb::cuda {
namespace {

// Rows `index` of a (rows, width) array; index -1 never occurs (maps are total).
template <typename T>
std::vector<T> GatherRows(absl::Span<const T> src, const std::vector<int32_t>& index,
                          size_t width) {
  std::vector<T> dst(index.size() * width);
  for (size_t i = 0; i < index.size(); ++i) {
    for (size_t c = 0; c < width; ++c) dst[i * width + c] = src[size_t(index[i]) * width + c];
  }
  return dst;
}

// Local rows of one rank (capacity rows, padding = NaN) from a packed array.
std::vector<float> Shard(absl::Span<const float> packed, const CpRankMaps& m, int64_t capacity,
                         size_t width) {
  std::vector<float> local(size_t(capacity) * width, std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
    for (size_t c = 0; c < width; ++c) {
      local[i * width + c] = packed[size_t(m.local_to_packed[i]) * width + c];
    }
  }
  return local;
}

// One rank's attention results: out, lse (heads, tokens) and dq over its local rows [0, tokens);
// dk, dv over its dkv_rows() key-gradient rows (cp_maps.h).
struct RankAttention {
  std::vector<double> out, lse, dq, dk, dv;
};

std::vector<int64_t> Iota(size_t n) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = int64_t(i);
  return v;
}

// CpSchedule::kWhole: one causal call over keys gathered from the source rows sk/sv.
absl::StatusOr<RankAttention> WholeAttention(const CpRankMaps& m, const std::vector<float>& lq,
                                             const std::vector<float>& ldo,
                                             const std::vector<float>& sk,
                                             const std::vector<float>& sv, size_t qw, size_t kw) {
  const size_t rows = size_t(m.tokens);
  const std::vector<float> rk = GatherRows<float>(sk, m.key_rows, kw);
  const std::vector<float> rv = GatherRows<float>(sv, m.key_rows, kw);
  const absl::Span<const float> rq(lq.data(), rows * qw);
  const absl::Span<const float> rdo(ldo.data(), rows * qw);
  absl::StatusOr<CpuForward> f = CpuAttentionForward(m.problem, rq, rk, rv);
  if (!f.ok()) return f.status();
  absl::StatusOr<CpuGradients> g = CpuAttentionBackward(m.problem, rq, rk, rv, rdo);
  if (!g.ok()) return g.status();
  return RankAttention{std::move(f->out), std::move(f->lse), std::move(g->dq), std::move(g->dk),
                       std::move(g->dv)};
}

// CpSchedule::kSplit: the diagonal blocks on the rank's own rows, the prefixes on keys gathered
// from the source rows, merged by log-sum-exp; each part's backward with the merged out and lse.
absl::StatusOr<RankAttention> SplitAttention(const CpRankMaps& m, const std::vector<float>& lq,
                                             const std::vector<float>& lk,
                                             const std::vector<float>& lv,
                                             const std::vector<float>& ldo,
                                             const std::vector<float>& sk,
                                             const std::vector<float>& sv, size_t qw, size_t kw) {
  const size_t rows = size_t(m.tokens), n = m.query_rows.size();
  const size_t heads = size_t(m.diagonal.num_heads), d = size_t(m.diagonal.head_dim);
  const absl::Span<const float> rq(lq.data(), rows * qw), rdo(ldo.data(), rows * qw);
  const absl::Span<const float> k_own(lk.data(), rows * kw), v_own(lv.data(), rows * kw);
  absl::StatusOr<CpuForward> diagonal = CpuAttentionForward(m.diagonal, rq, k_own, v_own);
  if (!diagonal.ok()) return diagonal.status();
  RankAttention a{std::move(diagonal->out), std::move(diagonal->lse), {}, {}, {}};
  const std::vector<float> pq = GatherRows<float>(rq, m.query_rows, qw);
  const std::vector<float> pdo = GatherRows<float>(rdo, m.query_rows, qw);
  const std::vector<float> pk = GatherRows<float>(sk, m.key_rows, kw);
  const std::vector<float> pv = GatherRows<float>(sv, m.key_rows, kw);
  if (n > 0) {
    absl::StatusOr<CpuForward> prefix = CpuAttentionForward(m.problem, pq, pk, pv);
    if (!prefix.ok()) return prefix.status();
    for (size_t j = 0; j < n; ++j) {
      const size_t i = size_t(m.query_rows[j]);
      for (size_t h = 0; h < heads; ++h) {
        double& lse = a.lse[h * rows + i];
        const double lp = prefix->lse[h * n + j];
        const double top = std::max(lse, lp);
        const double w_own = std::exp(lse - top), w_prefix = std::exp(lp - top);
        const double sum = w_own + w_prefix;
        for (size_t c = 0; c < d; ++c) {
          double& o = a.out[(i * heads + h) * d + c];
          o = (w_own * o + w_prefix * prefix->out[(j * heads + h) * d + c]) / sum;
        }
        lse = top + std::log(sum);
      }
    }
  }
  absl::StatusOr<CpuRows> gd = CpuAttentionBackwardRows(m.diagonal, rq, k_own, v_own, a.out,
                                                        rdo, a.lse, Iota(rows), Iota(rows));
  if (!gd.ok()) return gd.status();
  a.dq = std::move(gd->dq);
  a.dk.assign(size_t(m.dkv_rows()) * kw, 0.0);
  a.dv.assign(size_t(m.dkv_rows()) * kw, 0.0);
  const size_t prefix_keys = m.key_rows.size();
  std::copy(gd->dk.begin(), gd->dk.end(), a.dk.begin() + int64_t(prefix_keys * kw));
  std::copy(gd->dv.begin(), gd->dv.end(), a.dv.begin() + int64_t(prefix_keys * kw));
  if (n > 0) {
    const std::vector<double> pout = GatherRows<double>(a.out, m.query_rows, qw);
    std::vector<double> plse(heads * n);
    for (size_t h = 0; h < heads; ++h) {
      for (size_t j = 0; j < n; ++j) plse[h * n + j] = a.lse[h * rows + size_t(m.query_rows[j])];
    }
    absl::StatusOr<CpuRows> gp = CpuAttentionBackwardRows(m.problem, pq, pk, pv, pout, pdo, plse,
                                                          Iota(n), Iota(prefix_keys));
    if (!gp.ok()) return gp.status();
    for (size_t j = 0; j < n; ++j) {
      for (size_t c = 0; c < qw; ++c) a.dq[size_t(m.query_rows[j]) * qw + c] += gp->dq[j * qw + c];
    }
    std::copy(gp->dk.begin(), gp->dk.end(), a.dk.begin());
    std::copy(gp->dv.begin(), gp->dv.end(), a.dv.begin());
  }
  return a;
}

absl::Status CheckSize(absl::Span<const float> t, size_t expected, const char* name) {
  if (t.size() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("packed %s has %d elements; expected %d", name, t.size(), expected));
}

}  // namespace

absl::StatusOr<CpuCpResult> CpuCpAttention(const CpMaps& maps, absl::Span<const float> q,
                                           absl::Span<const float> k, absl::Span<const float> v,
                                           absl::Span<const float> dout) {
  if (maps.ranks.empty()) return absl::InvalidArgumentError("CP maps have no ranks");
  const AttentionProblem& shape = maps.ranks[0].problem;
  const size_t qw = size_t(shape.num_heads) * shape.head_dim;
  const size_t kw = size_t(shape.num_kv_heads) * shape.head_dim;
  const size_t tokens = size_t(maps.tokens);
  for (auto [t, width, name] : {std::tuple{q, qw, "q"}, std::tuple{k, kw, "k"},
                                std::tuple{v, kw, "v"}, std::tuple{dout, qw, "dout"}}) {
    if (absl::Status s = CheckSize(t, tokens * width, name); !s.ok()) return s;
  }
  const int cp = maps.cp_size;
  const size_t capacity = size_t(maps.rank_capacity);

  // Every rank's local rows, as the training step hands them to the executor.
  std::vector<std::vector<float>> lq(cp), lk(cp), lv(cp), ldo(cp);
  for (int r = 0; r < cp; ++r) {
    lq[r] = Shard(q, maps.ranks[r], maps.rank_capacity, qw);
    lk[r] = Shard(k, maps.ranks[r], maps.rank_capacity, kw);
    lv[r] = Shard(v, maps.ranks[r], maps.rank_capacity, kw);
    ldo[r] = Shard(dout, maps.ranks[r], maps.rank_capacity, qw);
  }
  CpuCpResult result;
  result.sent_rows.assign(size_t(cp), 0);
  result.received_rows.assign(size_t(cp), 0);
  // Every rank's source rows (cp_maps.h): the all-gather's rank-major concatenation of the local
  // buffers, padding included, or its own rows followed by what the others send it (the
  // all-to-all-v: from every source in rank order, the source's block for it).
  std::vector<std::vector<float>> sk(static_cast<size_t>(cp)), sv(static_cast<size_t>(cp));
  const bool all_gather = maps.exchange == ExchangeKind::kAllGather;
  // recv_offset[d][s]: where the rows from s start among d's received rows.
  std::vector<std::vector<int64_t>> recv_offset(size_t(cp), std::vector<int64_t>(size_t(cp), 0));
  if (all_gather) {
    std::vector<float> gk, gv;
    for (int r = 0; r < cp; ++r) {
      gk.insert(gk.end(), lk[r].begin(), lk[r].end());
      gv.insert(gv.end(), lv[r].begin(), lv[r].end());
    }
    for (int r = 0; r < cp; ++r) {
      sk[r] = gk;
      sv[r] = gv;
      result.sent_rows[r] = result.received_rows[r] = int64_t(cp - 1) * maps.rank_capacity;
    }
  } else {
    std::vector<std::vector<float>> send_k(static_cast<size_t>(cp)),
        send_v(static_cast<size_t>(cp));
    for (int r = 0; r < cp; ++r) {
      send_k[r] = GatherRows<float>(lk[r], maps.ranks[r].send_rows, kw);
      send_v[r] = GatherRows<float>(lv[r], maps.ranks[r].send_rows, kw);
      result.sent_rows[r] = int64_t(maps.ranks[r].send_rows.size());
    }
    for (int d = 0; d < cp; ++d) {
      const CpRankMaps& m = maps.ranks[d];
      sk[d].assign(lk[d].begin(), lk[d].begin() + m.tokens * int64_t(kw));
      sv[d].assign(lv[d].begin(), lv[d].begin() + m.tokens * int64_t(kw));
      int64_t received = 0;
      for (int s = 0; s < cp; ++s) {
        const CpRankMaps& src = maps.ranks[s];
        const int64_t n = src.send_counts[size_t(d)];
        if (n != m.recv_counts[size_t(s)]) {
          return absl::InternalError(absl::StrFormat(
              "row-exact maps disagree: rank %d sends %d rows to rank %d, which expects %d", s, n,
              d, m.recv_counts[size_t(s)]));
        }
        int64_t from = 0;
        for (int t = 0; t < d; ++t) from += src.send_counts[size_t(t)];
        recv_offset[d][s] = received;
        sk[d].insert(sk[d].end(), send_k[s].begin() + from * int64_t(kw),
                     send_k[s].begin() + (from + n) * int64_t(kw));
        sv[d].insert(sv[d].end(), send_v[s].begin() + from * int64_t(kw),
                     send_v[s].begin() + (from + n) * int64_t(kw));
        received += n;
      }
      result.received_rows[d] = received;
      if (m.tokens + received != m.source_rows) {
        return absl::InternalError(
            absl::StrFormat("rank %d: %d own + %d received rows, but its maps index %d source rows",
                            d, m.tokens, received, m.source_rows));
      }
    }
  }

  result.out.assign(tokens * qw, 0.0);
  result.dq.assign(tokens * qw, 0.0);
  result.dk.assign(tokens * kw, 0.0);
  result.dv.assign(tokens * kw, 0.0);
  result.lse.assign(size_t(shape.num_heads) * tokens, 0.0);
  // Every rank's dK/dV summed into its source rows (zero where it has no key).
  std::vector<std::vector<double>> pk(static_cast<size_t>(cp)), pv(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    const CpRankMaps& m = maps.ranks[r];
    pk[r].assign(size_t(m.source_rows) * kw, 0.0);
    pv[r].assign(size_t(m.source_rows) * kw, 0.0);
    if (!m.has_work()) continue;
    absl::StatusOr<RankAttention> a = maps.schedule == CpSchedule::kSplit
                                          ? SplitAttention(m, lq[r], lk[r], lv[r], ldo[r], sk[r],
                                                           sv[r], qw, kw)
                                          : WholeAttention(m, lq[r], ldo[r], sk[r], sv[r], qw, kw);
    if (!a.ok()) return a.status();
    // dK/dV into the source rows through the CSR transpose of the key rows.
    for (size_t row = 0; row < size_t(m.source_rows); ++row) {
      for (int32_t e = m.key_offsets[row]; e < m.key_offsets[row + 1]; ++e) {
        const size_t src = size_t(m.key_sources[size_t(e)]);
        for (size_t c = 0; c < kw; ++c) {
          pk[r][row * kw + c] += a->dk[src * kw + c];
          pv[r][row * kw + c] += a->dv[src * kw + c];
        }
      }
    }
    // Queries are local: out, lse and dQ go straight back to packed order.
    const size_t rows = size_t(m.tokens);
    for (size_t i = 0; i < rows; ++i) {
      const size_t p = size_t(m.local_to_packed[i]);
      for (size_t c = 0; c < qw; ++c) {
        result.out[p * qw + c] = a->out[i * qw + c];
        result.dq[p * qw + c] = a->dq[i * qw + c];
      }
      for (int h = 0; h < shape.num_heads; ++h) {
        result.lse[size_t(h) * tokens + p] = a->lse[size_t(h) * rows + i];
      }
    }
  }
  // dK/dV of every rank's own rows. All-gather: the reduce-scatter gives rank r the sum over
  // ranks of gathered rows [r * capacity, (r + 1) * capacity). Row-exact: its own source rows
  // plus what comes back (the reverse all-to-all-v: from every destination in rank order, the
  // rows it received from r), summed into local rows through the return CSR.
  for (int r = 0; r < cp; ++r) {
    const CpRankMaps& m = maps.ranks[r];
    std::vector<double> dk(size_t(m.tokens) * kw), dv(size_t(m.tokens) * kw);
    if (all_gather) {
      for (size_t x = 0; x < dk.size(); ++x) {
        const size_t at = size_t(r) * capacity * kw + x;
        for (int s = 0; s < cp; ++s) {
          dk[x] += pk[s][at];
          dv[x] += pv[s][at];
        }
      }
    } else {
      std::copy(pk[r].begin(), pk[r].begin() + int64_t(dk.size()), dk.begin());
      std::copy(pv[r].begin(), pv[r].begin() + int64_t(dv.size()), dv.begin());
      std::vector<double> back_k, back_v;
      for (int d = 0; d < cp; ++d) {
        const int64_t first = (maps.ranks[d].tokens + recv_offset[d][r]) * int64_t(kw);
        const int64_t n = maps.ranks[d].recv_counts[size_t(r)] * int64_t(kw);
        back_k.insert(back_k.end(), pk[d].begin() + first, pk[d].begin() + first + n);
        back_v.insert(back_v.end(), pv[d].begin() + first, pv[d].begin() + first + n);
      }
      for (size_t i = 0; i < size_t(m.tokens); ++i) {
        for (int32_t e = m.return_offsets[i]; e < m.return_offsets[i + 1]; ++e) {
          const size_t src = size_t(m.return_sources[size_t(e)]);
          for (size_t c = 0; c < kw; ++c) {
            dk[i * kw + c] += back_k[src * kw + c];
            dv[i * kw + c] += back_v[src * kw + c];
          }
        }
      }
    }
    for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
      const size_t p = size_t(m.local_to_packed[i]);
      for (size_t c = 0; c < kw; ++c) {
        result.dk[p * kw + c] = dk[i * kw + c];
        result.dv[p * kw + c] = dv[i * kw + c];
      }
    }
  }
  return result;
}

}  // namespace wlb::cuda
