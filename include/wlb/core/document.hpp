// Documents and micro-batches: the vocabulary every planner speaks.
//
// A document is a run of tokens that attends only to itself (causal document masking). The loader
// splits a document longer than the context window S into pieces of at most S tokens; every piece
// keeps the document's `id`, counts `piece` = 0, 1, ... and records its token `offset` inside the
// document, so (id, offset, length) names exactly which tokens a piece holds.
//
//   std::vector<int64_t> lengths = {5, 300000, 19};
//   absl::StatusOr<std::vector<wlb::Document>> docs = wlb::MakeDocuments(lengths, 131072);
//   // -> ids 0, 1, 1, 1, 2; document 1 becomes pieces of 131072, 131072 and 37856 tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// One document, or one piece of a document, in the input stream.
struct Document {
  int64_t id = 0;            // 0-based position of the document in the input.
  int64_t length = 0;        // tokens in this piece (> 0).
  int32_t piece = 0;         // index of this piece within its document.
  int64_t offset = 0;        // first token of this piece within its document.
  int64_t arrival_step = 0;  // step whose tokens this piece arrived with (set by the stream).

  friend bool operator==(const Document&, const Document&) = default;
};

// An ordered group of documents that one pipeline micro-batch trains on.
struct MicroBatch {
  std::vector<Document> documents;
  int64_t tokens = 0;  // sum of document lengths.
  double cost = 0.0;   // sum of W(d) under the packer's cost model.
};

// Returns an error naming `length` and `where` unless length > 0.
inline absl::Status ValidateLength(int64_t length, std::string_view where) {
  if (length <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: document length must be > 0, got %d", where, length));
  }
  return absl::OkStatus();
}

// Returns an error naming `context` unless it is in [1, kMaxContext].
inline absl::Status ValidateContext(int64_t context) {
  if (context < 1 || context > kMaxContext) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "context window (S) must be in [1, %d] tokens, got %d", kMaxContext, context));
  }
  return absl::OkStatus();
}

// Splits one document into pieces of at most `context` tokens and appends them to `out`. The
// document must be at most kMaxStreamTokens long and `out` may hold at most kMaxPieces pieces
// afterwards; beyond either, nothing is appended and the error names the limit.
inline absl::Status AppendPieces(int64_t id, int64_t length, int64_t context,
                                 std::vector<Document>& out) {
  if (absl::Status s = ValidateContext(context); !s.ok()) return s;
  if (length <= 0) {  // format the message only when it is needed (this runs per document)
    return ValidateLength(length, absl::StrFormat("document %d", id));
  }
  if (length > kMaxStreamTokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "document %d: length %d is above the limit of %d tokens", id, length, kMaxStreamTokens));
  }
  const int64_t pieces = (length - 1) / context + 1;
  if (pieces > kMaxPieces - static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "document %d: %d tokens split at S = %d make %d pieces, over the limit of %d pieces in "
        "one stream (%d already)",
        id, length, context, pieces, kMaxPieces, out.size()));
  }
  int32_t piece = 0;
  for (int64_t offset = 0; offset < length; offset += context, ++piece) {
    out.push_back(Document{
        .id = id, .length = std::min(context, length - offset), .piece = piece, .offset = offset});
  }
  return absl::OkStatus();
}

// Turns document lengths (ids = positions) into the loader's stream of pieces of <= context tokens.
// The stream may hold at most kMaxStreamTokens tokens in kMaxPieces pieces.
inline absl::StatusOr<std::vector<Document>> MakeDocuments(std::span<const int64_t> lengths,
                                                           int64_t context) {
  std::vector<Document> docs;
  docs.reserve(std::min<size_t>(lengths.size(), static_cast<size_t>(kMaxPieces)));
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (absl::Status s = AppendPieces(static_cast<int64_t>(i), lengths[i], context, docs);
        !s.ok()) {
      return s;
    }
    total += lengths[i];  // both <= kMaxStreamTokens: no overflow
    if (total > kMaxStreamTokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "documents 0..%d hold %d tokens, over the limit of %d tokens in one stream", i, total,
          kMaxStreamTokens));
    }
  }
  return docs;
}

// Sum of lengths.
inline int64_t TotalTokens(std::span<const Document> docs) {
  int64_t total = 0;
  for (const Document& d : docs) total += d.length;
  return total;
}

}  // namespace wlb
