// Tests of the one CSV row reader (wlb/io/csv.hpp) and of every table reader built on it: each
// reader in kReaders gets the same checks (a byte-order mark, \r\n line endings, quoted cells and
// comment lines change nothing; a column named twice, a stray or unterminated quote are refused),
// so a new reader added to the list gets them too.
#include "wlb/io/csv.hpp"

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/io/micro_batch_csv.hpp"
#include "wlb/io/profile.hpp"

namespace wlb {
namespace csv_test {

using ::testing::HasSubstr;

TEST(ParseCsv, DropsTheBomSkipsCommentsAndReadsQuotedCells) {
  absl::StatusOr<CsvTable> t = ParseCsv(
      "\xEF\xBB\xBF# made by hand\r\n\r\n a , \"b,c\" ,\"\"\r\n1,\" x \"\"y\"\" \", 2 \r\n",
      "t.csv", "table");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->header, (std::vector<std::string>{"a", "b,c", ""}));
  EXPECT_EQ(t->header_line, 3u);
  EXPECT_EQ(t->Column("a"), 0);
  EXPECT_EQ(t->Column("b,c"), 1);
  EXPECT_EQ(t->Column(""), -1);  // an unnamed column matches no name
  ASSERT_EQ(t->rows.size(), 1u);
  EXPECT_EQ(t->rows[0].cells, (std::vector<std::string>{"1", " x \"y\" ", "2"}));
  EXPECT_EQ(t->Where(t->rows[0]), "t.csv:4");
  // Two unnamed columns (an index written without a name, twice) are not a repeat.
  EXPECT_TRUE(ParseCsv(",,a\n1,2,3\n", "t.csv", "table").ok());
  // Tabs separate only where the caller allows it.
  absl::StatusOr<CsvTable> tabs = ParseCsv("a\tb\n1\t2\n", "t.tsv", "table", true);
  ASSERT_TRUE(tabs.ok());
  EXPECT_EQ(tabs->header.size(), 2u);
  EXPECT_EQ(ParseCsv("a\tb\n1\t2\n", "t.tsv", "table").value().header.size(), 1u);
}

TEST(ParseCsv, EveryBadTableIsOneErrorNamingTheLineAndValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "t.csv: empty table (no header line"},
      {"\xEF\xBB\xBF\n# c\n", "t.csv: empty table"},
      {"a,b\n", "t.csv: table has a header but no rows (the header is line 1)"},
      {"ms,lengths,ms\n1,2,3\n",
       "t.csv:1: the table header names column 'ms' twice (columns 1 and 3)"},
      {"# c\na, b ,\"b\"\n1,2,3\n", "t.csv:2: the table header names column 'b' twice"},
      {"a,b\n1,2\"3\n", "t.csv:2: stray quote in cell '2\\\"3'"},
      {"a,b\n1,\"2\n", "t.csv:2: unterminated quote"},
      {"a,b\n1,\"2\"3\n", "t.csv:2: text after a closing quote"},
      {"a,b\n1,2,3\n", "t.csv:2: 3 fields, the header has 2"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<CsvTable> t = ParseCsv(text, "t.csv", "table");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_THAT(t.status().message(), HasSubstr(want)) << text;
  }
}

// One table reader: a valid text, and a function that parses text to a comparable string (the
// parsed values) or the error.
struct Reader {
  const char* name;
  std::string good;
  std::function<absl::StatusOr<std::string>(const std::string&)> parse;
};

