// Fuzzes the Megatron-LM index reader: any bytes give either a short error or an index whose
// fields agree with each other (lengths >= 0, pointers contiguous from 0 at the dtype's size,
// document indices rising from 0 to the sequence count).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
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
  return 0;
}
