// Reading document lengths: one integer per line, or a JSON array of integers.
//
//   absl::StatusOr<std::vector<int64_t>> lengths = wlb::ReadLengthsFile("docs.txt");  // "-" = stdin
//   absl::StatusOr<std::vector<int64_t>> same = wlb::ParseLengths("[5, 19, 8]", "inline");
//
// Every length must be a positive integer; the first bad one is an error naming its line (text
// format) or array index (JSON) and its value. Blank lines and lines starting with '#' are skipped.
#pragma once

#include <cstdint>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace wlb {

// Parses `text` (from `source`, used in messages) into document lengths.
inline absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text,
                                                         absl::string_view source) {
  std::vector<int64_t> lengths;
  absl::string_view body = absl::StripLeadingAsciiWhitespace(text);
  if (!body.empty() && body.front() == '[') {
    nlohmann::json array = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (array.is_discarded() || !array.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not a valid JSON array of document lengths", source));
    }
    lengths.reserve(array.size());
    for (size_t i = 0; i < array.size(); ++i) {
      const nlohmann::json& v = array[i];
      if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: element %d is %s, expected a positive integer length", source, i,
                            v.dump()));
      }
      lengths.push_back(v.get<int64_t>());
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
          absl::StrFormat("%s:%d: '%s' is not a positive integer length", source, line_number,
                          value));
    }
    lengths.push_back(length);
  }
  return lengths;
}

// Reads lengths from a file, or from standard input when `path` is "-".
inline absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path) {
  std::stringstream buffer;
  if (path == "-") {
    buffer << std::cin.rdbuf();
    return ParseLengths(buffer.str(), "<stdin>");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat("cannot open lengths file '%s'", path));
  }
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrFormat("error while reading lengths file '%s'", path));
  }
  return ParseLengths(buffer.str(), path);
}

}  // namespace wlb
