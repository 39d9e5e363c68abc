// per-seq-ordered's search for a document order: PerSequenceOrder and its parts (the
// organ-pipe start, the incremental pair objective PerSequencePairEvaluator and the swap search
// SearchPerSequenceOrder).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/core/document.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/plan_builder.hpp"

namespace wlb {
namespace detail {

// The packed start of every document of `mb` laid out in `order` (document indices), plus the
// total at the end.
inline std::vector<int64_t> OrderedStarts(const MicroBatch& mb, const std::vector<int64_t>& order) {
  std::vector<int64_t> starts(order.size() + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    starts[i + 1] = starts[i] + mb.documents[static_cast<size_t>(order[i])].length;
  }
  return starts;
}

// Predicted slowest-rank latency of per-sequence chunks over a micro-batch's documents laid out
// in a given order.
inline double PerSequenceMaxMs(const MicroBatch& mb, const std::vector<int64_t>& order, int cp_size,
                               const KernelModel& model) {
  const std::vector<int64_t> starts = OrderedStarts(mb, order);
  std::vector<double> ms(static_cast<size_t>(cp_size), 0.0);
  ForEachPerSequenceSegment(starts, cp_size, [&](int r, int64_t, int64_t qb, int64_t qe) {
    ms[static_cast<size_t>(r)] += model.SegmentMs(qe - qb, qe);
  });
  return MaxOf(ms);
}

// The order search's objective: the largest per-rank count of causal (query, key) pairs under
// per-sequence chunks, with integer arithmetic (the kernel model is about 10x slower per segment;
// the search's result is checked against it). Load(order) computes it in O(documents + C) and
// keeps the order's layout; SwapMaxPairs(i, j) then gives the objective of that order with
// positions i and j swapped in O(C + chunk boundaries between them), exactly (only the chunk
// boundaries inside the swapped span see different documents).
class PerSequencePairEvaluator {
 public:
  PerSequencePairEvaluator(const MicroBatch& mb, int cp_size)
      : mb_(mb),
        cp_size_(cp_size),
        starts_(mb.documents.size() + 1, 0),
        pairs_before_(mb.documents.size() + 1, 0),
        length_(mb.documents.size(), 0),
        bound_(2 * static_cast<size_t>(cp_size), 0),
        bound_pairs_(2 * static_cast<size_t>(cp_size), 0),
        rank_pairs_(static_cast<size_t>(cp_size), 0),
        scratch_(static_cast<size_t>(cp_size), 0),
        first_bound_(mb.documents.size() + 1, 0),
        rank_of_chunk_(2 * static_cast<size_t>(cp_size), 0),
        bound_doc_(2 * static_cast<size_t>(cp_size), 0) {
    for (size_t t = 0; t < rank_of_chunk_.size(); ++t) {
      rank_of_chunk_[t] = static_cast<size_t>(RankOfChunk(static_cast<int64_t>(t), cp_size));
    }
  }

  // The objective of `order`, which becomes the loaded order.
  int64_t Load(const std::vector<int64_t>& order) {
    const size_t n = order.size();
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = mb_.documents[static_cast<size_t>(order[i])].length;
      length_[i] = len;
      starts_[i + 1] = starts_[i] + len;
      pairs_before_[i + 1] = pairs_before_[i] + CausalPairs(0, len);
    }
    const int64_t total = starts_[n];
    chunk_ = PerSequenceChunk(total, cp_size_);
    std::fill(rank_pairs_.begin(), rank_pairs_.end(), 0);
    size_t k = 0;  // document holding position x (boundaries only grow)
    auto pairs_up_to = [&](int64_t x) {
      while (k < n && starts_[k + 1] <= x) ++k;
      return k < n ? pairs_before_[k] + CausalPairs(0, x - starts_[k]) : pairs_before_[n];
    };
    int64_t previous = 0;
    for (size_t j = 0; j < bound_.size(); ++j) {
      bound_[j] = std::min((static_cast<int64_t>(j) + 1) * chunk_, total);
      bound_pairs_[j] = pairs_up_to(bound_[j]);
      bound_doc_[j] = std::min(k, n - 1);
      rank_pairs_[static_cast<size_t>(RankOfChunk(static_cast<int64_t>(j), cp_size_))] +=
          bound_pairs_[j] - previous;
      previous = bound_pairs_[j];
    }
    size_t t = 0;  // first_bound_[i]: the first boundary at or after document i's start
    for (size_t i = 0; i <= n; ++i) {
      while (t < bound_.size() && bound_[t] < starts_[i]) ++t;
      first_bound_[i] = t;
    }
    max_ = *std::max_element(rank_pairs_.begin(), rank_pairs_.end());
    max_ranks_.clear();
    for (int r = 0; r < cp_size_; ++r) {
      if (rank_pairs_[static_cast<size_t>(r)] == max_) max_ranks_.push_back(r);
    }
    return max_;
  }

