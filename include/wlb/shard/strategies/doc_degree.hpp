// doc-degree: per-document CP degree, communication-aware (see
// shard_plan.hpp).
//
//   CpPlanOptions options{.comm = {.link_gbps = 25}};
//   absl::StatusOr<ShardPlan> plan =
//       PlanShards(mb, 8, ShardStrategy("doc-degree"), KernelModel::Default(), options);
//
// How the greedy step prices a placement: as the executors will run the plan built so far with
// it. Per layer kind of the mix, the exchange is the one ChooseExchange (ChooseExchangeOf) picks
// for that plan, from its slowest rank's rows (max of sent and received) and its rank_capacity
// (the largest rank's tokens):
//  - row-exact: a rank pays its own rows x CommModel::RowMs, and every rank pays
//    CommModel::latency_us once as soon as any rank moves rows (one collective that all ranks
//    join); a plan that moves no rows pays nothing;
//  - the all-gather fallback: every rank pays (C - 1) x rank_capacity rows plus the latency,
//    whatever its own rows.
// A rank's time is the mix mean of attention + that exchange, and the candidate's slowest rank
// is exact when no layer kind or every layer kind takes the all-gather (so always for one mask).
// When only some kinds do, ranks outside the candidate's group still count their own rows for
// the gathered kinds on top of the all-gather (an over-estimate of them; the members are exact).
// The final comparison with the fixed strategies is PredictCp's, exact in every case.
// When the fallback applies: a rank never moves more rows than the all-gather would (it receives
// at most the other ranks' tokens and sends at most C - 1 copies of its own), so ChooseExchange
// takes the all-gather only on a tie, e.g. a document zig-zagged over all C ranks with nothing
// else placed. There the all-gather charges every rank the slowest rank's rows, which the greedy
// step now sees; pricing rows alone would not.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/attention_mask.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/hybrid.hpp"
#include "wlb/shard/strategies/per_doc.hpp"
#include "wlb/shard/strategies/per_seq_ordered.hpp"

