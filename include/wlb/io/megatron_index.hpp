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
// Every field is checked: magic, version, dtype, counts (at most kMaxPieces sequences), the file
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
#include <cstdint>
#include <string>
#include <string_view>
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
  if (sequences > static_cast<uint64_t>(kMaxPieces)) {
    return error(absl::StrFormat("%d sequences, more than the limit of %d", sequences, kMaxPieces));
  }
  if (documents < 1 || documents > static_cast<uint64_t>(kMaxPieces) + 1) {
    return error(absl::StrFormat("document count %d must be in [1, %d] (the indices start with 0)",
                                 documents, kMaxPieces + 1));
  }
  // Counts are bounded above, so these sizes cannot overflow.
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

// Parses the bytes of an index file; `name` names it in messages.
inline absl::StatusOr<MegatronIndex> ParseMegatronIndex(std::string_view bytes,
                                                        std::string_view name) {
  absl::StatusOr<MegatronHeader> header = ParseMegatronHeader(bytes, bytes.size(), name);
  if (!header.ok()) return header.status();
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Megatron index %s: %s", QuoteForMessage(name, 256), what));
  };
  auto le_at = [&](size_t offset, int width) {
    return detail::LittleEndianAt(bytes, offset, width);
  };
  auto u64_at = [&](size_t offset) { return le_at(offset, 8); };
  const uint64_t sequences = header->sequences;
  const uint64_t documents = header->documents;
  MegatronIndex index;
  index.dtype_code = header->dtype_code;
  index.item_size = header->item_size;
  const size_t n = static_cast<size_t>(sequences);
  index.sequence_lengths.resize(n);
  index.sequence_pointers.resize(n);
  index.document_indices.resize(static_cast<size_t>(documents));
  size_t at = kMegatronHeaderBytes;
  int64_t next_pointer = 0;
  for (size_t k = 0; k < n; ++k, at += 4) {
    const auto length = static_cast<int32_t>(static_cast<uint32_t>(le_at(at, 4)));
    if (length < 0) {
      return error(absl::StrFormat("sequence %d has length %d; lengths must be >= 0", k, length));
    }
    index.empty_sequences += length == 0 ? 1 : 0;
    index.sequence_lengths[k] = length;
  }
  for (size_t k = 0; k < n; ++k, at += 8) {
    const int64_t pointer = static_cast<int64_t>(u64_at(at));
    if (pointer != next_pointer) {
      return error(absl::StrFormat(
          "sequence %d starts at byte %d of the .bin, expected %d (sequences are contiguous)", k,
          pointer, next_pointer));
    }
    index.sequence_pointers[k] = pointer;
    next_pointer += index.sequence_lengths[k] * index.item_size;  // < 2^24 x 2^31 x 8
  }
  for (size_t d = 0; d < index.document_indices.size(); ++d, at += 8) {
    const int64_t start = static_cast<int64_t>(u64_at(at));
    const int64_t low = d == 0 ? 0 : index.document_indices[d - 1];
    if (start < low || start > static_cast<int64_t>(sequences) || (d == 0 && start != 0)) {
      return error(absl::StrFormat(
          "document index %d is %d: indices must rise from 0 to the sequence count %d", d, start,
          sequences));
    }
    index.document_indices[d] = start;
  }
  if (index.document_indices.back() != static_cast<int64_t>(sequences)) {
    return error(absl::StrFormat("the last document index is %d, expected the sequence count %d",
                                 index.document_indices.back(), sequences));
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

}  // namespace wlb
