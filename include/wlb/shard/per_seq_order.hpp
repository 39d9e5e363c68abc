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
// boundaries inside the swapped span see different documents), and Swap(i, j) loads that order
// in O(j - i + C).
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
    const size_t n = length_.size();
    for (size_t p = 0; p < n; ++p) length_[p] = mb_.documents[static_cast<size_t>(order[p])].length;
    LayOut(0, n);
    const int64_t total = starts_[n];
    chunk_ = PerSequenceChunk(total, cp_size_);
    for (size_t t = 0; t < bound_.size(); ++t) {
      bound_[t] = std::min((static_cast<int64_t>(t) + 1) * chunk_, total);
    }
    PlaceBoundaries(0, bound_.size(), 0, n);
    return max_;
  }

  // Loads the loaded order with positions i < j swapped, as Load would, in O(j - i + C): the
  // total and so the boundaries stay, and only the documents of positions i .. j move.
  void Swap(size_t i, size_t j) {
    std::swap(length_[i], length_[j]);
    LayOut(i, j + 1);
    PlaceBoundaries(first_bound_[i], first_bound_[j + 1], i, j + 1);
  }

  // The objective of the loaded order with positions i < j swapped (the loaded order stays), or,
  // when that is not below `below`, possibly only some value >= below (a swap that moves no
  // chunk of a rank holding the loaded maximum >= below cannot bring the maximum below it).
  int64_t SwapMaxPairs(size_t i, size_t j, int64_t below = std::numeric_limits<int64_t>::max()) {
    // Boundaries first_bound_[i] .. first_bound_[j + 1] - 1 can move, so chunks
    // first_bound_[i] .. first_bound_[j + 1] can change.
    const size_t c0 = first_bound_[i], c1 = first_bound_[j + 1];
    if (c0 == c1) return max_;
    const SwapSpan s(*this, i, j, c0, c1);
    if (max_ >= below) {
      // A rank holding the maximum that stays at or above `below` decides it. Rank r's chunks
      // are r and 2C-1-r.
      const size_t last = 2 * static_cast<size_t>(cp_size_) - 1;
      for (const int r : max_ranks_) {
        const size_t early = static_cast<size_t>(r);
        if (max_ + ChunkGain(s, early) + ChunkGain(s, last - early) >= below) return max_;
      }
    }
    std::copy(rank_pairs_.begin(), rank_pairs_.end(), scratch_.begin());
    int64_t previous = 0;  // Moved(t - 1)
    for (size_t t = s.c0; t < s.c1; ++t) {
      const int64_t m = Moved(s, t);
      scratch_[rank_of_chunk_[t]] += m - previous;
      previous = m;
    }
    scratch_[rank_of_chunk_[s.c1]] -= previous;  // chunk c1 starts at the last moved boundary
    return *std::max_element(scratch_.begin(), scratch_.end());
  }

 private:
  // A swap of positions i < j under evaluation, moving boundaries c0 .. c1 - 1.
  struct SwapSpan {
    SwapSpan(const PerSequencePairEvaluator& e, size_t i, size_t j, size_t c0, size_t c1)
        : c0(c0),
          c1(c1),
          i(i),
          j(j),
          a(e.starts_[i]),
          i_end(a + e.length_[j]),
          delta(e.length_[j] - e.length_[i]),
          shift(e.OwnPairs(j) - e.OwnPairs(i)),
          last_start(e.starts_[j + 1] - e.length_[i]),
          last_before(e.pairs_before_[j + 1] - e.OwnPairs(i)) {}
    size_t c0, c1, i, j;
    int64_t a;            // starts_[i]
    int64_t i_end;        // where document j, landing at a, ends
    int64_t delta;        // shift of documents i+1..j-1
    int64_t shift;        // and of their pairs before
    int64_t last_start;   // where document i lands
    int64_t last_before;  // pairs before it there
  };

  // Causal pairs of the document at position p.
  int64_t OwnPairs(size_t p) const { return pairs_before_[p + 1] - pairs_before_[p]; }

  // Pairs before boundary t (c0 <= t < c1) after the swap, less before it.
  [[gnu::always_inline]] int64_t Moved(const SwapSpan& s, size_t t) const {
    const int64_t x = bound_[t];
    int64_t p;
    if (x < s.i_end) {
      p = pairs_before_[s.i] + CausalPairs(0, x - s.a);
    } else if (x >= s.last_start) {
      p = s.last_before + CausalPairs(0, x - s.last_start);
    } else {  // a middle document, at its old position y
      const int64_t y = x - s.delta;
      // Step from the document that held x toward y: down when y < x, else up.
      size_t k = bound_doc_[t];
      if (s.delta > 0) {
        while (starts_[k] > y) --k;
      } else {
        while (starts_[k + 1] <= y) ++k;
      }
      p = pairs_before_[k] + s.shift + CausalPairs(0, y - starts_[k]);
    }
    return p - bound_pairs_[t];
  }

  // What chunk t, from boundary t - 1 to boundary t, gains by the swap: only chunks c0 .. c1
  // have a moved boundary.
  [[gnu::always_inline]] int64_t ChunkGain(const SwapSpan& s, size_t t) const {
    if (t < s.c0 || t > s.c1) return 0;
    return (t < s.c1 ? Moved(s, t) : 0) - (t > s.c0 ? Moved(s, t - 1) : 0);
  }

  // starts_ and pairs_before_ after positions lo .. hi - 1 from their lengths.
  void LayOut(size_t lo, size_t hi) {
    for (size_t p = lo; p < hi; ++p) {
      starts_[p + 1] = starts_[p] + length_[p];
      pairs_before_[p + 1] = pairs_before_[p] + CausalPairs(0, length_[p]);
    }
  }

  // Places boundaries t0 .. t1 - 1, which lie in positions lo .. hi - 1 (or at the total), and
  // the first boundaries of positions lo .. hi, then sums the ranks.
  void PlaceBoundaries(size_t t0, size_t t1, size_t lo, size_t hi) {
    const size_t n = length_.size();
    size_t k = lo;  // document holding bound_[t] (boundaries only grow)
    for (size_t t = t0; t < t1; ++t) {
      const int64_t x = bound_[t];
      while (k < n && starts_[k + 1] <= x) ++k;
      bound_pairs_[t] =
          k < n ? pairs_before_[k] + CausalPairs(0, x - starts_[k]) : pairs_before_[n];
      bound_doc_[t] = std::min(k, n - 1);
    }
    size_t t = t0;  // first_bound_[p]: the first boundary at or after document p's start
    for (size_t p = lo; p <= hi; ++p) {
      while (t < bound_.size() && bound_[t] < starts_[p]) ++t;
      first_bound_[p] = t;
    }
    std::fill(rank_pairs_.begin(), rank_pairs_.end(), 0);
    int64_t previous = 0;
    for (size_t t = 0; t < bound_.size(); ++t) {
      rank_pairs_[rank_of_chunk_[t]] += bound_pairs_[t] - previous;
      previous = bound_pairs_[t];
    }
    max_ = *std::max_element(rank_pairs_.begin(), rank_pairs_.end());
    max_ranks_.clear();
    for (int r = 0; r < cp_size_; ++r) {
      if (rank_pairs_[static_cast<size_t>(r)] == max_) max_ranks_.push_back(r);
    }
  }

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
  // The left side is written from the front, the right side from the back (no vector per side),
  // each the wrong way round until reversed.
  std::vector<int64_t> pipe(by_length.size());
  auto left = pipe.begin(), right = pipe.end();
  int64_t left_tokens = 0, right_tokens = 0;
  for (int64_t i : by_length) {
    const int64_t len = mb.documents[static_cast<size_t>(i)].length;
    if (left_tokens <= right_tokens) {
      *left++ = i;
      left_tokens += len;
    } else {
      *--right = i;
      right_tokens += len;
    }
  }
  std::reverse(pipe.begin(), left);
  std::reverse(right, pipe.end());
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
  // The better of the given order and the organ pipe (loaded last: it is usually the given one).
  PerSequencePairEvaluator eval(mb, cp_size);
  std::vector<int64_t> order = OrganPipeOrder(mb);
  const int64_t pipe_pairs = eval.Load(order);
  int64_t best_pairs = eval.Load(given.order);
  if (pipe_pairs < best_pairs) {
    best_pairs = eval.Load(order);
  } else {
    order = given.order;
  }
  // Improve it by first-improvement swaps of documents of different lengths, within a bounded
  // number of evaluations.
  int64_t budget = std::min(kOrderSearchEvaluationsPerDocument * n,
                            kOrderSearchWorkBudget / (n + 2 * int64_t{cp_size}));
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
          eval.Swap(static_cast<size_t>(i), static_cast<size_t>(j));
          best_pairs = p;
          improved = true;
        }
      }
    }
  }
  // The kernel model decides between the search's order and the given one, so ordering is never
  // predicted worse than plain per-sequence sharding.
  const double best_ms = PerSequenceMaxMs(mb, order, cp_size, model);
  if (best_ms < given.max_ms) return {std::move(order), best_ms, given.max_ms};
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
