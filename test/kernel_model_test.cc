// Tests of include/wlb/cost/kernel_model.hpp.
#include "wlb/cost/kernel_model.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/io/kernel_profile.hpp"

namespace wlb {
namespace kernel_model_test {

using ::testing::HasSubstr;

// Blocks a tiled causal kernel visits, row by row: the slow definition PaddedFlops must match.
int64_t NaiveBlocks(int64_t q_len, int64_t kv_len, int64_t tq, int64_t tk) {
  int64_t blocks = 0;
  for (int64_t t = 0; t * tq < q_len; ++t) {
    int64_t keys = 0;  // keys the tile's rows see, max over rows
    for (int64_t row = t * tq; row < std::min((t + 1) * tq, q_len); ++row) {
      keys = std::max(keys, kv_len - q_len + row + 1);
    }
    blocks += (keys + tk - 1) / tk;
  }
  return blocks;
}

TEST(KernelModelTest, PaddedFlopsMatchesBlockCount) {
  for (auto [tq, tk] :
       {std::pair<int64_t, int64_t>{128, 128}, {128, 64}, {64, 48}, {1, 1}, {16, 128}}) {
    absl::StatusOr<KernelModel> m =
        KernelModel::Analytic({.shape = {.heads = 2, .head_dim = 8, .tile_q = tq, .tile_k = tk}});
    ASSERT_TRUE(m.ok()) << m.status();
    for (int64_t q : {1, 5, 63, 64, 127, 128, 129, 300, 1000}) {
      for (int64_t extra : {0, 1, 17, 128, 999}) {
        const int64_t kv = q + extra;
        EXPECT_DOUBLE_EQ(m->PaddedFlops(q, kv), 4.0 * 8 * 2 * static_cast<double>(tq * tk) *
                                                    static_cast<double>(NaiveBlocks(q, kv, tq, tk)))
            << "tile " << tq << "x" << tk << " q " << q << " kv " << kv;
      }
    }
    EXPECT_EQ(m->PaddedFlops(0, 10), 0.0);
    EXPECT_EQ(m->SegmentMs(0, 10), 0.0);
  }
}

TEST(KernelModelTest, TileOneCountsExactCausalPairs) {
  absl::StatusOr<KernelModel> m =
      KernelModel::Analytic({.shape = {.heads = 1, .head_dim = 1, .tile_q = 1, .tile_k = 1}});
  ASSERT_TRUE(m.ok());
  // Queries [3, 11) of a document: sum of 4..11 = 60 pairs, 4 FLOPs each.
  EXPECT_DOUBLE_EQ(m->PaddedFlops(8, 11), 4.0 * 60);
}

// The analytic defaults reproduce the FlashAttention-2 H100 causal forward figures they were
// fitted to (REFERENCE.md): 191 / 298 / 335 TFLOP/s at 512 / 2K / 16K, FLOPs counted unpadded.
TEST(KernelModelTest, DefaultAnalyticMatchesFlashAttention2Figures) {
  const KernelModel m = KernelModel::DefaultAnalytic();
  EXPECT_EQ(m.tile_q(), 128);
  EXPECT_EQ(m.tile_k(), 128);
  EXPECT_TRUE(m.analytic());
  for (auto [length, tflops] :
       {std::pair<int64_t, double>{512, 191.0}, {2048, 298.0}, {16384, 335.0}}) {
    const double flops = 4.0 * 128 * 32 * static_cast<double>(length * length) / 2;
    const double achieved = flops / (m.SegmentMs(length, length) * 1e9);
    EXPECT_NEAR(achieved / tflops, 1.0, 0.03) << length << ": " << achieved;
  }
}

TEST(KernelModelTest, FlatBelowOneTileAndFasterPerTokenAbove) {
  const KernelModel m = KernelModel::DefaultAnalytic();
  const double one_tile = m.SegmentMs(128, 8192);
  for (int64_t q : {1, 16, 64, 100, 127}) EXPECT_DOUBLE_EQ(m.SegmentMs(q, 8192), one_tile) << q;
  // Throughput rises from 128 to 256 query rows (the paper's measured jump).
  EXPECT_GT(m.FlopsPerMs(256, 8192), 1.2 * m.FlopsPerMs(128, 8192));
  // More keys, more time.
  EXPECT_GT(m.SegmentMs(128, 16384), m.SegmentMs(128, 8192));
  EXPECT_DOUBLE_EQ(m.SegmentMs(1, 1) - m.PaddedFlops(1, 1) / m.FlopsPerMs(1, 1), 1e-3);
}

// Default() is the committed H100 flash table, embedded: bit for bit the model read from the CSV
// (tools/gen_default_kernel_profile.py regenerates the embedded rows when the CSV changes), on
// the table's own shapes, between them and beyond them.
TEST(KernelModelTest, DefaultIsTheEmbeddedH100FlashTable) {
  const std::string csv =
      std::string(WLB_SOURCE_DIR) + "/docs/results/gpu/h100_kernel_profile_flash.csv";
  absl::StatusOr<KernelModel> read = ReadKernelProfileCsv(csv);
  ASSERT_TRUE(read.ok()) << read.status();
  const KernelModel m = KernelModel::Default();
  EXPECT_FALSE(m.analytic());
  EXPECT_EQ(m.tile_q(), 128);
  EXPECT_EQ(m.shape().heads, 32);
  EXPECT_EQ(m.shape().head_dim, 128);
  EXPECT_EQ(m.segment_overhead_ms(), 0.0);
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++rows;
    int64_t q = 0, kv = 0;
    double ms = 0.0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%" SCNd64 ",%" SCNd64 ",%lf", &q, &kv, &ms), 3) << line;
    EXPECT_DOUBLE_EQ(m.SegmentMs(q, kv), ms) << q << " " << kv;
  }
  EXPECT_EQ(rows, 103);
  std::mt19937_64 rng(61);
  for (int i = 0; i < 20000; ++i) {
    const int64_t kv = std::uniform_int_distribution<int64_t>(1, 1 << 20)(rng);
    const int64_t q = std::uniform_int_distribution<int64_t>(1, kv)(rng);
    ASSERT_EQ(m.SegmentMs(q, kv), read->SegmentMs(q, kv)) << q << " " << kv;
  }
}

// The table lookup searches lengths as integers, from the first length of their bit width, and
// takes log2 only between grid points: on random tables its result is the straightforward
// interpolation in (log2 q_len, log2 kv_len), clamped outside the table.
TEST(KernelModelTest, TableLookupIsTheLogLogInterpolation) {
  std::mt19937_64 rng(62);
  for (int table = 0; table < 60; ++table) {
    std::vector<KernelProfilePoint> points;
    std::vector<int64_t> qs;
    const int rows = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < rows; ++i)
      qs.push_back(std::uniform_int_distribution<int64_t>(1, 3000)(rng));
    std::sort(qs.begin(), qs.end());
    qs.erase(std::unique(qs.begin(), qs.end()), qs.end());
    // Per q: ascending (kv, FLOPs per ms) with kv >= q.
    std::vector<std::vector<std::pair<int64_t, double>>> grid;
    for (int64_t q : qs) {
      std::vector<int64_t> kvs;
      const int cols = std::uniform_int_distribution<int>(1, 9)(rng);
      for (int j = 0; j < cols; ++j) {
        kvs.push_back(q + std::uniform_int_distribution<int64_t>(0, 40000)(rng));
      }
      std::sort(kvs.begin(), kvs.end());
      kvs.erase(std::unique(kvs.begin(), kvs.end()), kvs.end());
      grid.emplace_back();
      for (int64_t kv : kvs) {
        const double ms = std::uniform_real_distribution<double>(0.01, 5.0)(rng);
        points.push_back({q, kv, ms});
        grid.back().push_back({kv, 0.0});
      }
    }
    absl::StatusOr<KernelModel> m = KernelModel::FromProfile(points);
    ASSERT_TRUE(m.ok()) << m.status();
    for (size_t i = 0, k = 0; i < qs.size(); ++i) {
      for (auto& [kv, rate] : grid[i]) rate = m->PaddedFlops(qs[i], kv) / points[k++].ms;
    }
    auto row = [&](size_t i, double lkv) {
      const auto& r = grid[i];
      if (lkv <= std::log2(static_cast<double>(r.front().first))) return r.front().second;
      if (lkv >= std::log2(static_cast<double>(r.back().first))) return r.back().second;
      size_t j = 1;
      while (std::log2(static_cast<double>(r[j].first)) <= lkv) ++j;
      const double a = std::log2(static_cast<double>(r[j - 1].first));
      const double w = (lkv - a) / (std::log2(static_cast<double>(r[j].first)) - a);
      return (1 - w) * r[j - 1].second + w * r[j].second;
    };
    for (int probe = 0; probe < 300; ++probe) {
      const int64_t kv = std::uniform_int_distribution<int64_t>(1, 50000)(rng);
      // Probe the grid's own lengths too.
      const int64_t q = probe % 3 == 0 ? qs[static_cast<size_t>(probe) % qs.size()]
                                       : std::uniform_int_distribution<int64_t>(1, 4000)(rng);
      const double lq = std::log2(static_cast<double>(q));
      const double lkv = std::log2(static_cast<double>(kv));
      double want = 0.0;
      if (q <= qs.front()) {
        want = row(0, lkv);
      } else if (q >= qs.back()) {
        want = row(qs.size() - 1, lkv);
      } else {
        size_t i = 1;
        while (qs[i] <= q) ++i;
        const double a = std::log2(static_cast<double>(qs[i - 1]));
        const double w = (lq - a) / (std::log2(static_cast<double>(qs[i])) - a);
        want = (1 - w) * row(i - 1, lkv) + w * row(i, lkv);
      }
      ASSERT_NEAR(m->FlopsPerMs(q, kv), want, 1e-12 * want)
          << "table " << table << " q " << q << " kv " << kv;
    }
  }
}

