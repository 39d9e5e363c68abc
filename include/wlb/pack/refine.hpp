// Refinement of a step's micro-batches: moves and swaps from the heaviest micro-batch to lighter
// ones under the token cap, until the heaviest cannot be made lighter.
//
//   wlb::RefineMicroBatches(micro_batches, /*max_tokens=*/196608, cost, /*max_rounds=*/256);
//
// Each round takes the heaviest micro-batch h and, lightest partner first (up to kMaxPartners of
// them), looks for the single move (one document h -> l) or swap (a in h for b in l) that most
// lowers max(cost_h, cost_l); it applies the first partner's best change that lowers the pair's
// maximum. Every applied change
// moves work from a heavier to a lighter micro-batch without overshooting, so the sum of squared
// costs strictly falls and rounds cannot cycle. Which documents a step holds is unchanged, so
// token delay is exactly that of the packing it refines.
//
// Planning under model error (AttentionRange): the cost is known only to some error, and when
// nobody calibrated it the error is systematic (the kernels weigh attention 0.5-2.5x what a FLOP
// preset says). With a range [low, high] around 1, a change is applied only if, under every cost
// W_g(d) = g * W_a(d) + W_l(d) with g in [low, high], neither micro-batch of the pair ends heavier
// than the heaviest one was before it. Both sides are linear in g, so checking g = low and
// g = high covers the range; the other micro-batches are untouched and the step's documents (so
// its mean) are the same, so every applied change leaves the step's imbalance under every such
// cost no higher than before, and the refined step is never worse than the packing it refines
// under any of them (test/refine_test.cc, RobustRefinementNeverWorseUnderTheFamily).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/cost/document_cost.hpp"
#include "wlb/pack/argmin_tree.hpp"

namespace wlb {

namespace detail {
// A document of a micro-batch as a refinement round searches it.
struct CostEntry {
  double cost;     // W(length)
  int64_t length;  // tokens
  int64_t index;   // position in the micro-batch's documents
};

// Orders by (cost, position): the order in which a round looks at a partner's documents.
struct CheaperFirst {
  bool operator()(const CostEntry& a, const CostEntry& b) const {
    return a.cost < b.cost || (a.cost == b.cost && a.index < b.index);
  }
};

// A micro-batch's documents by CheaperFirst. Placement appends a few runs, each longest first
// (released, carried and fresh documents), so each run is reversed (its equal costs kept in
// document order) and the runs merged; many runs (a hand-made micro-batch) are sorted instead.
// (cost, position) pairs are distinct, so every way of sorting gives the same order.
inline void SortByCost(const MicroBatch& mb, const DocumentCost& cost,
                       std::vector<CostEntry>& out, std::vector<CostEntry>& scratch) {
  constexpr size_t kMaxRuns = 4;
  const size_t n = mb.documents.size();
  out.clear();
  out.reserve(n + 8);                         // room for a few documents moved in
  const CostModel* poly = cost.polynomial();  // evaluated inline, not through DocumentCost
  std::array<size_t, kMaxRuns + 1> run_start{};
  size_t runs = 0;
  for (size_t j = 0; j < n; ++j) {
    const int64_t length = mb.documents[j].length;
    out.push_back({poly ? (*poly)(length) : cost(length), length, static_cast<int64_t>(j)});
    if (j == 0 || out[j].cost > out[j - 1].cost) {
      if (runs < kMaxRuns) run_start[runs] = j;
      ++runs;
    }
  }
  if (runs > kMaxRuns) {
    std::sort(out.begin(), out.end(), CheaperFirst{});
    return;
  }
  run_start[runs] = n;
  for (size_t r = 0; r < runs; ++r) {
    const auto first = out.begin() + static_cast<std::ptrdiff_t>(run_start[r]);
    const auto last = out.begin() + static_cast<std::ptrdiff_t>(run_start[r + 1]);
    std::reverse(first, last);
    for (auto tie = first; tie != last;) {  // equal costs back into document order
      auto end = tie + 1;
      while (end != last && end->cost == tie->cost) ++end;
      std::reverse(tie, end);
      tie = end;
    }
  }
  for (size_t r = 1; r < runs; ++r) {  // merge run r into the sorted prefix before it
    const auto mid = out.begin() + static_cast<std::ptrdiff_t>(run_start[r]);
    const auto last = out.begin() + static_cast<std::ptrdiff_t>(run_start[r + 1]);
    scratch.assign(out.begin(), last);
    const auto split = scratch.begin() + (mid - out.begin());
    std::merge(scratch.begin(), split, split, scratch.end(), out.begin(), CheaperFirst{});
  }
}

// Keeps `sorted` in step with its micro-batch when the document at `index` is erased.
inline void EraseSorted(std::vector<CostEntry>& sorted, int64_t index) {
  std::erase_if(sorted, [index](const CostEntry& e) { return e.index == index; });
  for (CostEntry& e : sorted) e.index -= e.index > index ? 1 : 0;
}

// ... and when `entry` is appended (its index is the largest, so it goes after equal costs).
inline void InsertSorted(std::vector<CostEntry>& sorted, const CostEntry& entry) {
  const auto at = std::upper_bound(sorted.begin(), sorted.end(), entry, CheaperFirst{});
  sorted.insert(at, entry);
}
}  // namespace detail

// The attention weights, relative to the planning cost, under which refinement must not make a
// step worse (see the file comment). {1, 1}: the planning cost is taken as exact.
struct AttentionRange {
  double low = 1.0;
  double high = 1.0;

