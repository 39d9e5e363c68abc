// Balance and delay metrics of packed steps.
//
//   double imbalance = wlb::ImbalanceDegree(step.micro_batches);        // 1.0 is perfect
//   double bound = wlb::LowerBound(step.micro_batches, cost);            // no packing beats it
//   double tighter = wlb::CapLowerBound(step.micro_batches, cost, 163840);  // uses S_max too
//   wlb::DelayStats delay = wlb::TokenDelay(run.steps);                  // in steps
//   wlb::StreamSummary summary = wlb::Summarize(run.steps, cost);
//
// Imbalance degree of a step = max micro-batch cost / mean micro-batch cost (the paper's
// Max_Latency x PP / Total_Latency). Lower bound = max(max_d W(d), sum W / N) / (sum W / N): the
// heaviest single document, or a perfect split, whichever is worse. It ignores the token cap;
// CapLowerBound() adds it and is the one to compare with in steps that fill the cap.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <vector>

#include "wlb/core/step_plan.hpp"
#include "wlb/cost/document_cost.hpp"

namespace wlb {

// Max cost / mean cost over the micro-batches; 1.0 when all are empty.
inline double ImbalanceDegree(std::span<const MicroBatch> mbs) {
  double total = 0.0;
  double heaviest = 0.0;
  for (const MicroBatch& mb : mbs) {
    total += mb.cost;
    heaviest = std::max(heaviest, mb.cost);
  }
  if (mbs.empty() || total <= 0.0) return 1.0;
  return heaviest / (total / static_cast<double>(mbs.size()));
}

// The best imbalance any packing of these documents into as many micro-batches could reach.
inline double LowerBound(std::span<const MicroBatch> mbs, const DocumentCost& cost) {
  double total = 0.0;
  double heaviest_doc = 0.0;
  for (const MicroBatch& mb : mbs) {
    for (const Document& d : mb.documents) {
      const double w = cost(d.length);
      total += w;
      heaviest_doc = std::max(heaviest_doc, w);
    }
  }
  if (mbs.empty() || total <= 0.0) return 1.0;
  const double mean = total / static_cast<double>(mbs.size());
  return std::max(heaviest_doc, mean) / mean;
}

// A lower bound on the imbalance of any packing of these documents into as many micro-batches of
// at most `max_tokens` tokens (S_max), >= LowerBound(). With N micro-batches, T tokens in all and
// L = T - (N - 1) x S_max, every micro-batch holds at least L tokens, because the other N - 1 hold
// at most S_max each. So the micro-batch that holds document i holds d_i plus at least L - d_i
// tokens of other documents, and its cost is at least W(d_i) + C(L - d_i), where C(x) is the least
// cost of any set of documents with at least x tokens. C(x) is bounded below by the fractional
// relaxation (the LP of the covering knapsack): take documents cheapest per token first, the last
// one in part; allowing document i itself in the relaxation only lowers it. The heaviest
// micro-batch is at least as heavy as the micro-batch of any document i, and at least the mean, so
// max(mean, max_i W(d_i) + C(L - d_i)) / mean is a valid bound. It is tight where the cap binds:
// in a step filled to N x S_max every micro-batch is full and a long document cannot shed its
// short companions (test/metrics_test.cc checks it against the CBC optimum on small instances).
inline double CapLowerBound(std::span<const MicroBatch> mbs, const DocumentCost& cost,
                            int64_t max_tokens) {
  struct Entry {
    double per_token;
    int64_t length;
    double cost;
  };
  std::vector<Entry> docs;
  double total = 0.0;
  int64_t tokens = 0;
  for (const MicroBatch& mb : mbs) {
    for (const Document& d : mb.documents) {
      const double w = cost(d.length);
      docs.push_back({w / static_cast<double>(d.length), d.length, w});
      total += w;
      tokens += d.length;
    }
  }
  if (mbs.empty() || total <= 0.0) return 1.0;
  const double n = static_cast<double>(mbs.size());
  const double mean = total / n;
  // L in double: (N - 1) x S_max can exceed int64 for absurd caps; a negative L binds nothing.
  const double least = static_cast<double>(tokens) - (n - 1.0) * static_cast<double>(max_tokens);
  double heaviest = mean;
  if (least > 0.0) {
    std::sort(docs.begin(), docs.end(),
              [](const Entry& a, const Entry& b) { return a.per_token < b.per_token; });
    // Prefix sums: cover[k] = (tokens, cost) of the k cheapest-per-token documents.
    std::vector<std::pair<double, double>> cover(docs.size() + 1, {0.0, 0.0});
    for (size_t k = 0; k < docs.size(); ++k) {
      cover[k + 1] = {cover[k].first + static_cast<double>(docs[k].length),
                      cover[k].second + docs[k].cost};
    }
    auto least_cost = [&](double x) {  // C(x), fractional
      if (x <= 0.0) return 0.0;
      const auto it = std::lower_bound(cover.begin(), cover.end(), std::make_pair(x, -1.0));
      if (it == cover.end()) return cover.back().second;
      const size_t k = static_cast<size_t>(it - cover.begin());  // cover[k].first >= x, k >= 1
      return cover[k - 1].second + (x - cover[k - 1].first) * docs[k - 1].per_token;
    };
    for (const Entry& d : docs) {
      heaviest = std::max(heaviest, d.cost + least_cost(least - static_cast<double>(d.length)));
    }
  }
  return std::max(heaviest / mean, LowerBound(mbs, cost));
}

// Token delay: for every token, steps between its arrival and the step that trains on it.
struct DelayStats {
  double mean = 0.0;
  double p99 = 0.0;
  double max = 0.0;
};

// TokenDelay one step at a time (a streamed run holds no step): one (delay, tokens) total per
// distinct delay, summed in the order TokenDelay sums them.
class TokenDelayAccumulator {
 public:
  void Add(const StepPlan& s) {
    for (const MicroBatch& mb : s.micro_batches) {
      for (const Document& d : mb.documents) {
        const int64_t delay = s.step - d.arrival_step;
        delay_tokens_[delay] += d.length;
        total_tokens_ += d.length;
        weighted_ += static_cast<double>(delay) * static_cast<double>(d.length);
      }
    }
  }

