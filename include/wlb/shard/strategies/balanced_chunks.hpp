// balanced-chunks: equal-size chunks dealt to ranks by predicted time, with locality, under the
// memory cap (see shard_plan.hpp).
//
// A document of at most `unit` tokens stays whole (short documents are never split); a longer one
// is cut into ceil(d / unit) contiguous chunks, unit = ceil(T / 8C) rounded up to the kernel's
// query tile (about 8 chunks' worth of tokens per rank), counted from the document's end: every
// chunk is `unit` tokens but the first, which holds the d mod unit rest. A varlen kernel tiles a
// segment's queries from its first row, and a partial last tile costs a full one over all the
// segment's keys (KernelModel::PaddedFlops), so whole-tile chunks pay none and the one partial
// tile falls where keys are fewest (near-equal chunks of d / n rows paid one per chunk: 0.6% of
// the balance table's mean slowest rank, docs/results/cp/balance.md). Each rank is priced as
// the executors run it: its attention (KernelModel::SegmentCallMs of every chunk's queries over
// keys [0, end): SegmentMs, or with a packed-call fit the fit's forward + backward of the chunk)
// plus max(rows sent, rows received) x CommModel::RowMs (x 2 with a backward fit: the exchange
// once per pass, as adaptive ranks), the causal row-exact exchange (a rank receives, per
// document, keys [0, its largest end) less its own rows, and sends its rows below every other
// holder's largest end). Items go costliest first (longest-processing-time order), each to the
// rank, among those with room under CpRankTokenCap, that leaves the slowest rank fastest, then is
// fastest itself. Five cuts are dealt (ChunkCutSpec): the cut; coarse cuts of about 2 and 4
// times the unit (4 and 2 chunks' worth per rank), each where it differs from the finer cuts;
// a fine cut (a document longer than the unit in about 4 chunks), where it differs and its
// size allows; and a finer cut (chunks of half the unit), where it has at most 5/4 of the cut's
// chunks (PlanBalancedChunksPriced). An item no rank has room for is spilled over the ranks
// with the most room (SpillShards). Each deal gets up to two rounds of refinement: the best move or
// swap of items between the slowest and the fastest rank that lowers the slowest time within the
// cap. A rank's adjacent chunks of one document are one segment. The plan is the deal's that
// AdaptivePriceMs prices fastest, and adaptive ranks it like every other candidate.
//
// Why the coarse cuts (issue 57): scored against the peer's dispatch at 1024- and 4096-token
// chunks too (the balance table at seeds 1-13), the cut alone left exchange-bound micro-batches
// (C = 8 at 25 GB/s, two or three long documents) up to 10.4% behind 4096-token chunks, and a
// 12K-token micro-batch at C = 4 9.6% behind 1024-token chunks (its 384-row chunks each pay the
// kernel's per-segment floor); with the coarse cuts no C = 4 or 8 micro-batch of those streams is
// more than 1.9% behind any of the peer's chunk sizes, and on seeded random micro-batches of
// 16K-128K tokens adaptive at C = 8 went from up to 1.8x behind the peer to 1.04x (before
// contiguous became a candidate; docs/results/cp/balance.md). They replaced a second deal of the
// cut to the rank with the least attention (MagiAttention's rule), which they made redundant, so
// adaptive's planning at C = 8 stays under 100 µs.
//
// Why the send side and the swaps (issue 57): the rank holding a long document's first chunk
// sends it to every other holder, so a receive-only price piled those chunks on one rank, and
// dealing alone cannot trade a chunk for a cheaper one once ranks are at the cap; with both,
// adaptive's plans are at least as fast as a re-implemented MagiAttention dispatch on every
// balance-table cell at 25 GB/s (docs/results/cp/balance.md).
//
// Peers: MagiAttention's dispatch solver deals fixed-size chunks of the packed sequence by area
// (attention pairs), largest first to the least loaded rank, with an equal chunk count per rank
// (no locality, a chunk may straddle documents, the exchange not priced); this keeps short
// documents whole, prices both directions of the exchange with the link, and bounds memory by
// tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"
#include "wlb/shard/strategies/doc_degree.hpp"

namespace wlb {
namespace detail {

// `rows` rounded up to whole query tiles, at least one tile.
inline int64_t WholeTiles(int64_t rows, int64_t tile) {
  return std::max(tile, (rows + tile - 1) / tile * tile);
}

// The cut's chunks' worth of tokens per rank: measured against 4, 16 and 32 on the balance table's
// streams (docs/results/cp/balance.md), 8 gave adaptive the fastest plans as its only cut.
inline constexpr int64_t kChunksPerRank = 8;

// Chunk size of balanced-chunks for a micro-batch of `tokens` over `cp_size` ranks, about
// `per_rank` chunks' worth per rank, in whole query tiles.
inline int64_t BalancedChunkUnit(int64_t tokens, int cp_size, const KernelModel& model,
                                 int64_t per_rank = kChunksPerRank) {
  const int64_t unit = (tokens + per_rank * cp_size - 1) / (per_rank * cp_size);
  return WholeTiles(unit, std::max<int64_t>(1, model.tile_q()));
}

// balanced-chunks' ledger: where every chunk is, and per rank its attention, tokens and the
// causal K/V rows it sends and receives (what ChooseExchange's row-exact rule prices).
class ChunkLedger {
 public:
  struct Item {
    double ms = 0.0;  // SegmentCallMs of the chunk's queries over keys [0, end)
    size_t doc = 0;
    int64_t begin = 0, end = 0;
    int rank = -1;  // -1 while unplaced
  };

