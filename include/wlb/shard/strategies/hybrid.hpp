// hybrid: long documents sharded per document, short ones dealt whole to the least
// loaded rank (see shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {

// Documents at least this long are sharded per document by hybrid (every shard >= tile_q).
inline int64_t HybridMinLength(int cp_size, const KernelModel& model) {
  return 2 * static_cast<int64_t>(cp_size) * model.tile_q();
}

namespace detail {

// hybrid's placement: calls on_shard(rank, doc_index, q_begin, q_end) for every per-document
// shard of the long documents (ForEachPerDocumentSegment order), then deals the short ones and
// returns each document's owner (-1: sharded). sharded_ms gets every rank's predicted ms of its
// shards (summed in that order), whole_ms[i] a short document's SegmentMs(d, d).
template <typename Fn>
std::vector<int> PlaceHybrid(const MicroBatch& mb, int cp_size, const KernelModel& model,
                             std::vector<double>& sharded_ms, std::vector<double>& whole_ms,
                             Fn&& on_shard) {
  const size_t docs = mb.documents.size();
  const int64_t min_length = HybridMinLength(cp_size, model);
  auto is_long = [&](size_t i) { return mb.documents[i].length >= min_length; };
  std::vector<double> load(static_cast<size_t>(cp_size), 0.0);
  std::vector<int64_t> held(static_cast<size_t>(cp_size), 0);
  ForEachPerDocumentSegment(mb, cp_size, is_long, [&](int r, int64_t i, int64_t qb, int64_t qe) {
    on_shard(r, i, qb, qe);
    load[r] += model.SegmentMs(qe - qb, qe);
    held[r] += qe - qb;
  });
  sharded_ms = load;
  whole_ms.assign(docs, 0.0);
  std::vector<std::pair<double, size_t>> whole;  // (predicted ms, doc index)
  for (size_t i = 0; i < docs; ++i) {
    const int64_t d = mb.documents[i].length;
    if (!is_long(i)) {
      whole_ms[i] = model.SegmentMs(d, d);
      whole.push_back({whole_ms[i], i});
    }
  }
  std::sort(whole.begin(), whole.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  std::vector<int> owner(docs, -1);
  for (const auto& [ms, i] : whole) {
    int best = 0;
    for (int r = 1; r < cp_size; ++r) {
      if (load[r] < load[best] || (load[r] == load[best] && held[r] < held[best])) best = r;
    }
    owner[i] = best;
    load[best] += ms;
    held[best] += mb.documents[i].length;
  }
  return owner;
}

inline absl::StatusOr<ShardPlan> PlanHybrid(const ShardPlanRequest& r) {
  const MicroBatch& mb = r.mb;
  const size_t docs = mb.documents.size();
  PlanBuilder b(mb, r.starts, r.cp_size, docs * 2 * static_cast<size_t>(r.cp_size));
  std::vector<double> sharded_ms, whole_ms;
  const std::vector<int> owner =
      PlaceHybrid(mb, r.cp_size, r.model, sharded_ms, whole_ms,
                  [&](int rank, int64_t i, int64_t qb, int64_t qe) { b.Add(rank, i, qb, qe); });
  for (size_t i = 0; i < docs; ++i) {
    if (owner[i] >= 0) b.Add(owner[i], static_cast<int64_t>(i), 0, mb.documents[i].length);
  }
  return b.Finish(ShardStrategy("hybrid"), r.requested, r.cp_size, -1);
}

}  // namespace detail
}  // namespace wlb
