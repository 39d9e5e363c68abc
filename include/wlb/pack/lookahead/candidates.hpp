// wlb-lookahead's candidates: the ways to plan one step that it compares (wlb/pack/
// lookahead_packer.hpp). Each starts from wlb's rule (the same outlier queues, thresholds and
// carry-over) and changes which queued outliers the step releases or which arrivals it holds
// back; PlanStep() packs a step under a candidate as wlb-refine packs one.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "wlb/core/document.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/pack/length_order.hpp"
#include "wlb/pack/lookahead/delay_account.hpp"
#include "wlb/pack/outlier_queues.hpp"
#include "wlb/pack/packer.hpp"
#include "wlb/pack/refine.hpp"
#include "wlb/pack/wlb_packer.hpp"

namespace wlb::lookahead {

// Even releases (AddEvenReleases) and the overdue rule (ReleaseOverdue) from this N on, with a
// look-ahead (K >= 1); below it a step has few outliers to pair, and the plans stay those of
// the small-N packer measured on the paper's data. kMaxOutlierWait: from there on, an outlier
// queued at step t leaves its queue by step t + kMaxOutlierWait unless the step is planned under
// wlb's rule, which alone has no such bound (a level holding fewer than N waits for more).
// Measured: 8 steps forced a few lone outliers out on the default stream at 70B (N = 256 and 1,024:
// mean imbalance 1.032 -> 1.041 and 1.034 -> 1.046); 16 never binds on the streams of
// docs/RESULTS.md.
inline constexpr size_t kEvenReleaseFrom = 16;
inline constexpr int64_t kMaxOutlierWait = 16;
// Steps a queue level may be held back beyond wlb's release, windows of alike outliers tried
// per level and step, and the most arrivals (longest first) a candidate holds back.
inline constexpr int64_t kMaxExtraWait = 2;
inline constexpr size_t kMaxWindows = 4;
inline constexpr int kMaxHeldArrivals = 2;

// Queued outliers (first in, first out per level) and carry-over (longest first).
struct Holding {
  OutlierQueues<Document> queues;
  detail::LengthOrdered carry;
};

// The delay the held documents have accrued before step `step` (queued and carried).
inline double AccruedDelay(const Holding& held, int64_t step) {
  double accrued = AccruedDelay(held.queues, step);
  held.carry.ForEach([&](const Document& d) { accrued += Accrued(d, step); });
  return accrued;
}

// Positions in one level's queue, increasing. Inline up to four (a step at N = 4 makes a dozen
// candidates, each of a few levels; their heap vectors were about a third of its allocations).
using Positions = absl::InlinedVector<size_t, 4>;
using Release = absl::InlinedVector<Positions, 3>;  // per level

// One way to plan a step: which queued outliers it releases, which arrivals it holds back.
struct Candidate {
  Release release;       // per level: positions in the queue, increasing
  int hold_longest = 0;  // the longest non-queued arrivals to hold back to the next step
};

// How the look-ahead packs a step: as wlb-refine packs one.
struct StepPacking {
  const PackerConfig& config;
  const DocumentCost& cost;
  int refine_rounds;
  AttentionRange attention_range = {};  // RefineMicroBatches' range

  // Plans one step from `held` (outliers of this step's arrivals already queued) and `fresh`
  // (longest first) under `c`; leaves in `held` what the step does not take. Unrefined, the
  // micro-batches hold the same documents, not yet moved between them (Refine).
  std::vector<MicroBatch> PlanStep(const Candidate& c, std::span<const Document> fresh,
                                   Holding& held, bool refined = true) const {
    std::vector<Document> released;
    for (size_t l = 0; l < held.queues.levels(); ++l) {
      held.queues.Release(l, c.release[l], released);
    }
    const std::span<const Document> hold = fresh.first(static_cast<size_t>(c.hold_longest));
    fresh = fresh.subspan(hold.size());
    std::vector<MicroBatch> mbs =
        detail::PackUnderCap(std::move(released), held.carry, fresh, config, cost, true);
    // What was held back on purpose goes first next step, as carry-over does (after what was
    // carried of its length).
    held.carry.Merge({}, {hold.begin(), hold.end()});
    detail::FillEmptyMicroBatches(mbs, held.queues, held.carry, config, cost);
    if (refined) Refine(mbs);
    return mbs;
  }
  void Refine(std::vector<MicroBatch>& mbs) const {
    RefineMicroBatches(mbs, config.max_tokens, cost, refine_rounds, attention_range);
  }