  ChunkLedger(size_t docs, size_t ranks, double row_ms)
      : ranks_(ranks),
        row_ms_(row_ms),
        attention_(ranks, 0.0),
        tokens_(ranks, 0),
        sent_(ranks, 0),
        received_(ranks, 0),
        doc_lo_(docs, std::numeric_limits<int64_t>::max()),
        split_row_(docs, kNoItem),
        doc_items_(docs, 0),
        doc_last_(docs, kNoItem),
        d_sent_(ranks, 0),
        d_received_(ranks, 0),
        hi_(ranks, 0),
        own_(ranks, 0),
        time_(ranks, 0.0) {}

  // Room for `items` items, `cut_docs` of whose documents have more than one.
  void Reserve(size_t items, size_t cut_docs) {
    items_.reserve(items);
    earlier_of_doc_.reserve(items);
    doc_hi_.reserve(cut_docs * ranks_);
  }

  // A new unplaced item: queries [begin, end) of document `doc`; its index.
  size_t Add(size_t doc, int64_t begin, int64_t end, double ms) {
    if (++doc_items_[doc] == 2) {  // the document is cut: it gets a row of per-rank entries
      split_row_[doc] = doc_hi_.size();
      doc_hi_.resize(doc_hi_.size() + ranks_, 0);
    }
    earlier_of_doc_.push_back(doc_last_[doc]);
    doc_last_[doc] = items_.size();
    items_.push_back({ms, doc, begin, end, -1});
    return items_.size() - 1;
  }

  const std::vector<Item>& items() const { return items_; }
  double attention(size_t r) const { return attention_[r]; }
  int64_t tokens(size_t r) const { return tokens_[r]; }
  int64_t sent(size_t r) const { return sent_[r]; }
  int64_t received(size_t r) const { return received_[r]; }
  // Rank r's attention + max(rows sent, rows received) x row_ms, kept by Place and Apply (the
  // deal asks it of every rank for every item).
  double Time(size_t r) const { return time_[r]; }

  // The slowest rank's time if unplaced item k went to `rank` (the ledger is unchanged).
  double MaxTimeIfPlaced(size_t k, size_t rank) {
    const Item& it = items_[k];
    const double others = rank == slowest_ ? second_ms_ : slowest_ms_;
    if (doc_items_[it.doc] < 2) {  // a whole document moves no rows
      return std::max(Time(rank) + it.ms, others);
    }
    return MaxTimeIfCutPlaced(k, rank, others);
  }

  // Puts unplaced item k on `rank`.
  void Place(size_t k, size_t rank) {
    Item& it = items_[k];
    if (doc_items_[it.doc] > 1) {
      RowsIfPlaced(k, rank);
      for (size_t q = 0; q < ranks_; ++q) {
        sent_[q] += d_sent_[q];
        received_[q] += d_received_[q];
      }
      int64_t& hi = doc_hi_[split_row_[it.doc] + rank];
      hi = std::max(hi, it.end);
      doc_lo_[it.doc] = std::min(doc_lo_[it.doc], it.begin);
    }
    it.rank = static_cast<int>(rank);
    attention_[rank] += it.ms;
    tokens_[rank] += it.end - it.begin;
    if (doc_items_[it.doc] > 1) {
      UpdateTimes();
      return;
    }
    // A whole document changes `rank`'s time only, and only upwards: the scan's two slowest,
    // updated (the slowest is the lowest rank of the largest time, as the scan finds it).
    const double t = time_[rank] = TimeOf(rank);
    if (rank == slowest_) {
      slowest_ms_ = t;
    } else if (t > slowest_ms_ || (t == slowest_ms_ && rank < slowest_)) {
      second_ms_ = slowest_ms_;
      slowest_ms_ = t;
      slowest_ = rank;
    } else {
      second_ms_ = std::max(second_ms_, t);
    }
  }

