// wlb-lookahead's scoring: the summed imbalance of a step planned under a candidate and of the
// buffered steps after it, from sketches of those steps (ScoreBySketch). Lower is better.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "wlb/core/document.hpp"
#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/lookahead/candidates.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb {
// The most steps wlb-lookahead may see ahead (each costs a step of buffered arrivals and of
// planning work per candidate); MakePacker checks it.
inline constexpr int kMaxLookahead = 8;
}  // namespace wlb

namespace wlb::lookahead {

// The least a step's imbalance can be, from Sketcher::EstimateStep(): the
// heaviest micro-batch weighs at least the mean; with costs >= 0 the computed mean exceeds it by
// about N ulps at most, far within this margin.
inline constexpr double kMinImbalance = 1.0 - 1e-6;

// The least a score can end at that has reached `sum` with `steps_left` steps to add: each adds at
// least kMinImbalance, and a floating-point sum only grows with its terms.
inline double ScoreLowerBound(double sum, size_t steps_left) {
  for (size_t i = 0; i < steps_left; ++i) sum += kMinImbalance;
  return sum;
}

// A step as the look-ahead sees it while it compares candidates: long documents one by one,
// short ones (below LongCut(): most documents, and interchangeable filler) as a fluid of tokens
// at their mean cost per token. Estimating a candidate is then O(long documents x log N + N), not
// a packing of every document, so the search costs little next to the one real packing.
struct Sketch {
  std::vector<int64_t> lengths;  // long documents
  double short_tokens = 0.0;
  double short_cost = 0.0;
};

// A pushed step split as the look-ahead needs it: outliers per level, the rest as a sketch (its
// long lengths longest first). Made once per push (Sketcher::SplitArrivals): it serves while the
// step is buffered and then as its own step's arrivals.
struct Arrivals {
  std::vector<std::vector<int64_t>> outliers;  // lengths, in arrival order
  Sketch fresh;
  double tokens = 0.0;  // of all the arrivals
};

// The buffered steps' arrivals, oldest first: at most kMaxLookahead, so never on the heap.
using AheadArrivals = absl::InlinedVector<const Arrivals*, kMaxLookahead>;

// What every candidate's sketch score shares, computed once per step: the carry-over and the
// arrivals (the longest one apart, as a candidate may hold it back), and the buffered steps.
struct SketchBase {
  Sketch step;                  // carry-over and arrivals but the longest
  std::vector<Sketch> longest;  // the kMaxHeldArrivals longest arrivals (fewer if fewer)
  AheadArrivals ahead;
};

// Sketches of steps under one configuration and cost.
class Sketcher {
 public:
  // Up to this many micro-batches EstimateStep scans for the lightest and the emptiest.
  static constexpr size_t kScanMicroBatches = 8;

  Sketcher(const PackerConfig& config, const DocumentCost& cost)
      : config_(config),
        cost_(cost),
        long_cut_(std::max<int64_t>(1, config.context / (config.micro_batches <= 16 ? 32 : 8))),
        poly_(cost.polynomial()),
        scratch_(static_cast<size_t>(config.micro_batches)) {}

  void AddToSketch(const Document& d, Sketch& sketch) const {
    if (d.length >= long_cut_) {
      sketch.lengths.push_back(d.length);
    } else {
      sketch.short_tokens += static_cast<double>(d.length);
      sketch.short_cost += poly_ ? (*poly_)(d.length) : cost_(d.length);
    }
  }
  // Where long documents start. A small step holds a few hundred documents and each long one
  // moves a micro-batch's weight, so the sketch places more of them one by one: from S/32 up to
  // N = 16, S/8 beyond, which keeps it cheap where steps hold thousands. Measured with wlb-plan
  // (K = 1, delay bounded by wlb-refine's, the default) at N = 4, S/32 against S/64: the
  // WLB-LLM-like data 1.02448 at 0.4075 steps of delay (S/64 1.02445 at 0.4073), the heavy tail
  // of seed 5 (40 steps) 1.0690 (1.0758), seeds 1 and 2 (400 steps) 1.0479 and 1.0478 (1.0520,
  // 1.0482), the default of seeds 1 and 2 (400 steps) 1.0227 and 1.0214 (1.0226, 1.0215), at
  // half the long documents per estimate (46 against 86 a step of the default); with the delay
  // price alone the WLB-LLM-like data gives 1.0250 (1.0246). At N = 16 S/32 1.046 (S/8 1.054);
  // at N = 64 and 1,024 S/32 changed nothing and took twice the time.
  // Computed once: a division per document cost more than the rest of a sketch's bookkeeping.
  int64_t LongCut() const { return long_cut_; }

