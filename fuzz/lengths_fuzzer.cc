// Fuzzes the lengths reader (text and JSON), then splits what it accepts into pieces and steps:
// every accepted input must give pieces of <= S tokens that cover each document exactly, and
// steps that hold every piece once, in stream order.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz_check.hpp"
#include "wlb/wlb.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<int64_t>> lengths = wlb::ParseLengths(text, "fuzz");
  if (!lengths.ok()) {
    WLB_FUZZ_CHECK(!lengths.status().message().empty());
    WLB_FUZZ_CHECK(lengths.status().message().size() < 1024);  // bounded echo
    return 0;
  }
  for (int64_t length : *lengths) WLB_FUZZ_CHECK(length > 0);
  for (const int64_t context : {int64_t{131072}, int64_t{1} << 20}) {  // <= 2^19 pieces: fast
    absl::StatusOr<std::vector<wlb::Document>> pieces = wlb::MakeDocuments(*lengths, context);
    if (!pieces.ok()) {
      WLB_FUZZ_CHECK(pieces.status().message().size() < 1024);
      continue;
    }
    int64_t covered = 0, total = 0, next_id = 0, next_offset = 0;
    for (int64_t length : *lengths) total += length;
    for (const wlb::Document& d : *pieces) {
      WLB_FUZZ_CHECK(d.length >= 1 && d.length <= context);
      if (d.id != next_id) {
        WLB_FUZZ_CHECK(d.id == next_id + 1 && next_offset == (*lengths)[next_id]);
        next_id = d.id;
        next_offset = 0;
      }
      WLB_FUZZ_CHECK(d.offset == next_offset);
      next_offset += d.length;
      covered += d.length;
    }
    WLB_FUZZ_CHECK(covered == total);
    auto steps = wlb::SplitIntoSteps(*pieces, context * 4);
    WLB_FUZZ_CHECK(steps.ok());
    size_t i = 0;
    for (const auto& step : *steps) {
      for (const wlb::Document& d : step) WLB_FUZZ_CHECK(d == (*pieces)[i++]);
    }
    WLB_FUZZ_CHECK(i == pieces->size());
  }
  return 0;
}
