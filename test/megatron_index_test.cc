// Tests of include/wlb/io/megatron_index.hpp: index files written here byte by byte in the
// layout of Megatron-LM's _IndexWriter, read back (also through ReadLengthsFile), and every
// damaged field rejected with a message naming it.
#include "wlb/io/megatron_index.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/io/input.hpp"
#include "wlb/io/lengths.hpp"

namespace wlb {
namespace megatron_index_test {

using ::testing::HasSubstr;

void PutLe(std::string& out, uint64_t v, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// An index for sequences of `lengths` with `dtype_code`, documents starting at `starts`.
std::string IndexBytes(const std::vector<int32_t>& lengths, const std::vector<int64_t>& starts,
                       int dtype_code = 8) {
  std::string out(kMegatronIndexMagic);
  PutLe(out, 1, 8);
  PutLe(out, static_cast<uint64_t>(dtype_code), 1);
  PutLe(out, lengths.size(), 8);
  PutLe(out, starts.size(), 8);
  for (int32_t n : lengths) PutLe(out, static_cast<uint32_t>(n), 4);
  int64_t pointer = 0;
  for (int32_t n : lengths) {
    PutLe(out, static_cast<uint64_t>(pointer), 8);
    pointer += int64_t{n} * MegatronItemSize(dtype_code);
  }
  for (int64_t s : starts) PutLe(out, static_cast<uint64_t>(s), 8);
  return out;
}

std::string Error(const std::string& bytes) {
  absl::StatusOr<MegatronIndex> index = ParseMegatronIndex(bytes, "t.idx");
  return index.ok() ? "ok" : std::string(index.status().message());
}

TEST(MegatronIndexTest, ReadsRandomIndexes) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    const int dtype = 1 + static_cast<int>(rng() % 8);
    std::vector<int32_t> lengths(rng() % 50);
    for (int32_t& n : lengths) n = 1 + static_cast<int32_t>(rng() % 100000);
    std::vector<int64_t> starts = {0};
    for (size_t k = 1; k < lengths.size(); ++k) {
      if (rng() % 3 == 0) starts.push_back(static_cast<int64_t>(k));
    }
    starts.push_back(static_cast<int64_t>(lengths.size()));
    std::string bytes = IndexBytes(lengths, starts, dtype);
    if (trial % 2 == 1) bytes.append(lengths.size(), '\0');  // multimodal sequence modes
    absl::StatusOr<MegatronIndex> index = ParseMegatronIndex(bytes, "t.idx");
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(index->dtype_code, dtype);
    EXPECT_EQ(index->item_size, MegatronItemSize(dtype));
    EXPECT_EQ(index->sequence_lengths, std::vector<int64_t>(lengths.begin(), lengths.end()));
    EXPECT_EQ(index->document_indices, starts);
    ASSERT_EQ(index->sequence_pointers.size(), lengths.size());
    if (!lengths.empty()) {
      EXPECT_EQ(index->sequence_pointers.back() + lengths.back() * index->item_size, [&] {
        int64_t total = 0;
        for (int32_t n : lengths) total += n;
        return total * index->item_size;
      }());
    }
  }
}

TEST(MegatronIndexTest, ReadLengthsFileReadsIdxFiles) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("wlb_megatron_" + std::to_string(::getpid()) + ".idx");
  {
    std::ofstream f(path, std::ios::binary);
    // An empty sequence (Megatron's builder writes them) is read, counted and not planned.
    const std::string bytes = IndexBytes({5, 0, 19, 8}, {0, 2, 4});
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  absl::StatusOr<MegatronIndex> index = ReadMegatronIndex(path.string());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->sequence_lengths, (std::vector<int64_t>{5, 0, 19, 8}));
  EXPECT_EQ(index->sequence_pointers, (std::vector<int64_t>{0, 10, 10, 48}));
  EXPECT_EQ(index->empty_sequences, 1);
  absl::StatusOr<std::vector<int64_t>> lengths = ReadLengthsFile(path.string());
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_EQ(*lengths, (std::vector<int64_t>{5, 19, 8}));
  std::filesystem::remove(path);
  EXPECT_THAT(ReadLengthsFile(path.string()).status().message(), HasSubstr("cannot open"));
}