  bool exact() const { return low == 1.0 && high == 1.0; }
  friend bool operator==(const AttentionRange&, const AttentionRange&) = default;
};

// Checks 0 <= low <= 1 <= high (finite): the planning cost itself must be one of the family.
inline absl::Status ValidateAttentionRange(const AttentionRange& r) {
  if (!(r.low >= 0.0 && r.low <= 1.0) || !(r.high >= 1.0) || !std::isfinite(r.high)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attention range must be LOW,HIGH with 0 <= LOW <= 1 <= HIGH (finite), got %g,%g", r.low,
        r.high));
  }
  return absl::OkStatus();
}

// Partners tried per round, lightest first. The lightest few hold nearly all the useful changes;
// trying every micro-batch made a round O(N) sorts for a negligible gain (measured on the
// WLB-LLM-like data at N = 4, 16, 64: mean imbalance within 0.0002, planning time 10-35% lower).
inline constexpr int kMaxPartners = 8;

// Returns the number of changes applied (at most max_rounds).
//
// The search of a pair (h, l) looks, for each document a of h, at moving a and at swapping it with
// the 3 documents of l just below and the 3 at or above cost W_a - gap / 2 (a swap is best when
// W_a - W_b is near half the gap); of the changes that lower max(cost_h, cost_l) it takes the
// lowest, ties to the first document of h in its micro-batch, then the move, then the cheaper b.
// Each micro-batch's documents are sorted by cost once, on first use, and kept sorted through
// the changes. a's are walked costliest first, so the window into l's moves one way, and the
// walk stops where no cheaper a can beat the best change found.
//
// With a non-exact `range`, a change must also pass the check of the file comment; the search is
// otherwise the same (it takes the best change that passes).
inline int RefineMicroBatches(std::vector<MicroBatch>& mbs, int64_t max_tokens,
                              const DocumentCost& cost, int max_rounds, AttentionRange range = {}) {
  if (mbs.size() < 2) return 0;
  const bool robust = !range.exact();
  const CostModel* poly = cost.polynomial();
  auto attention = [&](int64_t length) {
    return poly ? poly->Attention(length) : cost.Attention(length);
  };
  // Each micro-batch's attention part (robust only), kept in step with the changes.
  std::vector<double> attention_sum;
  if (robust) {
    attention_sum.assign(mbs.size(), 0.0);
    for (size_t b = 0; b < mbs.size(); ++b) {
      for (const Document& d : mbs[b].documents) attention_sum[b] += attention(d.length);
    }
  }
  // The heaviest micro-batch (ties to the largest index) and the lightest ones in order (ties to
  // the smallest), from two tournament trees: the heaviest one keys micro-batch b by -cost at leaf
  // n - 1 - b, so its ties go to the largest b. No allocation per micro-batch, where an ordered
  // set allocated a node for each.
  const size_t n = mbs.size();
  detail::ArgminTree<double> lightest(n, 0.0);
  detail::ArgminTree<double> heaviest(n, 0.0);
  for (size_t b = 0; b < n; ++b) {
    lightest.SetLeaf(b, mbs[b].cost);
    heaviest.SetLeaf(n - 1 - b, -mbs[b].cost);
  }
  lightest.Rebuild();
  heaviest.Rebuild();
  std::vector<size_t> passed;  // partners tried this round, set aside in `lightest`
  std::vector<std::vector<detail::CostEntry>> sorted(mbs.size());
  std::vector<detail::CostEntry> merge_scratch;
  std::vector<bool> have_sorted(mbs.size(), false);
  auto sorted_costs = [&](size_t b) -> std::vector<detail::CostEntry>& {
    if (!have_sorted[b]) {
      detail::SortByCost(mbs[b], cost, sorted[b], merge_scratch);
      have_sorted[b] = true;
    }
    return sorted[b];
  };
  int applied = 0;
  for (; applied < max_rounds; ++applied) {
    const size_t h = n - 1 - heaviest.Min();
    const MicroBatch& heavy = mbs[h];
    bool changed = false;
    int partners = 0;
    passed.clear();
    for (;;) {
      if (++partners > kMaxPartners) break;
      // Never a set-aside one: h is not set aside (reaching it ends the round), and its key is
      // below theirs.
      const size_t l = lightest.Min();
      const MicroBatch& light = mbs[l];
      const double gap = heavy.cost - light.cost;
      if (l == h || gap <= heavy.cost * 1e-12) break;  // partners only get heavier from here
      const std::vector<detail::CostEntry>& hs = sorted_costs(h);
      const std::vector<detail::CostEntry>& ls = sorted_costs(l);
      // The best change so far: pair_max, then a's position, then b's place in ls (-1: a move).
      double best = heavy.cost;
      int64_t best_a = -1;
      std::ptrdiff_t best_b = -1;
      auto consider = [&](const detail::CostEntry& a, std::ptrdiff_t b) {
        const double wb = b < 0 ? 0.0 : ls[b].cost;
        const int64_t lb = b < 0 ? 0 : ls[b].length;
        if (light.tokens + a.length - lb > max_tokens ||
            heavy.tokens - a.length + lb > max_tokens) {
          return;
        }
        const double pair_max = std::max(heavy.cost - a.cost + wb, light.cost + a.cost - wb);
        if (robust && (pair_max < best || (best_a >= 0 && pair_max == best))) {
          // Under W_g = W + (g - 1) W_a: neither of the pair may end above the heavy one's cost.
          const double da = attention(a.length) - (b < 0 ? 0.0 : attention(ls[b].length));
          for (const double g : {range.low, range.high}) {
            const double heavy_g = heavy.cost + (g - 1.0) * attention_sum[h];
            const double light_after =
                light.cost + a.cost - wb + (g - 1.0) * (attention_sum[l] + da);
            const double heavy_after =
                heavy.cost - a.cost + wb + (g - 1.0) * (attention_sum[h] - da);
            if (std::isfinite(heavy_g) && std::isfinite(light_after) &&
                std::isfinite(heavy_after)) {
              if (light_after > heavy_g || heavy_after > heavy_g) return;
              continue;
            }
            // A weight near the double range (HIGH up to DBL_MAX is valid) overflows the costs
            // to inf, where inf > inf would pass anything: compare the differences instead, whose
            // products with g - 1 overflow only to an infinity of the right sign.
            if (light.cost + a.cost - wb - heavy.cost >
                    (g - 1.0) * (attention_sum[h] - attention_sum[l] - da) ||
                wb - a.cost > (g - 1.0) * da) {
              return;
            }
          }
        }
        if (pair_max < best || (best_a >= 0 && pair_max == best &&
                                (a.index < best_a || (a.index == best_a && b < best_b)))) {
          best = pair_max;
          best_a = a.index;
          best_b = b;
        }
      };
      // The search skips only changes whose pair maximum is already above the best, by bounds
      // that rounding cannot break: (cost_h - W_a) + W_b rises with W_b and (cost_l + W_a) - W_b
      // falls with it, and both are terms of the pair maximum.
      const auto size = static_cast<std::ptrdiff_t>(ls.size());
      const double cheapest_b = size == 0 ? 0.0 : std::min(0.0, ls.front().cost);
      std::ptrdiff_t at = size;  // the first of l's documents with cost >= W_a - gap / 2
      for (auto it = hs.rbegin(); it != hs.rend(); ++it) {  // costliest a first
        const detail::CostEntry& a = *it;
        const double h_without_a = heavy.cost - a.cost;
        if (h_without_a + cheapest_b > best) break;  // and so for every cheaper a
        consider(a, -1);                             // a move
        const double target = a.cost - gap / 2.0;
        while (at > 0 && !(ls[at - 1].cost < target)) --at;
        for (std::ptrdiff_t b = at; b < std::min(at + 3, size); ++b) {
          if (h_without_a + ls[b].cost > best) break;  // and so for every costlier b
          consider(a, b);
        }
        const double l_with_a = light.cost + a.cost;
        for (std::ptrdiff_t b = at - 1; b >= std::max<std::ptrdiff_t>(at - 3, 0); --b) {
          if (l_with_a - ls[b].cost > best) break;  // and so for every cheaper b
          consider(a, b);
        }
      }
      if (best_a < 0 || best >= heavy.cost * (1.0 - 1e-12)) {
        // The next partner is the next lightest: this one is set aside until the round ends.
        passed.push_back(l);
        lightest.Set(l, std::numeric_limits<double>::max());
        continue;
      }
      const int64_t from_l = best_b < 0 ? -1 : ls[best_b].index;
      // Applied in the order the sums must see: a leaves h, b leaves l and joins h, a joins l.
      auto take = [&](size_t m, int64_t index) {
        MicroBatch& mb = mbs[m];
        const Document d = mb.documents[index];
        const double w = cost(d.length);
        mb.documents.erase(mb.documents.begin() + index);
        detail::EraseSorted(sorted[m], index);
        mb.tokens -= d.length;
        mb.cost -= w;
        if (robust) attention_sum[m] -= attention(d.length);
        return std::pair(d, w);
      };
      auto add = [&](size_t m, const Document& d, double w) {
        MicroBatch& mb = mbs[m];
        mb.documents.push_back(d);
        detail::InsertSorted(sorted[m],
                             {w, d.length, static_cast<int64_t>(mb.documents.size()) - 1});
        mb.tokens += d.length;
        mb.cost += w;
        if (robust) attention_sum[m] += attention(d.length);
      };
      const auto [a, wa] = take(h, best_a);
      if (from_l >= 0) {
        const auto [b, wb] = take(l, from_l);
        add(h, b, wb);
      }
      add(l, a, wa);
      for (const size_t m : {h, l}) {
        lightest.Set(m, mbs[m].cost);
        heaviest.Set(n - 1 - m, -mbs[m].cost);
      }
      changed = true;
      break;
    }
    for (size_t m : passed) lightest.Set(m, mbs[m].cost);
    if (!changed) break;
  }
  return applied;
}

}  // namespace wlb
