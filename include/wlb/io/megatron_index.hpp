// Reading a Megatron-LM indexed dataset's index (.idx, the MMIDIDX format of
// megatron/core/datasets/indexed_dataset.py) for its sequence lengths.
//
//   absl::StatusOr<wlb::MegatronIndex> index = wlb::ReadMegatronIndex("corpus_text_document.idx");
//   // index->sequence_lengths: tokens per sequence; the tokens of sequence k are
//   // sequence_lengths[k] items of index->item_size bytes at byte sequence_pointers[k] of the .bin
//
// Layout (little-endian): magic "MMIDIDX\0\0" (9 bytes), version u64 (= 1), dtype code u8 (1 uint8,
// 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), sequence count u64,
// document count u64, then sequence lengths (int32 x sequences), sequence pointers (int64 x
// sequences, byte offsets into the .bin), document indices (int64 x documents: the sequence index
// where each document starts, ending with the sequence count), and for multimodal datasets one
// mode byte per sequence. wlb plans each sequence as one document (GPTDataset samples sequences;
// a corpus preprocessed without sentence splitting has one sequence per document).
//
// A corpus of any size (up to kMaxDocuments sequences: 10^9 and more) is read in constant memory by
// MegatronLengthReader, chunk by chunk:
//
//   absl::StatusOr<wlb::MegatronLengthReader> reader = wlb::MegatronLengthReader::Open(path);
//   std::vector<int64_t> chunk;
//   while (reader->Next(1 << 20, chunk).ok() && !chunk.empty()) { /* plan them */ }
//
// Every field is checked: magic, version, dtype, counts (at most kMaxDocuments sequences), the file
// size against the counts (truncated or trailing bytes), lengths >= 0 (Megatron's builder writes
// empty sequences: they are counted in empty_sequences; ReadLengthsFile drops them, as they hold
// no token to plan), pointers contiguous from 0
// and document indices rising from 0 to the sequence count; errors name the file and the value.
// ReadMegatronIndex checks the header's counts against the file's size before it reads the
// arrays, so an index with too many sequences, or one whose size does not match its counts, is
// refused after reading 34 bytes, not the whole file.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

inline constexpr std::string_view kMegatronIndexMagic{"MMIDIDX\0\0", 9};

// The parsed index of a Megatron indexed dataset.
struct MegatronIndex {
  int dtype_code = 0;  // Megatron's DType code of the .bin's tokens
  int item_size = 0;   // bytes per token in the .bin
  std::vector<int64_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;  // byte offsets into the .bin
  std::vector<int64_t> document_indices;   // document d = sequences [indices[d], indices[d+1])
  int64_t empty_sequences = 0;             // sequences of length 0 (no token to plan)
};

// Bytes per item of a Megatron dtype code, or 0 for an unknown code.
inline int MegatronItemSize(int dtype_code) {
  constexpr int kSizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  return dtype_code >= 1 && dtype_code <= 8 ? kSizes[dtype_code] : 0;
}

namespace detail {

// The unsigned little-endian integer of `width` bytes at `offset` of `bytes`, whatever the host.
inline uint64_t LittleEndianAt(std::string_view bytes, size_t offset, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(bytes[offset + static_cast<size_t>(i)]);
  }
  return v;
}

}  // namespace detail

// Bytes of the header: magic, version, dtype code, sequence and document counts.
inline constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

// What the header says, checked against the size of the whole file.
struct MegatronHeader {
  int dtype_code = 0;
  int item_size = 0;
  uint64_t sequences = 0;
  uint64_t documents = 0;
};

