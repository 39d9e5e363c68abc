// Reading document lengths: one integer per line, or a JSON array of integers.
//
//   absl::StatusOr<std::vector<int64_t>> lengths = wlb::ReadLengthsFile("docs.txt");  // "-" =
//   stdin absl::StatusOr<std::vector<int64_t>> same = wlb::ParseLengths("[5, 19, 8]", "inline");
//
// Every length must be a positive integer; the first bad one is an error naming its line (text
// format) or array index (JSON) and its value, escaped and cut short. Blank lines and lines
// starting with '#' are skipped. JSON must be one flat array (nesting is rejected at once).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "wlb/core/limits.hpp"
#include "wlb/io/megatron_index.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

namespace detail {
// Reads a flat JSON array of integers event by event: nothing is built or echoed whole, and the
// first nested value, non-integer or non-positive element stops the parse (so input nested
// 100,000 deep costs one event, not a recursion per level).
class LengthsSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit LengthsSax(std::vector<int64_t>& lengths) : lengths_(lengths) {}

  bool null() override { return Bad("null"); }
  bool boolean(bool v) override { return Bad(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (v <= 0) return Bad(absl::StrFormat("%d", v));
    return Add(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (v == 0 || v > static_cast<number_unsigned_t>(INT64_MAX)) {
      return Bad(absl::StrFormat("%d", v));
    }
    return Add(static_cast<int64_t>(v));
  }
  bool number_float(number_float_t, const string_t& text) override {
    return Bad(QuoteForMessage(text));
  }
  bool string(string_t& v) override {
    return Bad(absl::StrFormat("the string \"%s\"", absl::CHexEscape(v.substr(0, 64))));
  }
  bool binary(binary_t&) override { return Bad("binary data"); }
  bool start_object(std::size_t) override { return Bad("an object"); }
  bool key(string_t&) override { return false; }
  bool end_object() override { return false; }
  bool start_array(std::size_t) override {
    if (depth_ > 0) return Bad("a nested array");
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception&) override {
    if (error_.empty()) {
      error_ = absl::StrFormat(
          "not a valid JSON array of document lengths (syntax error at byte %d)", position);
    }
    return false;
  }

  // Empty when the array was read; else what went wrong.
  const std::string& error() const { return error_; }

 private:
  bool Add(int64_t v) {
    if (depth_ != 1) return Bad(absl::StrFormat("%d", v));
    if (static_cast<int64_t>(lengths_.size()) >= kMaxDocuments) {
      error_ =
          absl::StrFormat("more than %d document lengths (the limit of one input)", kMaxDocuments);
      return false;
    }
    lengths_.push_back(v);
    return true;
  }
  bool Bad(const std::string& what) {
    if (depth_ != 1) {
      error_ = "not a valid JSON array of document lengths (the top level must be one array)";
    } else {
      error_ = absl::StrFormat("element %d is %s, expected a positive integer length",
                               lengths_.size(), what);
    }
    return false;
  }

  std::vector<int64_t>& lengths_;
  int depth_ = 0;
  std::string error_;
};
}  // namespace detail

// Parses `text` (from `source`, used in messages) into document lengths. At most kMaxDocuments
// lengths; each length is only checked to be positive here (MakeDocuments bounds it).
inline absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text,
                                                         absl::string_view source) {
  std::vector<int64_t> lengths;
  absl::string_view body = absl::StripLeadingAsciiWhitespace(text);
  if (!body.empty() && body.front() == '[') {
    // The JSON lexer takes a NUL for the end of input and would silently drop what follows.
    if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: a NUL byte at byte %d; a JSON lengths file is text", source, nul));
    }
    detail::LengthsSax sax(lengths);
    const bool ok = nlohmann::json::sax_parse(body, &sax);
    if (!ok || !sax.error().empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s", source,
          sax.error().empty() ? "not a valid JSON array of document lengths" : sax.error()));
    }
    return lengths;
  }
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    absl::string_view value = absl::StripAsciiWhitespace(line);
    if (value.empty() || value.front() == '#') continue;
    int64_t length = 0;
    if (!absl::SimpleAtoi(value, &length) || length <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: %s is not a positive integer length", source, line_number,
                          QuoteForMessage(value)));
    }
    if (static_cast<int64_t>(lengths.size()) >= kMaxDocuments) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: more than %d document lengths (the limit of one input)", source,
                          line_number, kMaxDocuments));
    }
    lengths.push_back(length);
  }
  return lengths;
}

