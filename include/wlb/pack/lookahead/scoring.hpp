// wlb-lookahead's scoring: the summed imbalance of a step planned under a candidate and of the
// buffered steps after it, from sketches of those steps (ScoreBySketch). Lower is better.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "wlb/core/document.hpp"
#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/lookahead/candidates.hpp"
#include "wlb/pack/packer.hpp"

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

// A buffered step split as the look-ahead needs it: outliers per level, the rest as a sketch.
struct Arrivals {
  std::vector<std::vector<Document>> outliers;
  Sketch fresh;
};

// What every candidate's sketch score shares, computed once per step: the carry-over and the
// arrivals (the longest one apart, as a candidate may hold it back), and the buffered steps.
struct SketchBase {
  Sketch step;                  // carry-over and arrivals but the longest
  std::vector<Sketch> longest;  // the kMaxHeldArrivals longest arrivals (fewer if fewer)
  std::vector<Arrivals> ahead;
};

// Sketches of steps under one configuration and cost.
class Sketcher {
 public:
  Sketcher(const PackerConfig& config, const DocumentCost& cost)
      : config_(config), cost_(cost), scratch_(static_cast<size_t>(config.micro_batches)) {}

  void AddToSketch(const Document& d, Sketch& sketch) const {
    if (d.length >= LongCut()) {
      sketch.lengths.push_back(d.length);
    } else {
      sketch.short_tokens += static_cast<double>(d.length);
      sketch.short_cost += cost_(d.length);
    }
  }
  // Where long documents start. A small step holds a few hundred documents and each long one
  // moves a micro-batch's weight, so the sketch places more of them one by one: from S/64 up to
  // N = 4, S/32 up to N = 16, S/8 beyond, which keeps it cheap where steps hold thousands.
  // Measured with wlb-plan (K = 1) against scoring by real packings, which the look-ahead did
  // up to N = 4 before: the WLB-LLM-like data at N = 4 1.0246 (real packings 1.0237; S/32
  // 1.0250), the heavy tail (400 steps) 1.0464 (1.0462), the heavy tail of seed 5
  // 1.035 at 0.55 steps of delay (1.036 at 0.65); at N = 16 S/32 1.046 (S/8 1.054); at N = 64
  // and 1,024 S/32 changed nothing and took twice the time.
  int64_t LongCut() const {
    const int64_t n = config_.micro_batches;
    return std::max<int64_t>(1, config_.context / (n <= 4 ? 64 : n <= 16 ? 32 : 8));
  }