TEST(MegatronIndexTest, DamagedFilesAreErrorsNamingTheField) {
  const std::string good = IndexBytes({5, 19, 8}, {0, 2, 3});
  EXPECT_EQ(Error(good), "ok");
  EXPECT_THAT(Error(good.substr(0, 20)), HasSubstr("truncated: 20 bytes"));
  EXPECT_THAT(Error(good.substr(0, good.size() - 1)), HasSubstr("truncated"));
  EXPECT_THAT(Error(good + "xy"), HasSubstr("need 94 (or 97 with sequence modes)"));
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_THAT(Error(bad), HasSubstr("wrong magic"));
  bad = good;
  bad[9] = 2;
  EXPECT_THAT(Error(bad), HasSubstr("unsupported version 2"));
  bad = good;
  bad[17] = 9;
  EXPECT_THAT(Error(bad), HasSubstr("unknown dtype code 9"));
  bad = good;
  bad[25] = 0x7f;  // sequence count ~ 2^63
  EXPECT_THAT(Error(bad), HasSubstr("more than the limit"));
  EXPECT_THAT(Error(IndexBytes({5, -1, 8}, {0, 3})), HasSubstr("sequence 1 has length -1"));
  EXPECT_THAT(Error(IndexBytes({5, 19}, {0, 2, 1})), HasSubstr("document index 2 is 1"));
  EXPECT_THAT(Error(IndexBytes({5, 19}, {1, 2})), HasSubstr("document index 0 is 1"));
  EXPECT_THAT(Error(IndexBytes({5, 19}, {0, 1})), HasSubstr("last document index is 1"));
  EXPECT_THAT(Error(IndexBytes({5, 19}, {})), HasSubstr("document count 0 must be in [1, "));
  bad = IndexBytes({5, 19}, {0, 2});
  bad[34 + 8 + 8] = 3;  // second pointer (uint16 tokens: 10 expected)
  EXPECT_THAT(Error(bad), HasSubstr("sequence 1 starts at byte 3 of the .bin, expected 10"));
}

// A header claiming `sequences` and `documents`, then a hole up to `size` bytes (a sparse file:
// no disk blocks, and nothing a reader could parse past the header).
std::filesystem::path SparseIndex(uint64_t sequences, uint64_t documents, uint64_t size) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("wlb_megatron_sparse_" + std::to_string(::getpid()) + ".idx");
  std::string header(kMegatronIndexMagic);
  PutLe(header, 1, 8);
  PutLe(header, 4, 1);
  PutLe(header, sequences, 8);
  PutLe(header, documents, 8);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
  }
  std::filesystem::resize_file(path, size);
  return path;
}

// The header's counts are checked against the file size before the arrays are read: files
// larger than any index may be (kMaxInputBytes) are refused for their counts, not read.
TEST(MegatronIndexTest, CountsAreCheckedAgainstTheFileSizeBeforeReading) {
  const uint64_t huge = static_cast<uint64_t>(kMaxInputBytes) + 4096;
  std::filesystem::path path = SparseIndex(static_cast<uint64_t>(kMaxDocuments) + 1, 2, huge);
  absl::StatusOr<MegatronIndex> index = ReadMegatronIndex(path.string());
  EXPECT_THAT(index.status().message(),
              HasSubstr("1099511627777 sequences, more than the limit of 1099511627776"));
  EXPECT_THAT(MegatronLengthReader::Open(path.string()).status().message(),
              HasSubstr("1099511627777 sequences, more than the limit of 1099511627776"));
  path = SparseIndex(1000, 2, huge);  // counts within the limits, size far from theirs
  index = ReadMegatronIndex(path.string());
  EXPECT_THAT(
      index.status().message(),
      HasSubstr(absl::StrFormat("%d bytes: 1000 sequences and 2 documents need 12050", huge)));
  path = SparseIndex(1000, 2, 100);  // truncated, found from the size alone
  index = ReadMegatronIndex(path.string());
  EXPECT_THAT(index.status().message(),
              HasSubstr("truncated: 100 bytes, 1000 sequences and 2 documents need 12050"));
  std::filesystem::remove(path);
}

