// The one CSV row reader behind every table the library reads (single-document profiles,
// micro-batch measurements, kernel profiles, packed-call profiles): one place for byte-order
// marks, line endings, comments, quoting, header checks and the errors that name them.
//
//   absl::StatusOr<wlb::CsvTable> table = wlb::ParseCsv(text, "h200.csv", "kernel profile");
//   const int ms = table->Column("ms");                      // -1 when absent
//   for (const wlb::CsvRow& row : table->rows) Use(row.cells[ms], table->Where(row));
//
// The format: a UTF-8 byte-order mark at the start is dropped; lines end in \n or \r\n; blank
// lines and lines starting with '#' are skipped; the first other line is the header. Cells are
// separated by ',' (or by tabs when the caller allows it and the header holds a tab), trimmed of
// spaces; a cell may be double-quoted ("a,b", with "" for a quote inside), which keeps its text
// as written. Refused, naming the source, line and value: a header naming a column twice (which
// one is meant would be a guess), a stray or unterminated quote, a row whose field count differs
// from the header's, and a table without rows. Empty header cells are allowed (an index column
// written without a name) and match no name.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// One data row: its cells (as many as the header's) and its 1-based line in the text.
struct CsvRow {
  size_t line = 0;
  std::vector<std::string> cells;
};

// A parsed table (see the file comment).
struct CsvTable {
  std::string source;  // names the text in messages
  size_t header_line = 0;
  std::vector<std::string> header;
  std::vector<CsvRow> rows;

  // The index of the column named `name`, or -1 (names are unique: ParseCsv refuses repeats).
  int Column(absl::string_view name) const {
    for (size_t i = 0; i < header.size(); ++i) {
      if (!header[i].empty() && header[i] == name) return static_cast<int>(i);
    }
    return -1;
  }
  // "source:line" of a row, for messages.
  std::string Where(const CsvRow& row) const { return absl::StrFormat("%s:%d", source, row.line); }
  // The header as written (joined), quoted for a message.
  std::string HeaderForMessage() const { return QuoteForMessage(absl::StrJoin(header, ","), 200); }
};

namespace detail {

inline constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";

// The text without a leading UTF-8 byte-order mark.
inline absl::string_view WithoutBom(absl::string_view text) {
  absl::ConsumePrefix(&text, kUtf8Bom);
  return text;
}

// Whether a line is skipped: blank, or a '#' comment.
inline bool IsSkippedCsvLine(absl::string_view line) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(line);
  return stripped.empty() || absl::StartsWith(stripped, "#");
}

// Splits one line into trimmed cells at `delimiter`, honouring double quotes; an error names
// `where` and the line.
inline absl::StatusOr<std::vector<std::string>> SplitCsvLine(absl::string_view line, char delimiter,
                                                             absl::string_view where) {
  std::vector<std::string> cells;
  size_t i = 0;
  const auto is_space = [&](char c) { return c != delimiter && absl::ascii_isspace(c); };
  for (;;) {
    while (i < line.size() && is_space(line[i])) ++i;
    std::string cell;
    if (i < line.size() && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            cell.push_back('"');
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        cell.push_back(line[i++]);
      }
      while (i < line.size() && is_space(line[i])) ++i;
      if (!closed || (i < line.size() && line[i] != delimiter)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %s quote in %s (a quoted cell is \"text\", with \"\" for a quote inside)", where,
            closed ? "text after a closing" : "unterminated", QuoteForMessage(line, 200)));
      }
    } else {
      const size_t end = std::min(line.find(delimiter, i), line.size());
      const absl::string_view raw = absl::StripAsciiWhitespace(line.substr(i, end - i));
      if (raw.find('"') != absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: stray quote in cell %s (quote the whole cell: \"text\")", where,
                            QuoteForMessage(raw)));
      }
      cell = std::string(raw);
      i = end;
    }
    cells.push_back(std::move(cell));
    if (i >= line.size()) break;
    ++i;  // the delimiter
  }
  return cells;
}

}  // namespace detail

// The header of CSV text (the file comment's rules), or nullopt when it has no line other than
// blank and '#' ones or the header line cannot be split; for format sniffing only (ParseCsv
// checks everything).
inline std::optional<std::vector<std::string>> CsvHeader(absl::string_view text,
                                                         bool allow_tabs = false) {
  for (absl::string_view line : absl::StrSplit(detail::WithoutBom(text), '\n')) {
    if (detail::IsSkippedCsvLine(line)) continue;
    const char delimiter = allow_tabs && absl::StrContains(line, '\t') ? '\t' : ',';
    absl::StatusOr<std::vector<std::string>> cells = detail::SplitCsvLine(line, delimiter, "");
    if (!cells.ok()) return std::nullopt;
    return *std::move(cells);
  }
  return std::nullopt;
}

// Parses CSV text (the file comment's rules). `source` names the text and `what` its role
// ("kernel profile") in messages; `allow_tabs` lets a header holding a tab make the table
// tab-separated.
inline absl::StatusOr<CsvTable> ParseCsv(absl::string_view text, absl::string_view source,
                                         absl::string_view what, bool allow_tabs = false) {
  CsvTable table;
  table.source = std::string(source);
  char delimiter = ',';
  size_t number = 0;
  for (absl::string_view line : absl::StrSplit(detail::WithoutBom(text), '\n')) {
    ++number;
    if (detail::IsSkippedCsvLine(line)) continue;
    const std::string where = absl::StrFormat("%s:%d", source, number);
    if (table.header_line == 0) {
      if (allow_tabs && absl::StrContains(line, '\t')) delimiter = '\t';
      absl::StatusOr<std::vector<std::string>> header =
          detail::SplitCsvLine(line, delimiter, where);
      if (!header.ok()) return header.status();
      for (size_t i = 0; i < header->size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (!(*header)[i].empty() && (*header)[i] == (*header)[j]) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "%s: the %s header names column %s twice (columns %d and %d); which one is meant "
                "is ambiguous: rename or drop one",
                where, what, QuoteForMessage((*header)[i]), j + 1, i + 1));
          }
        }
      }
      table.header = *std::move(header);
      table.header_line = number;
      continue;
    }
    absl::StatusOr<std::vector<std::string>> cells = detail::SplitCsvLine(line, delimiter, where);
    if (!cells.ok()) return cells.status();
    if (cells->size() != table.header.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: %d fields, the header has %d", where,
                                                        cells->size(), table.header.size()));
    }
    table.rows.push_back({.line = number, .cells = *std::move(cells)});
  }
  if (table.header_line == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: empty %s (no header line; only blank and '#' lines)", source, what));
  }
  if (table.rows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s has a header but no rows (the header is line %d)", source, what,
                        table.header_line));
  }
  return table;
}

}  // namespace wlb