  // Estimates the imbalance of packing `step`: long documents longest first as PackUnderCap
  // places them, then the fluid poured into the lightest micro-batches up to S_max. What fits
  // nowhere goes to `carry`. The scoring passes lengths already longest first (merged from
  // sketches sorted once a step), which saves a sort per estimate; any other order is sorted here.
  double EstimateStep(const Sketch& step, Sketch& carry) const {
    const std::vector<int64_t>* lengths = &step.lengths;
    if (!std::is_sorted(step.lengths.begin(), step.lengths.end(), std::greater<>())) {
      scratch_.sorted.assign(step.lengths.begin(), step.lengths.end());
      std::sort(scratch_.sorted.begin(), scratch_.sorted.end(), std::greater<>());
      lengths = &scratch_.sorted;
    }
    const size_t n = static_cast<size_t>(config_.micro_batches);
    const double cap = static_cast<double>(config_.max_tokens);
    // The micro-batches' cost and tokens, and the lightest and the emptiest of them from
    // tournament trees (O(log N) per document) or, up to kScanMicroBatches, a scan (the trees'
    // upkeep costs more there), in scratch memory a Sketcher keeps: a step is estimated a few
    // dozen times. Both break ties to the smallest index.
    std::vector<double>& cost = scratch_.cost;
    std::vector<double>& tokens = scratch_.tokens;
    cost.assign(n, 0.0);
    tokens.assign(n, 0.0);
    detail::ArgminTree<double>& lightest = scratch_.lightest;
    detail::ArgminTree<double>& emptiest = scratch_.emptiest;
    const bool scan = n <= kScanMicroBatches;
    if (!scan) {
      lightest.Fill(0.0);
      emptiest.Fill(0.0);
    }
    auto argmin = [n](const std::vector<double>& v) {
      size_t best = 0;
      for (size_t b = 1; b < n; ++b) best = v[b] < v[best] ? b : best;
      return best;
    };
    const CostModel* poly = poly_;  // inlined: one evaluation per long document
    for (int64_t length : *lengths) {
      const double l = static_cast<double>(length);
      size_t target = scan ? argmin(cost) : lightest.Min();
      if (tokens[target] + l > cap) {
        target = scan ? argmin(tokens) : emptiest.Min();
        if (tokens[target] + l > cap) {
          carry.lengths.push_back(length);
          continue;
        }
      }
      cost[target] += poly ? (*poly)(length) : cost_(length);
      tokens[target] += l;
      if (!scan) {
        lightest.Set(target, cost[target]);
        emptiest.Set(target, tokens[target]);
      }
    }
    // Water-filling: raise the lightest micro-batches to a common level, each up to the cap.
    double total = 0.0;
    for (double c : cost) total += c;
    if (step.short_tokens > 0.0) {
      const double rate = step.short_cost / step.short_tokens;
      double placed = 0.0;
      if (rate > 0.0) {
        const double level = FluidLevel(cost, tokens, cap, rate, step.short_tokens);
        for (size_t b = 0; b < n; ++b) {
          const double t = std::clamp((level - cost[b]) / rate, 0.0, cap - tokens[b]);
          cost[b] += t * rate;
          placed += t;
        }
      } else {  // costless fluid (a cost model that is 0 for short documents) goes where room is
        for (size_t b = 0; b < n; ++b) placed += cap - tokens[b];
        placed = std::min(placed, step.short_tokens);
      }
      total += placed * rate;
      const double left = std::max(0.0, step.short_tokens - placed);
      carry.short_tokens += left;
      carry.short_cost += left * rate;
    }
    if (total <= 0.0) return 1.0;
    return *std::max_element(cost.begin(), cost.end()) / (total / static_cast<double>(n));
  }

