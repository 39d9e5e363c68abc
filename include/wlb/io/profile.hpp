// Reading measured latency profiles and turning a `--cost` argument into a cost model.
//
//   absl::StatusOr<std::vector<wlb::ProfilePoint>> pts =
//       wlb::ReadProfileCsv("../shared/data/h100/compute-attn-H100.csv");
//   absl::StatusOr<wlb::ProfileFit> fit = wlb::ResolveCostModel("llama2-7b");  // or a CSV path
//
// `--cost` also takes a micro-batch measurement CSV (one row per measured micro-batch, header
// with a `lengths` column: wlb/io/micro_batch_csv.hpp), fitted by FitMicroBatchCost.
//
// A profile is a CSV (or TSV) table as wlb/io/csv.hpp reads it. The length column is the first of
// L, seq_len, ctx_length, length, q_len; the latency column (ms) the first of duration_per_doc,
// latency(ms), latency_ms, ms. When cp or tp columns exist, only rows with cp = 1 and tp = 1 are
// kept (one GPU, no parallelism). Rows with the same length are averaged.
#pragma once

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/micro_batch_fit.hpp"
#include "wlb/io/csv.hpp"
#include "wlb/io/micro_batch_csv.hpp"
#include "wlb/io/read_file.hpp"

namespace wlb {

// Parses profile text (`source` names it in messages).
inline absl::StatusOr<std::vector<ProfilePoint>> ParseProfileCsv(absl::string_view text,
                                                                 absl::string_view source) {
  absl::StatusOr<CsvTable> table = ParseCsv(text, source, "profile", /*allow_tabs=*/true);
  if (!table.ok()) return table.status();
  auto find_column = [&](std::initializer_list<absl::string_view> names) -> int {
    for (absl::string_view name : names) {
      if (const int col = table->Column(name); col >= 0) return col;
    }
    return -1;
  };
  const int length_col = find_column({"L", "seq_len", "ctx_length", "length", "q_len"});
  const int ms_col = find_column({"duration_per_doc", "latency(ms)", "latency_ms", "ms"});
  if (length_col < 0 || ms_col < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: header %s needs a length column (L, seq_len, ctx_length, length, q_len) and a "
        "latency column (duration_per_doc, latency(ms), latency_ms, ms)",
        source, table->HeaderForMessage()));
  }
  const int filter_cols[] = {find_column({"cp"}), find_column({"tp"})};
  std::map<int64_t, std::pair<double, int>> by_length;  // length -> (sum ms, rows)
  for (const CsvRow& row : table->rows) {
    const size_t line_number = row.line;
    const std::vector<std::string>& cells = row.cells;
    bool keep = true;
    for (int col : filter_cols) {
      int64_t degree = 0;
      if (col >= 0 && (!absl::SimpleAtoi(cells[col], &degree) || degree != 1)) {
        keep = false;
      }
    }
    if (!keep) continue;
    int64_t length = 0;
    double ms = 0.0;
    const absl::string_view length_text = cells[length_col];
    const absl::string_view ms_text = cells[ms_col];
    if (!absl::SimpleAtoi(length_text, &length) || length <= 0 || length > kMaxContext) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: length %s is not an integer in [1, %d]", source, line_number,
                          QuoteForMessage(length_text), kMaxContext));
    }
    if (!absl::SimpleAtod(ms_text, &ms) || !(ms >= kMinProfileMs) || !(ms <= kMaxProfileMs)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: latency %s is not a number in [%g, %g] ms", source, line_number,
                          QuoteForMessage(ms_text), kMinProfileMs, kMaxProfileMs));
    }
    auto& [sum, rows] = by_length[length];
    sum += ms;
    ++rows;
  }
  std::vector<ProfilePoint> points;
  for (const auto& [length, acc] : by_length) {
    points.push_back({length, acc.first / acc.second});
  }
  if (points.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no usable rows (rows with cp/tp other than 1 are skipped)", source));
  }
  return points;
}

// Reads a profile file.
inline absl::StatusOr<std::vector<ProfilePoint>> ReadProfileCsv(const std::string& path) {
  absl::StatusOr<std::string> text = ReadInputFile(path, "profile");
  if (!text.ok()) return text.status();
  return ParseProfileCsv(*text, absl::CHexEscape(path));
}

// A `--cost` argument: a preset name (a FLOP model, zero fit error, or a shipped calibration), or
// the path of a CSV to fit: a micro-batch measurement CSV (its header has a `lengths` column,
// wlb/io/micro_batch_csv.hpp; fitted by FitMicroBatchCost, whose held-out error is in the model's
// description; `rms_relative_error` and `max_relative_error` are in sample) or a single-document
// profile (FitCostModel). Anything else is an error that lists the presets.
inline absl::StatusOr<ProfileFit> ResolveCostModel(const std::string& spec) {
  absl::StatusOr<CostModel> preset = CostModelFromPreset(spec);
  if (preset.ok()) return ProfileFit{.model = *std::move(preset)};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(spec, ec)) {
    return absl::NotFoundError(
        absl::StrFormat("--cost %s is neither a readable profile file nor a preset (%s)",
                        QuoteForMessage(spec), preset.status().message()));
  }
  absl::StatusOr<std::string> text = ReadInputFile(spec, "profile");
  if (!text.ok()) return text.status();
  if (IsMicroBatchCsv(*text)) {
    absl::StatusOr<std::vector<MicroBatchSample>> rows =
        ParseMicroBatchCsv(*text, absl::CHexEscape(spec));
    if (!rows.ok()) return rows.status();
    absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(*rows);
    if (!fit.ok()) return fit.status();
    ProfileFit out{.model = fit->model, .max_relative_error = fit->in_sample.max_relative};
    double sum_sq = 0.0;
    for (const MicroBatchSample& s : *rows) {
      const double rel = (PredictMicroBatchMs(*fit, s.lengths) - s.ms) / s.ms;
      sum_sq += rel * rel;
    }
    out.rms_relative_error = std::sqrt(sum_sq / static_cast<double>(rows->size()));
    out.model.description += absl::StrFormat(" from %s", absl::CHexEscape(spec));
    return out;
  }
  absl::StatusOr<std::vector<ProfilePoint>> points = ParseProfileCsv(*text, absl::CHexEscape(spec));
  if (!points.ok()) return points.status();
  return FitCostModel(*points);
}

}  // namespace wlb
