// Reading a whole input file (lengths, profiles, Megatron indexes) with the checks every reader
// needs: only regular files (or standard input) are read, so a directory, a FIFO without a writer
// or a device is an error at once, not an empty file, a hang or an endless read; and input beyond
// kMaxInputBytes is rejected instead of filling memory.
//
//   absl::StatusOr<std::string> text = wlb::ReadInputFile("docs.txt", "lengths file");
//   absl::StatusOr<std::string> piped = wlb::ReadInputFile("-", "lengths file");  // stdin
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// Reads `path` ("-" = standard input); `what` names the file's role in messages. A named path
// must be a regular file: a FIFO (which blocks until a writer appears), a device (/dev/zero,
// /dev/urandom never end), a socket or a directory is refused at once; pipe such input through
// standard input instead. The file is opened without blocking and checked on the opened
// descriptor, so nothing can be swapped in between the check and the read.
inline absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                                 int64_t max_bytes = kMaxInputBytes) {
  const std::string name = path == "-" ? "<stdin>" : QuoteForMessage(path, 256);
  std::FILE* f = stdin;
  if (path != "-") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      return absl::NotFoundError(
          absl::StrFormat("cannot open %s %s: %s", what, name, std::strerror(errno)));
    }
    struct stat info {};
    const bool stat_ok = ::fstat(fd, &info) == 0;
    if (!stat_ok || !S_ISREG(info.st_mode)) {
      ::close(fd);
      if (stat_ok && S_ISDIR(info.st_mode)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s %s is a directory, not a file", what, name));
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %s is not a regular file (a FIFO, device or socket); give '-' and redirect it to "
          "standard input to read a stream",
          what, name));
    }
    // A regular file: plain blocking reads from here on.
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
        (f = ::fdopen(fd, "rb")) == nullptr) {
      ::close(fd);
      return absl::NotFoundError(
          absl::StrFormat("cannot open %s %s: %s", what, name, std::strerror(errno)));
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
