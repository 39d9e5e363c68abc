// The JSON form of a packing plan, as wlb-plan --format=json writes it, and its one writer.
//
//   // The document as a tree: {"pending": [...], "steps": [...]}.
//   nlohmann::json j = wlb::PlanToJson(run.steps, packer->Pending(), cost);
//
//   // The same document, with a summary, as text (exactly its dump(1)), written a step at a time
//   // so that a long run never holds it whole (wlb-plan; its hook adds the CP shard plans):
//   wlb::PlanJsonWriter writer([&](std::string_view text) { return out.Write(text); }, cost);
//   absl::Status s = writer.Pending(packer->Pending());
//   for (const wlb::StepPlan& step : steps) if (s.ok()) s = writer.Step(step);
//   if (s.ok()) s = writer.Summary(wlb::SummaryToJson(summary));
//
// {"pending": [{"id", "length", "piece", "offset", "arrival_step"}],
//  "steps": [{"step", "drain", "partial", "micro_batches": [{"documents", "tokens", "cost"}],
//             "imbalance", "lower_bound", "cap_lower_bound", "held_back_documents",
//             "held_back_tokens"}],
//  "summary": {SummaryToJson's keys, and what the caller adds}}
// "cap_lower_bound" (CapLowerBound) appears when the caller passes S_max (max_tokens > 0). Keys are
// in nlohmann's order (sorted), in the tree and in the text.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "wlb/metrics/imbalance.hpp"

namespace wlb {

inline nlohmann::json DocumentToJson(const Document& d) {
  return {{"id", d.id},
          {"length", d.length},
          {"piece", d.piece},
          {"offset", d.offset},
          {"arrival_step", d.arrival_step}};
}

inline nlohmann::json MicroBatchToJson(const MicroBatch& mb) {
  nlohmann::json docs = nlohmann::json::array();
  for (const Document& d : mb.documents) docs.push_back(DocumentToJson(d));
  return {{"documents", std::move(docs)}, {"tokens", mb.tokens}, {"cost", mb.cost}};
}

inline nlohmann::json StepToJson(const StepPlan& s, const DocumentCost& cost,
                                  int64_t max_tokens = 0) {
  nlohmann::json mbs = nlohmann::json::array();
  for (const MicroBatch& mb : s.micro_batches) mbs.push_back(MicroBatchToJson(mb));
  nlohmann::json j = {{"step", s.step},
                      {"drain", s.drain},
                      {"partial", s.partial},
                      {"micro_batches", std::move(mbs)},
                      {"imbalance", ImbalanceDegree(s.micro_batches)},
                      {"lower_bound", LowerBound(s.micro_batches, cost)},
                      {"held_back_documents", s.held_back_documents},
                      {"held_back_tokens", s.held_back_tokens}};
  if (max_tokens > 0) j["cap_lower_bound"] = CapLowerBound(s.micro_batches, cost, max_tokens);
  return j;
}

inline nlohmann::json SummaryToJson(const StreamSummary& s) {
  return {{"steps", s.steps},
          {"drain_steps", s.drain_steps},
          {"partial_steps", s.partial_steps},
          {"partial_imbalance_max", s.partial_imbalance_max},
          {"imbalance_mean", s.imbalance_mean},
          {"imbalance_p90", s.imbalance_p90},
          {"imbalance_p99", s.imbalance_p99},
          {"imbalance_max", s.imbalance_max},
          {"lower_bound_mean", s.lower_bound_mean},
          {"cap_lower_bound_mean", s.cap_lower_bound_mean},
          {"delay_mean", s.delay.mean},
          {"delay_p99", s.delay.p99},
          {"delay_max", s.delay.max}};
}

// Writes the plan document in its order: Pending, then each Step, then Summary. To a sink, as the
// text nlohmann::json::dump(1) of the whole document would be, or into a tree (PlanToJson).
class PlanJsonWriter {
 public:
  // Takes the next piece of the text; a non-OK status names what failed (a full disk, ...).
  using Sink = std::function<absl::Status(std::string_view text)>;
  // Adds keys to a step's JSON before it is written (wlb-plan: each micro-batch's CP shard plan).
  using StepHook = std::function<absl::Status(const StepPlan& step, nlohmann::json& step_json)>;