// FlopsPerMs remembers the shapes each thread asked (planning repeats them): tables asked the
// same shapes in turn, a table built where a destroyed one lived, and two threads at once must
// each get their own table's answer. Table k's times are k times table 1's, so its throughput is
// table 1's over k at every shape.
TEST(KernelModelTest, TablesAskedTheSameShapesAnswerEachTheirOwn) {
  auto table = [](double scale) {
    std::vector<KernelProfilePoint> points;
    for (const int64_t q : {64, 256, 1024}) {
      for (const int64_t kv : {1024, 8192, 65536}) {
        points.push_back({q, kv, scale * 1e-6 * static_cast<double>(q * kv)});
      }
    }
    absl::StatusOr<KernelModel> m = KernelModel::FromProfile(points);
    EXPECT_TRUE(m.ok()) << m.status();
    return *std::move(m);
  };
  const KernelModel one = table(1.0);
  auto check = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::optional<KernelModel> slot;  // rebuilt in place: a new table where the last one lived
    for (int round = 0; round < 200; ++round) {
      const int k = 2 + round % 3;
      slot.reset();
      slot.emplace(table(k));
      const KernelModel copy = *slot;  // a copy shares its table's memo
      for (int probe = 0; probe < 20; ++probe) {
        const int64_t q = std::uniform_int_distribution<int64_t>(1, 2048)(rng);
        const int64_t kv = q + std::uniform_int_distribution<int64_t>(0, 70000)(rng);
        const double want = one.FlopsPerMs(q, kv) / k;
        ASSERT_NEAR(slot->FlopsPerMs(q, kv), want, 1e-12 * want) << "table " << k;
        ASSERT_NEAR(one.FlopsPerMs(q, kv), want * k, 1e-12 * want * k);
        ASSERT_EQ(copy.FlopsPerMs(q, kv), slot->FlopsPerMs(q, kv));
      }
    }
  };
  std::thread other(check, 2);
  check(1);
  other.join();
}

