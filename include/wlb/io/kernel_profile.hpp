// Reading kernel profiles: CSV tables of measured single-segment attention calls (q_len, kv_len,
// ms rows) that become a table KernelModel (wlb/cost/kernel_model.hpp).
//
//   absl::StatusOr<wlb::KernelModel> measured = wlb::ReadKernelProfileCsv("h200-fwd.csv");
//   absl::StatusOr<std::vector<wlb::KernelProfilePoint>> points =
//       wlb::ReadKernelProfilePoints("h200-fwd.csv");  // e.g. for FitAnalyticKernelParams
//   // The backward times of the same calls, where the profiler wrote them (bwd_ms column):
//   absl::StatusOr<wlb::KernelModel> backward =
//       wlb::ReadKernelProfileCsv("h200.csv", {}, 0.0, wlb::kBackwardMsColumn);
//   // Packed calls (wlb_cuda_kernel_profiler --packed_micro_batches=N: a `segments` column of
//   // q_len:kv_len pairs separated by spaces, ms, bwd_ms), fitted and added to a model:
//   absl::StatusOr<wlb::KernelModel> ranked =
//       wlb::WithPackedCallProfile(*measured, "h200-packed.csv");
#pragma once

#include <array>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/csv.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

// The time columns wlb_cuda_kernel_profiler writes: forward ms, and backward ms of the same call.
inline constexpr absl::string_view kForwardMsColumn = "ms";
inline constexpr absl::string_view kBackwardMsColumn = "bwd_ms";
// The column of a packed-call profile that lists a call's segments ("q_len:kv_len ...").
inline constexpr absl::string_view kSegmentsColumn = "segments";

namespace detail {

// The table of a profile (ParseCsv) and the index of each of `columns` in it (-1 when absent;
// the first `required` must be present, else an error naming the header and `names`).
template <size_t N>
absl::StatusOr<CsvTable> ProfileTable(absl::string_view text, absl::string_view source,
                                      absl::string_view what, absl::string_view names,
                                      const std::array<absl::string_view, N>& columns,
                                      size_t required, std::array<int, N>& cols) {
  absl::StatusOr<CsvTable> table = ParseCsv(text, source, what);
  if (!table.ok()) return table.status();
  for (size_t c = 0; c < N; ++c) {
    cols[c] = table->Column(columns[c]);
    if (c < required && cols[c] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s:%d: header %s must name the columns %s",
                                                        source, table->header_line,
                                                        table->HeaderForMessage(), names));
    }
  }
  return table;
}

}  // namespace detail

// Parses the points of a kernel profile CSV: a header naming q_len, kv_len and the time column
// `ms_column` (default ms, the forward; any order, other columns ignored), then one row per
// measured call; each point's ms is that column's value. `source` names the text in error
// messages, which also give the 1-based line and the bad value.
inline absl::StatusOr<std::vector<KernelProfilePoint>> ParseKernelProfilePoints(
    absl::string_view text, absl::string_view source,
    absl::string_view ms_column = kForwardMsColumn) {
  std::array<int, 3> col;
  absl::StatusOr<CsvTable> table = detail::ProfileTable(
      text, source, "kernel profile", absl::StrFormat("q_len, kv_len and %s", ms_column),
      std::array<absl::string_view, 3>{"q_len", "kv_len", ms_column}, 3, col);
  if (!table.ok()) return table.status();
  std::vector<KernelProfilePoint> points;
  for (const CsvRow& row : table->rows) {
    const std::string where = table->Where(row);
    KernelProfilePoint p;
    const absl::string_view q_text = row.cells[col[0]];
    const absl::string_view kv_text = row.cells[col[1]];
    const absl::string_view ms_text = row.cells[col[2]];
    if (!absl::SimpleAtoi(q_text, &p.q_len) || p.q_len <= 0 || p.q_len > kMaxContext) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: q_len %s is not an integer in [1, %d]",
                                                        where, QuoteForMessage(q_text),
                                                        kMaxContext));
    }
    if (!absl::SimpleAtoi(kv_text, &p.kv_len) || p.kv_len < p.q_len || p.kv_len > kMaxContext) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: kv_len %s is not an integer in [q_len %d, %d] (causal segments see at least their "
          "own queries)",
          where, QuoteForMessage(kv_text), p.q_len, kMaxContext));
    }
    if (!absl::SimpleAtod(ms_text, &p.ms) || !(p.ms >= kMinProfileMs) || !(p.ms <= kMaxProfileMs)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %s %s is not a number in [%g, %g]",
                                                        where, ms_column, QuoteForMessage(ms_text),
                                                        kMinProfileMs, kMaxProfileMs));
    }
    points.push_back(p);
  }
  return points;
}

