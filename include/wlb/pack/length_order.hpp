// Length-ordered containers of the packers: the stable longest-first order of a step's documents
// (a radix sort) and detail::LengthOrdered, documents held longest first with cheap inserts.
//
//   std::vector<size_t> order = wlb::LongestFirstOrder(docs);  // ties in stream order
//   wlb::SortLongestFirst(docs);
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <iterator>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "wlb/core/document.hpp"

namespace wlb {

// The longest-first order of packers; a stable sort or merge keeps ties in stream order.
inline bool LongerFirst(const Document& a, const Document& b) { return a.length > b.length; }

// The positions of `docs` in longest-first order, ties in stream order (a stable order, so it is
// deterministic). A stable LSD radix sort of (length, position) pairs packed into one 64-bit word,
// on the lengths' digits complemented (longest first): the documents are read once, in order, to
// build the words, and the passes read only the words (at N = 4,096 a step's 135,000 documents are
// 5 MB, and reading them in a permuted order missed the cache at every pass). Digits of up to 11
// bits and about 2n buckets, as few passes as that allows: 2 at S = 128K (17-bit keys) for large
// steps. Lengths too long to pack with the positions fall back to a comparison sort. With
// `lengths`, also sets (*lengths)[i] = docs[order[i]].length, read from the words, for a caller
// that needs only the lengths in that order (not the documents).
inline std::vector<size_t> LongestFirstOrder(std::span<const Document> docs,
                                             std::vector<int64_t>* lengths = nullptr) {
  const size_t n = docs.size();
  std::vector<size_t> order(n);
  if (lengths != nullptr) lengths->resize(n);
  const int position_bits = std::bit_width(n);
  // The words, built on the assumption that every length fits above the position (a negative
  // length reads as a huge one): the longest length says whether they did.
  std::vector<uint64_t> keyed(n);
  uint64_t longest = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t length = static_cast<uint64_t>(docs[i].length);
    longest = std::max(longest, length);
    keyed[i] = position_bits < 64 ? (length << position_bits) | i : 0;
  }
  const int bits = std::bit_width(longest);  // every length is below 2^bits
  if (bits + position_bits > 64) {
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return LongerFirst(docs[a], docs[b]); });
    if (lengths != nullptr) {
      for (size_t i = 0; i < n; ++i) (*lengths)[i] = docs[order[i]].length;
    }
    return order;
  }
  constexpr int kMaxDigitBits = 11;
  const int most_width = std::clamp(position_bits, 4, kMaxDigitBits);
  const int passes = (bits + most_width - 1) / most_width;
  const int width = passes == 0 ? 0 : (bits + passes - 1) / passes;
  const uint64_t digit_mask = (uint64_t{1} << width) - 1;
  std::vector<uint64_t> next(n);
  std::array<size_t, (size_t{1} << kMaxDigitBits) + 1> count;  // digit_mask + 2 of them used
  for (int shift = position_bits; shift < position_bits + passes * width; shift += width) {
    // Bucket digit_mask - digit: larger digits first.
    auto bucket = [&](uint64_t k) { return digit_mask - ((k >> shift) & digit_mask); };
    std::fill(count.begin(), count.begin() + digit_mask + 2, 0);
    for (uint64_t k : keyed) ++count[bucket(k) + 1];
    for (size_t b = 0; b <= digit_mask; ++b) count[b + 1] += count[b];
    for (uint64_t k : keyed) next[count[bucket(k)]++] = k;
    keyed.swap(next);
  }
  const uint64_t position_mask = (uint64_t{1} << position_bits) - 1;
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<size_t>(keyed[i] & position_mask);
  if (lengths != nullptr) {
    for (size_t i = 0; i < n; ++i) (*lengths)[i] = static_cast<int64_t>(keyed[i] >> position_bits);
  }
  return order;
}