namespace wlb {
namespace detail {

// A document that no whole or zig-zag placement fits under the memory cap: cut into contiguous
// pieces over the ranks with the most free tokens (fewest pieces), the earliest (cheapest) piece
// on the slowest of them (`time`: each rank's time so far), so the latest lands on the fastest.
// Always fits: the cap leaves at least the micro-batch's tokens over all ranks.
inline void SpillShards(int64_t length, int64_t cap, const std::vector<int64_t>& tokens,
                        const std::vector<double>& time, std::vector<DocShard>& shards) {
  std::vector<int> by_room(tokens.size());
  for (size_t r = 0; r < tokens.size(); ++r) by_room[r] = static_cast<int>(r);
  std::sort(by_room.begin(), by_room.end(), [&](int a, int b) {
    const int64_t ra = cap - tokens[static_cast<size_t>(a)],
                  rb = cap - tokens[static_cast<size_t>(b)];
    return ra != rb ? ra > rb : a < b;
  });
  size_t used = 0;
  for (int64_t covered = 0; covered < length && used < by_room.size(); ++used) {
    covered += std::max<int64_t>(0, cap - tokens[static_cast<size_t>(by_room[used])]);
  }
  by_room.resize(used);
  std::sort(by_room.begin(), by_room.end(), [&](int a, int b) {
    const double ta = time[static_cast<size_t>(a)], tb = time[static_cast<size_t>(b)];
    return ta != tb ? ta > tb : a < b;
  });
  int64_t begin = 0;
  for (const int r : by_room) {
    const int64_t take =
        std::min(length - begin, std::max<int64_t>(0, cap - tokens[static_cast<size_t>(r)]));
    if (take > 0) shards.push_back({r, begin, begin + take});
    begin += take;
  }
}

// Where doc-degree's greedy step put every document.
struct DocumentDegreePlacement {
  struct Placement {
    int degree = 1;  // 0: spilled (its shards in spilled[i])
    int first_rank = 0;
    int64_t pointer = 0;
  };
  std::vector<Placement> placed;
  std::vector<std::vector<DocShard>> spilled;
  int64_t tile = 1;  // the kernel's query tile: zig-zag shards are whole tiles (WholeTileCut)
};

// One degree's placement of a document in PlaceDocumentDegrees, members numbered from 0: its
// shards (one whole shard for degree 1) and their attention per layer kind; per member and layer
// kind the added attention (da), sent (ds) and received (dr) rows; per member the added tokens
// (dt). The best degree's is kept so applying it reuses what pricing computed.
struct DocDegreeCandidate {
  std::vector<DocShard> shards;
  std::vector<double> shard_ms, da, ds, dr;
  std::vector<int64_t> dt;
  size_t shard_count = 0;
};

// PlaceDocumentDegrees (below) for a mix of kKinds layer kinds (0: any number), so that the
// common single kind is compiled without loops over kinds.
template <size_t kKinds>
bool PlaceDocumentDegreesOf(const MicroBatch& mb, int cp_size, const KernelModel& model,
                            const CpPlanOptions& options, double give_up_above_ms,
                            DocumentDegreePlacement& out, bool price_every_degree) {
  const size_t docs = mb.documents.size();
  const size_t ranks = static_cast<size_t>(cp_size);
  const LayerMix& mix = options.mix;
  const size_t kinds = kKinds != 0 ? kKinds : mix.layers.size();
  const double row_ms = options.comm.RowMs(model);
  const int64_t row_bytes = options.comm.RowBytes(model);
  const double latency = options.comm.LatencyMs();
  std::vector<double> weight(kinds);
  for (size_t k = 0; k < kinds; ++k) {
    weight[k] = static_cast<double>(mix.layers[k].second) / static_cast<double>(mix.total_layers());
  }
  std::vector<int> degrees;  // 1, 2, 4, ... below C, then C
  for (int g = 1; g < cp_size; g *= 2) degrees.push_back(g);
  degrees.push_back(cp_size);
  // Per rank and layer kind: attention ms, rows sent, rows received; per rank: tokens held; per
  // layer kind: whether any rank moves rows yet.
  std::vector<double> attention(ranks * kinds);
  std::vector<double> sent(ranks * kinds);
  std::vector<double> received(ranks * kinds);
  std::vector<int64_t> tokens(ranks);
  std::vector<char> moving(kinds);
  // Per document and layer kind: the whole document's attention (degree 1's, priced once).
  std::vector<double> whole_kind_ms(docs * kinds);
  std::vector<std::pair<double, size_t>> order;  // (whole-document ms, index), costliest first
  order.reserve(docs);
  for (size_t i = 0; i < docs; ++i) {
    double t = 0.0;
    for (size_t k = 0; k < kinds; ++k) {
      const double ms = MaskedSegmentMs(model, mix.layers[k].first, 0, mb.documents[i].length);
      whole_kind_ms[i * kinds + k] = ms;
      t += weight[k] * ms;
    }
    order.push_back({t, i});
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<DocumentDegreePlacement::Placement>& placed = out.placed;
  std::vector<std::vector<DocShard>>& spilled = out.spilled;
  placed.assign(docs, {});
  spilled.clear();
  spilled.resize(docs);
  const bool may_give_up = give_up_above_ms < INFINITY && mix.all_causal();
  const int64_t cap = CpRankTokenCap(mb.tokens, cp_size, options.memory_cap_percent);
  std::vector<int64_t> pointer(degrees.size());
  const int64_t tile = out.tile = std::max<int64_t>(1, model.tile_q());
  // Per rank, before the document: row-exact time without latency (mix mean of attention + rows x
  // row_ms), attention alone, and the time as priced now (with the latency of moving kinds).
  std::vector<double> row_exact(ranks);
  std::vector<double> attention_only(ranks);
  std::vector<double> before(ranks);
  // Prefix (ranks [0, r)) and suffix (ranks [r, C)) maxima of row_exact, attention_only, tokens,
  // and per layer kind of the rows a rank moves (max of sent and received).
  std::vector<double> pre_exact(ranks + 1);
  std::vector<double> suf_exact(ranks + 1);
  std::vector<double> pre_att(ranks + 1);
  std::vector<double> suf_att(ranks + 1);
  std::vector<double> pre_rows((ranks + 1) * kinds);
  std::vector<double> suf_rows((ranks + 1) * kinds);
  std::vector<int64_t> pre_tokens(ranks + 1);
  std::vector<int64_t> suf_tokens(ranks + 1);
  DocDegreeCandidate candidates[2];
  for (DocDegreeCandidate& c : candidates) {
    c.shards.resize(2 * ranks);
    c.shard_ms.resize(2 * ranks * kinds);
    c.da.resize(ranks * kinds);
    c.ds.resize(ranks * kinds);
    c.dr.resize(ranks * kinds);
    c.dt.resize(ranks);
  }
  size_t priced = 0;  // candidates[priced] is the degree being priced, the other the best's
  // Per rank and layer kind, as a member of its group: max(sent, received) with ds, dr.
  std::vector<double> member_rows(ranks * kinds);
  // Per group of a degree and layer kind: the exchange every rank pays whatever its rows (the
  // all-gather's rows x row_ms and the latency), and whether it is the all-gather; per group:
  // whether it fits and the slowest other rank's time.
  std::vector<double> fixed_ms(ranks * kinds);
  std::vector<double> others_ms(ranks);
  std::vector<char> gather(ranks * kinds);
  std::vector<char> group_fits(ranks);
  DocExchangeScratch exchange_scratch;
  for (const auto& [whole, i] : order) {
    const int64_t length = mb.documents[i].length;
    for (size_t r = 0; r < ranks; ++r) {
      row_exact[r] = attention_only[r] = before[r] = 0.0;
      for (size_t k = 0; k < kinds; ++k) {
        const size_t x = r * kinds + k;
        row_exact[r] += weight[k] * (attention[x] + std::max(sent[x], received[x]) * row_ms);
        attention_only[r] += weight[k] * attention[x];
        before[r] += moving[k] ? weight[k] * latency : 0.0;
      }
      before[r] += row_exact[r];
    }
    pre_exact[0] = pre_att[0] = suf_exact[ranks] = suf_att[ranks] = 0.0;
    pre_tokens[0] = suf_tokens[ranks] = 0;
    for (size_t k = 0; k < kinds; ++k) pre_rows[k] = suf_rows[ranks * kinds + k] = 0.0;
    for (size_t r = 0; r < ranks; ++r) {
      pre_exact[r + 1] = std::max(pre_exact[r], row_exact[r]);
      pre_att[r + 1] = std::max(pre_att[r], attention_only[r]);
      pre_tokens[r + 1] = std::max(pre_tokens[r], tokens[r]);
      for (size_t k = 0; k < kinds; ++k) {
        const size_t x = r * kinds + k;
        pre_rows[x + kinds] = std::max(pre_rows[x], std::max(sent[x], received[x]));
      }
    }
    for (size_t r = ranks; r-- > 0;) {
      suf_exact[r] = std::max(suf_exact[r + 1], row_exact[r]);
      suf_att[r] = std::max(suf_att[r + 1], attention_only[r]);
      suf_tokens[r] = std::max(suf_tokens[r + 1], tokens[r]);
      for (size_t k = 0; k < kinds; ++k) {
        const size_t x = r * kinds + k;
        suf_rows[x] = std::max(suf_rows[x + kinds], std::max(sent[x], received[x]));
      }
    }
    // Best (slowest rank, slowest member, added time, degree, group) so far.
    std::tuple<double, double, double, int, int> best{INFINITY, INFINITY, INFINITY, 0, 0};
    size_t best_degree = degrees.size();  // none yet
    for (size_t di = 0; di < degrees.size(); ++di) {
      const int g = degrees[di];
      if (g > 1 && length < 2 * static_cast<int64_t>(g)) continue;  // every shard non-empty
      const int64_t n = 2 * static_cast<int64_t>(g);
      const size_t members = static_cast<size_t>(g);
      DocDegreeCandidate& cur = candidates[priced];
      std::vector<DocShard>& shards = cur.shards;
      std::vector<double>& shard_ms = cur.shard_ms;
      std::vector<double>& da = cur.da;
      std::vector<double>& ds = cur.ds;
      std::vector<double>& dr = cur.dr;
      std::vector<int64_t>& dt = cur.dt;
      std::fill_n(da.begin(), members * kinds, 0.0);
      std::fill_n(ds.begin(), members * kinds, 0.0);
      std::fill_n(dr.begin(), members * kinds, 0.0);
      if (g == 1) {
        dt[0] = length;
        shards[0] = {0, 0, length};
        cur.shard_count = 1;
      } else {
        const WholeTileCut cut(length, n, tile);
        for (int m = 0; m < g; ++m) {
          const auto [eb, ee] = cut.Shard(n, pointer[di], m);
          const auto [lb, le] = cut.Shard(n, pointer[di], n - 1 - m);
          shards[2 * static_cast<size_t>(m)] = {m, eb, ee};
          shards[2 * static_cast<size_t>(m) + 1] = {m, lb, le};
          dt[static_cast<size_t>(m)] = (ee - eb) + (le - lb);
        }
        cur.shard_count = 2 * members;
        const std::span<const DocShard> zigzag(shards.data(), cur.shard_count);
        for (size_t k = 0; k < kinds; ++k) {
          const AttentionMask& mask = mix.layers[k].first;
          if (!mask.causal()) {
            ForEachDocExchange(zigzag, mask, [&](int to, int from, int64_t rows) {
              dr[static_cast<size_t>(to) * kinds + k] += static_cast<double>(rows);
              ds[static_cast<size_t>(from) * kinds + k] += static_cast<double>(rows);
            });
            continue;
          }
          // Causal zig-zag, ForEachDocExchange's sums in closed form: member m holds early shard
          // m and late shard n-1-m, so it needs [0, end of its late shard) less its own rows;
          // every other member needs all of its early shard, and the m members with later late
          // shards (0 .. m-1) all of its late one.
          for (int m = 0; m < g; ++m) {
            const DocShard& early = shards[2 * static_cast<size_t>(m)];
            const DocShard& late = shards[2 * static_cast<size_t>(m) + 1];
            const int64_t se = early.q_end - early.q_begin, sl = late.q_end - late.q_begin;
            const size_t y = static_cast<size_t>(m) * kinds + k;
            dr[y] += static_cast<double>(late.q_end - se - sl);
            ds[y] += static_cast<double>((g - 1) * se + m * sl);
          }
        }
      }
      // Per group (first rank q x g): whether every member stays within the memory cap and, when
      // it does, what does not depend on the document's attention, for the probe and the priced
      // pass alike: per layer kind the exchange ChooseExchange picks for the plan with this
      // placement (gather, fixed_ms; member_rows by rank), and the slowest other rank.
      size_t groups = 0;
      for (int first = 0; first + g <= cp_size; first += g, ++groups) {
        const size_t q = groups;
        const size_t lo = static_cast<size_t>(first), hi = static_cast<size_t>(first + g);
        bool fits = true;
        int64_t capacity = std::max(pre_tokens[lo], suf_tokens[hi]);
        for (int m = 0; m < g; ++m) {
          const int64_t held = tokens[lo + static_cast<size_t>(m)] + dt[static_cast<size_t>(m)];
          fits = fits && held <= cap;
          capacity = std::max(capacity, held);
        }
        group_fits[q] = fits;
        if (!fits) continue;
        bool any_gather = false, all_gather = true;
        double nonmember_fixed = 0.0;
        for (size_t k = 0; k < kinds; ++k) {
          double rows = std::max(pre_rows[lo * kinds + k], suf_rows[hi * kinds + k]);
          for (int m = 0; m < g; ++m) {
            const size_t x = (lo + static_cast<size_t>(m)) * kinds + k;
            const size_t y = static_cast<size_t>(m) * kinds + k;
            member_rows[x] = std::max(sent[x] + ds[y], received[x] + dr[y]);
            rows = std::max(rows, member_rows[x]);
          }
          const ExchangeChoice c = ChooseExchangeOf(static_cast<int64_t>(rows), cp_size, capacity,
                                                    row_bytes, options.comm);
          const bool gathers = c.kind == ExchangeKind::kAllGather;
          const double fixed = (gathers ? static_cast<double>(c.allgather_rows) * row_ms : 0.0) +
                               (rows > 0 ? latency : 0.0);
          gather[q * kinds + k] = gathers;
          fixed_ms[q * kinds + k] = fixed;
          any_gather = any_gather || gathers;
          all_gather = all_gather && gathers;
          nonmember_fixed += weight[k] * fixed;
        }
        // Other ranks: exact when no layer kind or every one takes the all-gather; when only
        // some do, their own rows are still counted for those (an over-estimate).
        if (g < cp_size) {
          const double base = any_gather && all_gather ? std::max(pre_att[lo], suf_att[hi])
                                                       : std::max(pre_exact[lo], suf_exact[hi]);
          others_ms[q] = base + nonmember_fixed;
        }
      }
      // Each group's key (slowest rank, slowest member, added time, degree, first rank) with the
      // document's attention da as it stands; `probe` only asks whether one would beat the best.
      auto weigh_groups = [&](bool probe) {
        for (size_t q = 0; q < groups; ++q) {
          if (!group_fits[q]) continue;
          const size_t lo = q * members;
          double member_max = 0.0, added = 0.0;
          for (size_t m = 0; m < members; ++m) {
            const size_t r = lo + m;
            double t = 0.0;
            for (size_t k = 0; k < kinds; ++k) {
              const size_t x = r * kinds + k;
              const double rows = gather[q * kinds + k] ? 0.0 : member_rows[x];
              t += weight[k] *
                   (attention[x] + da[m * kinds + k] + rows * row_ms + fixed_ms[q * kinds + k]);
            }
            member_max = std::max(member_max, t);
            added += t - before[r];
          }
          const double slowest = g < cp_size ? std::max(member_max, others_ms[q]) : member_max;
          const std::tuple<double, double, double, int, int> key{slowest, member_max, added, g,
                                                                 static_cast<int>(lo)};
          if (key < best) {
            if (probe) return true;
            best = key;
            best_degree = di;
          }
        }
        return false;
      };
      // Without the document's attention (da = 0) every group's key is at most its priced key
      // in each part (the exchange does not depend on it, and adding it only grows the times),
      // so once the document has a best placement a degree none of whose groups beats it that
      // way is not priced.
      const bool has_best = std::get<0>(best) < INFINITY;
      if (has_best && !price_every_degree && !weigh_groups(/*probe=*/true)) continue;
      for (size_t k = 0; k < kinds; ++k) {
        const AttentionMask& mask = mix.layers[k].first;
        if (g == 1) {
          da[k] = shard_ms[k] = whole_kind_ms[i * kinds + k];
          continue;
        }
        for (size_t j = 0; j < cur.shard_count; ++j) {
          const DocShard& sh = shards[j];
          const double ms = MaskedSegmentMs(model, mask, sh.q_begin, sh.q_end);
          shard_ms[j * kinds + k] = ms;
          da[static_cast<size_t>(sh.rank) * kinds + k] += ms;
        }
      }
      weigh_groups(/*probe=*/false);
      if (best_degree == di) priced ^= 1;  // this degree is the best so far: keep it
    }
    // Apply the best placement, or spill the document when no whole or zig-zag placement fits
    // the cap.
    if (std::get<0>(best) == INFINITY) {
      SpillShards(length, cap, tokens, before, spilled[i]);
      const std::vector<DocShard>& spill = spilled[i];
      placed[i] = {0, 0, 0};
      for (const DocShard& sh : spill) {
        tokens[static_cast<size_t>(sh.rank)] += sh.q_end - sh.q_begin;
      }
      for (size_t k = 0; k < kinds; ++k) {
        const AttentionMask& mask = mix.layers[k].first;
        for (const DocShard& sh : spill) {
          attention[static_cast<size_t>(sh.rank) * kinds + k] +=
              MaskedSegmentMs(model, mask, sh.q_begin, sh.q_end);
        }
        DocExchangeRows(spill, mask, exchange_scratch, [&](int rank, int64_t in, int64_t out) {
          received[static_cast<size_t>(rank) * kinds + k] += static_cast<double>(in);
          sent[static_cast<size_t>(rank) * kinds + k] += static_cast<double>(out);
          if (in > 0) moving[k] = 1;
        });
      }
    } else {
      // The chosen degree as priced: the same shards' attention, added shard by shard as
      // MaskedSegmentMs would, and its rows (integers, so their sums are exact in any order).
      const int g = std::get<3>(best);
      const size_t first = static_cast<size_t>(std::get<4>(best));
      placed[i] = {g, static_cast<int>(first), pointer[best_degree]};
      if (g > 1) {
        const int64_t n = 2 * static_cast<int64_t>(g);
        pointer[best_degree] =
            (pointer[best_degree] + WholeTileCut(length, n, tile).PointerStep(n)) % n;
      }
      const DocDegreeCandidate& chosen = candidates[priced ^ 1];
      for (size_t m = 0; m < static_cast<size_t>(g); ++m) tokens[first + m] += chosen.dt[m];
      for (size_t k = 0; k < kinds; ++k) {
        for (size_t j = 0; j < chosen.shard_count; ++j) {
          const size_t r = first + static_cast<size_t>(chosen.shards[j].rank);
          attention[r * kinds + k] += chosen.shard_ms[j * kinds + k];
        }
        for (size_t m = 0; m < static_cast<size_t>(g); ++m) {
          const size_t x = (first + m) * kinds + k, y = m * kinds + k;
          received[x] += chosen.dr[y];
          sent[x] += chosen.ds[y];
          if (chosen.dr[y] > 0) moving[k] = 1;
        }
      }
    }
    if (may_give_up) {
      // Every layer kind is causal, so kind 0's attention and rows are every kind's.
      CausalCpLowerBound bound(model, options, cp_size,
                               *std::max_element(tokens.begin(), tokens.end()));
      for (size_t r = 0; r < ranks && !bound.Exceeds(give_up_above_ms); ++r) {
        const size_t x = r * kinds;
        bound.AddRank(attention[x], static_cast<int64_t>(std::max(sent[x], received[x])));
      }
      if (bound.Exceeds(give_up_above_ms)) return false;
    }
  }
  return true;
}

// doc-degree's greedy placement (see shard_plan.hpp's file comment), inputs checked. With a
// finite `give_up_above_ms` and an all-causal mix it stops and returns false once the
// CausalCpLowerBound of the documents placed so far exceeds it: the finished plan's PredictCp
// max_ms would too, as every further document only adds attention, rows and tokens. A degree
// none of whose groups could beat the document's best placement so far even without the
// document's attention is not priced (the same placement; price_every_degree: priced anyway,
// the reference for tests).
inline bool PlaceDocumentDegrees(const MicroBatch& mb, int cp_size, const KernelModel& model,
                                 const CpPlanOptions& options, double give_up_above_ms,
                                 DocumentDegreePlacement& out, bool price_every_degree = false) {
  return options.mix.layers.size() == 1
             ? PlaceDocumentDegreesOf<1>(mb, cp_size, model, options, give_up_above_ms, out,
                                         price_every_degree)
             : PlaceDocumentDegreesOf<0>(mb, cp_size, model, options, give_up_above_ms, out,
                                         price_every_degree);
}

// The plan of a DocumentDegreePlacement.
inline absl::StatusOr<ShardPlan> DocumentDegreePlan(const MicroBatch& mb,
                                                    const std::vector<int64_t>& starts, int cp_size,
                                                    ShardStrategy requested,
                                                    const DocumentDegreePlacement& placement) {
  const size_t docs = mb.documents.size();
  const auto& placed = placement.placed;
  const auto& spilled = placement.spilled;
  PlanBuilder b(mb, starts, cp_size, docs * 2);
  for (int half = 0; half < 3; ++half) {  // early shards, late shards, whole documents
    for (size_t i = 0; i < docs; ++i) {
      const DocumentDegreePlacement::Placement& p = placed[i];
      const int64_t length = mb.documents[i].length;
      if (p.degree == 0) {  // spilled: its pieces in order
        for (const DocShard& sh : spilled[i]) {
          if (half == 2) b.Add(sh.rank, static_cast<int64_t>(i), sh.q_begin, sh.q_end);
        }
        continue;
      }
      if (p.degree == 1) {
        if (half == 2) b.Add(p.first_rank, static_cast<int64_t>(i), 0, length);
        continue;
      }
      if (half == 2) continue;
      const int64_t n = 2 * static_cast<int64_t>(p.degree);
      const WholeTileCut cut(length, n, placement.tile);
      for (int m = 0; m < p.degree; ++m) {
        const auto [lo, hi] = cut.Shard(n, p.pointer, half == 0 ? m : n - 1 - m);
        if (lo < hi) b.Add(p.first_rank + m, static_cast<int64_t>(i), lo, hi);
      }
    }
  }
  return b.Finish(ShardStrategy("doc-degree"), requested, cp_size, -1);
}

// doc-degree's greedy plan, inputs checked.
inline absl::StatusOr<ShardPlan> GreedyDocumentDegree(const MicroBatch& mb,
                                                      const std::vector<int64_t>& starts,
                                                      int cp_size, ShardStrategy requested,
                                                      const KernelModel& model,
                                                      const CpPlanOptions& options) {
  DocumentDegreePlacement placement;
  PlaceDocumentDegrees(mb, cp_size, model, options, INFINITY, placement);
  return DocumentDegreePlan(mb, starts, cp_size, requested, placement);
}

// doc-degree: the greedy plan, or the greedy plan for all-causal layers (when the mix has
// other masks), per-doc's, hybrid's or per-seq-ordered's, whichever PredictCp under
// `options` finds fastest (a fixed strategy's plan keeps its strategy; requested says
// doc-degree).
inline absl::StatusOr<ShardPlan> PlanDocumentDegree(const ShardPlanRequest& r) {
  const KernelModel& model = r.model;
  const CpPlanOptions& options = r.options;
  absl::StatusOr<ShardPlan> greedy =
      GreedyDocumentDegree(r.mb, r.starts, r.cp_size, r.requested, model, options);
  if (!greedy.ok()) return greedy.status();
  double best_ms = PredictCp(*greedy, model, options).max_ms;
  ShardPlan chosen = *std::move(greedy);
  const int64_t cap = RankTokenCap(r);
  auto consider = [&](absl::StatusOr<ShardPlan> plan) -> absl::Status {
    if (!plan.ok()) return plan.status();
    if (plan->rank_capacity > cap) return absl::OkStatus();  // over the memory cap
    if (const double ms = PredictCp(*plan, model, options).max_ms; ms < best_ms) {
      best_ms = ms;
      chosen = *std::move(plan);
    }
    return absl::OkStatus();
  };
  if (!options.mix.all_causal()) {
    CpPlanOptions causal = options;
    causal.mix = LayerMix::Causal();
    absl::Status s =
        consider(GreedyDocumentDegree(r.mb, r.starts, r.cp_size, r.requested, model, causal));
    if (!s.ok()) return s;
  }
  if (absl::Status s = consider(PlanPerDocument(r)); !s.ok()) return s;
  if (absl::Status s = consider(PlanHybrid(r)); !s.ok()) return s;
  if (absl::Status s = consider(PlanPerSequenceOrdered(r)); !s.ok()) return s;
  return chosen;
}

}  // namespace detail
}  // namespace wlb