TEST(KernelModelTest, AnalyticRejectsBadConstants) {
  AnalyticKernelParams p;
  p.peak_tflops = -1.0;
  absl::StatusOr<KernelModel> m = KernelModel::Analytic(p);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("peak_tflops must be > 0"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("got -1"));
  m = KernelModel::Analytic({.shape = {.tile_q = 0}});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("tile_q must be in [1, 1048576], got 0"));
  p = AnalyticKernelParams{};
  p.q_half = NAN;
  m = KernelModel::Analytic(p);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("q_half"));
  p = AnalyticKernelParams{};
  p.segment_overhead_ms = -0.5;
  m = KernelModel::Analytic(p);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("segment_overhead_ms must be >= 0"));
}

TEST(KernelModelTest, ProfilePointsAreTheRowsInFileOrder) {
  absl::StatusOr<std::vector<KernelProfilePoint>> points =
      ParseKernelProfilePoints("ms,kv_len,q_len\n0.5,300,100\n0.25,64,64\n", "t.csv");
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 2u);
  EXPECT_EQ((*points)[0].q_len, 100);
  EXPECT_EQ((*points)[0].kv_len, 300);
  EXPECT_EQ((*points)[0].ms, 0.5);
  EXPECT_EQ((*points)[1].q_len, 64);
  absl::StatusOr<std::vector<KernelProfilePoint>> bad =
      ParseKernelProfilePoints("q_len,kv_len,ms\n100,50,1\n", "t.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("t.csv:2: kv_len"));
}