// Calls fn on docs[order[0]], docs[order[1]], ...: reads in a permuted order, so the document
// kPrefetchAhead places ahead is asked for early (its first and last byte: a document may span two
// cache lines) and the cache misses overlap.
template <typename Fn>
void ForEachInOrder(std::span<const Document> docs, const std::vector<size_t>& order, Fn&& fn) {
  constexpr size_t kPrefetchAhead = 16;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i + kPrefetchAhead < order.size()) {
      const Document* ahead = &docs[order[i + kPrefetchAhead]];
      __builtin_prefetch(ahead);
      __builtin_prefetch(reinterpret_cast<const char*>(ahead) + sizeof(Document) - 1);
    }
    fn(docs[order[i]]);
  }
}

// Orders documents longest first, ties in stream order (LongestFirstOrder).
inline void SortLongestFirst(std::vector<Document>& docs) {
  if (docs.size() < 2) return;
  std::vector<Document> sorted;
  sorted.reserve(docs.size());
  ForEachInOrder(docs, LongestFirstOrder(docs), [&](const Document& d) { sorted.push_back(d); });
  docs.swap(sorted);
}

namespace detail {

// Documents held in a stable longest-first order (longest first, equal lengths in the order they
// were added). Two sorted runs: the main run, and a recent run of the documents added at the back
// since it was last folded in, so adding a step's left-overs to a large carry merges them with the
// recent run, not with the whole carry (which made every step O(held): fixed-greedy at N = 16 in
// BM_Scaling, whose carry grows with every push, spent most of its time there). Taking the first
// document of at most a given length is a binary search in each run plus a skip over taken slots
// (SortedRun). Merge with documents at the front folds everything into one run, O(held + added).
class LengthOrdered {
 public:
  LengthOrdered() = default;
  // Holds `docs` in a stable longest-first order.
  explicit LengthOrdered(std::vector<Document> docs) {
    SortLongestFirst(docs);
    main_.Reset(std::move(docs));
  }

  bool empty() const { return size() == 0; }
  int64_t size() const { return main_.size() + recent_.size(); }
  int64_t tokens() const { return main_.tokens() + recent_.tokens(); }

  // Removes and returns the first document (in the held order) of at most `max_length` tokens.
  std::optional<Document> TakeFirstAtMost(int64_t max_length) {
    const size_t m = main_.FirstAtMost(max_length);
    const size_t r = recent_.empty() ? recent_.end() : recent_.FirstAtMost(max_length);
    if (r == recent_.end()) {
      if (m == main_.end()) return std::nullopt;
      return main_.Take(m);
    }
    // Of equal lengths the main run's came first: the recent run was added after it.
    if (m == main_.end() || recent_.at(r).length > main_.at(m).length) return recent_.Take(r);
    return main_.Take(m);
  }
  // Adds `front` before and `back` after the held documents of each length; both longest first.
  void Merge(const std::vector<Document>& front, const std::vector<Document>& back) {
    if (front.empty() && back.empty()) return;
    if (front.empty() && main_.size() > kRecentMin) {
      recent_.Reset(StableMerge(recent_.ToVector(), back));
      // Folded in when it outgrows main / 8 and 2 x sqrt(main): a merge with the recent run costs
      // at most that, and a fold O(held) after at least as many added documents.
      const int64_t n = recent_.size();
      if (n <= kRecentMin || n * n <= 4 * main_.size() || 8 * n <= main_.size()) return;
      main_.Reset(ToVector());
    } else {
      main_.Reset(StableMerge(StableMerge(front, ToVector()), back));
    }
    recent_.Reset({});
  }
  // Calls fn on the held documents in order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    if (recent_.empty()) return main_.ForEach(fn);
    std::vector<Document> recent = recent_.ToVector();
    size_t r = 0;
    main_.ForEach([&](const Document& d) {
      for (; r < recent.size() && recent[r].length > d.length; ++r) fn(recent[r]);
      fn(d);
    });
    for (; r < recent.size(); ++r) fn(recent[r]);
  }
  // The held documents in order, appended to `out`.
  void AppendTo(std::vector<Document>& out) const {
    out.reserve(out.size() + static_cast<size_t>(size()));
    ForEach([&out](const Document& d) { out.push_back(d); });
  }
  std::vector<Document> ToVector() const {
    std::vector<Document> out;
    AppendTo(out);
    return out;
  }
  void Clear() { *this = LengthOrdered(); }

