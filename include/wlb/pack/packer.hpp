// The packer interface: a stream of steps' documents in, balanced micro-batches out.
//
//   wlb::PackerConfig config{.context = 131072, .max_tokens = 196608, .micro_batches = 4};
//   absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
//       wlb::MakePacker("wlb", config, *wlb::CostModelFromPreset("llama2-7b"), {});
//   for (auto& arrivals : steps) {                   // see wlb/core/steps.hpp
//     auto ready = (*packer)->Push(std::move(arrivals));   // the steps now ready (usually one)
//   }
//   auto drained = (*packer)->Flush();               // everything still held, as final steps
//
// Packers are stateful: outlier queues and carry-over live between steps, and SaveState() /
// RestoreState() carry them across a checkpoint exactly.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/step_plan.hpp"
#include "wlb/cost/document_cost.hpp"

namespace wlb {

namespace detail {
// 64-bit FNV-1a: a cheap checksum that catches corrupted state blobs (not a security measure).
inline uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// A document as a compact JSON array [id, length, piece, offset, arrival_step] (state blobs).
inline nlohmann::json DocumentState(const Document& d) {
  return nlohmann::json::array({d.id, d.length, d.piece, d.offset, d.arrival_step});
}
// An integer field of a state blob in [lo, hi]; anything else (a float, a string, out of range)
// throws, so no value is ever narrowed or rounded silently.
inline int64_t StateInteger(const nlohmann::json& v, int64_t lo, int64_t hi, const char* what) {
  const bool fits =
      v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
  if (!fits || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    throw nlohmann::json::out_of_range::create(
        401, absl::StrFormat("%s must be an integer in [%d, %d]", what, lo, hi), &v);
  }
  return v.get<int64_t>();
}
inline Document DocumentFromState(const nlohmann::json& j) {
  if (!j.is_array() || j.size() != 5) {
    throw nlohmann::json::type_error::create(302, "document entry is not a 5-element array", &j);
  }
  // Ranges that keep every sum below 2^63; the packer checks length <= S and the rest against
  // its configuration and counters after loading (Packer::ValidateState).
  return Document{.id = StateInteger(j[0], 0, kMaxStateCounter, "document id"),
                  .length = StateInteger(j[1], 1, kMaxContext, "document length"),
                  .piece = static_cast<int32_t>(StateInteger(j[2], 0, kMaxPieces, "piece")),
                  .offset = StateInteger(j[3], 0, kMaxStreamTokens, "offset"),
                  .arrival_step = StateInteger(j[4], 0, kMaxStateCounter, "arrival step")};
}
template <typename Documents>  // a vector or deque of Document
nlohmann::json DocumentsState(const Documents& docs) {
  nlohmann::json a = nlohmann::json::array();
  for (const Document& d : docs) a.push_back(DocumentState(d));
  return a;
}
// Adds `docs` to a held-back count.
template <typename Documents>
void AddHeld(const Documents& docs, HeldBack& held) {
  held.documents += static_cast<int64_t>(docs.size());
  for (const Document& d : docs) held.tokens += d.length;
}
inline std::vector<Document> DocumentsFromState(const nlohmann::json& j) {
  if (!j.is_array()) {
    throw nlohmann::json::type_error::create(302, "document list is not an array", &j);
  }
  std::vector<Document> docs;
  for (const nlohmann::json& e : j) docs.push_back(DocumentFromState(e));
  return docs;
}
// Runs a state loader `load` (returning absl::Status) and returns what it throws reading a
// malformed state (nlohmann::json::exception: a missing field, a wrong type, a value out of
// range, as the readers above throw) as an error with the exception's text, so no exception
// leaves a state loader.
template <typename Load>
absl::Status LoadStateOrError(Load&& load) {
  try {
    return load();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(e.what());
  }
}
// True when `text` nests JSON arrays/objects deeper than `max_depth` (brackets inside strings do
// not count). Comparing or dumping a deeper value would recurse once per level.
inline bool JsonNestedDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}
}  // namespace detail

// A stateful packer. Push() validates before it changes any state: on error nothing happened.
class Packer {
 public:
  Packer(PackerConfig config, DocumentCost cost) : config_(config), cost_(std::move(cost)) {}
  virtual ~Packer() = default;

  // The packer's name as wlb-plan's --packer spells it.
  virtual std::string_view name() const = 0;

