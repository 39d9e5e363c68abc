// The packer interface: a stream of steps' documents in, balanced micro-batches out.
//
//   wlb::PackerConfig config{.context = 131072, .max_tokens = 196608, .micro_batches = 4};
//   absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
//       wlb::MakePacker("wlb", config, *wlb::CostModelFromPreset("llama2-7b"), {});
//   for (auto& arrivals : steps) {                   // see wlb/pack/stream.hpp
//     auto ready = (*packer)->Push(std::move(arrivals));   // the steps now ready (usually one)
//   }
//   auto drained = (*packer)->Flush();               // everything still held, as final steps
//
// Packers are stateful: outlier queues and carry-over live between steps, and SaveState() /
// RestoreState() carry them across a checkpoint exactly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"
#include "wlb/cost/document_cost.hpp"

namespace wlb {

// How much a packer holds back.
struct HeldBack {
  int64_t documents = 0;
  int64_t tokens = 0;
};

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
inline Document DocumentFromState(const nlohmann::json& j) {
  if (!j.is_array() || j.size() != 5) {
    throw nlohmann::json::type_error::create(302, "document entry is not a 5-element array", &j);
  }
  Document d{.id = j[0].get<int64_t>(),
             .length = j[1].get<int64_t>(),
             .piece = j[2].get<int32_t>(),
             .offset = j[3].get<int64_t>(),
             .arrival_step = j[4].get<int64_t>()};
  if (d.length <= 0 || d.id < 0 || d.offset < 0) {
    throw nlohmann::json::out_of_range::create(401, "document entry out of range", &j);
  }
  return d;
}
inline nlohmann::json DocumentsState(const std::vector<Document>& docs) {
  nlohmann::json a = nlohmann::json::array();
  for (const Document& d : docs) a.push_back(DocumentState(d));
  return a;
}
// Adds `docs` to a held-back count.
inline void AddHeld(const std::vector<Document>& docs, HeldBack& held) {
  held.documents += static_cast<int64_t>(docs.size());
  for (const Document& d : docs) held.tokens += d.length;
}
inline std::vector<Document> DocumentsFromState(const nlohmann::json& j) {
  std::vector<Document> docs;
  for (const nlohmann::json& e : j) docs.push_back(DocumentFromState(e));
  return docs;
}
}  // namespace detail

// Sizes every packer shares.
struct PackerConfig {
  int64_t context = 131072;     // S: the fixed-length capacity, and the longest piece.
  int64_t max_tokens = 131072;  // S_max: the variable-length cap per micro-batch (>= S).
  int32_t micro_batches = 4;    // N: micro-batches per step (PP x DP).
};

// The default variable-length cap: S + S/4. Memory, not balance, sets S_max in practice (the paper
// does not state its value); a quarter of headroom over the fixed-length window is wlb's default
// everywhere (wlb-plan, the bench tables, the examples).
inline int64_t DefaultMaxTokens(int64_t context) { return context + context / 4; }

// Returns an error naming the bad value unless N >= 1, S >= 1 and S_max >= S.
inline absl::Status ValidateConfig(const PackerConfig& c) {
  if (c.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("micro-batches per step (N) must be >= 1, got %d", c.micro_batches));
  }
  if (c.context < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("context window (S) must be >= 1 token, got %d", c.context));
  }
  if (c.max_tokens < c.context) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max tokens per micro-batch (S_max) %d is below the context window (S) %d",
                        c.max_tokens, c.context));
  }
  return absl::OkStatus();
}

// One step's plan: N micro-batches.
struct StepPlan {
  int64_t step = 0;  // 0-based index of the training step.
  std::vector<MicroBatch> micro_batches;
  int64_t held_back_documents = 0;  // what the packer still holds after planning this step
  int64_t held_back_tokens = 0;
  bool drain = false;  // produced by Flush() beyond the input's steps (leftovers only)
  // Planned for a step whose arrivals held at most (N - 1) x S tokens, or after it: the short last
  // step of a finite input (SplitIntoSteps gives every other step more). Summaries report it
  // apart, like drain steps.
  bool partial = false;
};