  // Moves and swaps between the slowest rank and the fastest that lower the slowest time within
  // the token cap, the best one a round, for at most `rounds` rounds. An item's change of rows
  // is priced once per round (DeltaIfMoved); a pair adds its two items' changes unless they are
  // of one document, then priced together.
  void Refine(int64_t cap, int rounds) {
    if (rounds <= 0 || ranks_ < 2) return;
    StoreDocRows();
    std::vector<size_t> on_s, on_f;
    std::vector<int64_t> ds_a, dr_a, ds_b, dr_b;  // per listed item, per rank: its change
    std::vector<char> priced_a, priced_b;         // per listed item: whether counted yet
    for (int round = 0; round < rounds; ++round) {
      size_t s = 0, f = 0;
      for (size_t q = 1; q < ranks_; ++q) {
        if (Time(q) > Time(s)) s = q;
        if (Time(q) < Time(f)) f = q;
      }
      if (s == f) return;
      on_s.clear();
      on_f.clear();
      for (size_t k = 0; k < items_.size(); ++k) {
        if (items_[k].rank == static_cast<int>(s)) on_s.push_back(k);
        if (items_[k].rank == static_cast<int>(f)) on_f.push_back(k);
      }
      ds_a.assign(on_s.size() * ranks_, 0);
      dr_a.assign(on_s.size() * ranks_, 0);
      ds_b.assign(on_f.size() * ranks_, 0);
      dr_b.assign(on_f.size() * ranks_, 0);
      // An item's change is counted when a move or swap within the cap first needs it.
      priced_a.assign(on_s.size(), 0);
      priced_b.assign(on_f.size(), 0);
      const double now = Time(s);
      double best = now * (1.0 - 1e-9);
      size_t best_a = items_.size(), best_b = items_.size();
      auto price = [&](size_t x, size_t y, double d_attention) {
        if (!priced_a[x]) {
          DeltaIfMoved(on_s[x], f, &ds_a[x * ranks_], &dr_a[x * ranks_]);
          priced_a[x] = 1;
        }
        if (y < on_f.size() && !priced_b[y]) {
          DeltaIfMoved(on_f[y], s, &ds_b[y * ranks_], &dr_b[y * ranks_]);
          priced_b[y] = 1;
        }
        double worst = 0.0;
        for (size_t q = 0; q < ranks_; ++q) {
          int64_t sent = sent_[q] + ds_a[x * ranks_ + q];
          int64_t received = received_[q] + dr_a[x * ranks_ + q];
          if (y < on_f.size()) {
            sent += ds_b[y * ranks_ + q];
            received += dr_b[y * ranks_ + q];
          }
          const double att = attention_[q] + (q == s ? -d_attention : q == f ? d_attention : 0.0);
          worst = std::max(worst, att + static_cast<double>(std::max(sent, received)) * row_ms_);
        }
        return worst;
      };
      for (size_t x = 0; x < on_s.size(); ++x) {
        const Item& a = items_[on_s[x]];
        const int64_t la = a.end - a.begin;
        if (tokens_[f] + la <= cap) {  // move
          const double m = price(x, on_f.size(), a.ms);
          if (m < best) best = m, best_a = on_s[x], best_b = items_.size();
        }
        for (size_t y = 0; y < on_f.size(); ++y) {  // swap
          const Item& b = items_[on_f[y]];
          const int64_t lb = b.end - b.begin;
          if (b.ms >= a.ms || tokens_[s] - la + lb > cap || tokens_[f] - lb + la > cap) continue;
          const double m = a.doc == b.doc && doc_items_[a.doc] > 1 ? MaxIfSwapped(on_s[x], on_f[y])
                                                                   : price(x, y, a.ms - b.ms);
          if (m < best) best = m, best_a = on_s[x], best_b = on_f[y];
        }
      }
      if (best_a == items_.size()) return;
      Apply(best_a, f);
      if (best_b < items_.size()) Apply(best_b, s);
    }
  }

  // Counts every cut document's rows per rank, which DeltaIfMoved and DeltaIfSwapped weigh
  // changes against (Refine counts them first and Apply keeps them; Place does not).
  void StoreDocRows() {
    doc_sent_.assign(doc_hi_.size(), 0);
    doc_received_.assign(doc_hi_.size(), 0);
    for (size_t i = 0; i < doc_items_.size(); ++i) {
      if (doc_items_[i] > 1) {
        DocRows(i, &doc_sent_[split_row_[i]], &doc_received_[split_row_[i]]);
      }
    }
  }

  // Adds to sent[0, ranks) and received[0, ranks) the change of rows each rank sends and
  // receives if placed item k went to rank `to` (the ledger is unchanged; see StoreDocRows).
  void DeltaIfMoved(size_t k, size_t to, int64_t* sent, int64_t* received) {
    const size_t doc = items_[k].doc;
    if (doc_items_[doc] < 2) return;  // a whole document moves no rows
    const int from = items_[k].rank;
    items_[k].rank = static_cast<int>(to);
    DocRowsChange(doc, static_cast<size_t>(from), to, sent, received);
    items_[k].rank = from;
  }

  // The same if placed items a and b, of one cut document on different ranks, traded ranks.
  void DeltaIfSwapped(size_t a, size_t b, int64_t* sent, int64_t* received) {
    const int ra = items_[a].rank, rb = items_[b].rank;
    items_[a].rank = rb;
    items_[b].rank = ra;
    DocRowsChange(items_[a].doc, static_cast<size_t>(ra), static_cast<size_t>(rb), sent, received);
    items_[a].rank = ra;
    items_[b].rank = rb;
  }

 private:
  // MaxTimeIfPlaced of an item of a cut document; `others`: the other ranks' slowest time now.
  double MaxTimeIfCutPlaced(size_t k, size_t rank, double others) {
    const Item& it = items_[k];
    const size_t base = split_row_[it.doc];
    const int64_t hi = doc_hi_[base + rank];
    if (it.end > hi && doc_lo_[it.doc] < it.end) {
      // Other holders would send it rows: every rank's time may change.
      RowsIfPlaced(k, rank);
      double worst = 0.0;
      for (size_t q = 0; q < ranks_; ++q) {
        const int64_t rows = std::max(sent_[q] + d_sent_[q], received_[q] + d_received_[q]);
        worst = std::max(
            worst, attention_[q] + (q == rank ? it.ms : 0.0) + static_cast<double>(rows) * row_ms_);
      }
      return worst;
    }
    // Only `rank` changes (the usual case: a document's chunks go latest first, so no holder has
    // rows below this one's end): it receives its largest end's growth less its rows, and sends
    // its rows below every other holder's largest end.
    if (below_item_ != k) {
      below_item_ = k;
      below_ = 0;
      for (size_t q = 0; q < ranks_; ++q) below_ += RowsBelow(it, doc_hi_[base + q]);
    }
    const int64_t sent = sent_[rank] + below_ - RowsBelow(it, hi);
    const int64_t received =
        received_[rank] + std::max<int64_t>(0, it.end - hi) - (it.end - it.begin);
    return std::max(
        others, attention_[rank] + it.ms + static_cast<double>(std::max(sent, received)) * row_ms_);
  }

