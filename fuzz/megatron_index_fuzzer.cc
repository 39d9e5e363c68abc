// Fuzzes the Megatron-LM index reader: any bytes give either a short error or an index whose
// fields agree with each other (lengths >= 0, pointers contiguous from 0 at the dtype's size,
// document indices rising from 0 to the sequence count). Its lengths cut into steps as wlb-plan
// cuts them (empty sequences skipped) give pieces whose ids name the index's sequences: every
// piece lies inside sequence `id`, and each non-empty sequence is planned whole.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "wlb/io/input.hpp"
#include "wlb/io/megatron_index.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<wlb::MegatronIndex> index = wlb::ParseMegatronIndex(bytes, "fuzz.idx");
  if (!index.ok()) {
    WLB_FUZZ_CHECK(!index.status().message().empty());
    WLB_FUZZ_CHECK(index.status().message().size() < 1024);  // bounded echo
    return 0;
  }
  WLB_FUZZ_CHECK(index->item_size == wlb::MegatronItemSize(index->dtype_code));
  WLB_FUZZ_CHECK(index->item_size > 0);
  const size_t n = index->sequence_lengths.size();
  WLB_FUZZ_CHECK(index->sequence_pointers.size() == n);
  int64_t pointer = 0;
  int64_t empty = 0;
  for (size_t k = 0; k < n; ++k) {
    WLB_FUZZ_CHECK(index->sequence_lengths[k] >= 0);
    WLB_FUZZ_CHECK(index->sequence_pointers[k] == pointer);
    pointer += index->sequence_lengths[k] * index->item_size;
    empty += index->sequence_lengths[k] == 0 ? 1 : 0;
  }
  WLB_FUZZ_CHECK(index->empty_sequences == empty);
  WLB_FUZZ_CHECK(!index->document_indices.empty() && index->document_indices.front() == 0);
  WLB_FUZZ_CHECK(index->document_indices.back() == static_cast<int64_t>(n));
  for (size_t d = 1; d < index->document_indices.size(); ++d) {
    WLB_FUZZ_CHECK(index->document_indices[d] >= index->document_indices[d - 1]);
  }
  int64_t tokens = 0;
  for (int64_t l : index->sequence_lengths) tokens += l;  // each < 2^32: no overflow
  if (tokens > (int64_t{1} << 22)) return 0;              // pieces in memory: keep them few
  wlb::Lengths kept;
  wlb::AppendNonEmpty(index->sequence_lengths, 0, kept.values, &kept.empty_positions);
  absl::StatusOr<wlb::Input> input = wlb::CutSteps(std::move(kept), 64, 2);
  if (!input.ok()) return 0;  // e.g. more pieces than the limit
  std::vector<int64_t> planned(n, 0);
  for (const wlb::Document& d : input->pieces) {
    WLB_FUZZ_CHECK(d.id >= 0 && d.id < static_cast<int64_t>(n));
    WLB_FUZZ_CHECK(d.offset + d.length <= index->sequence_lengths[static_cast<size_t>(d.id)]);
    planned[static_cast<size_t>(d.id)] += d.length;
  }
  WLB_FUZZ_CHECK(planned == index->sequence_lengths);
  return 0;
}