  // One step of Flush()'s drain: every queued outlier released, packed with the carry-over; what
  // does not fit stays in `held.carry`.
  std::vector<MicroBatch> DrainStep(Holding& held, bool refined = true) const {
    std::vector<Document> released;
    held.queues.ReleaseAll(released);
    std::vector<MicroBatch> mbs =
        detail::PackUnderCap(std::move(released), held.carry, {}, config, cost);
    if (refined) Refine(mbs);
    return mbs;
  }

  // The token-steps of delay that draining `held` as Flush() does (every queue released, then
  // steps packed until nothing is held) adds beyond the first drain step: each token a drain
  // step leaves waits one step more. At most N documents drain in one step (each fits an empty
  // micro-batch), which is most steps' case and costs no packing.
  double DrainDelay(Holding held) const {
    const auto n = static_cast<int64_t>(config.micro_batches);
    if (held.queues.held().documents + held.carry.size() <= n) return 0.0;
    double delay = 0.0;
    for (;;) {  // each drain step places at least one document, so this ends
      DrainStep(held, /*refined=*/false);
      if (held.carry.empty()) return delay;
      delay += static_cast<double>(held.carry.tokens());
      if (held.carry.size() <= n) return delay;
    }
  }
};

// The imbalance of planned micro-batches under the costs W_g = g W_a + W_l at both ends of
// `range` (g = range.low, range.high), W_a and W_l the attention and linear parts of `cost`.
// Each micro-batch's share of the step is linear-fractional in g, so the step's imbalance is
// largest at one of the ends.
inline std::array<double, 2> ImbalanceAtRangeEnds(const std::vector<MicroBatch>& mbs,
                                                  const DocumentCost& cost, AttentionRange range) {
  const std::array<double, 2> weights{range.low, range.high};
  const CostModel* poly = cost.polynomial();
  std::array<double, 2> total{0.0, 0.0};
  std::array<double, 2> heaviest{0.0, 0.0};
  for (const MicroBatch& mb : mbs) {
    // Each document's parts once; the ends weigh the micro-batch's sums.
    double attention = 0.0;
    double linear = 0.0;
    for (const Document& d : mb.documents) {
      attention += poly ? poly->Attention(d.length) : cost.Attention(d.length);
      linear += poly ? poly->Linear(d.length) : cost.Linear(d.length);
    }
    for (size_t e = 0; e < 2; ++e) {
      const double w = weights[e] * attention + linear;
      total[e] += w;
      heaviest[e] = std::max(heaviest[e], w);
    }
  }
  std::array<double, 2> out{1.0, 1.0};
  for (size_t e = 0; e < 2; ++e) {
    if (total[e] > 0.0) out[e] = heaviest[e] / (total[e] / static_cast<double>(mbs.size()));
  }
  return out;
}

// Queues the outliers of `arrivals` and returns the rest, in order (in the same memory).
inline std::vector<Document> Enqueue(std::vector<Document> arrivals, Holding& held) {
  size_t fresh = 0;
  for (const Document& d : arrivals) {
    if (!held.queues.Enqueue(d)) arrivals[fresh++] = d;
  }
  arrivals.resize(fresh);
  return arrivals;
}

// Tokens of queued outliers `c` releases minus the arrivals it holds back.
inline double TrainedTokens(const Candidate& c, const Holding& held,
                            const std::vector<Document>& fresh) {
  int64_t tokens = 0;
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    for (size_t i : c.release[l]) tokens += held.queues.queue(l)[i].length;
  }
  for (int i = 0; i < c.hold_longest; ++i) tokens -= fresh[i].length;
  return static_cast<double>(tokens);
}

// wlb's rule: a level holding >= N (`n`) documents releases its N oldest.
inline Release WlbRelease(const Holding& held, size_t n) {
  Release release(held.queues.levels());
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    if (held.queues.queue(l).size() < n) continue;
    for (size_t i = 0; i < n; ++i) release[l].push_back(i);
  }
  return release;
}

// Whether candidate `i` of `candidates` equals an earlier one.
inline bool RepeatsEarlier(const std::vector<Candidate>& candidates, size_t i) {
  for (size_t j = 0; j < i; ++j) {
    if (candidates[j].hold_longest == candidates[i].hold_longest &&
        candidates[j].release == candidates[i].release) {
      return true;
    }
  }
  return false;
}

// Every queued outlier, no arrival held back.
inline Candidate ReleaseAll(const Holding& held) {
  Candidate all{.release = Release(held.queues.levels())};
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    all.release[l].resize(held.queues.queue(l).size());
    for (size_t i = 0; i < held.queues.queue(l).size(); ++i) all.release[l][i] = i;
  }
  return all;
}

