// The one input path: where a document stream comes from and how it is cut into steps. wlb-plan,
// the bench tables and the examples all read their input through it, so the same flags give the
// same steps everywhere.
//
//   wlb::InputOptions in{.docs = "lengths.txt"};              // or "-" (stdin), or "" (sample)
//   absl::StatusOr<wlb::Input> input = wlb::LoadInput(in, /*context=*/131072, /*N=*/4);
//   // input->steps: one vector of pieces per step; input->name says where they came from
//
//   // Programs that sweep S load once and cut per S (lengths scaled by S / 128K):
//   absl::StatusOr<wlb::Lengths> base = wlb::LoadLengths(in, /*sample_tokens=*/1 << 30);
//   absl::StatusOr<wlb::Input> at_64k = wlb::CutSteps(*base, 65536, 4, {.scale_from = 131072});
//
// Cutting: lengths become pieces of at most S tokens (MakeDocuments) and a step is the next N x S
// tokens, a piece going to the step its first token lies in (SplitIntoSteps). The last step of a
// finite input is kept even when it is short: packers mark what they plan from it `partial` and
// summaries report it apart, so no document is dropped and every program sees the same steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "wlb/core/document.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/io/default_distribution.hpp"
#include "wlb/io/lengths.hpp"

namespace wlb {

// Where the lengths come from.
struct InputOptions {
  std::string docs;                      // lengths file, "-" = stdin, "" = sample `distribution`
  std::string distribution = "default";  // a name of kDistributions (default_distribution.hpp)
  uint64_t seed = 1;                     // sampling seed
  int64_t steps = 0;    // file: keep at most this many steps (0 = all); sampled: sample this many
                        // steps (0 = 100)
  bool stream = false;  // file: check and count the lengths, cut no step (CutOptions::stream)
};

// Lengths and a human-readable name of their source.
struct Lengths {
  std::string name;
  std::vector<int64_t> values;
  bool sampled = false;
  int64_t empty = 0;  // empty sequences the source held (a Megatron index's), skipped
  std::vector<int64_t> empty_positions;  // their positions in the source (rising)
};

// A stream cut into steps.
struct Input {
  std::string name;              // where it came from, for headers and messages
  std::vector<int64_t> lengths;  // the documents, as loaded (and scaled)
  int64_t tokens = 0;            // their tokens
  int64_t empty = 0;             // empty sequences skipped when the source was read
  // Their positions in the source (rising): a document's id is its source position (a piece of
  // lengths[k] has id SourceIdMap(empty_positions)(k)), so a plan names the sequence to fetch.
  std::vector<int64_t> empty_positions;
  // The loader's pieces of <= S tokens: all of them, or with max_steps those of the steps kept.
  std::vector<Document> pieces;
  std::vector<std::vector<Document>> steps;  // arrivals per step
};

// Reads `options.docs`, or samples the named distribution until `sample_tokens` tokens (at most
// kMaxStreamTokens). Errors name the file and line, or the unknown distribution; a file that holds
// no lengths is an error (nothing to plan).
inline absl::StatusOr<Lengths> LoadLengths(const InputOptions& options, int64_t sample_tokens) {
  Lengths out;
  if (!options.docs.empty()) {
    absl::StatusOr<std::vector<int64_t>> read =
        ReadLengthsFile(options.docs, &out.empty, &out.empty_positions);
    if (!read.ok()) return read.status();
    if (read->empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lengths file %s holds no document lengths: nothing to plan",
                          options.docs == "-" ? "<stdin>" : QuoteForMessage(options.docs, 256)));
    }
    out.name = options.docs == "-" ? "<stdin>" : absl::CHexEscape(options.docs);
    out.values = *std::move(read);
    return out;
  }
  if (sample_tokens < 0 || sample_tokens > kMaxStreamTokens) {
    return absl::InvalidArgumentError(absl::StrFormat("tokens to sample must be in [0, %d], got %d",
                                                      kMaxStreamTokens, sample_tokens));
  }
  std::optional<std::vector<int64_t>> sampled =
      SampleNamedLengths(options.distribution, sample_tokens, options.seed);
  if (!sampled) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown distribution %s (known: %s)",
                                                      QuoteForMessage(options.distribution),
                                                      DistributionNames()));
  }
  out.values = *std::move(sampled);
  out.name =
      absl::StrFormat("the embedded %s distribution (seed %d)", options.distribution, options.seed);
  out.sampled = true;
  return out;
}

