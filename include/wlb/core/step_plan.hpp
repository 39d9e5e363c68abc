// The plan types every planner speaks: the packer sizes (PackerConfig), one step's plan
// (StepPlan) and what a packer holds back (HeldBack).
//
//   wlb::PackerConfig config{.context = 131072, .max_tokens = wlb::DefaultMaxTokens(131072),
//                            .micro_batches = 4};
//   if (absl::Status s = wlb::ValidateConfig(config); !s.ok()) return s;
//   // ... a packer (wlb/pack/packer.hpp) turns arrivals into wlb::StepPlan values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"

namespace wlb {

// How much a packer holds back.
struct HeldBack {
  int64_t documents = 0;
  int64_t tokens = 0;

  friend HeldBack operator+(HeldBack a, HeldBack b) {
    return {a.documents + b.documents, a.tokens + b.tokens};
  }
  friend HeldBack operator-(HeldBack a, HeldBack b) {
    return {a.documents - b.documents, a.tokens - b.tokens};
  }
};

// Sizes every packer shares.
struct PackerConfig {
  int64_t context = 131072;     // S: the fixed-length capacity, and the longest piece.
  int64_t max_tokens = 131072;  // S_max: the variable-length cap per micro-batch (>= S).
  int32_t micro_batches = 4;    // N: micro-batches per step (PP x DP).
};

// The default variable-length cap: S + S/4. Memory, not balance, sets S_max in practice (the paper
// does not state its value); a quarter of headroom over the fixed-length window is wlb's default
// everywhere (wlb-plan, the bench tables, the examples). Saturates instead of overflowing, so an
// out-of-range S is reported by ValidateConfig as such.
inline int64_t DefaultMaxTokens(int64_t context) {
  if (context <= 0) return context;
  return context + std::min(context / 4, INT64_MAX - context);
}

// Returns an error naming the bad value unless N is in [1, kMaxMicroBatches], S in
// [1, kMaxContext] and S_max in [S, kMaxMaxTokens] (so S x N <= 2^36 and nothing overflows).
inline absl::Status ValidateConfig(const PackerConfig& c) {
  if (c.micro_batches < 1 || c.micro_batches > kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrFormat("micro-batches per step (N) must be in [1, %d], got %d", kMaxMicroBatches,
                        c.micro_batches));
  }
  if (absl::Status s = ValidateContext(c.context); !s.ok()) return s;
  if (c.max_tokens > kMaxMaxTokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max tokens per micro-batch (S_max) must be <= %d, got %d", kMaxMaxTokens, c.max_tokens));
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

}  // namespace wlb
