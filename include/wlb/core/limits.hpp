// The documented upper bounds of every size wlb accepts, and the helpers that enforce them.
//
// Every bound is chosen so that each product the planners form fits in int64 with margin:
// S x N <= 2^36, W x N <= 2^16 bins, a stream holds <= 2^35 tokens in <= 2^24 pieces, so offsets,
// step counts and token sums stay far below 2^63. Inputs beyond a bound are rejected with an error
// naming the value and the bound; nothing is clamped. docs/guides/guarantees.md lists them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace wlb {

inline constexpr int64_t kMaxContext = int64_t{1} << 24;    // S: context window, tokens
inline constexpr int64_t kMaxMaxTokens = int64_t{1} << 26;  // S_max: tokens per micro-batch
inline constexpr int32_t kMaxMicroBatches = 4096;           // N: micro-batches per step
inline constexpr int32_t kMaxWindow = 4096;                 // W: fixed-greedy window, steps
inline constexpr int64_t kMaxWindowMicroBatches = int64_t{1} << 16;  // W x N: bins of one window
inline constexpr int kMaxCpSize = 4096;                              // C: context-parallel ranks
// Documents x C of one micro-batch a CP plan is made for: the balancing strategies weigh every
// document against every rank (doc-degree's and balanced-chunks' greedy steps, adaptive's
// bounds), so planning time grows with the product. At the limit adaptive plans in seconds; far
// beyond it (2^20 one-token documents at C = 4096) it took many minutes.
inline constexpr int64_t kMaxCpDocumentRanks = int64_t{1} << 26;
// Rows of one plan's token index maps (BuildShardMaps): every rank's key rows together, about
// C x tokens under per-document sharding (1 GiB of int32 at the limit).
inline constexpr int64_t kMaxShardMapRows = int64_t{1} << 28;
inline constexpr int kMaxOutlierQueues = 16;                   // outlier thresholds of wlb packers
inline constexpr int64_t kMaxStreamTokens = int64_t{1} << 35;  // tokens of one input stream
inline constexpr int64_t kMaxPieces = int64_t{1} << 24;        // documents / pieces of one stream
// Documents of one corpus read chunk by chunk (a Megatron index, PackedBatchSampler's lengths):
// never held as pieces at once, so only counts and ids (int64) and byte offsets must fit.
inline constexpr int64_t kMaxDocuments = int64_t{1} << 40;
inline constexpr int64_t kMaxSteps = int64_t{1} << 20;         // steps one run plans or samples
inline constexpr int64_t kMaxInputBytes = int64_t{1} << 31;    // one lengths or profile file
inline constexpr int kMaxJsonDepth = 64;                       // nesting of JSON inputs
inline constexpr double kMinProfileMs = 1e-6;                  // one measured latency (ms): 1 ns
inline constexpr double kMaxProfileMs = 1e7;                   // .. to 2.8 hours
inline constexpr int64_t kMaxStateCounter = int64_t{1} << 40;  // step counters and ids in a state
inline constexpr double kMinGemmTflops = 1e-3;  // wlb-plan --gemm-tflops, per GPU: 1 GFLOP/s ..
inline constexpr double kMaxGemmTflops = 1e6;   // .. to 1 EFLOP/s, so step times stay finite

// `value` for an error message: C-escaped (no raw control bytes or NULs) and cut to `max_chars`
// characters with the original size noted, so a 10 MB line never becomes a 10 MB message.
inline std::string QuoteForMessage(std::string_view value, size_t max_chars = 64) {
  const std::string escaped =
      absl::CHexEscape(absl::string_view(value.data(), std::min(value.size(), max_chars)));
  if (value.size() > max_chars) {
    return absl::StrFormat("'%s...' (%d bytes in all)", escaped, value.size());
  }
  return absl::StrFormat("'%s'", escaped);
}
// The same for Abseil's string_view (a distinct type in some Abseil builds), strings and literals.
inline std::string QuoteForMessage(absl::string_view value, size_t max_chars = 64) {
  return QuoteForMessage(std::string_view(value.data(), value.size()), max_chars);
}
inline std::string QuoteForMessage(const std::string& value, size_t max_chars = 64) {
  return QuoteForMessage(std::string_view(value), max_chars);
}
inline std::string QuoteForMessage(const char* value, size_t max_chars = 64) {
  return QuoteForMessage(std::string_view(value), max_chars);
}

}  // namespace wlb