std::vector<Reader> Readers() {
  const auto str = [](auto status_or, auto format) -> absl::StatusOr<std::string> {
    if (!status_or.ok()) return status_or.status();
    return absl::StrJoin(*status_or, "|", format);
  };
  return {
      {"micro-batch measurements", "step,ms,lengths\n0,1.5,4096;12\n1,2,300\n2,0.5,7;8;9\n",
       [&](const std::string& t) {
         return str(ParseMicroBatchCsv(t, "m.csv"), [](std::string* out,
                                                       const MicroBatchSample& s) {
           absl::StrAppend(out, absl::StrJoin(s.lengths, ";"), "@", s.ms, "#", s.step.value_or(-1));
         });
       }},
      {"profile", "length,ms\n128,0.02\n1024,0.1\n8192,3.1\n",
       [&](const std::string& t) {
         return str(ParseProfileCsv(t, "p.csv"), [](std::string* out, const ProfilePoint& p) {
           absl::StrAppend(out, p.length, "@", p.ms);
         });
       }},
      {"kernel profile", "q_len,kv_len,ms\n128,128,0.02\n1024,4096,0.3\n",
       [&](const std::string& t) {
         return str(ParseKernelProfilePoints(t, "k.csv"),
                    [](std::string* out, const KernelProfilePoint& p) {
                      absl::StrAppend(out, p.q_len, ":", p.kv_len, "@", p.ms);
                    });
       }},
      {"packed-call profile", "segments,ms,bwd_ms\n128:128 64:64,0.02,0.05\n1024:4096,0.3,0.7\n",
       [&](const std::string& t) {
         return str(ParsePackedCallProfile(t, "c.csv"),
                    [](std::string* out, const PackedCallPoint& p) {
                      for (const CallSegment& s : p.segments) {
                        absl::StrAppend(out, s.q_len, ":", s.kv_len, " ");
                      }
                      absl::StrAppend(out, "@", p.fwd_ms, "/", p.bwd_ms);
                    });
       }},
  };
}

// Every reader: the same values through a BOM, \r\n, comment lines and quoted cells; a header
// naming one of its columns twice is refused, whichever column and wherever the copy stands.
TEST(CsvReaders, ShareTheRowReadersRulesProperty) {
  std::mt19937_64 rng(60);
  for (const Reader& reader : Readers()) {
    SCOPED_TRACE(reader.name);
    absl::StatusOr<std::string> want = reader.parse(reader.good);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<std::string> lines = absl::StrSplit(reader.good, '\n', absl::SkipEmpty());
    const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
    for (int trial = 0; trial < 20; ++trial) {
      std::string text = trial % 2 == 0 ? "\xEF\xBB\xBF" : "";
      const std::string eol = trial % 3 == 0 ? "\r\n" : "\n";
      for (size_t i = 0; i < lines.size(); ++i) {
        if (rng() % 3 == 0) text += "# comment, with, commas" + eol;
        std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
        for (std::string& c : cells) {
          if (rng() % 2 == 0) c = "\"" + c + "\"";
        }
        text += absl::StrJoin(cells, rng() % 2 == 0 ? "," : " , ") + eol;
      }
      absl::StatusOr<std::string> got = reader.parse(text);
      ASSERT_TRUE(got.ok()) << got.status() << "\n" << text;
      EXPECT_EQ(*got, *want) << text;
    }
    for (size_t col = 0; col < header.size(); ++col) {
      for (size_t at = 0; at <= header.size(); ++at) {
        std::vector<std::string> h = header;
        h.insert(h.begin() + static_cast<std::ptrdiff_t>(at), header[col]);
        std::string text = absl::StrJoin(h, ",") + "\n";
        for (size_t i = 1; i < lines.size(); ++i) {
          std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
          cells.insert(cells.begin() + static_cast<std::ptrdiff_t>(at), cells[col]);
          text += absl::StrJoin(cells, ",") + "\n";
        }
        absl::StatusOr<std::string> got = reader.parse(text);
        ASSERT_FALSE(got.ok()) << text;
        EXPECT_THAT(got.status().message(), HasSubstr("names column '" + header[col] + "' twice"));
      }
    }
    // An unterminated quote is refused by every reader.
    EXPECT_THAT(reader.parse(lines[0] + "\n\"" + lines[1] + "\n").status().message(),
                HasSubstr(":2: unterminated quote"));
  }
}

}  // namespace csv_test
}  // namespace wlb