  // Rows of item `it` below a holder's largest end `hi` (what it sends that holder).
  static int64_t RowsBelow(const Item& it, int64_t hi) {
    return std::max<int64_t>(0, std::min(hi, it.end) - it.begin);
  }

  // Adds document `doc`'s rows per rank to sent[0, ranks) and received[0, ranks): a rank needs
  // keys [0, its largest end) less its own rows, each other rank's rows in that range sent to it.
  void DocRows(size_t doc, int64_t* sent, int64_t* received) {
    if (doc_items_[doc] < 2) return;
    std::fill(hi_.begin(), hi_.end(), 0);
    std::fill(own_.begin(), own_.end(), 0);
    for (size_t k = doc_last_[doc]; k != kNoItem; k = earlier_of_doc_[k]) {
      const Item& it = items_[k];
      if (it.rank < 0) continue;
      hi_[static_cast<size_t>(it.rank)] = std::max(hi_[static_cast<size_t>(it.rank)], it.end);
      own_[static_cast<size_t>(it.rank)] += it.end - it.begin;
    }
    ends_.clear();
    for (size_t r = 0; r < ranks_; ++r) {
      if (hi_[r] == 0) continue;
      received[r] += hi_[r] - own_[r];
      ends_.push_back(hi_[r]);
    }
    // An item's rows below each holder's largest end x, min(x, end) - min(x, begin), go to that
    // holder (its own rank's end is at or past the item's end: less its length). Over many
    // holders they are summed from the sorted ends in O(log holders): items x holders was most
    // of planning one long document at C = 512 and above; over a few a scan is cheaper (2.4%
    // more instructions for adaptive at C = 8 when every document was summed so).
    if (ends_.size() > kScannedHolders) {
      end_sums_.Assign(ends_);
      for (size_t k = doc_last_[doc]; k != kNoItem; k = earlier_of_doc_[k]) {
        const Item& it = items_[k];
        if (it.rank < 0) continue;
        sent[static_cast<size_t>(it.rank)] +=
            end_sums_.RowsBetween(it.begin, it.end) - (it.end - it.begin);
      }
      return;
    }
    for (size_t k = doc_last_[doc]; k != kNoItem; k = earlier_of_doc_[k]) {
      const Item& it = items_[k];
      if (it.rank < 0) continue;
      int64_t rows = it.begin - it.end;
      for (const int64_t e : ends_) rows += std::max<int64_t>(0, std::min(e, it.end) - it.begin);
      sent[static_cast<size_t>(it.rank)] += rows;
    }
  }

  // Adds to sent[0, ranks) and received[0, ranks) how cut document `doc`'s rows change when, of
  // its placed items, only some on ranks a and b have traded between them since StoreDocRows
  // (doc_hi_, doc_sent_, doc_received_; items_ hold the new ranks): DocRows' count less the
  // stored one, in O(items + C) rather than items x holders. Only a's and b's largest ends move,
  // so another rank's item sends its rows below them anew, and a and b are counted afresh.
  void DocRowsChange(size_t doc, size_t a, size_t b, int64_t* sent, int64_t* received) {
    const size_t x = split_row_[doc];
    int64_t hi_a = 0, hi_b = 0, own_a = 0, own_b = 0;
    for (size_t k = doc_last_[doc]; k != kNoItem; k = earlier_of_doc_[k]) {
      const Item& it = items_[k];
      if (it.rank == static_cast<int>(a)) hi_a = std::max(hi_a, it.end), own_a += it.end - it.begin;
      if (it.rank == static_cast<int>(b)) hi_b = std::max(hi_b, it.end), own_b += it.end - it.begin;
    }
    const int64_t old_hi_a = doc_hi_[x + a], old_hi_b = doc_hi_[x + b];
    int64_t sent_a = 0, sent_b = 0;
    for (size_t k = doc_last_[doc]; k != kNoItem; k = earlier_of_doc_[k]) {
      const Item& it = items_[k];
      if (it.rank < 0) continue;
      const size_t r = static_cast<size_t>(it.rank);
      if (r != a && r != b) {
        sent[r] += RowsBelow(it, hi_a) - RowsBelow(it, old_hi_a) + RowsBelow(it, hi_b) -
                   RowsBelow(it, old_hi_b);
        continue;
      }
      // Its rows below every holder's largest end, less its length (its own rank's end is at or
      // past its end), as in DocRows.
      int64_t rows = RowsBelow(it, hi_a) + RowsBelow(it, hi_b) - (it.end - it.begin);
      for (size_t q = 0; q < ranks_; ++q) {
        if (q != a && q != b) rows += RowsBelow(it, doc_hi_[x + q]);
      }
      (r == a ? sent_a : sent_b) += rows;
    }
    sent[a] += sent_a - doc_sent_[x + a];
    sent[b] += sent_b - doc_sent_[x + b];
    received[a] += hi_a - own_a - doc_received_[x + a];
    received[b] += hi_b - own_b - doc_received_[x + b];
  }