  // The level the fluid raises the lightest micro-batches to: micro-batch b below it takes
  // (level - cost[b]) / rate tokens, at most its room under the cap, and together they take
  // `fluid`; +infinity when all the room together is not enough (every micro-batch fills). The
  // poured amount is piecewise linear in the level, with a break where a micro-batch starts
  // filling (its cost) and where it is full, so one sweep over the sorted breaks finds the
  // level exactly: O(N log N), where a bisection took ~20 passes over the N micro-batches.
  // `rate` > 0: the cost per token of the fluid.
  double FluidLevel(const std::vector<double>& cost, const std::vector<double>& tokens, double cap,
                    double rate, double fluid) const {
    constexpr double kFull = std::numeric_limits<double>::infinity();
    std::vector<std::pair<double, int>>& breaks = scratch_.breaks;  // (level, change of slope)
    breaks.clear();
    double room = 0.0;
    for (size_t b = 0; b < cost.size(); ++b) {
      room += cap - tokens[b];
      breaks.push_back({cost[b], +1});
      breaks.push_back({cost[b] + rate * (cap - tokens[b]), -1});
    }
    if (room <= fluid) return kFull;
    std::sort(breaks.begin(), breaks.end());
    double level = breaks.front().first;
    double poured = 0.0;
    int filling = 0;  // micro-batches taking fluid between `level` and the next break
    for (const auto& [next, change] : breaks) {
      const double at_next = poured + filling * (next - level) / rate;
      if (at_next >= fluid && filling > 0) return level + (fluid - poured) * rate / filling;
      poured = at_next;
      level = next;
      filling += change;
    }
    return level;  // not reached: the room exceeds the fluid
  }

  // `arrivals` split into the outliers of each level of `queues` and a sketch of the rest, its
  // long lengths longest first.
  Arrivals SplitArrivals(const std::vector<Document>& arrivals,
                         const OutlierQueues<Document>& queues) const {
    Arrivals a;
    a.outliers.resize(queues.levels());
    a.fresh.lengths.reserve(arrivals.size());  // one allocation, not one per doubling
    for (const Document& d : arrivals) {
      a.tokens += static_cast<double>(d.length);
      const int level = queues.Level(d.length);
      if (level >= 0) {
        a.outliers[level].push_back(d.length);
      } else {
        AddToSketch(d, a.fresh);
      }
    }
    std::sort(a.fresh.lengths.begin(), a.fresh.lengths.end(), std::greater<>());
    return a;
  }

