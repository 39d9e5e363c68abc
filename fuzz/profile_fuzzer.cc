// Fuzzes the cost-profile reader and fit (first byte even; a header with a `lengths` column is a
// micro-batch measurement CSV, fitted by FitMicroBatchCost, as --cost tells them apart) and the
// kernel-profile reader (odd): whatever they accept must give finite, non-negative costs and
// finite, positive kernel latencies over the whole range of lengths the planners use.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz_check.hpp"
#include "wlb/wlb.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int64_t lengths[] = {
      1, 2, 127, 128, 129, 4096, 131072, wlb::kMaxContext, wlb::kMaxMaxTokens};
  if (data[0] % 2 == 0 && wlb::IsMicroBatchCsv(text)) {
    absl::StatusOr<std::vector<wlb::MicroBatchSample>> rows = wlb::ParseMicroBatchCsv(text, "fuzz");
    if (!rows.ok()) {
      WLB_FUZZ_CHECK(rows.status().message().size() < 1024);
      return 0;
    }
    absl::StatusOr<wlb::MicroBatchFit> fit = wlb::FitMicroBatchCost(*rows);
    if (!fit.ok()) {
      WLB_FUZZ_CHECK(fit.status().message().size() < 1024);
      return 0;
    }
    for (int64_t d : lengths) {
      const double w = fit->model(d);
      WLB_FUZZ_CHECK(std::isfinite(w) && w >= 0.0);
    }
    WLB_FUZZ_CHECK(fit->per_call_ms >= 0.0 && std::isfinite(fit->per_call_ms));
    WLB_FUZZ_CHECK(std::isfinite(fit->held_out.mean_relative));
    return 0;
  }
  if (data[0] % 2 == 0) {
    absl::StatusOr<std::vector<wlb::ProfilePoint>> points = wlb::ParseProfileCsv(text, "fuzz");
    if (!points.ok()) {
      WLB_FUZZ_CHECK(points.status().message().size() < 1024);
      return 0;
    }
    absl::StatusOr<wlb::ProfileFit> fit = wlb::FitCostModel(*points);
    if (!fit.ok()) return 0;
    for (int64_t d : lengths) {
      const double w = fit->model(d);
      WLB_FUZZ_CHECK(std::isfinite(w) && w >= 0.0);
      WLB_FUZZ_CHECK(std::isfinite(fit->model.Attention(d)));
    }
    WLB_FUZZ_CHECK(std::isfinite(fit->rms_relative_error));
    return 0;
  }
  absl::StatusOr<wlb::KernelModel> model = wlb::ParseKernelProfileCsv(text, "fuzz");
  if (!model.ok()) {
    WLB_FUZZ_CHECK(model.status().message().size() < 1024);
    return 0;
  }
  for (int64_t kv : lengths) {
    for (int64_t q : {int64_t{1}, kv / 2, kv}) {
      if (q < 1) continue;
      const double ms = model->SegmentMs(q, kv);
      WLB_FUZZ_CHECK(std::isfinite(ms) && ms > 0.0);
      WLB_FUZZ_CHECK(model->PaddedFlops(q, kv) > 0.0);
    }
  }
  return 0;
}