// Checks the header at the start of `bytes` (at least kMegatronHeaderBytes of them, or the whole
// file if it is shorter) against `file_size`, the size of the whole index file: magic, version,
// dtype code, counts within the limits, and the size the counts need (with or without the
// multimodal mode bytes). `name` names the file in messages.
inline absl::StatusOr<MegatronHeader> ParseMegatronHeader(std::string_view bytes,
                                                          uint64_t file_size,
                                                          std::string_view name) {
  constexpr size_t kHeader = kMegatronHeaderBytes;
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Megatron index %s: %s", QuoteForMessage(name, 256), what));
  };
  if (bytes.size() < kHeader || file_size < kHeader) {
    return error(absl::StrFormat("truncated: %d bytes, the header alone is %d",
                                 std::min<uint64_t>(bytes.size(), file_size), kHeader));
  }
  if (bytes.substr(0, 9) != kMegatronIndexMagic) {
    return error(absl::StrFormat("wrong magic %s (expected MMIDIDX\\x00\\x00)",
                                 QuoteForMessage(bytes.substr(0, 9))));
  }
  auto le_at = [&](size_t offset, int width) {
    return detail::LittleEndianAt(bytes, offset, width);
  };
  auto u64_at = [&](size_t offset) { return le_at(offset, 8); };
  const uint64_t version = u64_at(9);
  if (version != 1) return error(absl::StrFormat("unsupported version %d (expected 1)", version));
  MegatronHeader header;
  header.dtype_code = static_cast<uint8_t>(bytes[17]);
  header.item_size = MegatronItemSize(header.dtype_code);
  if (header.item_size == 0) {
    return error(absl::StrFormat("unknown dtype code %d (expected 1..8)", header.dtype_code));
  }
  const uint64_t sequences = u64_at(18);
  const uint64_t documents = u64_at(26);
  if (sequences > static_cast<uint64_t>(kMaxDocuments)) {
    return error(
        absl::StrFormat("%d sequences, more than the limit of %d", sequences, kMaxDocuments));
  }
  if (documents < 1 || documents > static_cast<uint64_t>(kMaxDocuments) + 1) {
    return error(absl::StrFormat("document count %d must be in [1, %d] (the indices start with 0)",
                                 documents, kMaxDocuments + 1));
  }
  // Counts are at most 2^40 + 1, so these sizes (< 2^45) cannot overflow.
  const uint64_t expected = kHeader + sequences * (4 + 8) + documents * 8;
  if (file_size < expected) {
    return error(absl::StrFormat("truncated: %d bytes, %d sequences and %d documents need %d",
                                 file_size, sequences, documents, expected));
  }
  if (file_size != expected && file_size != expected + sequences) {
    return error(absl::StrFormat(
        "%d bytes: %d sequences and %d documents need %d (or %d with sequence modes)", file_size,
        sequences, documents, expected, expected + sequences));
  }
  header.sequences = sequences;
  header.documents = documents;
  return header;
}

namespace detail {

// Checks sequences [first, first + lengths.size() / 4) of an index named `name`: their lengths
// (int32, little-endian, in `lengths`) are >= 0 and their pointers (int64, in `pointers`) are
// contiguous from `next_pointer` (bytes into the .bin, advanced here; overflow-checked). Counts
// empty sequences into `empty`; with `lengths_out` / `pointers_out`, stores the values there.
inline absl::Status CheckMegatronSequences(std::string_view lengths, std::string_view pointers,
                                           uint64_t first, int item_size, std::string_view name,
                                           int64_t& next_pointer, int64_t& empty,
                                           int64_t* lengths_out, int64_t* pointers_out) {
  const size_t n = lengths.size() / 4;
  for (size_t k = 0; k < n; ++k) {
    const auto length =
        static_cast<int32_t>(static_cast<uint32_t>(LittleEndianAt(lengths, 4 * k, 4)));
    const int64_t pointer = static_cast<int64_t>(LittleEndianAt(pointers, 8 * k, 8));
    const uint64_t index = first + k;
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Megatron index %s: %s", QuoteForMessage(name, 256), what));
    };
    if (length < 0) {
      return error(
          absl::StrFormat("sequence %d has length %d; lengths must be >= 0", index, length));
    }
    if (pointer != next_pointer) {
      return error(absl::StrFormat(
          "sequence %d starts at byte %d of the .bin, expected %d (sequences are contiguous)",
          index, pointer, next_pointer));
    }
    const int64_t bytes = int64_t{length} * item_size;  // < 2^34
    if (next_pointer > std::numeric_limits<int64_t>::max() - bytes) {
      return error(absl::StrFormat("sequence %d ends past byte 2^63 of the .bin", index));
    }
    next_pointer += bytes;
    empty += length == 0 ? 1 : 0;
    if (lengths_out != nullptr) lengths_out[k] = length;
    if (pointers_out != nullptr) pointers_out[k] = pointer;
  }
  return absl::OkStatus();
}