// Maps the position of a kept length (ReadLengthsFile) to the source's sequence index, given the
// rising source positions of the sequences skipped: positions must be asked in rising order
// (constant time each, amortised).
class SourceIdMap {
 public:
  explicit SourceIdMap(std::span<const int64_t> skipped) : skipped_(skipped) {}
  int64_t operator()(int64_t kept) {
    // skipped_[next_] lies before the kept sequence when it is at most kept + (skips so far).
    while (next_ < skipped_.size() && skipped_[next_] <= kept + static_cast<int64_t>(next_)) {
      ++next_;
    }
    return kept + static_cast<int64_t>(next_);
  }

 private:
  std::span<const int64_t> skipped_;
  size_t next_ = 0;
};

// Appends the non-zero lengths of `chunk` (sequences `first_position`, ... of a source) to `kept`
// and, when given, the positions of the empty ones (they hold no token to plan) to `skipped`.
inline void AppendNonEmpty(std::span<const int64_t> chunk, int64_t first_position,
                           std::vector<int64_t>& kept, std::vector<int64_t>* skipped) {
  for (size_t i = 0; i < chunk.size(); ++i) {
    if (chunk[i] != 0) {
      kept.push_back(chunk[i]);
    } else if (skipped != nullptr) {
      skipped->push_back(first_position + static_cast<int64_t>(i));
    }
  }
}

// Reads lengths from a file, or from standard input when `path` is "-" (see ReadInputFile for
// the checks on the file itself). A path ending in ".idx" is a Megatron-LM index: its sequence
// lengths (megatron_index.hpp), read chunk by chunk from a regular file (any number of sequences
// up to kMaxDocuments, held as the int64 lengths only), its empty sequences dropped and counted
// in `*empty` (when given), their positions in the index (rising) stored in `*empty_positions`
// (when given): the k-th length returned is sequence SourceIdMap(positions)(k) of the index, the
// id a plan must name for a trainer to fetch its tokens.
inline absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(
    const std::string& path, int64_t* empty = nullptr,
    std::vector<int64_t>* empty_positions = nullptr) {
  if (empty != nullptr) *empty = 0;
  if (empty_positions != nullptr) empty_positions->clear();
  const auto drop_empty = [&](std::vector<int64_t>& lengths, int64_t first_position,
                              std::span<const int64_t> chunk) {
    AppendNonEmpty(chunk, first_position, lengths, empty_positions);
  };
  if (path.size() > 4 && path.ends_with(".idx")) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {  // a pipe or device: read it whole
      absl::StatusOr<MegatronIndex> index = ReadMegatronIndex(path);
      if (!index.ok()) return index.status();
      std::vector<int64_t> lengths;
      lengths.reserve(index->sequence_lengths.size());
      drop_empty(lengths, 0, index->sequence_lengths);
      if (empty != nullptr) *empty = index->empty_sequences;
      return lengths;
    }
    absl::StatusOr<MegatronLengthReader> reader = MegatronLengthReader::Open(path);
    if (!reader.ok()) return reader.status();
    std::vector<int64_t> lengths;
    lengths.reserve(static_cast<size_t>(reader->header().sequences));
    std::vector<int64_t> chunk;
    int64_t position = 0;
    while (true) {
      if (absl::Status s = reader->Next(size_t{1} << 20, chunk); !s.ok()) return s;
      if (chunk.empty()) break;
      drop_empty(lengths, position, chunk);
      position += static_cast<int64_t>(chunk.size());
    }
    lengths.shrink_to_fit();
    if (empty != nullptr) *empty = reader->empty_sequences();
    return lengths;
  }
  absl::StatusOr<std::string> text = ReadInputFile(path, "lengths file");
  if (!text.ok()) return text.status();
  return ParseLengths(*text, path == "-" ? "<stdin>" : absl::CHexEscape(path));
}

}  // namespace wlb