  // The objective of the loaded order with positions i < j swapped (the loaded order stays), or,
  // when that is not below `below`, possibly only some value >= below (a swap that moves no
  // chunk of a rank holding the loaded maximum >= below cannot bring the maximum below it).
  int64_t SwapMaxPairs(size_t i, size_t j, int64_t below = std::numeric_limits<int64_t>::max()) {
    // Boundaries first_bound_[i] .. first_bound_[j + 1] - 1 can move, so chunks
    // first_bound_[i] .. first_bound_[j + 1] can change.
    const size_t c0 = first_bound_[i], c1 = first_bound_[j + 1];
    if (c0 == c1) return max_;
    const int64_t a = starts_[i], e = starts_[j + 1];
    const int64_t li = length_[i], lj = length_[j];
    const int64_t delta = lj - li;                                  // shift of documents i+1..j-1
    const int64_t shift = CausalPairs(0, lj) - CausalPairs(0, li);  // and of their pairs before
    const int64_t last_start = e - li;                              // where document i lands
    const int64_t last_before = pairs_before_[j + 1] - CausalPairs(0, li);
    // Pairs before boundary t after the swap, less before it (0 outside c0 .. c1 - 1).
    auto moved = [&](int64_t t) -> int64_t {
      if (t < static_cast<int64_t>(c0) || t >= static_cast<int64_t>(c1)) return 0;
      const int64_t x = bound_[static_cast<size_t>(t)];
      int64_t p;
      if (x < a + lj) {
        p = pairs_before_[i] + CausalPairs(0, x - a);
      } else if (x >= last_start) {
        p = last_before + CausalPairs(0, x - last_start);
      } else {  // a middle document, at its old position y
        const int64_t y = x - delta;
        // From the document holding x before the swap, step to the one holding y.
        size_t k = std::clamp(bound_doc_[static_cast<size_t>(t)], i + 1, j - 1);
        while (starts_[k] > y) --k;
        while (starts_[k + 1] <= y) ++k;
        p = pairs_before_[k] + shift + CausalPairs(0, y - starts_[k]);
      }
      return p - bound_pairs_[static_cast<size_t>(t)];
    };
    const int64_t last = 2 * static_cast<int64_t>(cp_size_) - 1;
    if (max_ >= below) {
      // A rank holding the maximum that stays at or above `below` decides it. Rank r's chunks
      // are r and 2C-1-r; chunk t gains moved(t) - moved(t - 1).
      for (const int r : max_ranks_) {
        const int64_t late = last - r;
        const int64_t after = max_ + moved(r) - moved(r - 1) + moved(late) - moved(late - 1);
        if (after >= below) return max_;
      }
    }
    std::copy(rank_pairs_.begin(), rank_pairs_.end(), scratch_.begin());
    int64_t previous = 0;  // moved(t - 1)
    for (int64_t t = static_cast<int64_t>(c0); t <= static_cast<int64_t>(c1); ++t) {
      const int64_t m = moved(t);
      scratch_[rank_of_chunk_[static_cast<size_t>(t)]] += m - previous;
      previous = m;
    }
    return *std::max_element(scratch_.begin(), scratch_.end());
  }