// Points drawn from a known analytic curve (with +-2% noise) give back its constants.
TEST(KernelModelTest, FitRecoversAKnownAnalyticCurve) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 10; ++trial) {
    AnalyticKernelParams truth;
    truth.peak_tflops = std::uniform_real_distribution<double>(150, 700)(rng);
    truth.q_half = 8.0 * std::uniform_int_distribution<int>(0, 100)(rng);
    truth.kv_half = 64.0 * std::uniform_int_distribution<int>(0, 20)(rng);
    truth.segment_overhead_ms = 0.0;
    absl::StatusOr<KernelModel> model = KernelModel::Analytic(truth);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<KernelProfilePoint> points;
    for (int64_t q : {16, 64, 128, 256, 512, 1024, 4096, 8192}) {
      for (int64_t kv = q; kv <= 131072; kv *= 4) {
        const double noise = std::uniform_real_distribution<double>(0.98, 1.02)(rng);
        points.push_back({q, kv, model->SegmentMs(q, kv) * noise});
      }
    }
    absl::StatusOr<AnalyticKernelParams> fit = FitAnalyticKernelParams(points);
    ASSERT_TRUE(fit.ok()) << fit.status();
    absl::StatusOr<KernelModel> fitted = KernelModel::Analytic(*fit);
    ASSERT_TRUE(fitted.ok()) << fitted.status();
    for (const KernelProfilePoint& p : points) {
      const double truth_ms = model->SegmentMs(p.q_len, p.kv_len);
      EXPECT_NEAR(fitted->SegmentMs(p.q_len, p.kv_len) / truth_ms, 1.0, 0.03)
          << "trial " << trial << " q " << p.q_len << " kv " << p.kv_len;
    }
    EXPECT_EQ(fit->segment_overhead_ms, 0.0);
  }
  EXPECT_FALSE(FitAnalyticKernelParams(std::vector<KernelProfilePoint>{}).ok());
}