  // Consumes one step of arrivals (pieces of <= S tokens, in stream order) and returns the steps
  // that became ready: one for most packers, W at every W-th call for a window of W steps.
  // Accepts exactly what a saved state can hold (ids, piece indices, offsets within the state's
  // limits, the pieces of a document disjoint and in piece order: CheckPiecesTile), so a packer's
  // own SaveState() always restores. Pieces of one document pushed in different calls are checked
  // when a state is restored, not by every Push() (that would cost O(held) a push).
  absl::StatusOr<std::vector<StepPlan>> Push(std::vector<Document> arrivals) {
    if (pushes_ >= kMaxStateCounter) {
      return absl::FailedPreconditionError(
          absl::StrFormat("a packer takes at most %d pushes", kMaxStateCounter));
    }
    // One pass checks every piece, stamps its arrival step and sees whether the arrivals are in
    // stream order (sorted by (id, offset)): at N = 4,096 a step's pieces are 5 MB, and each
    // further pass over them cost about 1% of wlb's time.
    int64_t tokens = 0;
    bool in_stream_order = true;
    absl::Status tiled;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      Document& d = arrivals[i];
      if (d.length <= 0 || d.length > config_.context) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "document %d piece %d: length %d is outside [1, %d] (split documents longer than the "
            "context window into pieces first)",
            d.id, d.piece, d.length, config_.context));
      }
      if (d.id < 0 || d.id > kMaxStateCounter) {
        return absl::InvalidArgumentError(
            absl::StrFormat("document id %d is outside [0, %d]", d.id, kMaxStateCounter));
      }
      if (d.piece < 0 || d.piece > kMaxPieces) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "document %d: piece index %d is outside [0, %d]", d.id, d.piece, kMaxPieces));
      }
      if (d.offset < 0 || d.offset > kMaxStreamTokens) {
        return absl::InvalidArgumentError(
            absl::StrFormat("document %d piece %d: offset %d is outside [0, %d]", d.id, d.piece,
                            d.offset, kMaxStreamTokens));
      }
      // Pieces in stream order tile their documents when each tiles with the one before it (the
      // first failure is the one reported); others are sorted and checked after the loop.
      if (i > 0 && in_stream_order) {
        const Document& before = arrivals[i - 1];
        if (ByIdAndOffset(d, before)) {
          in_stream_order = false;
        } else if (before.id == d.id && tiled.ok()) {
          tiled = CheckNextPiece(before, d);
        }
      }
      d.arrival_step = pushes_;
      tokens += d.length;  // cannot overflow: each length is <= S, and a step holds few documents
    }
    if (!in_stream_order) tiled = CheckPiecesTile(arrivals);
    if (!tiled.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("arrivals: %s", tiled.message()));
    }
    // A step cut by SplitIntoSteps holds more than (N - 1) x S tokens unless the input ended in it.
    if (short_from_ < 0 && tokens <= config_.context * (config_.micro_batches - 1)) {
      short_from_ = pushes_;
    }
    ++pushes_;
    std::vector<StepPlan> steps = DoPush(std::move(arrivals));
    MarkPartial(steps);
    return steps;
  }

  // Plans everything still held into final steps; afterwards Pending() is empty. A step beyond
  // the input's steps is marked drain (steps a look-ahead or windowed packer still owed the input
  // are not).
  std::vector<StepPlan> Flush() {
    std::vector<StepPlan> steps = DoFlush();
    for (StepPlan& s : steps) s.drain = s.step >= pushes_;
    MarkPartial(steps);
    return steps;
  }

  // The documents held back (queued, carried or buffered), in a deterministic order.
  virtual std::vector<Document> Pending() const = 0;

  // How many documents and tokens Pending() holds, without copying them.
  virtual HeldBack Held() const {
    HeldBack held;
    for (const Document& d : Pending()) {
      ++held.documents;
      held.tokens += d.length;
    }
    return held;
  }

  // The identity a saved state must match: packer name, sizes and packer-specific settings.
  virtual nlohmann::json ConfigJson() const {
    return {{"packer", std::string(name())},
            {"context", config_.context},
            {"max_tokens", config_.max_tokens},
            {"micro_batches", config_.micro_batches}};
  }

  // The packer's mutable state (queues, carry-over, counters) as JSON (SaveState() holds it;
  // RestoreState() is its inverse).
  virtual nlohmann::json StateJson() const = 0;

  // The whole state as a self-checking blob: a magic line, an FNV-1a checksum of the payload,
  // then JSON holding ConfigJson(), the step counters and StateJson().
  std::string SaveState() const {
    const std::string payload = nlohmann::json{
        {"config", ConfigJson()},
        {"pushes", pushes_},
        {"next_step", next_step_},
        {"short_from", short_from_},
        {"state", StateJson()}}.dump();
    return absl::StrFormat("%s\n%016x\n%s", kStateMagic, detail::Fnv1a64(payload), payload);
  }

  // Restores a blob from SaveState(). A corrupted blob, one saved by a packer of another kind or
  // configuration, or one whose content this packer could not have produced (a piece longer than
  // S, a negative piece index, a duplicated piece, a counter out of range, ...) is rejected whole
  // with an error and leaves this packer unchanged.
  absl::Status RestoreState(std::string_view blob) {
    const size_t first = blob.find('\n');
    const size_t second = first == std::string_view::npos ? first : blob.find('\n', first + 1);
    if (second == std::string_view::npos || blob.substr(0, first) != kStateMagic) {
      return absl::DataLossError(
          absl::StrFormat("packer state: missing the '%s' header", kStateMagic));
    }
    const std::string_view checksum = blob.substr(first + 1, second - first - 1);
    const std::string_view payload = blob.substr(second + 1);
    const std::string expected = absl::StrFormat("%016x", detail::Fnv1a64(payload));
    if (checksum != expected) {
      return absl::DataLossError(absl::StrFormat(
          "packer state: checksum %s does not match the payload (%s): the blob is corrupted",
          QuoteForMessage(checksum), expected));
    }
    if (detail::JsonNestedDeeperThan(payload, kMaxJsonDepth)) {
      return absl::DataLossError(
          absl::StrFormat("packer state: payload nests deeper than %d levels", kMaxJsonDepth));
    }
    const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("config")) {
      return absl::DataLossError("packer state: payload is not a state object");
    }
    if (j["config"] != ConfigJson()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("packer state was saved by %s but this packer is %s",
                          QuoteForMessage(j["config"].dump(), 256), ConfigJson().dump()));
    }
    const nlohmann::json previous = StateJson();
    int64_t pushes = 0;
    int64_t next_step = 0;
    int64_t short_from = -1;
    const absl::Status malformed = detail::LoadStateOrError([&]() -> absl::Status {
      pushes = detail::StateInteger(j.at("pushes"), 0, kMaxStateCounter, "pushes");
      next_step = detail::StateInteger(j.at("next_step"), 0, kMaxStateCounter, "next_step");
      // short_from is a push index (or -1: no short push yet), so it is below `pushes`.
      short_from = detail::StateInteger(j.at("short_from"), -1, pushes - 1, "short_from");
      return LoadStateJson(j.at("state"));  // all-or-nothing: assigns only when it succeeds
    });
    if (!malformed.ok()) {  // nothing was loaded: this packer is unchanged
      return absl::DataLossError(
          absl::StrFormat("packer state: malformed payload (%s)", malformed.message()));
    }
    const absl::Status invalid = ValidateState(pushes, next_step);
    if (invalid.ok()) {
      pushes_ = pushes;
      next_step_ = next_step;
      short_from_ = short_from;
      return absl::OkStatus();
    }
    // Loaded but not a state this packer could have produced: put back what it held. Its own
    // state always loads (Push() accepts only what a state can hold).
    LoadStateJson(previous).IgnoreError();
    return absl::DataLossError(absl::StrFormat("packer state: %s", invalid.message()));
  }

  const PackerConfig& config() const { return config_; }
  const DocumentCost& cost() const { return cost_; }
  static constexpr std::string_view kStateMagic = "wlb-packer-state v1";

 protected:
  virtual std::vector<StepPlan> DoPush(std::vector<Document> arrivals) = 0;
  virtual std::vector<StepPlan> DoFlush() = 0;

  // Loads a StateJson() of this packer, all or nothing (implementations assign only at the end);
  // a malformed state (a missing field, a value of the wrong type or out of range) is an error
  // naming it, and nothing is loaded. Internal to RestoreState(); implementations run their
  // reading in detail::LoadStateOrError, so no exception leaves them.
  virtual absl::Status LoadStateJson(const nlohmann::json& state) = 0;

  // The one state validation of a packer: whether a just-loaded state is one this packer could
  // have produced, given `pushes` (the restored Push() count) and `next_step` (the index of the
  // next step to plan). Every override runs CheckHeldPieces() along with its own checks
  // (queue levels, orders, counters); the default runs it alone.
  virtual absl::Status ValidateState(int64_t pushes, int64_t /*next_step*/) const {
    return CheckHeldPieces(pushes);
  }

  // What every packer's state must satisfy: every held piece has a length in [1, S], arrived
  // before `pushes`, no (document, piece) is held twice, and the pieces held of each document are
  // disjoint token ranges in piece order (CheckPiecesTile). These are what Flush() needs to end
  // with plans that place every held piece exactly once.
  absl::Status CheckHeldPieces(int64_t pushes) const {
    std::vector<Document> pending = Pending();
    for (const Document& d : pending) {
      if (d.length < 1 || d.length > config_.context) {
        return absl::InvalidArgumentError(
            absl::StrFormat("document %d piece %d: length %d is outside [1, %d] (S)", d.id, d.piece,
                            d.length, config_.context));
      }
      if (d.arrival_step >= pushes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "document %d piece %d: arrival step %d is not before the %d pushes so far", d.id,
            d.piece, d.arrival_step, pushes));
      }
    }
    std::sort(pending.begin(), pending.end(), [](const Document& a, const Document& b) {
      return std::pair(a.id, a.piece) < std::pair(b.id, b.piece);
    });
    for (size_t i = 1; i < pending.size(); ++i) {
      if (pending[i].id == pending[i - 1].id && pending[i].piece == pending[i - 1].piece) {
        return absl::InvalidArgumentError(
            absl::StrFormat("document %d piece %d is held twice", pending[i].id, pending[i].piece));
      }
    }
    return CheckPiecesTile(std::move(pending));
  }

  // The pieces held of one document are parts of one tiling of it: sorted by offset, no two start
  // at the same token, none overlaps the next, piece indices increase with offsets, and pieces
  // p and p + 1 are adjacent (p + 1 starts where p ends). A subset of the pieces may be held (the
  // others were planned), so gaps between non-consecutive pieces are allowed.
  static absl::Status CheckPiecesTile(std::vector<Document> pieces) {
    std::sort(pieces.begin(), pieces.end(), ByIdAndOffset);
    for (size_t i = 1; i < pieces.size(); ++i) {
      if (absl::Status s = CheckNextPiece(pieces[i - 1], pieces[i]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  static bool ByIdAndOffset(const Document& a, const Document& b) {
    return std::pair(a.id, a.offset) < std::pair(b.id, b.offset);
  }
  // Piece b, next after a in (id, offset) order, does not break its document's tiling.
  static absl::Status CheckNextPiece(const Document& a, const Document& b) {
    if (a.id != b.id) return absl::OkStatus();
    if (a.offset == b.offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("document %d offset %d is held twice (pieces %d and %d)", a.id, a.offset,
                          a.piece, b.piece));
    }
    if (a.offset + a.length > b.offset) {
      return absl::InvalidArgumentError(
          absl::StrFormat("document %d: piece %d [%d, %d) overlaps piece %d starting at offset %d",
                          a.id, a.piece, a.offset, a.offset + a.length, b.piece, b.offset));
    }
    if (a.piece >= b.piece) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d: piece %d at offset %d comes after piece %d at offset %d (piece "
          "indices must follow offsets)",
          a.id, b.piece, b.offset, a.piece, a.offset));
    }
    if (b.piece == a.piece + 1 && b.offset != a.offset + a.length) {
      return absl::InvalidArgumentError(
          absl::StrFormat("document %d: piece %d starts at offset %d, not where piece %d ends (%d)",
                          a.id, b.piece, b.offset, a.piece, a.offset + a.length));
    }
    return absl::OkStatus();
  }

  // Wraps micro-batches into the next step, recording what is still held back.
  StepPlan MakeStep(std::vector<MicroBatch> micro_batches) {
    StepPlan plan{.step = next_step_++, .micro_batches = std::move(micro_batches)};
    const HeldBack held = Held();
    plan.held_back_documents = held.documents;
    plan.held_back_tokens = held.tokens;
    return plan;
  }

  // Appends `d` to `mb`, keeping tokens and cost current.
  void Add(MicroBatch& mb, const Document& d) const {
    mb.documents.push_back(d);
    mb.tokens += d.length;
    mb.cost += cost_(d.length);
  }

  PackerConfig config_;
  DocumentCost cost_;
  int64_t pushes_ = 0;       // Push() calls so far: the arrival step of the next arrivals
  int64_t next_step_ = 0;    // index of the next step to be planned
  int64_t short_from_ = -1;  // first push of at most (N - 1) x S tokens (-1: none yet)

 private:
  void MarkPartial(std::vector<StepPlan>& steps) const {
    for (StepPlan& s : steps) s.partial = !s.drain && short_from_ >= 0 && s.step >= short_from_;
  }
};

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
