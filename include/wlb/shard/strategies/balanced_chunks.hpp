// balanced-chunks: equal-size chunks dealt to ranks by predicted time, with locality, under the
// memory cap (see shard_plan.hpp).
//
// A document of at most `unit` tokens stays whole (short documents are never split); a longer one
// is cut into ceil(d / unit) contiguous chunks of near-equal size, unit = ceil(T / 8C) rounded up
// to the kernel's query tile (about 8 chunks' worth of tokens per rank). Items go costliest first
// (SegmentMs of the chunk's queries over its keys [0, end)) to the rank whose time after taking
// it is least among those with room under CpRankTokenCap: its attention so far plus the item's,
// plus the K/V rows it would then receive (causal: for each document, its largest end less its
// own rows) x CommModel::RowMs. Chunks of one document therefore gather where they save rows:
// an earlier chunk placed on a rank that holds a later one cuts that rank's receive. An item no
// rank has room for is spilled over the ranks with the most room (SpillShards). A rank's adjacent
// chunks of one document are one segment. The sending side is not priced here; adaptive ranks
// this plan with PredictCp like every other candidate.
//
// Peers: MagiAttention's dispatch solver deals fixed-size chunks of the packed sequence by area
// with an equal chunk count per rank (no locality, a chunk may straddle documents); this keeps
// short documents whole, prices the receive with the link, and bounds memory by tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/doc_degree.hpp"

namespace wlb {
namespace detail {

// Chunk size of balanced-chunks for a micro-batch of `tokens` over `cp_size` ranks.
inline int64_t BalancedChunkUnit(int64_t tokens, int cp_size, const KernelModel& model) {
  const int64_t tile = std::max<int64_t>(1, model.tile_q());
  // 8 chunks' worth per rank: measured against 4, 16 and 32 on the balance table's streams
  // (docs/results/cp/balance.md), 8 gave adaptive the fastest plans.
  const int64_t per_rank = 8;
  const int64_t unit = (tokens + per_rank * cp_size - 1) / (per_rank * cp_size);
  return std::max(tile, (unit + tile - 1) / tile * tile);
}

inline absl::StatusOr<ShardPlan> PlanBalancedChunks(const ShardPlanRequest& r) {
  const MicroBatch& mb = r.mb;
  const size_t docs = mb.documents.size();
  const size_t ranks = static_cast<size_t>(r.cp_size);
  const int64_t unit = BalancedChunkUnit(mb.tokens, r.cp_size, r.model);
  const int64_t cap = CpRankTokenCap(mb.tokens, r.cp_size);
  const double row_ms = r.options.comm.RowMs(r.model);
  struct Item {
    double ms;
    size_t doc;
    int64_t begin, end;
  };
  std::vector<Item> items;
  items.reserve(static_cast<size_t>(mb.tokens / unit) + docs);
  for (size_t i = 0; i < docs; ++i) {
    const int64_t d = mb.documents[i].length;
    const int64_t n = (d + unit - 1) / unit;
    for (int64_t j = 0; j < n; ++j) {
      const auto [b, e] = PerDocumentShard(d, n, 0, j);
      items.push_back({r.model.SegmentMs(e - b, e), i, b, e});
    }
  }
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return std::tie(y.ms, x.doc, x.begin) < std::tie(x.ms, y.doc, y.begin);
  });
  // Per rank: attention ms, tokens, rows received; per (rank, document): largest end, own rows.
  std::vector<double> attention(ranks, 0.0), time(ranks, 0.0);
  std::vector<int64_t> tokens(ranks, 0), received(ranks, 0);
  std::vector<int64_t> hi(ranks * docs, 0), own(ranks * docs, 0);
  std::vector<std::vector<DocShard>> held(docs);  // every document's pieces
  std::vector<DocShard> spill;
  auto take = [&](size_t rank, size_t doc, int64_t b, int64_t e) {
    const size_t x = rank * docs + doc;
    received[rank] -= hi[x] - own[x];
    hi[x] = std::max(hi[x], e);
    own[x] += e - b;
    received[rank] += hi[x] - own[x];
    tokens[rank] += e - b;
    attention[rank] += r.model.SegmentMs(e - b, e);
    time[rank] = attention[rank] + static_cast<double>(received[rank]) * row_ms;
    held[doc].push_back({static_cast<int>(rank), b, e});
  };
  for (const Item& it : items) {
    const int64_t len = it.end - it.begin;
    size_t best = ranks;
    double best_t = 0.0;
    for (size_t k = 0; k < ranks; ++k) {
      if (tokens[k] + len > cap) continue;
      const size_t x = k * docs + it.doc;
      const int64_t recv =
          received[k] - (hi[x] - own[x]) + (std::max(hi[x], it.end) - own[x] - len);
      const double t = attention[k] + it.ms + static_cast<double>(recv) * row_ms;
      if (best == ranks || t < best_t) {
        best = k;
        best_t = t;
      }
    }
    if (best < ranks) {
      take(best, it.doc, it.begin, it.end);
      continue;
    }
    spill.clear();
    SpillShards(len, cap, tokens, time, spill);
    for (const DocShard& s : spill) {
      take(static_cast<size_t>(s.rank), it.doc, it.begin + s.q_begin, it.begin + s.q_end);
    }
  }
  PlanBuilder b(mb, r.starts, r.cp_size, items.size() + ranks);
  for (size_t i = 0; i < docs; ++i) {
    std::vector<DocShard>& pieces = held[i];
    std::sort(pieces.begin(), pieces.end(),
              [](const DocShard& x, const DocShard& y) { return x.q_begin < y.q_begin; });
    for (size_t k = 0; k < pieces.size();) {
      size_t end = k + 1;  // merge the rank's adjacent pieces into one segment
      while (end < pieces.size() && pieces[end].rank == pieces[k].rank) ++end;
      b.Add(pieces[k].rank, static_cast<int64_t>(i), pieces[k].q_begin, pieces[end - 1].q_end);
      k = end;
    }
  }
  return b.Finish(ShardStrategy("balanced-chunks"), r.requested, r.cp_size, -1);
}

}  // namespace detail
}  // namespace wlb
