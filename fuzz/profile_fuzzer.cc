// Fuzzes the table readers and the fits built on them. The first byte picks the reader: even, the
// cost-profile reader and fit (a header with a `lengths` column is a micro-batch measurement CSV,
// fitted by FitMicroBatchCost, as --cost tells them apart); 1 mod 4, the kernel-profile reader;
// 3 mod 4, the packed-call reader. Whatever they accept must give finite, non-negative costs and
// finite, positive kernel latencies over the whole range of lengths the planners use. Every
// reader shares wlb/io/csv.hpp's rules, checked on every input: a UTF-8 byte-order mark or \r\n
// line endings change nothing (the same values, or an error either way), and a measurement fit
// that succeeds had micro-batches of more than one document count and more than one set of
// lengths (else its terms could not be told apart).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.hpp"
#include "wlb/wlb.hpp"

namespace {

// The values `reader` (the first byte's choice) parses from `text`, as a string; nullopt for an
// error (whose message must be bounded).
std::optional<std::string> Parsed(uint8_t reader, absl::string_view text) {
  std::string out;
  auto done = [&](const absl::Status& status) -> std::optional<std::string> {
    if (status.ok()) return out;
    WLB_FUZZ_CHECK(status.message().size() < 1024);
    return std::nullopt;
  };
  if (reader % 2 == 0 && wlb::IsMicroBatchCsv(text)) {
    auto rows = wlb::ParseMicroBatchCsv(text, "fuzz");
    if (rows.ok()) {
      for (const auto& r : *rows) {
        absl::StrAppend(&out, absl::StrJoin(r.lengths, ";"), "@", r.ms, "#", r.step.value_or(-1),
                        "|");
      }
    }
    return done(rows.status());
  }
  if (reader % 2 == 0) {
    auto points = wlb::ParseProfileCsv(text, "fuzz");
    if (points.ok()) {
      for (const auto& p : *points) absl::StrAppend(&out, p.length, "@", p.ms, "|");
    }
    return done(points.status());
  }
  if (reader % 4 == 1) {
    auto points = wlb::ParseKernelProfilePoints(text, "fuzz");
    if (points.ok()) {
      for (const auto& p : *points) absl::StrAppend(&out, p.q_len, ":", p.kv_len, "@", p.ms, "|");
    }
    return done(points.status());
  }
  auto points = wlb::ParsePackedCallProfile(text, "fuzz");
  if (points.ok()) {
    for (const auto& p : *points) {
      for (const auto& seg : p.segments) absl::StrAppend(&out, seg.q_len, ":", seg.kv_len, " ");
      absl::StrAppend(&out, "@", p.fwd_ms, "/", p.bwd_ms, "|");
    }
  }
  return done(points.status());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int64_t lengths[] = {
      1, 2, 127, 128, 129, 4096, 131072, wlb::kMaxContext, wlb::kMaxMaxTokens};
  // The shared row reader's rules, for every reader.
  const std::optional<std::string> plain = Parsed(data[0], text);
  if (!absl::StartsWith(text, "\xEF\xBB\xBF")) {  // one mark is dropped, not two
    WLB_FUZZ_CHECK(Parsed(data[0], absl::StrCat("\xEF\xBB\xBF", text)) == plain);
  }
  if (text.find('\r') == absl::string_view::npos) {
    WLB_FUZZ_CHECK(Parsed(data[0], absl::StrReplaceAll(text, {{"\n", "\r\n"}})) == plain);
  }
  if (data[0] % 4 == 3) return 0;  // the packed-call reader: its fit needs a kernel model
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
    std::set<size_t> counts;
    std::set<std::multiset<int64_t>> sets;
    for (const auto& r : *rows) {
      counts.insert(r.lengths.size());
      sets.insert(std::multiset<int64_t>(r.lengths.begin(), r.lengths.end()));
    }
    WLB_FUZZ_CHECK(counts.size() > 1 && sets.size() > 1);  // else a rank-deficient design
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