// Writes `bytes` to a fresh temporary .idx file.
std::filesystem::path WriteIndex(const std::string& bytes, const std::string& tag) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("wlb_megatron_" + tag + "_" + std::to_string(::getpid()) + ".idx");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Reading chunk by chunk gives what the whole-file parse gives, for every chunk size, and
// counts the empty sequences.
TEST(MegatronLengthReaderTest, ChunksMatchTheWholeParse) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> lengths(1 + rng() % 60);
    for (int32_t& n : lengths) n = static_cast<int32_t>(rng() % 5 == 0 ? 0 : 1 + rng() % 9000);
    std::vector<int64_t> starts = {0};
    for (size_t k = 1; k < lengths.size(); ++k) {
      if (rng() % 4 == 0) starts.push_back(static_cast<int64_t>(k));
    }
    starts.push_back(static_cast<int64_t>(lengths.size()));
    const std::string bytes = IndexBytes(lengths, starts, 1 + static_cast<int>(rng() % 8));
    absl::StatusOr<MegatronIndex> whole = ParseMegatronIndex(bytes, "t.idx");
    ASSERT_TRUE(whole.ok()) << whole.status();
    const std::filesystem::path path = WriteIndex(bytes, "chunks");
    absl::StatusOr<MegatronLengthReader> reader = MegatronLengthReader::Open(path.string());
    ASSERT_TRUE(reader.ok()) << reader.status();
    const size_t chunk = 1 + rng() % 17;
    std::vector<int64_t> read, part;
    while (true) {
      ASSERT_TRUE(reader->Next(chunk, part).ok());
      if (part.empty()) break;
      EXPECT_LE(part.size(), chunk);
      read.insert(read.end(), part.begin(), part.end());
    }
    EXPECT_EQ(read, whole->sequence_lengths);
    EXPECT_EQ(reader->empty_sequences(), whole->empty_sequences);
    int64_t empty = -1;
    absl::StatusOr<std::vector<int64_t>> kept = ReadLengthsFile(path.string(), &empty);
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(empty, whole->empty_sequences);
    EXPECT_EQ(static_cast<int64_t>(kept->size()),
              static_cast<int64_t>(lengths.size()) - whole->empty_sequences);
    std::filesystem::remove(path);
  }
}