  // The step's sketch from the carry-over and `arrived`, the SplitArrivals of its arrivals, whose
  // non-outliers are `fresh`, sorted longest first; `ahead`: the buffered steps' SplitArrivals.
  // The sketches' long lengths come out longest first (the carry and the arrivals' are each in
  // that order, so they merge). The arrivals are not sketched again: only their longest (at most
  // kMaxHeldArrivals, held back by some candidates) are set apart, which are the sketch's first
  // long lengths unless the step has fewer long ones than that.
  SketchBase MakeSketchBase(const Holding& base, const std::vector<Document>& fresh,
                            const Arrivals& arrived, AheadArrivals ahead) const {
    SketchBase s;
    s.ahead = std::move(ahead);
    s.step.lengths.reserve(static_cast<size_t>(base.carry.size()) + arrived.fresh.lengths.size());
    base.carry.ForEach([&](const Document& d) { AddToSketch(d, s.step); });
    const size_t carried = s.step.lengths.size();
    const size_t apart = std::min<size_t>(kMaxHeldArrivals, fresh.size());
    s.longest.resize(apart);
    const std::vector<int64_t>& lengths = arrived.fresh.lengths;
    if (lengths.size() >= apart) {
      for (size_t i = 0; i < apart; ++i) s.longest[i].lengths.push_back(lengths[i]);
      s.step.lengths.insert(s.step.lengths.end(), lengths.begin() + apart, lengths.end());
      s.step.short_tokens += arrived.fresh.short_tokens;
      s.step.short_cost += arrived.fresh.short_cost;
    } else {  // a short arrival is among the longest: sketch them one by one
      for (size_t i = 0; i < fresh.size(); ++i) {
        AddToSketch(fresh[i], i < apart ? s.longest[i] : s.step);
      }
    }
    std::inplace_merge(s.step.lengths.begin(), s.step.lengths.begin() + carried,
                       s.step.lengths.end(), std::greater<>());
    return s;
  }
  // `sorted` (longest first) and `extra` (any order; sorted here) merged longest first into `out`.
  static void MergeLengths(const std::vector<int64_t>& sorted, std::vector<int64_t>& extra,
                           std::vector<int64_t>& out) {
    std::sort(extra.begin(), extra.end(), std::greater<>());
    out.resize(sorted.size() + extra.size());
    std::merge(sorted.begin(), sorted.end(), extra.begin(), extra.end(), out.begin(),
               std::greater<>());
  }
  // Empties `s`, keeping its memory.
  static Sketch& Reset(Sketch& s) {
    s.lengths.clear();
    s.short_tokens = 0.0;
    s.short_cost = 0.0;
    return s;
  }
  static void AddSketch(const Sketch& from, Sketch& to) {
    to.lengths.insert(to.lengths.end(), from.lengths.begin(), from.lengths.end());
    to.short_tokens += from.short_tokens;
    to.short_cost += from.short_cost;
  }

