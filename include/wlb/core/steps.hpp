// Cutting the input stream into steps of N x S tokens.
//
//   auto pieces = wlb::MakeDocuments(lengths, S);                 // split at the context window
//   auto arrivals = wlb::SplitIntoSteps(*pieces, N * S);          // StatusOr: one vector per step
//   // each step's arrivals go to a packer's Push() (wlb/pack/packer.hpp, wlb/pack/stream.hpp)
//
// A step is the next N x S tokens of the stream. A piece belongs to the step in which its first
// token lies: a piece straddling the boundary goes wholly to the earlier step, so a step's arrivals
// hold more than N x S - S tokens (fewer only at the end of input) and less than N x S + S.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/step_plan.hpp"

namespace wlb {

// Tokens of `steps` whole steps of N x S tokens: what to sample for that many steps. An error
// names the value unless steps is in [1, kMaxSteps] and the product is at most kMaxStreamTokens.
inline absl::StatusOr<int64_t> StreamTokensForSteps(const PackerConfig& config, int64_t steps) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (steps < 1 || steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrFormat("steps must be in [1, %d], got %d", kMaxSteps, steps));
  }
  const int64_t step_tokens = config.context * config.micro_batches;  // <= 2^36
  if (steps > kMaxStreamTokens / step_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d steps of S x N = %d tokens exceed the limit of %d tokens in one stream (at most %d "
        "steps at this S and N)",
        steps, step_tokens, kMaxStreamTokens, kMaxStreamTokens / step_tokens));
  }
  return steps * step_tokens;
}

// Groups pieces (in stream order) into steps of `tokens_per_step` tokens by their first token.
// Errors name the value unless tokens_per_step is in [1, kMaxContext x kMaxMicroBatches] and every
// piece has a length in [1, kMaxContext] (at most kMaxPieces pieces).
inline absl::StatusOr<std::vector<std::vector<Document>>> SplitIntoSteps(
    std::span<const Document> pieces, int64_t tokens_per_step) {
  constexpr int64_t kMaxStepTokens = kMaxContext * kMaxMicroBatches;
  if (tokens_per_step < 1 || tokens_per_step > kMaxStepTokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokens per step (S x N) must be in [1, %d], got %d", kMaxStepTokens, tokens_per_step));
  }
  if (static_cast<int64_t>(pieces.size()) > kMaxPieces) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pieces are over the limit of %d in one stream", pieces.size(), kMaxPieces));
  }
  int64_t total = 0;  // <= kMaxPieces x kMaxContext = 2^48
  for (const Document& d : pieces) {
    if (d.length < 1 || d.length > kMaxContext) {
      return absl::InvalidArgumentError(
          absl::StrFormat("document %d piece %d: length %d is outside [1, %d]", d.id, d.piece,
                          d.length, kMaxContext));
    }
    total += d.length;
  }
  // Pieces longer than a step leave empty steps between them; bound them like pieces.
  if (total > 0 && (total - 1) / tokens_per_step >= kMaxPieces) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d tokens in steps of %d make more than %d steps", total, tokens_per_step, kMaxPieces));
  }
  std::vector<std::vector<Document>> steps;
  int64_t offset = 0;
  for (const Document& d : pieces) {
    const size_t step = static_cast<size_t>(offset / tokens_per_step);
    if (steps.size() <= step) steps.resize(step + 1);
    steps[step].push_back(d);
    offset += d.length;
  }
  return steps;
}

}  // namespace wlb
