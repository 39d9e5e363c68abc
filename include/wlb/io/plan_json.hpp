// The JSON form of a packing plan, as wlb-plan --format=json writes it.
//
//   nlohmann::json j = wlb::PlanToJson(run.steps, packer->Pending(), cost);
//   j["summary"] = ...;  // wlb-plan adds the summary (docs/guides/cli.md, "JSON output")
//
// {"steps": [{"step", "drain", "partial", "micro_batches": [{"documents": [{"id", "length",
//   "piece", "offset", "arrival_step"}], "tokens", "cost"}], "imbalance", "lower_bound",
//   "cap_lower_bound", "held_back_documents", "held_back_tokens"}],
//  "pending": [{"id", "length", "piece", ...}]}
// "cap_lower_bound" (CapLowerBound) appears when the caller passes S_max (max_tokens > 0).
#pragma once

#include <span>

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
          {"imbalance_max", s.imbalance_max},
          {"lower_bound_mean", s.lower_bound_mean},
          {"cap_lower_bound_mean", s.cap_lower_bound_mean},
          {"delay_mean", s.delay.mean},
          {"delay_p99", s.delay.p99},
          {"delay_max", s.delay.max}};
}

// Steps and what is still pending (empty after a flush); the caller adds "summary".
inline nlohmann::json PlanToJson(std::span<const StepPlan> steps, std::span<const Document> pending,
                                 const DocumentCost& cost, int64_t max_tokens = 0) {
  nlohmann::json j;
  j["steps"] = nlohmann::json::array();
  for (const StepPlan& s : steps) j["steps"].push_back(StepToJson(s, cost, max_tokens));
  j["pending"] = nlohmann::json::array();
  for (const Document& d : pending) j["pending"].push_back(DocumentToJson(d));
  return j;
}

}  // namespace wlb