// Cuts a corpus's lengths into steps one at a time, as MakeDocuments + SplitIntoSteps would (a
// piece goes to the step its first token lies in; a piece is at most S <= N x S tokens, so steps
// have no gaps): it holds the step being cut, never the stream's pieces. Every length must be in
// [1, kMaxStreamTokens] in at most kMaxPieces pieces (CheckStreamLengths) and S, N within their
// limits.
class StepCutter {
 public:
  // `skipped`: the source positions of sequences left out of `lengths` (Input::empty_positions),
  // so that ids name source positions.
  StepCutter(std::span<const int64_t> lengths, int64_t context, int32_t micro_batches,
             std::span<const int64_t> skipped = {})
      : lengths_(lengths),
        context_(context),
        tokens_per_step_(context * micro_batches),
        source_id_(skipped) {}

  // The next step's arrivals replace `step`'s contents; false (and `step` empty) at the end.
  bool Next(std::vector<Document>& step) {
    step.clear();
    if (doc_ >= lengths_.size()) return false;
    const int64_t index = offset_ / tokens_per_step_;
    while (doc_ < lengths_.size() && offset_ / tokens_per_step_ == index) {
      const int64_t length = std::min(context_, lengths_[doc_] - within_);
      step.push_back(Document{.id = source_id_(static_cast<int64_t>(doc_)),
                              .length = length,
                              .piece = piece_,
                              .offset = within_});
      offset_ += length;
      within_ += length;
      ++piece_;
      if (within_ == lengths_[doc_]) {
        ++doc_;
        within_ = 0;
        piece_ = 0;
      }
    }
    ++steps_;
    return true;
  }

  int64_t steps() const { return steps_; }  // steps cut so far

 private:
  std::span<const int64_t> lengths_;
  int64_t context_;
  int64_t tokens_per_step_;
  size_t doc_ = 0;      // the document the next piece belongs to
  int64_t within_ = 0;  // its first token within that document
  int32_t piece_ = 0;   // its index within that document
  int64_t offset_ = 0;  // its first token within the stream
  int64_t steps_ = 0;
  SourceIdMap source_id_;
};

// Checks that every length is in [1, kMaxStreamTokens] and splits at S = `context` into at most
// kMaxPieces pieces (the error names the document) and returns their sum, overflow-checked.
inline absl::StatusOr<int64_t> CheckStreamLengths(std::span<const int64_t> lengths,
                                                  int64_t context) {
  int64_t tokens = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    if (l <= 0) return ValidateLength(l, absl::StrFormat("document %d", i));
    if (l > kMaxStreamTokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d: length %d is above the limit of %d tokens", i, l, kMaxStreamTokens));
    }
    if ((l - 1) / context + 1 > kMaxPieces) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d: %d tokens split at S = %d make %d pieces, over the limit of %d pieces", i,
          l, context, (l - 1) / context + 1, kMaxPieces));
    }
    if (tokens > std::numeric_limits<int64_t>::max() - l) {
      return absl::InvalidArgumentError(
          absl::StrFormat("documents 0..%d hold more than 2^63 tokens", i));
    }
    tokens += l;
  }
  return tokens;
}

struct CutOptions {
  int64_t max_steps = 0;   // keep at most this many steps (0 = all)
  int64_t scale_from = 0;  // > 0: scale every length by S / scale_from first (at least 1 token)
  // Check and count the lengths (CheckStreamLengths) but cut no step: the caller cuts them one at
  // a time with StepCutter, holding one step, whatever the corpus's size.
  bool stream = false;
};