// Checks document indices [first, first + bytes.size() / 8) (int64, little-endian): they rise
// from 0 (`previous`: the index before `first`, advanced here) to the sequence count, which the
// last of `documents` must equal. With `out`, stores them there.
inline absl::Status CheckMegatronDocuments(std::string_view bytes, uint64_t first,
                                           uint64_t documents, uint64_t sequences,
                                           std::string_view name, int64_t& previous, int64_t* out) {
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Megatron index %s: %s", QuoteForMessage(name, 256), what));
  };
  for (size_t k = 0; k < bytes.size() / 8; ++k) {
    const uint64_t d = first + k;
    const int64_t start = static_cast<int64_t>(LittleEndianAt(bytes, 8 * k, 8));
    if (start < previous || start > static_cast<int64_t>(sequences) || (d == 0 && start != 0)) {
      return error(absl::StrFormat(
          "document index %d is %d: indices must rise from 0 to the sequence count %d", d, start,
          sequences));
    }
    if (d + 1 == documents && start != static_cast<int64_t>(sequences)) {
      return error(absl::StrFormat("the last document index is %d, expected the sequence count %d",
                                   start, sequences));
    }
    previous = start;
    if (out != nullptr) out[k] = start;
  }
  return absl::OkStatus();
}

}  // namespace detail

// Parses the bytes of an index file; `name` names it in messages.
inline absl::StatusOr<MegatronIndex> ParseMegatronIndex(std::string_view bytes,
                                                        std::string_view name) {
  absl::StatusOr<MegatronHeader> header = ParseMegatronHeader(bytes, bytes.size(), name);
  if (!header.ok()) return header.status();
  const uint64_t sequences = header->sequences;
  const uint64_t documents = header->documents;
  MegatronIndex index;
  index.dtype_code = header->dtype_code;
  index.item_size = header->item_size;
  const size_t n = static_cast<size_t>(sequences);
  index.sequence_lengths.resize(n);
  index.sequence_pointers.resize(n);
  index.document_indices.resize(static_cast<size_t>(documents));
  const size_t at = kMegatronHeaderBytes;
  int64_t next_pointer = 0;
  if (absl::Status s = detail::CheckMegatronSequences(
          bytes.substr(at, 4 * n), bytes.substr(at + 4 * n, 8 * n), 0, index.item_size, name,
          next_pointer, index.empty_sequences, index.sequence_lengths.data(),
          index.sequence_pointers.data());
      !s.ok()) {
    return s;
  }
  int64_t previous = 0;
  if (absl::Status s = detail::CheckMegatronDocuments(
          bytes.substr(at + 12 * n, 8 * static_cast<size_t>(documents)), 0, documents, sequences,
          name, previous, index.document_indices.data());
      !s.ok()) {
    return s;
  }
  return index;
}

// Reads and parses an index file (see ReadInputFile for the checks on the file itself). A named
// regular file's header is read and checked against its size first (ParseMegatronHeader), so a
// bad count is refused before the arrays are read.
inline absl::StatusOr<MegatronIndex> ReadMegatronIndex(const std::string& path) {
  if (path != "-") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat info {};
    if (fd >= 0 && ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode)) {
      char header[kMegatronHeaderBytes];
      const ssize_t got = ::pread(fd, header, sizeof header, 0);
      ::close(fd);
      if (got >= 0) {
        absl::StatusOr<MegatronHeader> checked =
            ParseMegatronHeader(std::string_view(header, static_cast<size_t>(got)),
                                static_cast<uint64_t>(info.st_size), path);
        if (!checked.ok()) return checked.status();
      }
    } else if (fd >= 0) {
      ::close(fd);  // not a regular file: ReadInputFile says so
    }
  }
  absl::StatusOr<std::string> bytes = ReadInputFile(path, "Megatron index");
  if (!bytes.ok()) return bytes.status();
  return ParseMegatronIndex(*bytes, path);
}