  // The summed imbalance of the step under `c` and the buffered steps after it, each estimated
  // (EstimateStep). Each buffered step takes wlb's release or, when wlb releases a level, every
  // queued outlier, whichever balances better: the step that must take a long outlier is best
  // filled with the other long ones, so holding them for it pays. `fresh` is sorted longest
  // first, so holding back the h longest arrivals moves `sketch.longest[0, h)` to the carry.
  // `loses(bound)` says whether a score of at least `bound` cannot win; scoring stops (nullopt)
  // as soon as ScoreLowerBound() loses, so the candidate is not followed further.
  // `first_step`, when given, receives the estimate of the candidate's own step (if scoring gets
  // that far).
  template <typename Loses>
  std::optional<double> ScoreBySketch(const Candidate& c, const Holding& base,
                                      const SketchBase& sketch, const Loses& loses,
                                      double* first_step = nullptr) const {
    if (loses(ScoreLowerBound(kMinImbalance, sketch.ahead.size()))) return std::nullopt;
    // Lengths are gathered in scratch memory and merged, longest first, with the sketches'
    // sorted ones (the floating-point sums add up in the order AddSketch would).
    Scratch& m = scratch_;
    Sketch& carry = Reset(m.carry);
    Sketch& step = m.step;
    step.short_tokens = sketch.step.short_tokens;
    step.short_cost = sketch.step.short_cost;
    m.extra.clear();
    for (size_t i = 0; i < sketch.longest.size(); ++i) {
      const Sketch& longest = sketch.longest[i];
      if (static_cast<int>(i) < c.hold_longest) {
        AddSketch(longest, carry);
        continue;
      }
      m.extra.insert(m.extra.end(), longest.lengths.begin(), longest.lengths.end());
      step.short_tokens += longest.short_tokens;
      step.short_cost += longest.short_cost;
    }
    std::vector<std::vector<int64_t>>& queues = m.queues;  // lengths left queued
    queues.resize(base.queues.levels());
    for (size_t l = 0; l < base.queues.levels(); ++l) {
      queues[l].clear();
      const std::vector<Document>& q = base.queues.queue(l);
      size_t next = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        const bool out = next < c.release[l].size() && c.release[l][next] == i;
        next += out;
        (out ? m.extra : queues[l]).push_back(q[i].length);
      }
    }
    MergeLengths(sketch.step.lengths, m.extra, step.lengths);
    double score = EstimateStep(step, carry);
    if (first_step != nullptr) *first_step = score;
    const size_t n = static_cast<size_t>(config_.micro_batches);
    for (size_t s = 0; s < sketch.ahead.size(); ++s) {
      if (loses(ScoreLowerBound(score, sketch.ahead.size() - s))) return std::nullopt;
      const Arrivals& a = *sketch.ahead[s];
      // The step takes what was carried and the arrivals; `carry` starts over for what it leaves.
      Sketch& future = m.future;
      future.short_tokens = carry.short_tokens + a.fresh.short_tokens;
      future.short_cost = carry.short_cost + a.fresh.short_cost;
      m.extra.assign(carry.lengths.begin(), carry.lengths.end());
      Reset(carry);
      bool releases = false;
      for (size_t l = 0; l < queues.size(); ++l) {
        queues[l].insert(queues[l].end(), a.outliers[l].begin(), a.outliers[l].end());
        releases |= queues[l].size() >= n;
      }
      if (!releases) {
        MergeLengths(a.fresh.lengths, m.extra, future.lengths);
        score += EstimateStep(future, carry);
        continue;
      }
      // wlb's release, or every queued outlier, whichever balances better.
      Sketch& all = m.all;
      all.short_tokens = future.short_tokens;
      all.short_cost = future.short_cost;
      m.all_extra.assign(m.extra.begin(), m.extra.end());
      for (size_t l = 0; l < queues.size(); ++l) {
        m.all_extra.insert(m.all_extra.end(), queues[l].begin(), queues[l].end());
        if (queues[l].size() < n) continue;
        m.extra.insert(m.extra.end(), queues[l].begin(), queues[l].begin() + n);
      }
      MergeLengths(a.fresh.lengths, m.extra, future.lengths);
      MergeLengths(a.fresh.lengths, m.all_extra, all.lengths);
      Sketch& all_carry = Reset(m.all_carry);
      const double by_wlb = EstimateStep(future, carry);
      const double by_all = EstimateStep(all, all_carry);
      if (by_all < by_wlb) {
        score += by_all;
        std::swap(carry, all_carry);
        for (auto& q : queues) q.clear();
      } else {
        score += by_wlb;
        for (auto& q : queues) {
          if (q.size() >= n) q.erase(q.begin(), q.begin() + n);
        }
      }
    }
    return score;
  }

 private:
  const PackerConfig& config_;
  const DocumentCost& cost_;
  int64_t long_cut_;
  const CostModel* poly_;  // the cost's polynomial, evaluated inline (nullptr: a custom cost)
  struct Scratch {
    explicit Scratch(size_t n) : lightest(n, 0.0), emptiest(n, 0.0) {}
    // EstimateStep's
    std::vector<double> cost, tokens;
    detail::ArgminTree<double> lightest, emptiest;
    std::vector<std::pair<double, int>> breaks;
    std::vector<int64_t> sorted;
    // ScoreBySketch's
    Sketch step, future, all, carry, all_carry;
    std::vector<int64_t> extra, all_extra;
    std::vector<std::vector<int64_t>> queues;
  };
  // Working memory kept across the few dozen estimates of a step; a Sketcher is used by one
  // thread.
  mutable Scratch scratch_;
};

}  // namespace wlb::lookahead
