// The varlen layout of a packed micro-batch: what FlashAttention's varlen functions and a model's
// rotary embedding take.
//
//   absl::StatusOr<std::vector<int32_t>> cu = wlb::CuSeqlens(mb);  // {0, l0, l0 + l1, ...}
//   std::vector<int64_t> pos = wlb::PositionIds(mb);                // 0..l0-1, 0..l1-1, ...
//
// The packed micro-batch is its pieces concatenated in order, no padding between them. Every
// piece attends only to itself (causal document masking) and counts positions from 0: the loader
// trains each piece as its own sequence (see wlb/shard/shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"

namespace wlb {

// Prefix sums of the piece lengths, from 0 (documents + 1 entries). OutOfRange when the packed
// micro-batch exceeds int32 (what varlen kernels take); InvalidArgument for a length <= 0.
inline absl::StatusOr<std::vector<int32_t>> CuSeqlens(const MicroBatch& mb) {
  std::vector<int32_t> cu;
  cu.reserve(mb.documents.size() + 1);
  cu.push_back(0);
  int64_t total = 0;
  for (const Document& d : mb.documents) {
    if (d.length <= 0) return ValidateLength(d.length, absl::StrFormat("document %d", d.id));
    total += d.length;
    if (total > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrFormat(
          "packed micro-batch reaches %d tokens at document %d; cu_seqlens must fit int32 (max %d)",
          total, d.id, std::numeric_limits<int32_t>::max()));
    }
    cu.push_back(static_cast<int32_t>(total));
  }
  return cu;
}

// The position of every packed token inside its piece: 0..length-1 for each piece in order.
inline std::vector<int64_t> PositionIds(const MicroBatch& mb) {
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(std::max<int64_t>(mb.tokens, 0)));
  for (const Document& d : mb.documents) {
    for (int64_t i = 0; i < d.length; ++i) pos.push_back(i);
  }
  return pos;
}

}  // namespace wlb
