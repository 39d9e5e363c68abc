// Reading micro-batch measurement CSVs: one row per measured micro-batch, for FitMicroBatchCost.
//
//   absl::StatusOr<std::vector<wlb::MicroBatchSample>> rows =
//       wlb::ReadMicroBatchCsv("docs/results/gpu/h100_layer_7b_128k_measurements.csv");
//   absl::StatusOr<wlb::MicroBatchFit> fit = wlb::FitMicroBatchCost(*rows);
//
// The format: a CSV table as wlb/io/csv.hpp reads it (a UTF-8 BOM dropped, '#' and blank lines
// skipped, the first other line the header; a column named twice is refused). It needs a `lengths`
// column (the micro-batch's document lengths,
// ';'-separated) and either an `ms` column or both `forward_ms` and `backward_ms` (their sum is the
// micro-batch's time). An optional `step` column (integers >= 0) gives each row's step, which the
// held-out split follows. Every other column is ignored, so the layer bench's measurements.csv
// (backends/cuda: method,step,index,...,forward_ms,backward_ms,...,lengths) is read unmodified:
//
//   # H100, wlb_cuda_layer_bench ...
//   step,ms,lengths
//   0,12.5,4096;812;30000
//
// A profile whose header has a `lengths` column is this form (IsMicroBatchCsv); single-document
// `length,ms` profiles (wlb/io/profile.hpp) have none.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/micro_batch_fit.hpp"
#include "wlb/io/csv.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

// Whether profile text is a micro-batch measurement CSV: its header has a `lengths` column.
inline bool IsMicroBatchCsv(absl::string_view text) {
  const std::optional<std::vector<std::string>> header = CsvHeader(text);
  return header && absl::c_linear_search(*header, "lengths");
}

// Parses measurement CSV text (`source` names it in messages, with the line number of a bad row:
// "file.csv:12: ..."). The table's rules (BOM, comments, quoting, a column named twice, field
// counts, no rows) are ParseCsv's (wlb/io/csv.hpp). Errors name the line and value: a header
// without `lengths` or without a time (`ms`, or `forward_ms` and `backward_ms`; both forms at
// once is ambiguous), an empty lengths cell, a length that is not an integer in [1, kMaxContext],
// a time that is not a number (NaN included), a non-integer or negative step. Times are checked
// by FitMicroBatchCost (and here: not in [kMinProfileMs, kMaxProfileMs] is an error naming the
// line).
inline absl::StatusOr<std::vector<MicroBatchSample>> ParseMicroBatchCsv(absl::string_view text,
                                                                        absl::string_view source) {
  absl::StatusOr<CsvTable> table = ParseCsv(text, source, "micro-batch measurement");
  if (!table.ok()) return table.status();
  const int lengths_col = table->Column("lengths"), ms_col = table->Column("ms");
  const int step_col = table->Column("step");
  const int fwd_col = table->Column("forward_ms"), bwd_col = table->Column("backward_ms");
  const bool split_times = fwd_col >= 0 && bwd_col >= 0;
  if (lengths_col < 0 || (ms_col < 0 && !split_times) || (ms_col >= 0 && split_times)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s:%d: a micro-batch measurement header needs a 'lengths' column and either 'ms' or "
        "both 'forward_ms' and 'backward_ms' (not both forms), got %s",
        source, table->header_line, table->HeaderForMessage()));
  }
  std::vector<MicroBatchSample> rows;
  for (const CsvRow& row : table->rows) {
    MicroBatchSample s;
    s.where = table->Where(row);
    const absl::string_view lengths = row.cells[lengths_col];
    if (lengths.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: empty lengths (a measured micro-batch holds documents)", s.where));
    }
    for (absl::string_view part : absl::StrSplit(lengths, ';')) {
      const absl::string_view cell = absl::StripAsciiWhitespace(part);
      int64_t d = 0;
      if (!absl::SimpleAtoi(cell, &d) || d < 1 || d > kMaxContext) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: document length %s is not an integer in [1, %d]", s.where,
                            QuoteForMessage(cell), kMaxContext));
      }
      s.lengths.push_back(d);
    }
    double total = 0.0;
    for (int col : split_times ? std::vector<int>{fwd_col, bwd_col} : std::vector<int>{ms_col}) {
      const absl::string_view cell = row.cells[col];
      double v = 0.0;
      if (!absl::SimpleAtod(cell, &v) || !(v >= kMinProfileMs) || !(v <= kMaxProfileMs)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %s %s is not a time in [%g, %g] ms", s.where, table->header[col],
                            QuoteForMessage(cell), kMinProfileMs, kMaxProfileMs));
      }
      total += v;
    }
    s.ms = total;
    if (step_col >= 0) {
      const absl::string_view cell = row.cells[step_col];
      int64_t step = 0;
      if (!absl::SimpleAtoi(cell, &step) || step < 0 || step > kMaxStateCounter) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: step %s is not an integer in [0, %d]", s.where,
                            QuoteForMessage(cell), kMaxStateCounter));
      }
      s.step = step;
    }
    rows.push_back(std::move(s));
  }
  return rows;
}

// Reads a measurement CSV file.
inline absl::StatusOr<std::vector<MicroBatchSample>> ReadMicroBatchCsv(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "micro-batch measurements");
  if (!text.ok()) return text.status();
  return ParseMicroBatchCsv(*text, absl::CHexEscape(path));
}

}  // namespace wlb
