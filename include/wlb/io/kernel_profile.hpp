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
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

// The time columns wlb_cuda_kernel_profiler writes: forward ms, and backward ms of the same call.
inline constexpr absl::string_view kForwardMsColumn = "ms";
inline constexpr absl::string_view kBackwardMsColumn = "bwd_ms";
// The column of a packed-call profile that lists a call's segments ("q_len:kv_len ...").
inline constexpr absl::string_view kSegmentsColumn = "segments";

namespace detail {

// The row loop both profile formats share: skips blank lines, finds the header, the index of each
// of `columns` in it (-1 when absent; the first `required` must be present), then calls
// row(cells, line) for every non-blank line after it (line 1-based) with exactly the header's
// number of fields. `what` ("kernel profile") and `need` ("a header q_len,kv_len,ms") and
// `names` ("q_len, kv_len and ms") word the errors, which name `source` and the line.
template <size_t N, typename Row>
absl::Status ForEachProfileRow(absl::string_view text, absl::string_view source,
                               absl::string_view what, absl::string_view need,
                               absl::string_view names,
                               const std::array<absl::string_view, N>& columns, size_t required,
                               std::array<int, N>& cols, Row&& row) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  size_t header_line = 0;
  while (header_line < lines.size() && absl::StripAsciiWhitespace(lines[header_line]).empty()) {
    ++header_line;
  }
  if (header_line == lines.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: empty %s (need %s)", source, what, need));
  }
  std::vector<absl::string_view> header = absl::StrSplit(lines[header_line], ',');
  cols.fill(-1);
  for (size_t i = 0; i < header.size(); ++i) {
    for (size_t c = 0; c < N; ++c) {
      if (absl::StripAsciiWhitespace(header[i]) == columns[c]) cols[c] = static_cast<int>(i);
    }
  }
  for (size_t c = 0; c < required; ++c) {
    if (cols[c] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: header %s must name the columns %s", source, header_line + 1,
          QuoteForMessage(absl::StripAsciiWhitespace(lines[header_line]), 200), names));
    }
  }
  size_t rows = 0;
  for (size_t li = header_line + 1; li < lines.size(); ++li) {
    if (absl::StripAsciiWhitespace(lines[li]).empty()) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(lines[li], ',');
    if (cells.size() != header.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: %d fields, the header has %d", source, li + 1, cells.size(), header.size()));
    }
    if (absl::Status s = row(cells, li + 1); !s.ok()) return s;
    ++rows;
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s has a header but no rows", source, what));
  }
  return absl::OkStatus();
}

}  // namespace detail

// Parses the points of a kernel profile CSV: a header naming q_len, kv_len and the time column
// `ms_column` (default ms, the forward; any order, other columns ignored), then one row per
// measured call; each point's ms is that column's value. `source` names the text in error
// messages, which also give the 1-based line and the bad value.
inline absl::StatusOr<std::vector<KernelProfilePoint>> ParseKernelProfilePoints(
    absl::string_view text, absl::string_view source,
    absl::string_view ms_column = kForwardMsColumn) {
  std::vector<KernelProfilePoint> points;
  std::array<int, 3> col;
  const absl::Status s = detail::ForEachProfileRow(
      text, source, "kernel profile", "a header q_len,kv_len,ms",
      absl::StrFormat("q_len, kv_len and %s", ms_column),
      std::array<absl::string_view, 3>{"q_len", "kv_len", ms_column}, 3, col,
      [&](const std::vector<absl::string_view>& cells, size_t line) -> absl::Status {
        KernelProfilePoint p;
        const absl::string_view q_text = absl::StripAsciiWhitespace(cells[col[0]]);
        const absl::string_view kv_text = absl::StripAsciiWhitespace(cells[col[1]]);
        const absl::string_view ms_text = absl::StripAsciiWhitespace(cells[col[2]]);
        if (!absl::SimpleAtoi(q_text, &p.q_len) || p.q_len <= 0 || p.q_len > kMaxContext) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s:%d: q_len %s is not an integer in [1, %d]", source, line,
                              QuoteForMessage(q_text), kMaxContext));
        }
        if (!absl::SimpleAtoi(kv_text, &p.kv_len) || p.kv_len < p.q_len || p.kv_len > kMaxContext) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s:%d: kv_len %s is not an integer in [q_len %d, %d] (causal segments see at "
              "least their own queries)",
              source, line, QuoteForMessage(kv_text), p.q_len, kMaxContext));
        }
        if (!absl::SimpleAtod(ms_text, &p.ms) || !(p.ms >= kMinProfileMs) ||
            !(p.ms <= kMaxProfileMs)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s:%d: %s %s is not a number in [%g, %g]", source, line, ms_column,
                              QuoteForMessage(ms_text), kMinProfileMs, kMaxProfileMs));
        }
        points.push_back(p);
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
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
  std::vector<PackedCallPoint> points;
  std::array<int, 3> col;
  const absl::Status s = detail::ForEachProfileRow(
      text, source, "packed-call profile", "a header naming segments and ms", "segments and ms",
      std::array<absl::string_view, 3>{kSegmentsColumn, kForwardMsColumn, kBackwardMsColumn}, 2,
      col, [&](const std::vector<absl::string_view>& cells, size_t line) -> absl::Status {
        PackedCallPoint p;
        for (absl::string_view item : absl::StrSplit(cells[col[0]], ' ', absl::SkipWhitespace())) {
          std::vector<absl::string_view> qk = absl::StrSplit(item, ':');
          CallSegment seg;
          if (qk.size() != 2 || !absl::SimpleAtoi(qk[0], &seg.q_len) ||
              !absl::SimpleAtoi(qk[1], &seg.kv_len) || seg.q_len <= 0 || seg.kv_len < seg.q_len ||
              seg.kv_len > kMaxContext) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "%s:%d: segment %s is not q_len:kv_len with 0 < q_len <= kv_len <= %d", source,
                line, QuoteForMessage(item), kMaxContext));
          }
          p.segments.push_back(seg);
        }
        if (p.segments.empty()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s:%d: the segments cell lists no segment", source, line));
        }
        for (auto [c, name, out] : {std::tuple{col[1], kForwardMsColumn, &p.fwd_ms},
                                    std::tuple{col[2], kBackwardMsColumn, &p.bwd_ms}}) {
          if (c < 0) continue;
          const absl::string_view t = absl::StripAsciiWhitespace(cells[c]);
          if (!absl::SimpleAtod(t, out) || !(*out >= kMinProfileMs) || !(*out <= kMaxProfileMs)) {
            return absl::InvalidArgumentError(
                absl::StrFormat("%s:%d: %s %s is not a number in [%g, %g]", source, line, name,
                                QuoteForMessage(t), kMinProfileMs, kMaxProfileMs));
          }
        }
        points.push_back(std::move(p));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
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
