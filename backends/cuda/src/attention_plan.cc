#include "wlb/cuda/attention_plan.h"

#include <algorithm>
#include <cassert>
#include <cstdint>

namespace wlb::cuda {
namespace {

// Orders `tiles` for `order`: `weight(t)` ranks tiles (a block's running time grows with it),
// `work(t)` is the tile's share of its segment's total.
template <typename Tile, typename Weight, typename Work>
void OrderTiles(std::vector<Tile>& tiles, BlockOrder order, int batch, Weight weight, Work work) {
  if (order == BlockOrder::kHeaviestFirst) {
    std::stable_sort(tiles.begin(), tiles.end(),
                     [&](const Tile& a, const Tile& b) { return weight(a) > weight(b); });
    return;
  }
  std::vector<int64_t> segment_work(static_cast<size_t>(batch), 0);
  for (const Tile& t : tiles) segment_work[t.segment] += work(t);
  std::stable_sort(tiles.begin(), tiles.end(), [&](const Tile& a, const Tile& b) {
    if (a.segment != b.segment) {
      const int64_t wa = segment_work[a.segment], wb = segment_work[b.segment];
      if (wa != wb) return wa > wb;
      return a.segment < b.segment;
    }
    return weight(a) > weight(b);
  });
}

}  // namespace

std::vector<ForwardTile> BuildForwardTiles(const AttentionProblem& p, int block_m,
                                           BlockOrder order) {
  assert(block_m > 0);
  std::vector<ForwardTile> tiles;
  for (int b = 0; b < p.batch(); ++b) {
    const int32_t lq = p.seqlen_q(b);
    const int32_t lk = p.seqlen_k(b);
    for (int32_t m0 = 0; m0 < lq; m0 += block_m) {
      ForwardTile t;
      t.q_begin = p.cu_seqlens_q[b] + m0;
      t.q_rows = std::min(block_m, lq - m0);
      t.k_begin = p.cu_seqlens_k[b];
      if (p.causal) {
        t.diag = m0 + (lk - lq);
        t.k_len = std::min(lk, t.diag + t.q_rows);  // the last row sees keys [0, diag + q_rows)
      } else {
        t.diag = kNoDiagonal;
        t.k_len = lk;
      }
      t.segment = b;
      tiles.push_back(t);
    }
  }
  OrderTiles(
      tiles, order, p.batch(), [](const ForwardTile& t) { return t.k_len; },
      [](const ForwardTile& t) { return int64_t(t.q_rows) * t.k_len; });
  return tiles;
}

std::vector<BackwardTile> BuildBackwardTiles(const AttentionProblem& p, int block_n,
                                             BlockOrder order) {
  assert(block_n > 0);
  std::vector<BackwardTile> tiles;
  for (int b = 0; b < p.batch(); ++b) {
    const int32_t lq = p.seqlen_q(b);
    const int32_t lk = p.seqlen_k(b);
    if (lq == 0) continue;
    for (int32_t n0 = 0; n0 < lk; n0 += block_n) {
      BackwardTile t;
      t.k_begin = p.cu_seqlens_k[b] + n0;
      t.k_rows = std::min(block_n, lk - n0);
      t.q_begin = p.cu_seqlens_q[b];
      t.q_len = lq;
      if (p.causal) {
        // Query q sees segment key j iff j <= q + (lk - lq); tile key c is j = n0 + c.
        t.diag = (lk - lq) - n0;
        t.q_first = std::max(0, -t.diag);  // the first query that sees tile key 0
      } else {
        t.diag = kNoDiagonal;
        t.q_first = 0;
      }
      t.segment = b;
      tiles.push_back(t);
    }
  }
  OrderTiles(
      tiles, order, p.batch(), [](const BackwardTile& t) { return t.q_len - t.q_first; },
      [](const BackwardTile& t) { return int64_t(t.k_rows) * (t.q_len - t.q_first); });
  return tiles;
}

}  // namespace wlb::cuda