TEST(KernelModelTest, ProfileReproducesItsPointsAndInterpolates) {
  const std::string csv =
      "kv_len,q_len,ms,note\r\n"
      "1024,128,0.05,a\r\n"
      "4096,128,0.15,b\r\n"
      "1024,1024,0.30,c\r\n"
      "4096,1024,1.00,d\r\n"
      "4096,1024,1.20,repeat\r\n";
  absl::StatusOr<KernelModel> m = ParseKernelProfileCsv(csv, "t.csv");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->analytic());
  EXPECT_NEAR(m->SegmentMs(128, 1024), 0.05, 1e-12);
  EXPECT_NEAR(m->SegmentMs(128, 4096), 0.15, 1e-12);
  EXPECT_NEAR(m->SegmentMs(1024, 1024), 0.30, 1e-12);
  EXPECT_NEAR(m->SegmentMs(1024, 4096), 1.10, 1e-12);  // repeated rows are averaged
  // Between the rows: throughput between its neighbours' (linear in log2 q and log2 kv).
  const double mid = m->FlopsPerMs(362, 2048);
  const double lo = std::min({m->FlopsPerMs(128, 1024), m->FlopsPerMs(128, 4096),
                              m->FlopsPerMs(1024, 1024), m->FlopsPerMs(1024, 4096)});
  const double hi = std::max({m->FlopsPerMs(128, 1024), m->FlopsPerMs(128, 4096),
                              m->FlopsPerMs(1024, 1024), m->FlopsPerMs(1024, 4096)});
  EXPECT_GT(mid, lo);
  EXPECT_LT(mid, hi);
  const double kv_mid = m->FlopsPerMs(128, 2048);  // halfway in log2 between 1024 and 4096
  EXPECT_NEAR(kv_mid, (m->FlopsPerMs(128, 1024) + m->FlopsPerMs(128, 4096)) / 2, kv_mid * 1e-12);
  // Outside the table: clamped to the nearest row's throughput.
  EXPECT_DOUBLE_EQ(m->FlopsPerMs(64, 512), m->FlopsPerMs(128, 1024));
  EXPECT_DOUBLE_EQ(m->FlopsPerMs(8192, 65536), m->FlopsPerMs(1024, 4096));
}

TEST(KernelModelTest, ProfileOverheadIsAdded) {
  const std::vector<KernelProfilePoint> pts = {{128, 128, 0.02}};
  absl::StatusOr<KernelModel> m = KernelModel::FromProfile(pts, {}, 0.004);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->SegmentMs(128, 128), 0.024, 1e-12);
  EXPECT_NEAR(m->SegmentMs(256, 256), 3 * 0.02 + 0.004, 1e-12);  // 3 blocks at one throughput
}

TEST(KernelModelTest, ProfileReadsTheNamedTimeColumn) {
  // The profiler's layout: forward ms, then the backward of the same call.
  const std::string text = "q_len,kv_len,ms,bwd_ms,note\n128,128,0.5,1.25,x\n128,256,1,2.5,y\n";
  absl::StatusOr<KernelModel> fwd = ParseKernelProfileCsv(text, "t.csv");
  absl::StatusOr<KernelModel> bwd =
      ParseKernelProfileCsv(text, "t.csv", {}, 0.0, kBackwardMsColumn);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  EXPECT_NEAR(fwd->SegmentMs(128, 128), 0.5, 1e-12);
  EXPECT_NEAR(bwd->SegmentMs(128, 128), 1.25, 1e-12);
  EXPECT_NEAR(bwd->SegmentMs(128, 256), 2.5, 1e-12);
  absl::StatusOr<std::vector<KernelProfilePoint>> points =
      ParseKernelProfilePoints(text, "t.csv", kBackwardMsColumn);
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 2u);
  EXPECT_EQ((*points)[1].ms, 2.5);
  // A table without the column, and a bad value in it, are errors that name it.
  EXPECT_THAT(std::string(ParseKernelProfileCsv("q_len,kv_len,ms\n1,1,1\n", "t.csv", {}, 0.0,
                                                kBackwardMsColumn)
                              .status()
                              .message()),
              HasSubstr("must name the columns q_len, kv_len and bwd_ms"));
  EXPECT_THAT(std::string(ParseKernelProfileCsv("q_len,kv_len,ms,bwd_ms\n1,1,1,-3\n", "t.csv",
                                                {}, 0.0, kBackwardMsColumn)
                              .status()
                              .message()),
              HasSubstr("t.csv:2: bwd_ms '-3' is not a number"));
}