// The table model of a kernel profile CSV's `ms_column` (ParseKernelProfilePoints, then
// KernelModel::FromProfile).
inline absl::StatusOr<KernelModel> ParseKernelProfileCsv(
    absl::string_view text, absl::string_view source, const KernelShape& shape = {},
    double segment_overhead_ms = 0.0, absl::string_view ms_column = kForwardMsColumn) {
  absl::StatusOr<std::vector<KernelProfilePoint>> points =
      ParseKernelProfilePoints(text, source, ms_column);
  if (!points.ok()) return points.status();
  absl::StatusOr<KernelModel> model = KernelModel::FromProfile(*points, shape, segment_overhead_ms);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrFormat("%s: %s", source, model.status().message()));
  }
  return model;
}

// Reads the points of a kernel profile CSV file (see ParseKernelProfilePoints).
inline absl::StatusOr<std::vector<KernelProfilePoint>> ReadKernelProfilePoints(
    const std::string& path, absl::string_view ms_column = kForwardMsColumn) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "kernel profile");
  if (!text.ok()) return text.status();
  return ParseKernelProfilePoints(*text, absl::CHexEscape(path), ms_column);
}

// Reads a kernel profile CSV file (see ParseKernelProfileCsv).
inline absl::StatusOr<KernelModel> ReadKernelProfileCsv(
    const std::string& path, const KernelShape& shape = {}, double segment_overhead_ms = 0.0,
    absl::string_view ms_column = kForwardMsColumn) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "kernel profile");
  if (!text.ok()) return text.status();
  return ParseKernelProfileCsv(*text, absl::CHexEscape(path), shape, segment_overhead_ms,
                               ms_column);
}

// Parses a packed-call profile: a header naming `segments` and `ms` (and optionally `bwd_ms`; any
// order, other columns ignored), then one row per measured call whose `segments` cell lists its
// segments as q_len:kv_len separated by spaces (0 < q_len <= kv_len <= kMaxContext). Without a
// bwd_ms column every point's bwd_ms is 0. `source` names the text in error messages, which also
// give the 1-based line and the bad value.
inline absl::StatusOr<std::vector<PackedCallPoint>> ParsePackedCallProfile(
    absl::string_view text, absl::string_view source) {
  std::array<int, 3> col;
  absl::StatusOr<CsvTable> table = detail::ProfileTable(
      text, source, "packed-call profile", "segments and ms",
      std::array<absl::string_view, 3>{kSegmentsColumn, kForwardMsColumn, kBackwardMsColumn}, 2,
      col);
  if (!table.ok()) return table.status();
  std::vector<PackedCallPoint> points;
  for (const CsvRow& row : table->rows) {
    const std::string where = table->Where(row);
    PackedCallPoint p;
    for (absl::string_view item : absl::StrSplit(row.cells[col[0]], ' ', absl::SkipWhitespace())) {
      std::vector<absl::string_view> qk = absl::StrSplit(item, ':');
      CallSegment seg;
      if (qk.size() != 2 || !absl::SimpleAtoi(qk[0], &seg.q_len) ||
          !absl::SimpleAtoi(qk[1], &seg.kv_len) || seg.q_len <= 0 || seg.kv_len < seg.q_len ||
          seg.kv_len > kMaxContext) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: segment %s is not q_len:kv_len with 0 < q_len <= kv_len <= %d",
                            where, QuoteForMessage(item), kMaxContext));
      }
      p.segments.push_back(seg);
    }
    if (p.segments.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the segments cell lists no segment", where));
    }
    for (auto [c, name, out] : {std::tuple{col[1], kForwardMsColumn, &p.fwd_ms},
                                std::tuple{col[2], kBackwardMsColumn, &p.bwd_ms}}) {
      if (c < 0) continue;
      const absl::string_view t = row.cells[c];
      if (!absl::SimpleAtod(t, out) || !(*out >= kMinProfileMs) || !(*out <= kMaxProfileMs)) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: %s %s is not a number in [%g, %g]",
                                                          where, name, QuoteForMessage(t),
                                                          kMinProfileMs, kMaxProfileMs));
      }
    }
    points.push_back(std::move(p));
  }
  return points;
}

// Reads a packed-call profile file (see ParsePackedCallProfile).
inline absl::StatusOr<std::vector<PackedCallPoint>> ReadPackedCallProfile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "packed-call profile");
  if (!text.ok()) return text.status();
  return ParsePackedCallProfile(*text, absl::CHexEscape(path));
}

// `model` with the packed-call fit (FitPackedCalls) of the profile at `path`; errors name the
// file.
inline absl::StatusOr<KernelModel> WithPackedCallProfile(const KernelModel& model,
                                                         const std::string& path) {
  absl::StatusOr<std::vector<PackedCallPoint>> points = ReadPackedCallProfile(path);
  if (!points.ok()) return points.status();
  absl::StatusOr<PackedCallFit> fit = FitPackedCalls(*points, model);
  if (!fit.ok()) {
    return absl::Status(fit.status().code(),
                        absl::StrFormat("%s: %s", absl::CHexEscape(path), fit.status().message()));
  }
  return model.WithPackedCalls(*fit);
}

}  // namespace wlb