  // The slowest rank's time if placed items a and b, of one document, traded ranks.
  double MaxIfSwapped(size_t a, size_t b) {
    const int ra = items_[a].rank, rb = items_[b].rank;
    std::fill(d_sent_.begin(), d_sent_.end(), 0);
    std::fill(d_received_.begin(), d_received_.end(), 0);
    DeltaIfSwapped(a, b, d_sent_.data(), d_received_.data());
    const double d = items_[a].ms - items_[b].ms;
    double worst = 0.0;
    for (size_t q = 0; q < ranks_; ++q) {
      const int64_t sent = sent_[q] + d_sent_[q];
      const int64_t received = received_[q] + d_received_[q];
      const double att = attention_[q] + (q == static_cast<size_t>(ra)   ? -d
                                          : q == static_cast<size_t>(rb) ? d
                                                                         : 0.0);
      worst = std::max(worst, att + static_cast<double>(std::max(sent, received)) * row_ms_);
    }
    return worst;
  }

  // Moves placed item k to rank `to`, keeping the stored rows exact.
  void Apply(size_t k, size_t to) {
    Item& it = items_[k];
    const size_t from = static_cast<size_t>(it.rank);
    attention_[from] -= it.ms;
    tokens_[from] -= it.end - it.begin;
    attention_[to] += it.ms;
    tokens_[to] += it.end - it.begin;
    it.rank = static_cast<int>(to);
    if (doc_items_[it.doc] > 1) {  // a whole document moves no rows
      const size_t x = split_row_[it.doc];
      for (size_t q = 0; q < ranks_; ++q) {
        sent_[q] -= doc_sent_[x + q];
        received_[q] -= doc_received_[x + q];
        doc_sent_[x + q] = doc_received_[x + q] = 0;
      }
      DocRows(it.doc, &doc_sent_[x], &doc_received_[x]);
      for (size_t q = 0; q < ranks_; ++q) {
        sent_[q] += doc_sent_[x + q];
        received_[q] += doc_received_[x + q];
        doc_hi_[x + q] = hi_[q];
      }
    }
    UpdateTimes();
  }

  double TimeOf(size_t r) const {
    return attention_[r] + static_cast<double>(std::max(sent_[r], received_[r])) * row_ms_;
  }

  // Every rank's time, and the two slowest for MaxTimeIfPlaced.
  void UpdateTimes() {
    double slowest_ms = 0.0, second_ms = 0.0;  // in locals: the loop runs per item
    size_t slowest = 0;
    for (size_t r = 0; r < ranks_; ++r) {
      const double t = time_[r] = TimeOf(r);
      if (t > slowest_ms) {
        second_ms = slowest_ms;
        slowest_ms = t;
        slowest = r;
      } else {
        second_ms = std::max(second_ms, t);
      }
    }
    slowest_ms_ = slowest_ms;
    second_ms_ = second_ms;
    slowest_ = slowest;
  }

  // d_sent_ and d_received_: how placing unplaced item k on `rank` changes the rows each rank
  // sends and receives. A rank needs keys [0, its largest end) less its own rows (unplaced rows
  // count as received), so `rank` gains its largest end's growth less the item's rows; it sends
  // the item's rows below every other holder's largest end; and when its largest end grows, the
  // other holders of rows in the new range send them to it.
  void RowsIfPlaced(size_t k, size_t rank) {
    const Item& it = items_[k];
    const size_t base = split_row_[it.doc];
    std::fill(d_sent_.begin(), d_sent_.end(), 0);
    std::fill(d_received_.begin(), d_received_.end(), 0);
    const int64_t hi = doc_hi_[base + rank];
    d_received_[rank] = std::max<int64_t>(0, it.end - hi) - (it.end - it.begin);
    for (size_t q = 0; q < ranks_; ++q) {
      const int64_t h = doc_hi_[base + q];
      if (q != rank) d_sent_[rank] += RowsBelow(it, h);
    }
    if (it.end <= hi) return;
    for (size_t j = doc_last_[it.doc]; j != kNoItem; j = earlier_of_doc_[j]) {
      const Item& p = items_[j];
      if (p.rank < 0 || static_cast<size_t>(p.rank) == rank) continue;
      const int64_t rows = std::min(p.end, it.end) - std::max(p.begin, hi);
      if (rows > 0) d_sent_[static_cast<size_t>(p.rank)] += rows;
    }
  }