  DelayStats Finish() const {
    DelayStats stats;
    if (total_tokens_ == 0) return stats;
    stats.mean = weighted_ / static_cast<double>(total_tokens_);
    stats.max = static_cast<double>(delay_tokens_.rbegin()->first);
    const double p99_rank = 0.99 * static_cast<double>(total_tokens_);
    int64_t seen = 0;
    for (const auto& [delay, tokens] : delay_tokens_) {
      seen += tokens;
      if (static_cast<double>(seen) >= p99_rank) {
        stats.p99 = static_cast<double>(delay);
        break;
      }
    }
    return stats;
  }

 private:
  std::map<int64_t, int64_t> delay_tokens_;  // delay -> tokens
  int64_t total_tokens_ = 0;
  double weighted_ = 0.0;
};

inline DelayStats TokenDelay(std::span<const StepPlan> steps) {
  TokenDelayAccumulator delay;
  for (const StepPlan& s : steps) delay.Add(s);
  return delay.Finish();
}

// Balance over the steady steps. Drain steps (leftovers after the end of input) and partial steps
// (planned from the last, short step of a finite input: a few documents) are counted apart: they
// say little about the packer, and one partial step at imbalance 49 would move a mean over 750
// steps by 0.06.
struct StreamSummary {
  int64_t steps = 0;  // steady steps
  int64_t drain_steps = 0;
  int64_t partial_steps = 0;
  double imbalance_mean = 1.0;
  double imbalance_p90 = 1.0;
  double imbalance_p99 = 1.0;
  double imbalance_max = 1.0;          // the worst step
  double lower_bound_mean = 1.0;       // LowerBound(), mean over steady steps
  double cap_lower_bound_mean = 1.0;   // CapLowerBound(), mean over steady steps
  double partial_imbalance_max = 1.0;  // over the partial steps
  DelayStats delay;                    // over every step, drain and partial steps included
};

// Summarize one step at a time (a streamed run holds no step, only one double per steady step for
// the exact p90). `max_tokens` (S_max) feeds CapLowerBound(); 0 leaves the cap out
// (cap_lower_bound_mean is then lower_bound_mean).
class StreamSummaryAccumulator {
 public:
  StreamSummaryAccumulator(const DocumentCost& cost, int64_t max_tokens)
      : cost_(cost), max_tokens_(max_tokens) {}

  void Add(const StepPlan& s) {
    delay_.Add(s);
    if (s.drain) {
      ++sum_.drain_steps;
      return;
    }
    if (s.partial) {
      ++sum_.partial_steps;
      sum_.partial_imbalance_max =
          std::max(sum_.partial_imbalance_max, ImbalanceDegree(s.micro_batches));
      return;
    }
    imbalance_.push_back(ImbalanceDegree(s.micro_batches));
    const double bound = LowerBound(s.micro_batches, cost_);
    bound_total_ += bound;
    cap_bound_total_ +=
        max_tokens_ > 0 ? CapLowerBound(s.micro_batches, cost_, max_tokens_) : bound;
  }

  StreamSummary Finish() const {
    StreamSummary sum = sum_;
    sum.steps = static_cast<int64_t>(imbalance_.size());
    if (!imbalance_.empty()) {
      double total = 0.0;
      for (double x : imbalance_) total += x;
      sum.imbalance_mean = total / static_cast<double>(imbalance_.size());
      sum.lower_bound_mean = bound_total_ / static_cast<double>(imbalance_.size());
      sum.cap_lower_bound_mean = cap_bound_total_ / static_cast<double>(imbalance_.size());
      std::vector<double> sorted = imbalance_;
      std::sort(sorted.begin(), sorted.end());
      sum.imbalance_max = sorted.back();
      // Nearest-rank percentiles: the smallest value at least that share of steps reach.
      auto percentile = [&](double p) {
        return sorted[static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size()))) - 1];
      };
      sum.imbalance_p90 = percentile(0.9);
      sum.imbalance_p99 = percentile(0.99);
    }
    sum.delay = delay_.Finish();
    return sum;
  }

 private:
  const DocumentCost& cost_;
  int64_t max_tokens_;
  StreamSummary sum_;
  std::vector<double> imbalance_;
  double bound_total_ = 0.0;
  double cap_bound_total_ = 0.0;
  TokenDelayAccumulator delay_;
};

inline StreamSummary Summarize(std::span<const StepPlan> steps, const DocumentCost& cost,
                               int64_t max_tokens = 0) {
  StreamSummaryAccumulator sum(cost, max_tokens);
  for (const StepPlan& s : steps) sum.Add(s);
  return sum.Finish();
}

}  // namespace wlb