// Adds to `c` every queued outlier that has waited kMaxOutlierWait steps by `next_step` (from N =
// kEvenReleaseFrom on, with a look-ahead): no outlier stays queued longer, whichever candidate
// wins.
inline void ReleaseOverdue(const Holding& held, int64_t next_step, Candidate& c) {
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    const std::vector<Document>& q = held.queues.queue(l);
    Positions overdue;
    for (size_t i = 0; i < q.size() && q[i].arrival_step + kMaxOutlierWait <= next_step; ++i) {
      overdue.push_back(i);  // queues are in arrival order: the overdue ones come first
    }
    if (overdue.empty()) continue;
    Positions merged;
    std::set_union(overdue.begin(), overdue.end(), c.release[l].begin(), c.release[l].end(),
                   std::back_inserter(merged));
    c.release[l] = std::move(merged);
  }
}

// Even releases, from N = kEvenReleaseFrom on: sets of queued outliers of all levels together
// that a step can absorb evenly. wlb's rule puts the N oldest of one level into one step, one
// per micro-batch; at the cap a micro-batch holding a long outlier weighs what no filler can
// match, so the step is as unbalanced as its outliers are unlike (1.2-1.4 at N = 1,024 on a
// heavy tail). The candidates, in length order across levels:
//   - the k shortest, k = 3N/2 and 2N: more outliers than micro-batches, so the placement pairs
//     the shortest (two of 70K weigh about one of 99K) up to the level the longest sets;
//   - windows of 3N/2 alike ones around the oldest queued outlier, at up to kMaxWindows
//     offsets: a band of similar lengths, paired likewise, that still trains the oldest now.
// Measured (docs/RESULTS.md, "Planning at scale"): windows of N alike ones as well made the
// default stream at 70B 0.03-0.05 worse (they leave the longest outliers for a later step that
// the one-step look-ahead cannot see coming), so they are not tried.
// They compete with the other candidates on the same score, and the delay account still holds
// the packer to wlb's delay; every candidate also takes the overdue outliers (ReleaseOverdue),
// so the long ones that even releases pass over wait at most kMaxOutlierWait steps.
inline void AddEvenReleases(const Holding& held, size_t n, std::vector<Candidate>& out) {
  struct Queued {
    int64_t length;
    size_t level;
    size_t position;
  };
  std::vector<Queued> queued;
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    for (size_t i = 0; i < held.queues.queue(l).size(); ++i) {
      queued.push_back({held.queues.queue(l)[i].length, l, i});
    }
  }
  if (queued.size() < n) return;
  // Shortest first; ties by level and queue position, so the order is deterministic.
  std::sort(queued.begin(), queued.end(), [](const Queued& a, const Queued& b) {
    return std::tie(a.length, a.level, a.position) < std::tie(b.length, b.level, b.position);
  });
  auto arrival = [&](const Queued& q) {
    return held.queues.queue(q.level)[q.position].arrival_step;
  };
  // Releases queued[first, first + k).
  auto add = [&](size_t first, size_t k) {
    Candidate c{.release = Release(held.queues.levels())};
    for (size_t j = 0; j < queued.size(); ++j) {
      if (j >= first && j < first + k) c.release[queued[j].level].push_back(queued[j].position);
    }
    for (Positions& r : c.release) std::sort(r.begin(), r.end());
    out.push_back(std::move(c));
  };
  for (size_t k : {n + n / 2, 2 * n}) {
    if (k <= queued.size()) add(0, k);
  }
  size_t oldest = 0;  // the first of the longest-waiting, in length order
  for (size_t j = 1; j < queued.size(); ++j) {
    if (arrival(queued[j]) < arrival(queued[oldest])) oldest = j;
  }
  if (const size_t k = n + n / 2; k <= queued.size()) {
    const size_t first = oldest + 1 >= k ? oldest + 1 - k : 0;
    const size_t last = std::min(oldest, queued.size() - k);
    const size_t stride = std::max<size_t>(1, (last - first + 1) / kMaxWindows);
    for (size_t w = first; w <= last; w += stride) add(w, k);
  }
}