  std::vector<Item> items_;
  size_t ranks_;
  double row_ms_;
  std::vector<double> attention_;
  std::vector<int64_t> tokens_, sent_, received_;
  // Per cut document (two items or more) a row of per-rank entries at split_row_[doc] (kNoItem
  // for a whole one): memory grows with the cut documents x C, not every document x C (a
  // micro-batch of 2^20 one-token documents at C = 4096 needed 32 GiB per array).
  std::vector<int64_t> doc_hi_;    // per (cut document, rank): its largest end
  std::vector<int64_t> doc_lo_;    // per document: the least begin placed
  std::vector<size_t> split_row_;  // per document: its row's first entry, or kNoItem
  size_t below_item_ = SIZE_MAX;  // MaxTimeIfPlaced's item and its rows below the holders' ends
  int64_t below_ = 0;
  // Per document its item count and last item, per item the document's item added before it
  // (kNoItem for the first): a document's items without a vector per document.
  static constexpr size_t kNoItem = std::numeric_limits<size_t>::max();
  std::vector<size_t> doc_items_, doc_last_, earlier_of_doc_;
  size_t slowest_ = 0;
  double slowest_ms_ = 0.0, second_ms_ = 0.0;
  std::vector<int64_t> d_sent_, d_received_;      // RowsIfPlaced's
  std::vector<int64_t> doc_sent_, doc_received_;  // Refine's: per (cut document, rank) rows
  std::vector<int64_t> hi_, own_, ends_;          // DocRows' scratch
  std::vector<double> time_;                      // Time(r)
  SortedSums end_sums_;                           // DocRows': the holders' largest ends
  static constexpr size_t kScannedHolders = 16;   // DocRows scans up to this many
};

// How balanced-chunks cuts documents: the unit is BalancedChunkUnit at `per_rank` chunks' worth
// per rank, and a document longer than it is cut into chunks of DocChunkUnit(d, unit, min_chunks).
struct ChunkCutSpec {
  int64_t per_rank = kChunksPerRank;
  int64_t min_chunks = 1;
};

// The fine cut's chunks per document longer than the unit: enough for two ranks to share it
// evenly (zigzag halves, as per-doc at degree 2).
inline constexpr int64_t kFineCutMinChunks = 4;

inline constexpr ChunkCutSpec kCut{};
inline constexpr ChunkCutSpec kCoarseCuts[] = {{.per_rank = kChunksPerRank / 2, .min_chunks = 1},
                                               {.per_rank = kChunksPerRank / 4, .min_chunks = 1}};
inline constexpr ChunkCutSpec kFineCut{.per_rank = kChunksPerRank, .min_chunks = kFineCutMinChunks};
// The finer cut: every document longer than half the unit in chunks of half the unit.
inline constexpr ChunkCutSpec kFinerCut{.per_rank = 2 * kChunksPerRank, .min_chunks = 1};

// balanced-chunks' items, cut (see the file comment) and unplaced, and their deal order.
struct ChunkCut {
  ChunkLedger ledger;
  std::vector<size_t> order;  // costliest first
};

// The chunk size of a document of `length` tokens: `unit`, or for a document longer than `unit`
// with min_chunks > 1, at most ceil(length / min_chunks) rounded up to whole query tiles.
inline int64_t DocChunkUnit(int64_t length, int64_t unit, int64_t min_chunks, int64_t tile) {
  if (length <= unit || min_chunks <= 1) return unit;
  return std::min(unit, WholeTiles((length + min_chunks - 1) / min_chunks, tile));
}

// `whole_ms`: per document, its price whole (SegmentCallMs(d, d)) or < 0 while not yet computed;
// the cuts of one request share it (every cut keeps the short documents whole, and pricing is
// most of a cut's work).
inline ChunkCut CutBalancedChunks(const ShardPlanRequest& r, ChunkCutSpec spec,
                                  std::vector<double>& whole_ms) {
  const MicroBatch& mb = r.mb;
  const size_t docs = mb.documents.size();
  whole_ms.resize(docs, -1.0);
  const int64_t unit0 = BalancedChunkUnit(mb.tokens, r.cp_size, r.model, spec.per_rank);
  const int64_t tile = std::max<int64_t>(1, r.model.tile_q());
  // With a packed-call fit, adaptive prices a rank's call forward + backward and its exchange once
  // per pass; the deal weighs the same.
  ChunkCut cut{.ledger = ChunkLedger(docs, static_cast<size_t>(r.cp_size),
                                     r.options.comm.RowMs(r.model) * r.model.passes()),
               .order = {}};
  size_t item_count = 0, cut_docs = 0;
  for (const Document& doc : mb.documents) {
    const int64_t unit = DocChunkUnit(doc.length, unit0, spec.min_chunks, tile);
    const int64_t chunks = (doc.length + unit - 1) / unit;
    item_count += static_cast<size_t>(chunks);
    cut_docs += chunks > 1;
  }
  cut.ledger.Reserve(item_count, cut_docs);
  for (size_t i = 0; i < docs; ++i) {
    const int64_t d = mb.documents[i].length;
    const int64_t unit = DocChunkUnit(d, unit0, spec.min_chunks, tile);
    // From the document's end: whole-tile chunks of `unit`, the d mod unit rest first.
    if (d <= unit) {
      if (whole_ms[i] < 0.0) whole_ms[i] = r.model.SegmentCallMs(d, d);
      cut.ledger.Add(i, 0, d, whole_ms[i]);
      continue;
    }
    for (int64_t b = 0, e = d % unit == 0 ? unit : d % unit; b < d; b = e, e += unit) {
      cut.ledger.Add(i, b, e, r.model.SegmentCallMs(e - b, e));
    }
  }
  // Costliest first, ties by document and position: the items' order (added so), hence by
  // (-ms, index).
  const std::vector<ChunkLedger::Item>& items = cut.ledger.items();
  std::vector<std::pair<double, size_t>> by_cost(items.size());
  for (size_t k = 0; k < items.size(); ++k) by_cost[k] = {-items[k].ms, k};
  std::sort(by_cost.begin(), by_cost.end());
  cut.order.resize(items.size());
  for (size_t k = 0; k < items.size(); ++k) cut.order[k] = by_cost[k].second;
  return cut;
}

// The cut's items dealt, costliest first, each to the rank among those with room that leaves the
// slowest rank fastest (the exchange included), then is fastest itself; then refined.
// refine_rounds = 0 stops after the deal (tests).
inline ChunkLedger DealBalancedChunks(const ShardPlanRequest& r, ChunkCut cut,
                                      int refine_rounds = 2) {
  const size_t ranks = static_cast<size_t>(r.cp_size);
  const int64_t cap = RankTokenCap(r);
  ChunkLedger& ledger = cut.ledger;
  std::vector<double> time(ranks, 0.0);
  std::vector<int64_t> tokens(ranks, 0);
  std::vector<DocShard> spill;
  for (const size_t k : cut.order) {
    const ChunkLedger::Item it = ledger.items()[k];
    const int64_t len = it.end - it.begin;
    int best = -1;
    double best_key = 0.0, best_own = 0.0;
    for (size_t q = 0; q < ranks; ++q) {
      if (ledger.tokens(q) + len > cap) continue;
      const double key = ledger.MaxTimeIfPlaced(k, q);
      const double own = ledger.Time(q) + it.ms;
      if (best < 0 || key < best_key || (key == best_key && own < best_own)) {
        best = static_cast<int>(q);
        best_key = key;
        best_own = own;
      }
    }
    if (best >= 0) {
      ledger.Place(k, static_cast<size_t>(best));
      continue;
    }
    // No rank has room: spread it over the ranks with the most (SpillShards); the item itself is
    // left unplaced and the plan skips it.
    for (size_t q = 0; q < ranks; ++q) {
      tokens[q] = ledger.tokens(q);
      time[q] = ledger.Time(q);
    }
    spill.clear();
    SpillShards(len, cap, tokens, time, spill);
    for (const DocShard& s : spill) {
      const int64_t b = it.begin + s.q_begin, e = it.begin + s.q_end;
      ledger.Place(ledger.Add(it.doc, b, e, r.model.SegmentCallMs(e - b, e)),
                   static_cast<size_t>(s.rank));
    }
  }
  ledger.Refine(cap, refine_rounds);
  return std::move(ledger);
}

// The deal of every item of the cut `spec` (tests, the balance table's what-if rows).
inline ChunkLedger PlaceBalancedChunks(const ShardPlanRequest& r, ChunkCutSpec spec = kCut,
                                       int refine_rounds = 2) {
  std::vector<double> whole_ms;
  return DealBalancedChunks(r, CutBalancedChunks(r, spec, whole_ms), refine_rounds);
}

// The plan of a placement: a rank's adjacent pieces of one document are one segment.
inline absl::StatusOr<ShardPlan> BalancedChunksPlan(const ShardPlanRequest& r,
                                                    const ChunkLedger& ledger) {
  const std::vector<ChunkLedger::Item>& items = ledger.items();
  // Placed items by document and position (the cut's order but for spilled pieces, added last).
  std::vector<size_t> placed;
  placed.reserve(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    if (items[k].rank >= 0) placed.push_back(k);
  }
  auto by_position = [&](size_t x, size_t y) {
    return std::tie(items[x].doc, items[x].begin) < std::tie(items[y].doc, items[y].begin);
  };
  if (!std::is_sorted(placed.begin(), placed.end(), by_position)) {  // sorted but for spills
    std::sort(placed.begin(), placed.end(), by_position);
  }
  PlanBuilder b(r.mb, r.starts, r.cp_size, items.size() + static_cast<size_t>(r.cp_size));
  for (size_t k = 0; k < placed.size();) {
    const ChunkLedger::Item& first = items[placed[k]];
    size_t end = k + 1;  // merge the rank's adjacent pieces of the document into one segment
    while (end < placed.size() && items[placed[end]].doc == first.doc &&
           items[placed[end]].rank == first.rank) {
      ++end;
    }
    b.Add(first.rank, static_cast<int64_t>(first.doc), first.begin, items[placed[end - 1]].end);
    k = end;
  }
  return b.Finish(ShardStrategy("balanced-chunks"), r.requested, r.cp_size, -1);
}

// The fine cut (kFineCut): a document longer than the unit is cut into chunks of ceil(d / 4)
// rounded up to whole query tiles (4 chunks, fewer where the rounding takes the rest).
// The fine cut is dealt only while its chunks x ranks stay within this: the deal's work grows
// with both, and adaptive's planning at C = 8 must stay under 100 us (shard_benchmark). 400
// admits most 128K micro-batches at C = 2 and 4 and at C = 8 only those of at most 50 chunks:
// adaptive's mean planning time at C = 8 is unchanged (docs/results/cp/balance.md).
inline constexpr size_t kFineCutMaxChunkRanks = 400;

// The cut's number of chunks (items) for this request, counted without cutting.
inline size_t ChunkCount(const ShardPlanRequest& r, ChunkCutSpec spec) {
  const int64_t unit = BalancedChunkUnit(r.mb.tokens, r.cp_size, r.model, spec.per_rank);
  const int64_t tile = std::max<int64_t>(1, r.model.tile_q());
  size_t chunks = 0;
  for (const Document& doc : r.mb.documents) {
    const int64_t u = DocChunkUnit(doc.length, unit, spec.min_chunks, tile);
    chunks += static_cast<size_t>((doc.length + u - 1) / u);
  }
  return chunks;
}

// Whether balanced-chunks deals the fine cut for this request (see PlanBalancedChunksPriced): some
// document's chunks differ from the cut's, and its chunks x ranks are within the budget.
inline bool DealsFineCut(const ShardPlanRequest& r) {
  const int64_t unit = BalancedChunkUnit(r.mb.tokens, r.cp_size, r.model, kFineCut.per_rank);
  const int64_t tile = std::max<int64_t>(1, r.model.tile_q());
  const bool differs =
      std::any_of(r.mb.documents.begin(), r.mb.documents.end(), [&](const Document& d) {
        return DocChunkUnit(d.length, unit, kFineCut.min_chunks, tile) != unit;
      });
  return differs &&
         ChunkCount(r, kFineCut) * static_cast<size_t>(r.cp_size) <= kFineCutMaxChunkRanks;
}

// Whether balanced-chunks deals the finer cut (kFinerCut) for this request: it cuts some document
// finer than the cut (kCut) and has at most 5/4 of the cut's chunks, so its deal costs about what
// the cut's does. That holds on micro-batches of many short documents around a few long ones,
// where the cut's deal is already the larger part of planning, and not on the usual 128K
// micro-batch of a few dozen documents (adaptive's planning time at C = 8 is unchanged).
inline bool DealsFinerCut(const ShardPlanRequest& r) {
  const size_t cut = ChunkCount(r, kCut), finer = ChunkCount(r, kFinerCut);
  return finer > cut && 4 * finer <= 5 * cut;
}

// The fastest of balanced-chunks' deals by AdaptivePriceMs under the request's model and options
// (the earlier on a tie), and that price in *ms when given:
//  1. the cut (kCut);
//  2. the coarse cuts (kCoarseCuts, finest first), each when some document is longer than the
//     previous cut's unit (else both keep every document whole and deal alike). Why: see the
//     file comment;
//  3. the fine cut (kFineCut), when DealsFineCut. Why (issue 57): with one
//     document of T/8 to T/4 tokens among short ones at C = 2, the cut's 2-4 chunks of it cannot
//     split its attention evenly, and the token cap stops the short documents from making up the
//     rest; on the balance table's synthetic stream at seeds 8-11 adaptive's worst C = 2
//     micro-batch went from 3.0-3.8% behind a peer's plan to 1.8-2.0% (what is left there is
//     the flash table's preference for 512-token query segments, see balance.md);
//  4. the finer cut (kFinerCut, chunks of half the unit), when DealsFinerCut. Why (issue 57): on
//     a micro-batch of hundreds of short documents around a long one the token cap makes the
//     rank that takes the long document's costly last chunk hold nearly as many other tokens as
//     the rest; half-size chunks spread that cost. On a held-out Pareto-shaped stream adaptive's
//     worst micro-batch went from 6.9% behind the fastest plan in the cap (a peer's, C = 4) to
//     1.1%, and seeds 1-13 of the balance table from 215 cells with a micro-batch over 1% to 210
//     (docs/results/cp/memory_cap/README.md, balance.md).
inline absl::StatusOr<ShardPlan> PlanBalancedChunksPriced(const ShardPlanRequest& r, double* ms) {
  std::vector<double> whole_ms;
  auto place = [&](ChunkCutSpec spec) {
    return DealBalancedChunks(r, CutBalancedChunks(r, spec, whole_ms));
  };
  absl::StatusOr<ShardPlan> plan = BalancedChunksPlan(r, place(kCut));
  if (!plan.ok()) return plan.status();
  double best_ms = AdaptivePriceMs(*plan, r.model, r.options);
  // A deal known to be slower than the best so far is not priced (the lower bound adaptive skips
  // candidates with; without a packed-call fit AdaptivePriceMs is PredictCp's max_ms).
  const bool bounded = !r.model.has_packed_calls();
  auto keep_if_faster = [&](const ChunkLedger& ledger) -> absl::Status {
    absl::StatusOr<ShardPlan> other = BalancedChunksPlan(r, ledger);
    if (!other.ok()) return other.status();
    if (bounded && CausalCpSlowerThan(*other, r.model, r.options, best_ms)) {
      return absl::OkStatus();
    }
    if (const double other_ms = AdaptivePriceMs(*other, r.model, r.options); other_ms < best_ms) {
      plan = std::move(other);
      best_ms = other_ms;
    }
    return absl::OkStatus();
  };
  absl::Status status;
  int64_t longest = 0;
  for (const Document& doc : r.mb.documents) longest = std::max(longest, doc.length);
  int64_t finer_unit = BalancedChunkUnit(r.mb.tokens, r.cp_size, r.model, kCut.per_rank);
  for (const ChunkCutSpec& coarse : kCoarseCuts) {
    if (!status.ok() || longest <= finer_unit) break;
    status = keep_if_faster(place(coarse));
    finer_unit = BalancedChunkUnit(r.mb.tokens, r.cp_size, r.model, coarse.per_rank);
  }
  if (status.ok() && DealsFineCut(r)) {
    status = keep_if_faster(place(kFineCut));
  }
  if (status.ok() && DealsFinerCut(r)) {
    status = keep_if_faster(place(kFinerCut));
  }
  if (!status.ok()) return status;
  if (ms != nullptr) *ms = best_ms;
  return plan;
}

inline absl::StatusOr<ShardPlan> PlanBalancedChunks(const ShardPlanRequest& r) {
  return PlanBalancedChunksPriced(r, nullptr);
}

}  // namespace detail
}  // namespace wlb