// A stateful packer. Push() validates before it changes any state: on error nothing happened.
class Packer {
 public:
  Packer(PackerConfig config, DocumentCost cost) : config_(config), cost_(std::move(cost)) {}
  virtual ~Packer() = default;

  // The packer's name as wlb-plan's --packer spells it.
  virtual std::string_view name() const = 0;

  // Consumes one step of arrivals (pieces of <= S tokens, in stream order) and returns the steps
  // that became ready: one for most packers, W at every W-th call for a window of W steps.
  absl::StatusOr<std::vector<StepPlan>> Push(std::vector<Document> arrivals) {
    for (const Document& d : arrivals) {
      if (d.length <= 0 || d.length > config_.context) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "document %d piece %d: length %d is outside [1, %d] (split documents longer than the "
            "context window into pieces first)",
            d.id, d.piece, d.length, config_.context));
      }
    }
    int64_t tokens = 0;
    for (Document& d : arrivals) {
      d.arrival_step = pushes_;
      tokens += d.length;  // cannot overflow: each length is <= S, and a step holds few documents
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

  // The packer's mutable state (queues, carry-over, counters) as JSON, and its inverse. LoadState
  // may throw nlohmann::json::exception on malformed input; RestoreState() turns that into a
  // Status.
  virtual nlohmann::json StateJson() const = 0;
  virtual void LoadStateJson(const nlohmann::json& state) = 0;

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

  // Restores a blob from SaveState(). A corrupted blob, or one saved by a packer of another kind
  // or configuration, is rejected with an error and leaves this packer unchanged.
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
          checksum, expected));
    }
    const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("config")) {
      return absl::DataLossError("packer state: payload is not a state object");
    }
    if (j["config"] != ConfigJson()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("packer state was saved by %s but this packer is %s", j["config"].dump(),
                          ConfigJson().dump()));
    }
    try {
      const int64_t pushes = j.at("pushes").get<int64_t>();
      const int64_t next_step = j.at("next_step").get<int64_t>();
      const int64_t short_from = j.at("short_from").get<int64_t>();
      if (short_from < -1 || short_from >= pushes) {
        return absl::DataLossError(absl::StrFormat(
            "packer state: short_from %d is outside [-1, %d) (pushes)", short_from, pushes));
      }
      LoadStateJson(j.at("state"));  // all-or-nothing: implementations assign only at the end
      pushes_ = pushes;
      next_step_ = next_step;
      short_from_ = short_from;
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(absl::StrFormat("packer state: malformed payload (%s)", e.what()));
    }
    return absl::OkStatus();
  }

  const PackerConfig& config() const { return config_; }
  const DocumentCost& cost() const { return cost_; }
  static constexpr std::string_view kStateMagic = "wlb-packer-state v1";

 protected:
  virtual std::vector<StepPlan> DoPush(std::vector<Document> arrivals) = 0;
  virtual std::vector<StepPlan> DoFlush() = 0;

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

// Orders documents longest first; ties stay in stream order so the order is deterministic. A
// stable LSD radix sort on (longest - length), 8 bits a pass (3 passes at S = 128K), then each
// document moved once: about three times as fast as comparison sorting 2,000 documents.
inline void SortLongestFirst(std::vector<Document>& docs) {
  const size_t n = docs.size();
  if (n < 2) return;
  int64_t longest = 0;
  for (const Document& d : docs) longest = std::max(longest, d.length);
  std::vector<size_t> order(n), next(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  const auto key = [&](size_t i) { return static_cast<uint64_t>(longest - docs[i].length); };
  for (int shift = 0; shift < 64 && (static_cast<uint64_t>(longest) >> shift) != 0; shift += 8) {
    size_t count[257] = {};
    for (size_t i : order) ++count[((key(i) >> shift) & 0xff) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (size_t i : order) next[count[(key(i) >> shift) & 0xff]++] = i;
    order.swap(next);
  }
  std::vector<Document> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(docs[i]);
  docs.swap(sorted);
}

}  // namespace wlb
