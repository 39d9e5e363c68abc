// wlb-lookahead's scoring: the summed imbalance of a step planned under a candidate and of the
// buffered steps after it, from real packings while they are cheap (ScoreByPacking) and from
// sketches beyond (ScoreBySketch). Lower is better.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "wlb/core/document.hpp"
#include "wlb/metrics/imbalance.hpp"
#include "wlb/pack/argmin_tree.hpp"
#include "wlb/pack/lookahead/candidates.hpp"
#include "wlb/pack/packer.hpp"

namespace wlb::lookahead {

// Candidates are scored by real packings while candidates x documents to pack (this step's and
// the buffered ones) stays within this (N = 4 at S = 128K: about 2,500), else by sketches: at
// N = 64 real packings of every candidate would take ~10 times wlb-refine's planning time.
inline constexpr size_t kExactScoringDocuments = 6000;

// The least a step's imbalance can be, from ImbalanceDegree() or Sketcher::EstimateStep(): the
// heaviest micro-batch weighs at least the mean; with costs >= 0 the computed mean exceeds it by
// about N ulps at most, far within this margin.
inline constexpr double kMinImbalance = 1.0 - 1e-6;

// The least a score can end at that has reached `sum` with `steps_left` steps to add: each adds at
// least kMinImbalance, and a floating-point sum only grows with its terms.
inline double ScoreLowerBound(double sum, size_t steps_left) {
  for (size_t i = 0; i < steps_left; ++i) sum += kMinImbalance;
  return sum;
}

// A step planned under a candidate and what it leaves held: scoring keeps the winner's, so the
// winner is not packed a second time.
struct PlannedStep {
  std::vector<MicroBatch> micro_batches;
  Holding held;
};

// The summed imbalance of the step under `c` and the `buffer`ed steps after it, from real
// packings (as wlb-refine packs) of every step; the step under `c` goes to `planned`. Each
// buffered step takes wlb's release or, when wlb releases a level, every queued outlier,
// whichever balances better: the step that must take a long outlier is best filled with the
// other long ones, so holding them for it pays. `ahead_fresh[s]` is SortedNonOutliers() of
// `buffer[s]`, the same for every candidate.
// `loses(bound)` says whether a score of at least `bound` cannot win; scoring stops (nullopt) as
// soon as ScoreLowerBound() loses, so the candidate is not followed further.
template <typename Loses>
std::optional<double> ScoreByPacking(const StepPacking& packing, const Candidate& c,
                                     const Holding& base, const std::vector<Document>& fresh,
                                     const std::deque<std::vector<Document>>& buffer,
                                     const std::vector<std::vector<Document>>& ahead_fresh,
                                     const Loses& loses, PlannedStep& planned) {
  if (loses(ScoreLowerBound(kMinImbalance, buffer.size()))) return std::nullopt;
  const size_t n = static_cast<size_t>(packing.config.micro_batches);
  planned.held = base;
  planned.micro_batches = packing.PlanStep(c, fresh, planned.held, /*fresh_sorted=*/true);
  double score = ImbalanceDegree(planned.micro_batches);
  if (buffer.empty()) return score;
  Holding held = planned.held;
  for (size_t s = 0; s < buffer.size(); ++s) {
    if (loses(ScoreLowerBound(score, buffer.size() - s))) return std::nullopt;
    for (const Document& d : buffer[s]) held.queues.Enqueue(d);  // the rest is ahead_fresh[s]
    std::vector<Document> next_fresh = ahead_fresh[s];
    const Candidate wlb{.release = WlbRelease(held, n)};
    if (!ReleasesAny(wlb)) {
      score += ImbalanceDegree(
          packing.PlanStep(wlb, std::move(next_fresh), held, /*fresh_sorted=*/true));
      continue;
    }
    Holding by_wlb = held;
    double best = ImbalanceDegree(packing.PlanStep(wlb, next_fresh, by_wlb, /*fresh_sorted=*/true));
    const double all = ImbalanceDegree(
        packing.PlanStep(ReleaseAll(held), std::move(next_fresh), held, /*fresh_sorted=*/true));
    if (all < best) {
      best = all;
    } else {
      held = std::move(by_wlb);
    }
    score += best;
  }
  return score;
}

// A step as the look-ahead sees it while it compares candidates: long documents one by one,
// short ones (< S/8: most documents, and interchangeable filler) as a fluid of tokens at their
// mean cost per token. Estimating a candidate is then O(long documents x log N + N), not a
// packing of every document, so the search costs little next to the one real packing.
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
  Sketcher(const PackerConfig& config, const DocumentCost& cost) : config_(config), cost_(cost) {}

  void AddToSketch(const Document& d, Sketch& sketch) const {
    if (d.length >= LongCut()) {
      sketch.lengths.push_back(d.length);
    } else {
      sketch.short_tokens += static_cast<double>(d.length);
      sketch.short_cost += cost_(d.length);
    }
  }
  int64_t LongCut() const { return std::max<int64_t>(1, config_.context / 8); }

  // Estimates the imbalance of packing `step`: long documents longest first as PackUnderCap
  // places them, then the fluid poured into the lightest micro-batches up to S_max. What fits
  // nowhere goes to `carry`.
  double EstimateStep(Sketch step, Sketch& carry) const {
    const size_t n = static_cast<size_t>(config_.micro_batches);
    const double cap = static_cast<double>(config_.max_tokens);
    std::vector<double> cost(n, 0.0), tokens(n, 0.0);
    std::sort(step.lengths.begin(), step.lengths.end(), std::greater<>());
    // The lightest and the emptiest micro-batch from tournament trees (O(log N) per document).
    detail::ArgminTree<double> lightest(n, 0.0);
    detail::ArgminTree<double> emptiest(n, 0.0);
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
      // The level: micro-batches sorted by cost; each below the level takes fluid up to it or to
      // its cap. Found by bisection on the poured amount, which grows with the level.
      auto poured = [&](double level) {
        double t = 0.0;
        for (size_t b = 0; b < n; ++b) {
          t += std::clamp((level - cost[b]) / rate, 0.0, cap - tokens[b]);
        }
        return t;
      };
      double lo = *std::min_element(cost.begin(), cost.end());
      double hi = *std::max_element(cost.begin(), cost.end()) + rate * cap;
      if (poured(hi) <= step.short_tokens) {
        lo = hi;  // everything is full: the rest is carried
      } else {
        while (hi - lo > 1e-6 * hi) {  // ~20 halvings
          const double mid = 0.5 * (lo + hi);
          (poured(mid) < step.short_tokens ? lo : hi) = mid;
        }
      }
      double placed = 0.0;
      for (size_t b = 0; b < n; ++b) {
        const double t = std::clamp((lo - cost[b]) / rate, 0.0, cap - tokens[b]);
        cost[b] += t * rate;
        placed += t;
      }
      total += placed * rate;
      const double left = std::max(0.0, step.short_tokens - placed);
      carry.short_tokens += left;
      carry.short_cost += left * rate;
    }
    if (total <= 0.0) return 1.0;
    return *std::max_element(cost.begin(), cost.end()) / (total / static_cast<double>(n));
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

  // The same as ScoreByPacking from sketches (EstimateStep): far cheaper, a little less exact.
  // `fresh` is sorted longest first, so holding back the h longest arrivals moves
  // `sketch.longest[0, h)` to the carry.
  // Stops early (nullopt) as ScoreByPacking does.
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
};

}  // namespace wlb::lookahead
