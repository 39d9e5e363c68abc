// kDocumentDegree ("doc-degree"): per-document CP degree, communication-aware (see
// shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

// kDocumentDegree's greedy placement (see shard_plan.hpp's file comment), inputs checked.
inline absl::StatusOr<ShardPlan> GreedyDocumentDegree(const MicroBatch& mb,
                                                      const std::vector<int64_t>& starts,
                                                      int cp_size, ShardStrategy requested,
                                                      const KernelModel& model,
                                                      const CpPlanOptions& options) {
  const size_t docs = mb.documents.size();
  const size_t ranks = static_cast<size_t>(cp_size);
  const LayerMix& mix = options.mix;
  const size_t kinds = mix.layers.size();
  const double row_ms = options.comm.RowMs(model);
  std::vector<double> weight(kinds);
  for (size_t k = 0; k < kinds; ++k) {
    weight[k] = static_cast<double>(mix.layers[k].second) / static_cast<double>(mix.total_layers());
  }
  std::vector<int> degrees;  // 1, 2, 4, ... below C, then C
  for (int g = 1; g < cp_size; g *= 2) degrees.push_back(g);
  degrees.push_back(cp_size);
  // Per rank and layer kind: attention ms, rows sent, rows received.
  std::vector<double> attention(ranks * kinds, 0.0), sent(ranks * kinds, 0.0),
      received(ranks * kinds, 0.0);
  auto rank_time = [&](size_t r, const double* da, const double* ds, const double* dr) {
    double t = 0.0;
    for (size_t k = 0; k < kinds; ++k) {
      const size_t x = r * kinds + k;
      t += weight[k] *
           (attention[x] + (da ? da[k] : 0.0) +
            std::max(sent[x] + (ds ? ds[k] : 0.0), received[x] + (dr ? dr[k] : 0.0)) * row_ms);
    }
    return t;
  };
  auto whole_ms = [&](int64_t length) {
    double t = 0.0;
    for (size_t k = 0; k < kinds; ++k) {
      t += weight[k] * MaskedSegmentMs(model, mix.layers[k].first, 0, length);
    }
    return t;
  };
  std::vector<std::pair<double, size_t>> order;  // (whole-document ms, index), costliest first
  order.reserve(docs);
  for (size_t i = 0; i < docs; ++i) order.push_back({whole_ms(mb.documents[i].length), i});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  struct Placement {
    int degree = 1;
    int first_rank = 0;
    int64_t pointer = 0;
  };
  std::vector<Placement> placed(docs);
  std::vector<int64_t> pointer(degrees.size(), 0);
  std::vector<double> time(ranks), prefix_max(ranks + 1), suffix_max(ranks + 1);
  // Per member of a group and layer kind: added attention, sent and received rows.
  std::vector<double> da(ranks * kinds), ds(ranks * kinds), dr(ranks * kinds);
  std::vector<DocShard> shards;
  for (const auto& [whole, i] : order) {
    const int64_t length = mb.documents[i].length;
    for (size_t r = 0; r < ranks; ++r) time[r] = rank_time(r, nullptr, nullptr, nullptr);
    prefix_max[0] = 0.0;
    for (size_t r = 0; r < ranks; ++r) prefix_max[r + 1] = std::max(prefix_max[r], time[r]);
    suffix_max[ranks] = 0.0;
    for (size_t r = ranks; r-- > 0;) suffix_max[r] = std::max(suffix_max[r + 1], time[r]);
    // Best (slowest rank, slowest member, added time, degree, group) so far.
    std::tuple<double, double, double, int, int> best{INFINITY, INFINITY, INFINITY, 0, 0};
    size_t best_degree = 0;
    for (size_t di = 0; di < degrees.size(); ++di) {
      const int g = degrees[di];
      if (g > 1 && length < 2 * static_cast<int64_t>(g)) continue;  // every shard non-empty
      const int64_t n = 2 * static_cast<int64_t>(g);
      std::fill(da.begin(), da.end(), 0.0);
      std::fill(ds.begin(), ds.end(), 0.0);
      std::fill(dr.begin(), dr.end(), 0.0);
      if (g == 1) {
        for (size_t k = 0; k < kinds; ++k) {
          da[k] = MaskedSegmentMs(model, mix.layers[k].first, 0, length);
        }
      } else {
        shards.clear();
        for (int m = 0; m < g; ++m) {
          for (const int64_t j : {int64_t{m}, n - 1 - m}) {
            const auto [b, e] = PerDocumentShard(length, n, pointer[di], j);
            shards.push_back({m, b, e});
          }
        }
        for (size_t k = 0; k < kinds; ++k) {
          const AttentionMask& mask = mix.layers[k].first;
          for (const DocShard& sh : shards) {
            da[static_cast<size_t>(sh.rank) * kinds + k] +=
                MaskedSegmentMs(model, mask, sh.q_begin, sh.q_end);
          }
          ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
            dr[static_cast<size_t>(to) * kinds + k] += static_cast<double>(rows);
            ds[static_cast<size_t>(from) * kinds + k] += static_cast<double>(rows);
          });
        }
      }
      for (int first = 0; first + g <= cp_size; first += g) {
        double member_max = 0.0, added = 0.0;
        for (int m = 0; m < g; ++m) {
          const size_t r = static_cast<size_t>(first + m);
          const size_t x = static_cast<size_t>(m) * kinds;
          const double t = rank_time(r, &da[x], &ds[x], &dr[x]);
          member_max = std::max(member_max, t);
          added += t - time[r];
        }
        const double slowest = std::max({member_max, prefix_max[static_cast<size_t>(first)],
                                         suffix_max[static_cast<size_t>(first + g)]});
        const std::tuple<double, double, double, int, int> key{slowest, member_max, added, g,
                                                               first};
        if (key < best) {
          best = key;
          best_degree = di;
        }
      }
    }
    // Apply the best placement.
    const int g = std::get<3>(best);
    const int first = std::get<4>(best);
    placed[i] = {g, first, pointer[best_degree]};
    const int64_t n = 2 * static_cast<int64_t>(g);
    for (size_t k = 0; k < kinds; ++k) {
      const AttentionMask& mask = mix.layers[k].first;
      if (g == 1) {
        attention[static_cast<size_t>(first) * kinds + k] +=
            MaskedSegmentMs(model, mask, 0, length);
        continue;
      }
      shards.clear();
      for (int m = 0; m < g; ++m) {
        for (const int64_t j : {int64_t{m}, n - 1 - m}) {
          const auto [b, e] = PerDocumentShard(length, n, pointer[best_degree], j);
          shards.push_back({first + m, b, e});
          attention[static_cast<size_t>(first + m) * kinds + k] +=
              MaskedSegmentMs(model, mask, b, e);
        }
      }
      ForEachDocExchange(shards, mask, [&](int to, int from, int64_t rows) {
        received[static_cast<size_t>(to) * kinds + k] += static_cast<double>(rows);
        sent[static_cast<size_t>(from) * kinds + k] += static_cast<double>(rows);
      });
    }
    if (g > 1) pointer[best_degree] = (pointer[best_degree] + length % n) % n;
  }
  PlanBuilder b(mb, starts, cp_size, docs * 2);
  for (int half = 0; half < 3; ++half) {  // early shards, late shards, whole documents
    for (size_t i = 0; i < docs; ++i) {
      const Placement& p = placed[i];
      const int64_t length = mb.documents[i].length;
      if (p.degree == 1) {
        if (half == 2) b.Add(p.first_rank, static_cast<int64_t>(i), 0, length);
        continue;
      }
      if (half == 2) continue;
      const int64_t n = 2 * static_cast<int64_t>(p.degree);
      for (int m = 0; m < p.degree; ++m) {
        const auto [lo, hi] = PerDocumentShard(length, n, p.pointer, half == 0 ? m : n - 1 - m);
        if (lo < hi) b.Add(p.first_rank + m, static_cast<int64_t>(i), lo, hi);
      }
    }
  }
  return b.Finish(ShardStrategy("doc-degree"), requested, cp_size, -1);
}

// kDocumentDegree: the greedy plan, or the greedy plan for all-causal layers (when the mix has
// other masks), kPerDocument's, kHybrid's or kPerSequenceOrdered's, whichever PredictCp under
// `options` finds fastest (a fixed strategy's plan keeps its strategy; requested says
// kDocumentDegree).
inline absl::StatusOr<ShardPlan> PlanDocumentDegree(const ShardPlanRequest& r) {
  const KernelModel& model = r.model;
  const CpPlanOptions& options = r.options;
  absl::StatusOr<ShardPlan> greedy =
      GreedyDocumentDegree(r.mb, r.starts, r.cp_size, r.requested, model, options);
  if (!greedy.ok()) return greedy.status();
  double best_ms = PredictCp(*greedy, model, options).max_ms;
  ShardPlan chosen = *std::move(greedy);
  auto consider = [&](absl::StatusOr<ShardPlan> plan) -> absl::Status {
    if (!plan.ok()) return plan.status();
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