TEST(KernelModelTest, ProfileErrorsNameLineAndValue) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "empty kernel profile"},
      {"q_len,ms\n1,2\n", "t.csv:1: header 'q_len,ms' must name the columns q_len, kv_len and ms"},
      {"q_len,kv_len,ms\n", "has a header but no rows"},
      {"q_len,kv_len,ms\n128,128,0.1\nabc,128,0.1\n",
       "t.csv:3: q_len 'abc' is not an integer in [1, 16777216]"},
      {"q_len,kv_len,ms\n0,128,0.1\n", "t.csv:2: q_len '0'"},
      {"q_len,kv_len,ms\n256,128,0.1\n",
       "t.csv:2: kv_len '128' is not an integer in [q_len 256, 16777216]"},
      {"q_len,kv_len,ms\n128,128,-2\n", "t.csv:2: ms '-2' is not a number in [1e-06, 1e+07]"},
      {"q_len,kv_len,ms\n128,128,inf\n", "t.csv:2: ms 'inf'"},
      {"q_len,kv_len,ms\n128,128\n", "t.csv:2: 2 fields, the header has 3"},
      // INT64_MAX used to overflow PaddedFlops into a negative latency; 1e308 ms into inf/NaN.
      {"q_len,kv_len,ms\n9223372036854775807,9223372036854775807,1\n",
       "q_len '9223372036854775807' is not an integer in [1, 16777216]"},
      {"q_len,kv_len,ms\n128,16777217,1\n", "kv_len '16777217' is not an integer in [q_len 128"},
      {"q_len,kv_len,ms\n128,128,1e308\n", "ms '1e308' is not a number in [1e-06, 1e+07]"},
      {std::string("q_len,kv_len,ms\n128,128,") + std::string(5000, '9') + "\n",
       "(5000 bytes in all) is not a number"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<KernelModel> m = ParseKernelProfileCsv(c.text, "t.csv");
    ASSERT_FALSE(m.ok()) << c.text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.expected)) << c.text;
  }
  absl::StatusOr<KernelModel> bad_shape =
      ParseKernelProfileCsv("q_len,kv_len,ms\n1,1,1\n", "t.csv", {.head_dim = -4});
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_THAT(std::string(bad_shape.status().message()),
              HasSubstr("head_dim must be in [1, 1048576], got -4"));
  const std::vector<KernelProfilePoint> empty;
  EXPECT_THAT(std::string(KernelModel::FromProfile(empty).status().message()),
              HasSubstr("no points"));
}

TEST(KernelModelTest, ReadsProfileFile) {
  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "kernel_model_test_profile.csv";
  {
    std::ofstream out(path);
    out << "q_len,kv_len,ms\n128,128,0.01\n128,8192,0.2\n";
  }
  absl::StatusOr<KernelModel> m = ReadKernelProfileCsv(path.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->SegmentMs(128, 8192), 0.2, 1e-12);
  std::filesystem::remove(path);
  absl::StatusOr<KernelModel> missing = ReadKernelProfileCsv(path.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(path.string()));
}

TEST(KernelModelTest, ProfilePointsBeyondTheLimitsAreRejected) {
  const std::vector<KernelProfilePoint> huge = {{.q_len = INT64_MAX, .kv_len = INT64_MAX, .ms = 1}};
  EXPECT_THAT(std::string(KernelModel::FromProfile(huge).status().message()),
              HasSubstr("need 0 < q_len <= kv_len <= 16777216"));
  const std::vector<KernelProfilePoint> slow = {{.q_len = 128, .kv_len = 128, .ms = 1e308}};
  EXPECT_THAT(std::string(KernelModel::FromProfile(slow).status().message()),
              HasSubstr("ms must be in [1e-06, 1e+07], got 1e+308"));
  // At the limits every latency is finite and positive.
  const std::vector<KernelProfilePoint> edge = {
      {.q_len = 1, .kv_len = 1, .ms = kMinProfileMs},
      {.q_len = kMaxContext, .kv_len = kMaxContext, .ms = kMaxProfileMs}};
  absl::StatusOr<KernelModel> m = KernelModel::FromProfile(edge);
  ASSERT_TRUE(m.ok()) << m.status();
  for (int64_t kv : {int64_t{1}, int64_t{4096}, kMaxContext, kMaxMaxTokens}) {
    const double ms = m->SegmentMs(kv, kv);
    EXPECT_TRUE(std::isfinite(ms) && ms > 0) << kv << ": " << ms;
  }
}

}  // namespace kernel_model_test
}  // namespace wlb