// Scales (optionally), splits into pieces of <= `context` tokens and cuts steps of N x S tokens.
// S, N and max_steps must be within wlb's limits (core/limits.hpp), and so must the stream
// (MakeDocuments, SplitIntoSteps); errors name the value and the limit. With max_steps, only the
// pieces of the first max_steps steps are made (document by document, as SplitIntoSteps would
// assign them), so a corpus of any number of documents (up to kMaxDocuments, every length in
// [1, kMaxStreamTokens]) plans its first steps with the lengths and those steps in memory.
inline absl::StatusOr<Input> CutSteps(Lengths lengths, int64_t context, int32_t micro_batches,
                                      const CutOptions& options = {}) {
  if (absl::Status s = ValidateContext(context); !s.ok()) return s;
  if (micro_batches < 1 || micro_batches > kMaxMicroBatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "micro-batches per step (N) must be in [1, %d], got %d", kMaxMicroBatches, micro_batches));
  }
  if (options.max_steps < 0 || options.max_steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_steps must be in [0, %d] (0 = all), got %d", kMaxSteps, options.max_steps));
  }
  if (options.scale_from < 0 || options.scale_from > kMaxStreamTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scale_from must be in [0, %d] (0 = no scaling), got %d", kMaxStreamTokens,
                        options.scale_from));
  }
  Input input;
  input.name = lengths.name;
  input.lengths = std::move(lengths.values);
  input.empty = lengths.empty;
  input.empty_positions = std::move(lengths.empty_positions);
  if (static_cast<int64_t>(input.lengths.size()) > kMaxDocuments) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d documents, over the limit of %d", input.lengths.size(), kMaxDocuments));
  }
  if (options.scale_from > 0) {
    for (int64_t& l : input.lengths) {
      // Lengths outside [1, kMaxStreamTokens] stay as they are, for MakeDocuments to reject; in
      // range, l x S <= 2^59 fits, and double keeps the historical rounding.
      if (l < 1 || l > kMaxStreamTokens) continue;
      l = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(l) * static_cast<double>(context) /
                                  static_cast<double>(options.scale_from)));
    }
  }
  if (options.max_steps == 0 && !options.stream) {  // the whole stream, within its limits
    absl::StatusOr<std::vector<Document>> pieces = MakeDocuments(input.lengths, context);
    if (!pieces.ok()) return pieces.status();
    input.pieces = *std::move(pieces);
    SourceIdMap source_id(input.empty_positions);
    for (Document& piece : input.pieces) piece.id = source_id(piece.id);
    absl::StatusOr<std::vector<std::vector<Document>>> steps =
        SplitIntoSteps(input.pieces, context * micro_batches);  // <= 2^36: S and N are checked
    if (!steps.ok()) return steps.status();
    input.steps = *std::move(steps);
    input.tokens = TotalTokens(input.pieces);
    return input;
  }
  // Every length is checked and counted; pieces are made for the steps kept only.
  absl::StatusOr<int64_t> tokens = CheckStreamLengths(input.lengths, context);
  if (!tokens.ok()) return tokens.status();
  input.tokens = *tokens;
  if (options.stream) return input;
  StepCutter cutter(input.lengths, context, micro_batches, input.empty_positions);
  std::vector<Document> step;
  while (static_cast<int64_t>(input.steps.size()) < options.max_steps && cutter.Next(step)) {
    input.pieces.insert(input.pieces.end(), step.begin(), step.end());
    input.steps.push_back(std::move(step));
  }
  return input;
}

// LoadLengths + CutSteps: a file is cut after `options.steps` steps (0 = all); a distribution is
// sampled for exactly `options.steps` full steps (0 = 100).
inline absl::StatusOr<Input> LoadInput(const InputOptions& options, int64_t context,
                                       int32_t micro_batches) {
  if (options.steps < 0 || options.steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "steps must be in [0, %d] (0 = all, or 100 sampled), got %d", kMaxSteps, options.steps));
  }
  const bool sample = options.docs.empty();
  const int64_t steps = sample && options.steps == 0 ? 100 : options.steps;
  int64_t sample_tokens = 0;
  if (sample) {
    if (absl::Status s = ValidateContext(context); !s.ok()) return s;
    absl::StatusOr<int64_t> tokens = StreamTokensForSteps({.context = context,
                                                           .max_tokens = DefaultMaxTokens(context),
                                                           .micro_batches = micro_batches},
                                                          steps);
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot sample %d steps of N x S = %d x %d tokens: %s", steps,
                          micro_batches, context, tokens.status().message()));
    }
    sample_tokens = *tokens;
  }
  absl::StatusOr<Lengths> lengths = LoadLengths(options, sample_tokens);
  if (!lengths.ok()) return lengths.status();
  return CutSteps(*std::move(lengths), context, micro_batches,
                  {.max_steps = steps, .stream = options.stream && !sample});
}

}  // namespace wlb
