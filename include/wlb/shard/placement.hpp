// Another balancer's placement, scored by wlb's CP model: PredictCpOfPlacement prices a placement
// given as the rank of every packed token (the permutation of PyTorch's context-parallel load
// balancers cut into C equal runs, a dispatch solver's chunk owners), so that it meets
// PlanShards' plans under one truth (PredictCp: attention from the kernel model plus the K/V
// exchange ChooseExchange picks over the link).
//
//   std::vector<int64_t> owner(mb.tokens);  // owner[t]: the rank holding packed token t
//   absl::StatusOr<wlb::CpPrediction> p =
//       wlb::PredictCpOfPlacement(mb, /*cp_size=*/8, owner, wlb::KernelModel::Default(), {});
//   // p->max_ms: its slowest rank, as adaptive ranks its candidates (without a packed-call fit)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/plan_builder.hpp"
#include "wlb/shard/shard_types.hpp"

namespace wlb {
namespace detail {

// The plan of a placement of the documents laid out from `starts` (CheckMicroBatch's): a rank's
// consecutive tokens of one document are one segment, its segments in packed order. A placement
// is no registered strategy, so the plan records per-seq (PredictCp reads only its segments and
// capacity, the largest rank's tokens). Errors: an owner count other than the micro-batch's
// tokens, an owner outside [0, cp_size), more than kMaxCpDocumentRanks segments, and
// PlanBuilder's.
inline absl::StatusOr<ShardPlan> PlanOfPlacement(const MicroBatch& mb,
                                                 const std::vector<int64_t>& starts, int cp_size,
                                                 std::span<const int64_t> owner) {
  const int64_t tokens = starts.back();
  if (static_cast<int64_t>(owner.size()) != tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "placement: %d owners for a micro-batch of %d tokens (one rank per packed token)",
        owner.size(), tokens));
  }
  // Segments: runs of one rank within a document, as many as a plan of documents x C pieces
  // may have (kMaxCpDocumentRanks), so a scattered placement is an error before it is built.
  int64_t segments = 0;
  for (size_t t = 0, doc_end = 0, i = 0; t < owner.size(); ++t) {
    if (owner[t] < 0 || owner[t] >= cp_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "placement: token %d is on rank %d, outside [0, %d)", t, owner[t], cp_size));
    }
    const bool starts_document = t == doc_end;
    if (starts_document) doc_end = static_cast<size_t>(starts[++i]);
    segments += starts_document || owner[t] != owner[t - 1];
  }
  if (segments > kMaxCpDocumentRanks) {
    return absl::OutOfRangeError(absl::StrFormat(
        "placement: %d segments (runs of one rank within a document), over the limit %d "
        "(kMaxCpDocumentRanks, what a plan of documents x C pieces may have)",
        segments, kMaxCpDocumentRanks));
  }
  PlanBuilder b(mb, starts, cp_size, static_cast<size_t>(segments));
  for (size_t i = 0; i < mb.documents.size(); ++i) {
    for (int64_t begin = starts[i]; begin < starts[i + 1];) {
      int64_t end = begin + 1;
      while (end < starts[i + 1] && owner[static_cast<size_t>(end)] ==
                                        owner[static_cast<size_t>(begin)]) {
        ++end;
      }
      b.Add(static_cast<int>(owner[static_cast<size_t>(begin)]), static_cast<int64_t>(i),
            begin - starts[i], end - starts[i]);
      begin = end;
    }
  }
  return b.Finish(ShardStrategy("per-seq"), ShardStrategy("per-seq"), cp_size, -1);
}

}  // namespace detail

// PredictCp of the placement that puts packed token t of `mb` on rank owner[t] (owner.size() ==
// mb.tokens, every owner in [0, cp_size)): a rank's consecutive tokens of one document are one
// segment, and its buffer holds the largest rank's tokens. Errors as PlanShards (the micro-batch,
// C, the options), and for a bad placement an error naming the token and its rank.
inline absl::StatusOr<CpPrediction> PredictCpOfPlacement(const MicroBatch& mb, int cp_size,
                                                         std::span<const int64_t> owner,
                                                         const KernelModel& model,
                                                         const CpPlanOptions& options) {
  absl::StatusOr<std::vector<int64_t>> starts = detail::CheckMicroBatch(mb, cp_size);
  if (!starts.ok()) return starts.status();
  if (absl::Status s = ValidateCpPlanOptions(options); !s.ok()) return s;
  absl::StatusOr<ShardPlan> plan = detail::PlanOfPlacement(mb, *starts, cp_size, owner);
  if (!plan.ok()) return plan.status();
  return PredictCp(*plan, model, options);
}

}  // namespace wlb