  PlanJsonWriter(Sink sink, DocumentCost cost, int64_t max_tokens = 0, StepHook hook = {})
      : sink_(std::move(sink)), cost_(std::move(cost)), max_tokens_(max_tokens), hook_(std::move(hook)) {}
  PlanJsonWriter(nlohmann::json* tree, DocumentCost cost, int64_t max_tokens = 0,
                 StepHook hook = {})
      : tree_(tree), cost_(std::move(cost)), max_tokens_(max_tokens), hook_(std::move(hook)) {}

  // First: the documents still pending at the end of the run (none after a flush).
  absl::Status Pending(std::span<const Document> pending) {
    if (absl::Status s = Next(Phase::kPending, Phase::kSteps, "Pending"); !s.ok()) return s;
    nlohmann::json docs = nlohmann::json::array();
    for (const Document& d : pending) docs.push_back(DocumentToJson(d));
    if (tree_ != nullptr) {
      (*tree_)["pending"] = std::move(docs);
      (*tree_)["steps"] = nlohmann::json::array();
      return absl::OkStatus();
    }
    return Write(absl::StrCat("{\n \"pending\": ", Nested(docs, 1), ",\n \"steps\": "));
  }

  absl::Status Step(const StepPlan& step) {
    if (absl::Status s = Next(Phase::kSteps, Phase::kSteps, "Step"); !s.ok()) return s;
    nlohmann::json j = StepToJson(step, cost_, max_tokens_);
    if (hook_) {
      if (absl::Status s = hook_(step, j); !s.ok()) return s;
    }
    const bool first = steps_++ == 0;
    if (tree_ != nullptr) {
      (*tree_)["steps"].push_back(std::move(j));
      return absl::OkStatus();
    }
    return Write(absl::StrCat(first ? "[\n  " : ",\n  ", Nested(j, 2)));
  }

  // Last: closes the steps and the document.
  absl::Status Summary(const nlohmann::json& summary) {
    if (absl::Status s = Next(Phase::kSteps, Phase::kDone, "Summary"); !s.ok()) return s;
    if (tree_ != nullptr) {
      (*tree_)["summary"] = summary;
      return absl::OkStatus();
    }
    return Write(absl::StrCat(steps_ == 0 ? "[]" : "\n ]", ",\n \"summary\": ", Nested(summary, 1),
                              "\n}\n"));
  }

 private:
  enum class Phase { kPending, kSteps, kDone };

  // The first sink failure, or an error for a call out of order; else moves on to `next`.
  absl::Status Next(Phase expected, Phase next, std::string_view call) {
    if (!status_.ok()) return status_;
    if (phase_ != expected) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "PlanJsonWriter::%s out of order (Pending, then each Step, then Summary)", call));
    }
    phase_ = next;
    return absl::OkStatus();
  }

  absl::Status Write(std::string_view text) { return status_ = sink_(text); }

  // `value`.dump(1) as it reads `depth` levels deep in the dump(1) of the whole document (a JSON
  // string holds no raw newline, so each newline starts a line of the value).
  static std::string Nested(const nlohmann::json& value, int depth) {
    return absl::StrReplaceAll(value.dump(1),
                               {{"\n", "\n" + std::string(static_cast<size_t>(depth), ' ')}});
  }

  Sink sink_;
  nlohmann::json* tree_ = nullptr;
  DocumentCost cost_;  // by value: a CostModel argument converts to a temporary
  int64_t max_tokens_;
  StepHook hook_;
  Phase phase_ = Phase::kPending;
  int64_t steps_ = 0;
  absl::Status status_;
};

// The document as a tree, without "summary" (callers may add one): what PlanJsonWriter writes.
inline nlohmann::json PlanToJson(std::span<const StepPlan> steps, std::span<const Document> pending,
                                 const DocumentCost& cost, int64_t max_tokens = 0) {
  nlohmann::json j;
  PlanJsonWriter writer(&j, cost, max_tokens);
  writer.Pending(pending).IgnoreError();  // building a tree in order cannot fail
  for (const StepPlan& s : steps) writer.Step(s).IgnoreError();
  return j;
}

}  // namespace wlb