// A damaged pointer or length is found in the chunk that holds it, named by its sequence; a
// damaged document index is found when the reader opens.
TEST(MegatronLengthReaderTest, DamageIsNamedByItsSequence) {
  std::vector<int32_t> lengths(40, 3);
  const std::string good = IndexBytes(lengths, {0, 40});
  std::string bad = good;
  bad[kMegatronHeaderBytes + 4 * 40 + 8 * 33] ^= 1;  // sequence 33's pointer
  std::filesystem::path path = WriteIndex(bad, "damaged");
  absl::StatusOr<MegatronLengthReader> reader = MegatronLengthReader::Open(path.string());
  ASSERT_TRUE(reader.ok());
  std::vector<int64_t> part;
  EXPECT_TRUE(reader->Next(30, part).ok());
  EXPECT_THAT(reader->Next(30, part).message(),
              HasSubstr("sequence 33 starts at byte 199 of the .bin, expected 198"));
  bad = good;
  bad[kMegatronHeaderBytes + 4 * 7 + 3] = static_cast<char>(0x80);  // sequence 7: negative
  path = WriteIndex(bad, "damaged");
  reader = MegatronLengthReader::Open(path.string());
  ASSERT_TRUE(reader.ok());
  EXPECT_THAT(reader->Next(100, part).message(), HasSubstr("sequence 7 has length -2147483645"));
  bad = good;
  bad[kMegatronHeaderBytes + 12 * 40 + 8] = 39;  // the last document index
  path = WriteIndex(bad, "damaged");
  EXPECT_THAT(MegatronLengthReader::Open(path.string()).status().message(),
              HasSubstr("the last document index is 39, expected the sequence count 40"));
  EXPECT_EQ(MegatronLengthReader::Open(path.string() + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

// More than 2^24 sequences (the old limit): a sparse index of 2^24 + 5 sequences, all empty but
// the last, reads in chunks; ReadLengthsFile keeps the one non-empty length and counts the rest.
TEST(MegatronLengthReaderTest, ReadsMoreThan2Pow24Sequences) {
  const uint64_t n = (uint64_t{1} << 24) + 5;
  const uint64_t size = kMegatronHeaderBytes + 12 * n + 16;
  std::filesystem::path path = SparseIndex(n, 2, size);
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    std::string tail;
    PutLe(tail, 7, 4);  // the last sequence: 7 tokens at byte 0 of the .bin
    f.seekp(static_cast<std::streamoff>(kMegatronHeaderBytes + 4 * (n - 1)));
    f.write(tail.data(), 4);
    tail.clear();
    PutLe(tail, n, 8);  // document indices [0, n]
    f.seekp(static_cast<std::streamoff>(size - 8));
    f.write(tail.data(), 8);
  }
  int64_t empty = -1;
  absl::StatusOr<std::vector<int64_t>> lengths = ReadLengthsFile(path.string(), &empty);
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  EXPECT_EQ(*lengths, std::vector<int64_t>{7});
  EXPECT_EQ(empty, static_cast<int64_t>(n) - 1);
  std::filesystem::remove(path);
}

// A plan's document ids name the index's sequences whatever empty sequences (Megatron writes
// them) lie before them: every piece of every step, cut whole, cut for the first steps only, or
// cut one step at a time as wlb-plan streams an index, has id i such that sequence i of the
// index holds the piece's tokens, and every non-empty sequence is planned (seeded random
// indexes, empty runs at the start, middle and end).
TEST(MegatronIndexTest, DocumentIdsNameTheIndexSequenceAcrossEmptySequences) {
  std::mt19937_64 rng(59);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> lengths(1 + rng() % 60);
    for (int32_t& n : lengths) n = rng() % 4 == 0 ? 0 : 1 + static_cast<int32_t>(rng() % 9000);
    if (trial % 3 == 0) lengths.front() = 0;
    lengths.back() = trial % 2 == 0 ? 0 : lengths.back();
    lengths.push_back(1 + static_cast<int32_t>(rng() % 9000));  // something to plan
    if (trial % 4 == 0) lengths.insert(lengths.end(), 3, 0);
    const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                       ("wlb_ids_" + std::to_string(::getpid()) + ".idx");
    std::ofstream(path, std::ios::binary)
        << IndexBytes(lengths, {0, static_cast<int64_t>(lengths.size())});
    const auto check = [&](const std::vector<Document>& pieces, bool all, const char* mode) {
      std::vector<int64_t> planned(lengths.size(), 0);
      for (const Document& d : pieces) {
        ASSERT_GE(d.id, 0) << mode;
        ASSERT_LT(d.id, static_cast<int64_t>(lengths.size())) << mode;
        EXPECT_LE(d.offset + d.length, lengths[static_cast<size_t>(d.id)]) << mode << " " << d.id;
        planned[static_cast<size_t>(d.id)] += d.length;
      }
      for (size_t i = 0; i < lengths.size() && all; ++i) {
        EXPECT_EQ(planned[i], lengths[i]) << mode << ": sequence " << i;
      }
    };
    const int64_t context = 4096;
    absl::StatusOr<Input> whole = LoadInput({.docs = path.string()}, context, 2);
    ASSERT_TRUE(whole.ok()) << whole.status();
    check(whole->pieces, true, "whole");
    absl::StatusOr<Input> first = LoadInput({.docs = path.string(), .steps = 2}, context, 2);
    ASSERT_TRUE(first.ok()) << first.status();
    check(first->pieces, false, "first steps");
    for (size_t i = 0; i < std::min(first->pieces.size(), whole->pieces.size()); ++i) {
      EXPECT_EQ(first->pieces[i].id, whole->pieces[i].id);
    }
    absl::StatusOr<Input> streamed = LoadInput({.docs = path.string(), .stream = true}, context, 2);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(streamed->empty, static_cast<int64_t>(std::count(lengths.begin(), lengths.end(), 0)));
    StepCutter cutter(streamed->lengths, context, 2, streamed->empty_positions);
    std::vector<Document> step, pieces;
    while (cutter.Next(step)) pieces.insert(pieces.end(), step.begin(), step.end());
    check(pieces, true, "streamed");
    std::filesystem::remove(path);
  }
}

}  // namespace megatron_index_test
}  // namespace wlb