 private:
  const MicroBatch& mb_;
  int cp_size_;
  int64_t chunk_ = 0;
  std::vector<int64_t> starts_;        // of the loaded order
  std::vector<int64_t> pairs_before_;  // causal pairs of the documents before each position
  std::vector<int64_t> length_;        // document length at each position
  std::vector<int64_t> bound_;         // end of chunk t
  std::vector<int64_t> bound_pairs_;   // causal pairs before bound_[t]
  std::vector<int64_t> rank_pairs_;
  std::vector<int64_t> scratch_;
  std::vector<size_t> first_bound_;  // first boundary >= starts_[i]
  int64_t max_ = 0;                  // the loaded order's objective
  std::vector<int> max_ranks_;       // ranks holding it
  std::vector<size_t> rank_of_chunk_;
  std::vector<size_t> bound_doc_;  // document holding bound_[t] (the last one for the total)
};

// Bounds on the swap search of PerSequenceOrder: at most kOrderSearchEvaluationsPerDocument
// orders per document, and at most kOrderSearchWorkBudget (documents + 2C) units in all, which
// keeps a 128K micro-batch of ~40 documents near ten microseconds (swaps are evaluated
// incrementally, see PerSequencePairEvaluator).
inline constexpr int64_t kOrderSearchEvaluationsPerDocument = 12;
inline constexpr int64_t kOrderSearchWorkBudget = int64_t{1} << 16;

// An order for per-seq-ordered and its predicted slowest-rank latency.
struct OrderResult {
  std::vector<int64_t> order;  // document indices in packing order
  double max_ms = 0.0;
  double given_max_ms = 0.0;  // the micro-batch order's (plain per-seq)
};

// The search's first candidate, the "organ pipe": longest in the middle, the next ones
// alternately left and right of it (to the side with fewer tokens), shortest at the ends, so
// documents of similar length sit at mirrored positions, whose chunks the head-tail pairing gives
// to the same rank.
inline std::vector<int64_t> OrganPipeOrder(const MicroBatch& mb) {
  std::vector<int64_t> by_length(mb.documents.size());
  std::iota(by_length.begin(), by_length.end(), int64_t{0});
  std::stable_sort(by_length.begin(), by_length.end(), [&](int64_t a, int64_t b) {
    return mb.documents[static_cast<size_t>(a)].length >
           mb.documents[static_cast<size_t>(b)].length;
  });
  std::vector<int64_t> left, right;  // left is built outward (reversed at the end)
  int64_t left_tokens = 0, right_tokens = 0;
  for (int64_t i : by_length) {
    const int64_t len = mb.documents[static_cast<size_t>(i)].length;
    if (left_tokens <= right_tokens) {
      left.push_back(i);
      left_tokens += len;
    } else {
      right.push_back(i);
      right_tokens += len;
    }
  }
  std::vector<int64_t> pipe(left.rbegin(), left.rend());
  pipe.insert(pipe.end(), right.begin(), right.end());
  return pipe;
}

// The search behind PerSequenceOrder (inputs already checked).
inline OrderResult SearchPerSequenceOrder(const MicroBatch& mb, int cp_size,
                                          const KernelModel& model) {
  const int64_t n = static_cast<int64_t>(mb.documents.size());
  OrderResult given;
  given.order.resize(static_cast<size_t>(n));
  std::iota(given.order.begin(), given.order.end(), int64_t{0});
  given.max_ms = PerSequenceMaxMs(mb, given.order, cp_size, model);
  given.given_max_ms = given.max_ms;
  const auto [shortest, longest] =
      std::minmax_element(mb.documents.begin(), mb.documents.end(),
                          [](const Document& a, const Document& b) { return a.length < b.length; });
  if (n < 2 || cp_size < 2 || shortest->length == longest->length) return given;  // nothing to gain
  PerSequencePairEvaluator eval(mb, cp_size);
  std::vector<int64_t> best = given.order;
  int64_t best_pairs = eval.Load(best);
  const std::vector<int64_t> pipe = OrganPipeOrder(mb);
  if (const int64_t p = eval.Load(pipe); p < best_pairs) {
    best = pipe;
    best_pairs = p;
  }
  eval.Load(best);
  // Improve it by first-improvement swaps of documents of different lengths, within a bounded
  // number of evaluations.
  int64_t budget = std::min(kOrderSearchEvaluationsPerDocument * n,
                            kOrderSearchWorkBudget / (n + 2 * int64_t{cp_size}));
  std::vector<int64_t> order = best;
  for (bool improved = true; improved && budget > 0;) {
    improved = false;
    for (int64_t i = 0; i < n && budget > 0; ++i) {
      for (int64_t j = i + 1; j < n && budget > 0; ++j) {
        if (mb.documents[static_cast<size_t>(order[i])].length ==
            mb.documents[static_cast<size_t>(order[j])].length) {
          continue;
        }
        --budget;
        if (const int64_t p =
                eval.SwapMaxPairs(static_cast<size_t>(i), static_cast<size_t>(j), best_pairs);
            p < best_pairs) {
          std::swap(order[i], order[j]);
          eval.Load(order);
          best = order;
          best_pairs = p;
          improved = true;
        }
      }
    }
  }
  // The kernel model decides between the search's order and the given one, so ordering is never
  // predicted worse than plain per-sequence sharding.
  const double best_ms = PerSequenceMaxMs(mb, best, cp_size, model);
  if (best_ms < given.max_ms) return {std::move(best), best_ms, given.max_ms};
  return given;
}

}  // namespace detail

// The packing order (document indices) that per-seq-ordered uses for this micro-batch: the
// micro-batch order, the organ-pipe order (longest in the middle, shorter ones alternately
// outward) or a swap-search improvement of the better of the two, whichever the kernel model
// predicts to have the fastest slowest rank. Errors as PlanShards.
inline absl::StatusOr<std::vector<int64_t>> PerSequenceOrder(const MicroBatch& mb, int cp_size,
                                                             const KernelModel& model) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  return detail::SearchPerSequenceOrder(mb, cp_size, model).order;
}

}  // namespace wlb
