#include "wlb/cuda/cp_reference.h"

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
  // All-gather: rank-major concatenation of the local K/V buffers, padding included.
  std::vector<float> gk, gv;
  for (int r = 0; r < cp; ++r) {
    gk.insert(gk.end(), lk[r].begin(), lk[r].end());
    gv.insert(gv.end(), lv[r].begin(), lv[r].end());
  }

  CpuCpResult result;
  result.out.assign(tokens * qw, 0.0);
  result.dq.assign(tokens * qw, 0.0);
  result.dk.assign(tokens * kw, 0.0);
  result.dv.assign(tokens * kw, 0.0);
  result.lse.assign(size_t(shape.num_heads) * tokens, 0.0);
  const size_t gathered = size_t(maps.gathered_rows());
  std::vector<double> rs_dk(gathered * kw, 0.0), rs_dv(gathered * kw, 0.0);  // reduce-scatter sum
  for (int r = 0; r < cp; ++r) {
    const CpRankMaps& m = maps.ranks[r];
    if (!m.has_work()) continue;
    const size_t rows = size_t(m.tokens);
    const std::vector<float> rk = GatherRows<float>(gk, m.key_rows, kw);
    const std::vector<float> rv = GatherRows<float>(gv, m.key_rows, kw);
    const absl::Span<const float> rq(lq[r].data(), rows * qw);
    const absl::Span<const float> rdo(ldo[r].data(), rows * qw);
    absl::StatusOr<CpuForward> f = CpuAttentionForward(m.problem, rq, rk, rv);
    if (!f.ok()) return f.status();
    absl::StatusOr<CpuGradients> g = CpuAttentionBackward(m.problem, rq, rk, rv, rdo);
    if (!g.ok()) return g.status();
    // dK/dV into the gathered layout through the CSR transpose of key_rows.
    std::vector<double> pk(gathered * kw, 0.0), pv(gathered * kw, 0.0);
    for (size_t row = 0; row < gathered; ++row) {
      for (int32_t e = m.key_offsets[row]; e < m.key_offsets[row + 1]; ++e) {
        const size_t src = size_t(m.key_sources[size_t(e)]);
        for (size_t c = 0; c < kw; ++c) {
          pk[row * kw + c] += g->dk[src * kw + c];
          pv[row * kw + c] += g->dv[src * kw + c];
        }
      }
    }
    for (size_t i = 0; i < pk.size(); ++i) {
      rs_dk[i] += pk[i];
      rs_dv[i] += pv[i];
    }
    // Queries are local: out, lse and dQ go straight back to packed order.
    for (size_t i = 0; i < rows; ++i) {
      const size_t p = size_t(m.local_to_packed[i]);
      for (size_t c = 0; c < qw; ++c) {
        result.out[p * qw + c] = f->out[i * qw + c];
        result.dq[p * qw + c] = g->dq[i * qw + c];
      }
      for (int h = 0; h < shape.num_heads; ++h) {
        result.lse[size_t(h) * tokens + p] = f->lse[size_t(h) * rows + i];
      }
    }
  }
  // Rank r receives gathered rows [r * capacity, (r + 1) * capacity): its own local rows.
  for (int r = 0; r < cp; ++r) {
    const CpRankMaps& m = maps.ranks[r];
    for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
      const size_t p = size_t(m.local_to_packed[i]);
      const size_t row = size_t(r) * capacity + i;
      for (size_t c = 0; c < kw; ++c) {
        result.dk[p * kw + c] = rs_dk[row * kw + c];
        result.dv[p * kw + c] = rs_dv[row * kw + c];
      }
    }
  }
  return result;
}

}  // namespace wlb::cuda