 private:
  // A main run of at most this many documents takes every merge itself (one run is the fastest
  // for a small carry), and a recent run of at most this many is never folded in.
  static constexpr int64_t kRecentMin = 64;

  // `a` then `b` merged longest first, `a`'s first among equal lengths.
  static std::vector<Document> StableMerge(const std::vector<Document>& a,
                                           const std::vector<Document>& b) {
    std::vector<Document> out;
    out.reserve(a.size() + b.size());
    std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out), LongerFirst);
    return out;
  }

  // One sorted vector, where taking the first document of at most a given length is a binary
  // search plus a skip over the taken ones (forward pointers, path-compressed), so a packer that
  // drains a carry of millions of documents step by step never rescans or copies it; taken
  // slots are compacted away once they are half the vector.
  class SortedRun {
   public:
    bool empty() const { return count_ == 0; }
    int64_t size() const { return count_; }
    int64_t tokens() const { return tokens_; }
    size_t end() const { return docs_.size(); }
    const Document& at(size_t i) const { return docs_[i]; }

    // The slot of the first held document of at most `max_length` tokens (end() if none).
    size_t FirstAtMost(int64_t max_length) {
      const auto first =
          std::partition_point(docs_.begin(), docs_.end(),
                               [max_length](const Document& d) { return d.length > max_length; });
      return NextHeld(static_cast<size_t>(first - docs_.begin()));
    }
    // Removes and returns the held document at slot i.
    Document Take(size_t i) {
      const Document d = docs_[i];
      skip_[i] = i + 1;
      --count_;
      tokens_ -= d.length;
      if (docs_.size() > 64 && static_cast<int64_t>(docs_.size()) > 2 * count_) Reset(ToVector());
      return d;
    }
    template <typename Fn>
    void ForEach(Fn&& fn) const {
      for (size_t i = 0; i < docs_.size();) {
        if (skip_[i] == i) {
          fn(docs_[i]);
          ++i;
        } else {
          i = skip_[i];  // every slot before skip_[i] is taken
        }
      }
    }
    std::vector<Document> ToVector() const {
      std::vector<Document> out;
      out.reserve(static_cast<size_t>(count_));
      ForEach([&out](const Document& d) { out.push_back(d); });
      return out;
    }
    // Holds exactly `sorted` (longest first), nothing taken.
    void Reset(std::vector<Document> sorted) {
      docs_ = std::move(sorted);
      skip_.resize(docs_.size() + 1);
      for (size_t i = 0; i < skip_.size(); ++i) skip_[i] = i;
      count_ = static_cast<int64_t>(docs_.size());
      tokens_ = TotalTokens(docs_);
    }

   private:
    // The first held slot at or after `i` (docs_.size() if none); compresses the path it followed.
    size_t NextHeld(size_t i) {
      size_t held = i;
      while (skip_[held] != held) held = skip_[held];
      while (skip_[i] != i) i = std::exchange(skip_[i], held);
      return held;
    }

    std::vector<Document> docs_;      // longest first, taken slots included
    std::vector<size_t> skip_ = {0};  // skip_[i] == i: slot i is held (or i is the end); else
                                      // slots [i, skip_[i]) are taken
    int64_t count_ = 0;
    int64_t tokens_ = 0;
  };

  SortedRun main_;
  SortedRun recent_;  // added at the back since the last fold; after main_'s of equal lengths
};

}  // namespace detail

}  // namespace wlb