// The alternatives to wlb's rule for the step `next_step` whose outliers are queued in `held`,
// with N = `n` micro-batches and a look-ahead of `lookahead` steps (0: wlb's rule alone). With one
// micro-batch every plan is balanced (imbalance 1), so the alternatives could only add delay:
// wlb's rule alone there too, which makes the packer wlb-refine at N = 1.
inline std::vector<Candidate> Candidates(const Holding& held, const std::vector<Document>& fresh,
                                         size_t n, int64_t max_tokens,
                                         const OutlierQueues<ArrivedTokens>& wlb_queues,
                                         int lookahead, int64_t next_step) {
  const Candidate wlb{.release = WlbRelease(held, n)};
  std::vector<Candidate> out;
  out.reserve(16);  // about as many as a step makes at two levels
  out.push_back(wlb);
  if (lookahead == 0 || n == 1) return out;
  for (size_t l = 0; l < held.queues.levels(); ++l) {
    const std::vector<Document>& q = held.queues.queue(l);
    if (q.empty()) continue;
    if (q.size() < n) {
      Candidate c = wlb;  // release this level's waiting outliers now
      for (size_t i = 0; i < q.size(); ++i) c.release[l].push_back(i);
      out.push_back(c);
      continue;
    }
    // Catch up: a level that queues more than wlb's would on the same stream (`wlb_queues`, after
    // a step held it back) releases up to N more, when two of its outliers fit one micro-batch
    // (else the extra ones would be carried into later steps). Without it a level held back
    // while it fills at N a step stays a release behind for good (a saturated bimodal stream
    // ended 0.12 steps above wlb's delay).
    const size_t wlb_queued = l < wlb_queues.levels() ? wlb_queues.queue(l).size() : q.size();
    if (q.size() > n && q.size() - n > wlb_queued && 2 * held.queues.MaxLength(l) <= max_tokens) {
      Candidate c = wlb;
      c.release[l].clear();
      const size_t release = std::min(q.size() - wlb_queued, 2 * n);
      for (size_t i = 0; i < release; ++i) c.release[l].push_back(i);
      out.push_back(c);
    }
    // Hold this level back one more step, unless its oldest has waited long enough.
    if (q.front().arrival_step >= next_step - kMaxExtraWait) {
      Candidate c = wlb;
      c.release[l].clear();
      out.push_back(c);
    }
    // Release the oldest with the N - 1 queued outliers closest to it in length, so the
    // released outliers are alike and one micro-batch each balances (a 128K outlier next to
    // three of 70K cannot be balanced under the cap).
    if (q.size() > n) {
      std::vector<size_t> order(q.size());
      for (size_t i = 0; i < q.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return q[a].length > q[b].length; });
      const size_t oldest = std::find(order.begin(), order.end(), size_t{0}) - order.begin();
      const size_t first = oldest + 1 >= n ? oldest + 1 - n : 0;
      const size_t last = std::min(oldest, q.size() - n);
      const size_t stride = std::max<size_t>(1, (last - first + 1) / kMaxWindows);
      for (size_t w = first; w <= last; w += stride) {
        Candidate c = wlb;
        c.release[l].assign(order.begin() + w, order.begin() + w + n);
        std::sort(c.release[l].begin(), c.release[l].end());
        if (c.release[l] != wlb.release[l]) out.push_back(c);
      }
    }
  }
  // Releasing every queued outlier at once is not a candidate: it won on the sketch by pairing
  // mid-size outliers with a long one, but its real steps were cap-full with more outliers than
  // micro-batches, and the long ones that did not fit were carried into later steps of short
  // documents (prolong-like streams: worst steps 0.3-0.8 above wlb's; without it 0.0 above,
  // docs/results/packing/lookahead_worst_step.md).
  const Candidate all = ReleaseAll(held);
  // A level that releases takes the whole level below with it.
  for (size_t l = 1; l < held.queues.levels(); ++l) {
    if (wlb.release[l].empty() || !wlb.release[l - 1].empty() || held.queues.queue(l - 1).empty()) {
      continue;
    }
    Candidate c = wlb;
    c.release[l - 1] = all.release[l - 1];
    out.push_back(c);
  }
  if (n >= kEvenReleaseFrom) AddEvenReleases(held, n, out);
  // Hold back the longest arrival, or the two longest, to the next step.
  for (int h = 1; h <= kMaxHeldArrivals && static_cast<size_t>(h) <= fresh.size(); ++h) {
    Candidate c = wlb;
    c.hold_longest = h;
    out.push_back(c);
  }
  if (n >= kEvenReleaseFrom) {
    // wlb's rule itself stays as it is, with the overdue ones as a candidate of its own: the step
    // check measures every candidate against wlb's rule, and a lone overdue outlier released
    // into a step of short documents is a step 2-5 times the mean (rare-long at N = 16) that
    // wlb's rule would not plan. So an outlier waits past kMaxOutlierWait only in steps planned
    // under wlb's rule (which releases its oldest first).
    Candidate rule = out[0];
    for (size_t i = 1; i < out.size(); ++i) ReleaseOverdue(held, next_step, out[i]);
    ReleaseOverdue(held, next_step, rule);
    if (rule.release != out[0].release) out.push_back(std::move(rule));
  }
  return out;
}

}  // namespace wlb::lookahead