// Reads a regular index file's sequence lengths a chunk at a time (pread), with the checks of
// ParseMegatronIndex: the header and every document index when it opens (read in chunks), each
// chunk's lengths and pointers as it is read. Holds one chunk, whatever the corpus's size.
class MegatronLengthReader {
 public:
  static absl::StatusOr<MegatronLengthReader> Open(const std::string& path) {
    auto fail = [&](const char* what) {
      const int err = errno;
      return absl::Status(
          err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable,
          absl::StrFormat("cannot %s Megatron index %s: %s", what, QuoteForMessage(path, 256),
                          std::strerror(err)));
    };
    MegatronLengthReader reader;
    reader.name_ = path;
    reader.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (reader.fd_ < 0) return fail("open");
    struct stat info {};
    if (::fstat(reader.fd_, &info) != 0) return fail("stat");
    if (!S_ISREG(info.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Megatron index %s is not a regular file", QuoteForMessage(path, 256)));
    }
    std::string header(kMegatronHeaderBytes, '\0');
    absl::StatusOr<size_t> got = reader.ReadAt(0, header.data(), header.size());
    if (!got.ok()) return got.status();
    header.resize(*got);
    absl::StatusOr<MegatronHeader> checked =
        ParseMegatronHeader(header, static_cast<uint64_t>(info.st_size), path);
    if (!checked.ok()) return checked.status();
    reader.header_ = *checked;
    // Document indices, checked before any length is given.
    const uint64_t sequences = checked->sequences;
    const uint64_t documents_at = kMegatronHeaderBytes + 12 * sequences;
    int64_t previous = 0;
    std::string chunk;
    for (uint64_t d = 0; d < checked->documents; d += kChunk) {
      const uint64_t count = std::min<uint64_t>(kChunk, checked->documents - d);
      if (absl::Status s = reader.ReadExactly(documents_at + 8 * d, 8 * count, chunk); !s.ok()) {
        return s;
      }
      if (absl::Status s = detail::CheckMegatronDocuments(chunk, d, checked->documents, sequences,
                                                          path, previous, nullptr);
          !s.ok()) {
        return s;
      }
    }
    return reader;
  }

  MegatronLengthReader(MegatronLengthReader&& other) noexcept { *this = std::move(other); }
  MegatronLengthReader& operator=(MegatronLengthReader&& other) noexcept {
    std::swap(fd_, other.fd_);
    name_ = std::move(other.name_);
    header_ = other.header_;
    read_ = other.read_;
    next_pointer_ = other.next_pointer_;
    empty_ = other.empty_;
    return *this;
  }
  MegatronLengthReader(const MegatronLengthReader&) = delete;
  MegatronLengthReader& operator=(const MegatronLengthReader&) = delete;
  ~MegatronLengthReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  const MegatronHeader& header() const { return header_; }
  uint64_t sequences_read() const { return read_; }
  int64_t empty_sequences() const { return empty_; }   // among those read so far
  int64_t bin_bytes() const { return next_pointer_; }  // the .bin's size the sequences read need

  // The next at most `max` (>= 1) sequence lengths, empty ones included, replace `out`'s
  // contents; `out` is empty at the end of the index.
  absl::Status Next(size_t max, std::vector<int64_t>& out) {
    out.clear();
    const uint64_t count = std::min<uint64_t>(std::max<size_t>(max, 1), header_.sequences - read_);
    if (count == 0) return absl::OkStatus();
    std::string lengths, pointers;
    if (absl::Status s = ReadExactly(kMegatronHeaderBytes + 4 * read_, 4 * count, lengths);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadExactly(kMegatronHeaderBytes + 4 * header_.sequences + 8 * read_,
                                     8 * count, pointers);
        !s.ok()) {
      return s;
    }
    out.resize(static_cast<size_t>(count));
    if (absl::Status s =
            detail::CheckMegatronSequences(lengths, pointers, read_, header_.item_size, name_,
                                           next_pointer_, empty_, out.data(), nullptr);
        !s.ok()) {
      out.clear();
      return s;
    }
    read_ += count;
    return absl::OkStatus();
  }

 private:
  static constexpr uint64_t kChunk = uint64_t{1} << 20;  // items per read of the checks at Open

  MegatronLengthReader() = default;

  absl::StatusOr<size_t> ReadAt(uint64_t offset, char* data, size_t size) const {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(fd_, data + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::UnavailableError(absl::StrFormat("cannot read Megatron index %s: %s",
                                                      QuoteForMessage(name_, 256),
                                                      std::strerror(errno)));
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  absl::Status ReadExactly(uint64_t offset, uint64_t size, std::string& out) const {
    out.resize(static_cast<size_t>(size));
    absl::StatusOr<size_t> got = ReadAt(offset, out.data(), out.size());
    if (!got.ok()) return got.status();
    if (*got != size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("Megatron index %s: truncated while reading (the file changed?)",
                          QuoteForMessage(name_, 256)));
    }
    return absl::OkStatus();
  }

  int fd_ = -1;
  std::string name_;
  MegatronHeader header_;
  uint64_t read_ = 0;
  int64_t next_pointer_ = 0;
  int64_t empty_ = 0;
};

}  // namespace wlb
