// Reading a whole input file (lengths, profiles) with the checks every reader needs: a directory
// is an error, not an empty file, and input beyond kMaxInputBytes is rejected instead of filling
// memory (a FIFO or /dev/zero never ends).
//
//   absl::StatusOr<std::string> text = wlb::ReadInputFile("docs.txt", "lengths file");
//   absl::StatusOr<std::string> piped = wlb::ReadInputFile("-", "lengths file");  // stdin
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// Reads `path` ("-" = standard input); `what` names the file's role in messages.
inline absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                                 int64_t max_bytes = kMaxInputBytes) {
  const std::string name = path == "-" ? "<stdin>" : QuoteForMessage(path, 256);
  std::FILE* f = stdin;
  if (path != "-") {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s is a directory, not a file", what, name));
    }
    f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError(absl::StrFormat("cannot open %s %s", what, name));
    }
  }
  std::string text;
  char buffer[1 << 16];
  bool failed = false;
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof buffer, f);
    if (static_cast<int64_t>(text.size() + n) > max_bytes) {
      if (f != stdin) std::fclose(f);
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s is larger than the limit of %d bytes", what, name, max_bytes));
    }
    text.append(buffer, n);
    if (n < sizeof buffer) {
      failed = std::ferror(f) != 0;
      break;
    }
  }
  if (f != stdin) std::fclose(f);
  if (failed) {
    return absl::DataLossError(absl::StrFormat("error while reading %s %s", what, name));
  }
  return text;
}

}  // namespace wlb
