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
#include "wlb/pack/packer_state.hpp"

namespace wlb {

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

}  // namespace wlb