  // Estimates the imbalance of packing `step`: long documents longest first as PackUnderCap
  // places them, then the fluid poured into the lightest micro-batches up to S_max. What fits
  // nowhere goes to `carry`.
  double EstimateStep(Sketch step, Sketch& carry) const {
    const size_t n = static_cast<size_t>(config_.micro_batches);
    const double cap = static_cast<double>(config_.max_tokens);
    // The micro-batches' cost and tokens, and the lightest and the emptiest of them from
    // tournament trees (O(log N) per document), in scratch memory a Sketcher keeps: a step is
    // estimated a few dozen times.
    std::vector<double>& cost = scratch_.cost;
    std::vector<double>& tokens = scratch_.tokens;
    cost.assign(n, 0.0);
    tokens.assign(n, 0.0);
    detail::ArgminTree<double>& lightest = scratch_.lightest;
    detail::ArgminTree<double>& emptiest = scratch_.emptiest;
    lightest.Fill(0.0);
    emptiest.Fill(0.0);
    std::sort(step.lengths.begin(), step.lengths.end(), std::greater<>());
    for (int64_t length : step.lengths) {
      const double l = static_cast<double>(length);
      size_t target = lightest.Min();
      if (tokens[target] + l > cap) {
        target = emptiest.Min();
        if (tokens[target] + l > cap) {
          carry.lengths.push_back(length);
          continue;
        }
      }
      cost[target] += cost_(length);
      tokens[target] += l;
      lightest.Set(target, cost[target]);
      emptiest.Set(target, tokens[target]);
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

  // `arrivals` split into the outliers of each level of `queues` and a sketch of the rest.
  Arrivals SplitArrivals(const std::vector<Document>& arrivals,
                         const OutlierQueues<Document>& queues) const {
    Arrivals a;
    a.outliers.resize(queues.levels());
    for (const Document& d : arrivals) {
      const int level = queues.Level(d.length);
      if (level >= 0) {
        a.outliers[level].push_back(d);
      } else {
        AddToSketch(d, a.fresh);
      }
    }
    return a;
  }

  SketchBase MakeSketchBase(const Holding& base, const std::vector<Document>& fresh,
                            const std::deque<std::vector<Document>>& buffer) const {
    SketchBase s;
    base.carry.ForEach([&](const Document& d) { AddToSketch(d, s.step); });
    s.longest.resize(std::min<size_t>(kMaxHeldArrivals, fresh.size()));
    for (size_t i = 0; i < fresh.size(); ++i) {
      AddToSketch(fresh[i], i < s.longest.size() ? s.longest[i] : s.step);
    }
    for (const std::vector<Document>& next : buffer) {
      s.ahead.push_back(SplitArrivals(next, base.queues));
    }
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
  template <typename Loses>
  std::optional<double> ScoreBySketch(const Candidate& c, const Holding& base,
                                      const SketchBase& sketch, const Loses& loses) const {
    if (loses(ScoreLowerBound(kMinImbalance, sketch.ahead.size()))) return std::nullopt;
    Sketch step = sketch.step;
    Sketch carry;
    for (size_t i = 0; i < sketch.longest.size(); ++i) {
      AddSketch(sketch.longest[i], static_cast<int>(i) < c.hold_longest ? carry : step);
    }
    std::vector<std::vector<int64_t>> queues(base.queues.levels());  // lengths left queued
    for (size_t l = 0; l < base.queues.levels(); ++l) {
      const std::vector<Document>& q = base.queues.queue(l);
      size_t next = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        const bool out = next < c.release[l].size() && c.release[l][next] == i;
        next += out;
        (out ? step.lengths : queues[l]).push_back(q[i].length);
      }
    }
    double score = EstimateStep(std::move(step), carry);
    const size_t n = static_cast<size_t>(config_.micro_batches);
    for (size_t s = 0; s < sketch.ahead.size(); ++s) {
      if (loses(ScoreLowerBound(score, sketch.ahead.size() - s))) return std::nullopt;
      const Arrivals& a = sketch.ahead[s];
      Sketch future = std::move(carry);
      carry = Sketch();
      AddSketch(a.fresh, future);
      bool releases = false;
      for (size_t l = 0; l < queues.size(); ++l) {
        for (const Document& d : a.outliers[l]) queues[l].push_back(d.length);
        releases |= queues[l].size() >= n;
      }
      if (!releases) {
        score += EstimateStep(std::move(future), carry);
        continue;
      }
      // As in ScoreByPacking: wlb's release, or every queued outlier, whichever balances better.
      Sketch all = future;
      Sketch all_carry;
      for (size_t l = 0; l < queues.size(); ++l) {
        all.lengths.insert(all.lengths.end(), queues[l].begin(), queues[l].end());
        if (queues[l].size() < n) continue;
        future.lengths.insert(future.lengths.end(), queues[l].begin(), queues[l].begin() + n);
      }
      const double by_wlb = EstimateStep(std::move(future), carry);
      const double by_all = EstimateStep(std::move(all), all_carry);
      if (by_all < by_wlb) {
        score += by_all;
        carry = std::move(all_carry);
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
  struct Scratch {
    explicit Scratch(size_t n) : lightest(n, 0.0), emptiest(n, 0.0) {}
    std::vector<double> cost, tokens;
    detail::ArgminTree<double> lightest, emptiest;
    std::vector<std::pair<double, int>> breaks;
  };
  mutable Scratch scratch_;  // EstimateStep's working memory; a Sketcher is used by one thread
};

}  // namespace wlb::lookahead
