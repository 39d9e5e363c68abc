// CP index maps on the CPU: worked example, errors, and the property that the executor's whole
// dataflow (CpuCpAttention: shard, all-gather, gather, per-rank attention, CSR sum,
// reduce-scatter) equals single-device attention over the packed micro-batch for thousands of
// random shard plans, at float64.
#include "wlb/cuda/cp_maps.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "test/test_util.h"
#include "wlb/cuda/cp_reference.h"
#include "wlb/cuda/cpu_reference.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace wlb::cuda {
namespace {

using ::testing::HasSubstr;

constexpr auto kStrategies = ShardStrategy::All();  // every registered strategy

MicroBatch Batch(const std::vector<int64_t>& lengths) {
  MicroBatch mb;
  for (int64_t l : lengths) {
    mb.documents.push_back(Document{.id = static_cast<int64_t>(mb.documents.size()), .length = l});
    mb.tokens += l;
  }
  return mb;
}

CpAttentionConfig SmallConfig(int heads = 2, int kv_heads = 1, int head_dim = 3) {
  return {.num_heads = heads,
          .num_kv_heads = kv_heads,
          .head_dim = head_dim,
          .kernel = AttentionKernel::kReference};
}

// Tile 4 so that hybrid shards documents of >= 8C tokens even in small micro-batches.
KernelModel SmallTileModel() {
  AnalyticKernelParams p;
  p.shape.tile_q = p.shape.tile_k = 4;
  return *KernelModel::Analytic(p);
}

// Largest |a - b| / (1 + |b|); infinity when any value is NaN.
double MaxError(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(a[i] - b[i]) / (1.0 + std::abs(b[i]));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

TEST(CpMapsTest, WorkedExamplePerDocument) {
  // Documents 5, 19, 8 (REFERENCE.md's artifact example), C = 2, per-document sharding.
  const MicroBatch mb = Batch({5, 19, 8});
  absl::StatusOr<ShardPlan> plan =
      PlanShards(mb, 2, ShardStrategy("per-doc"), KernelModel::Default());
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<CpMaps> maps = BuildCpMaps(*plan, SmallConfig());
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->rank_capacity, 16);
  // Rank 0 holds shard 0 then shard 3 of every document; the first shard of document 0 is
  // tokens [0, 2) (5 = 1 + 1 + 1 + 1 + remainder 1 to shard 0).
  const CpRankMaps& r0 = maps->ranks[0];
  ASSERT_GE(r0.local_to_packed.size(), 2u);
  EXPECT_EQ(r0.local_to_packed[0], 0);
  EXPECT_EQ(r0.local_to_packed[1], 1);
  EXPECT_EQ(r0.problem.cu_seqlens_q.front(), 0);
  EXPECT_EQ(r0.problem.total_q(), r0.tokens);
  EXPECT_EQ(r0.tokens + maps->ranks[1].tokens, 32);
  // Every packed token is at its own local row after the all-gather.
  for (int r = 0; r < 2; ++r) {
    const CpRankMaps& m = maps->ranks[r];
    for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
      EXPECT_EQ(maps->packed_to_gathered[m.local_to_packed[i]], r * 16 + static_cast<int>(i));
    }
  }
  // Rank 0's first segment (document 0, queries [0, 2)) needs keys 0, 1 of the packed batch.
  EXPECT_EQ(r0.key_rows[0], maps->packed_to_gathered[0]);
  EXPECT_EQ(r0.key_rows[1], maps->packed_to_gathered[1]);
  // The transpose lists every key row once.
  std::vector<int32_t> sources = r0.key_sources;
  std::sort(sources.begin(), sources.end());
  for (size_t j = 0; j < sources.size(); ++j) EXPECT_EQ(sources[j], static_cast<int32_t>(j));
}

TEST(CpMapsTest, RejectsBadConfigAndInconsistentPlans) {
  const MicroBatch mb = Batch({7, 9});
  ShardPlan plan = *PlanShards(mb, 2, ShardStrategy("per-seq"), KernelModel::Default());
  CpAttentionConfig flash = SmallConfig(4, 2, 96);
  flash.kernel = AttentionKernel::kFlash;
  absl::StatusOr<CpMaps> bad_dim = BuildCpMaps(plan, flash);
  EXPECT_EQ(bad_dim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_dim.status().message(), HasSubstr("96"));
  EXPECT_EQ(BuildCpMaps(plan, SmallConfig(3, 2, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);  // 2 kv heads do not divide 3
  // No silent causal fallback: a sliding window or chunked mask is refused by name.
  CpAttentionConfig window = SmallConfig();
  window.mask = *AttentionMask::SlidingWindow(4096);
  EXPECT_THAT(BuildCpMaps(plan, window).status().message(),
              HasSubstr("causal masks only, got attention mask window:4096"));
  window.mask = *AttentionMask::ChunkedLocal(8);
  EXPECT_THAT(WholeBatchProblem(mb, window).status().message(), HasSubstr("chunk:8"));

  ShardPlan missing = plan;
  missing.ranks[1].segments.pop_back();
  absl::StatusOr<CpMaps> m = BuildCpMaps(missing, SmallConfig());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("held by no rank"));

  ShardPlan twice = plan;
  twice.ranks[1].segments.push_back(twice.ranks[0].segments.front());
  twice.rank_capacity += 16;
  EXPECT_THAT(BuildCpMaps(twice, SmallConfig()).status().message(), HasSubstr("held by rank"));

  ShardPlan outside = plan;
  outside.ranks[0].segments.front().k_pos = 100;
  EXPECT_THAT(BuildCpMaps(outside, SmallConfig()).status().message(),
              HasSubstr("do not lie in the 16-token micro-batch"));

  ShardPlan over = plan;
  over.rank_capacity = 3;
  EXPECT_THAT(BuildCpMaps(over, SmallConfig()).status().message(),
              HasSubstr("rank_capacity 3"));

  EXPECT_EQ(WholeBatchProblem(MicroBatch{}, SmallConfig()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpMapsTest, TinyMicroBatchLeavesRanksWithoutWork) {
  const MicroBatch mb = Batch({3});
  ShardPlan plan = *PlanShards(mb, 4, ShardStrategy("per-doc"), KernelModel::Default());
  absl::StatusOr<CpMaps> maps = BuildCpMaps(plan, SmallConfig());
  ASSERT_TRUE(maps.ok()) << maps.status();
  int idle = 0;
  for (const CpRankMaps& m : maps->ranks) {
    if (!m.has_work()) {
      ++idle;
      EXPECT_TRUE(m.key_rows.empty());
      EXPECT_EQ(m.key_offsets.back(), 0);
    }
  }
  EXPECT_EQ(idle, 1);  // 3 tokens over 4 ranks: one rank holds nothing
}

struct Case {
  MicroBatch mb;
  CpAttentionConfig config;
  testing::Inputs in;
  CpuForward whole_f;
  CpuGradients whole_g;
};

Case MakeCase(std::mt19937_64& rng, int iter) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<int64_t> lengths;
  switch (iter % 3) {
    case 0:  // many short documents, many below 2C
      for (int64_t n = uniform(1, 30); n > 0; --n) lengths.push_back(uniform(1, 9));
      break;
    case 1:  // one long document among small ones
      for (int64_t n = uniform(0, 3); n > 0; --n) lengths.push_back(uniform(1, 20));
      lengths.insert(lengths.begin() + uniform(0, int64_t(lengths.size())), uniform(64, 160));
      break;
    default:  // heavy-tailed mix
      for (int64_t n = uniform(1, 8); n > 0; --n) {
        lengths.push_back(uniform(0, 4) == 0 ? uniform(40, 120) : uniform(1, 30));
      }
  }
  Case c;
  c.mb = Batch(lengths);
  c.config = iter % 2 ? SmallConfig(2, 1, 3) : SmallConfig(4, 2, 2);  // GQA groups of 2
  const AttentionProblem whole = *WholeBatchProblem(c.mb, c.config);
  c.in = testing::RandomInputs(whole, rng);
  c.whole_f = *CpuAttentionForward(whole, c.in.q, c.in.k, c.in.v);
  c.whole_g = *CpuAttentionBackward(whole, c.in.q, c.in.k, c.in.v, c.in.dout);
  return c;
}

TEST(CpMapsPropertyTest, EmulatedDataflowEqualsSingleDevice) {
  std::mt19937_64 rng(6);
  const KernelModel models[] = {KernelModel::Default(), SmallTileModel()};
  int plans = 0, multi_segment_ranks = 0, moved = 0, split_prefixes = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    const Case c = MakeCase(rng, iter);
    const int cp = static_cast<int>(std::uniform_int_distribution<int>(1, 16)(rng));
    for (ShardStrategy strategy : kStrategies) {
      absl::StatusOr<ShardPlan> plan = PlanShards(c.mb, cp, strategy, models[iter % 2]);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<RankExchange> predicted = ExchangedKvRows(*plan);
      // Row-exact under both schedules on every plan; the all-gather on even iterations, split
      // and whole in turn.
      struct Run {
        ExchangeKind exchange;
        CpSchedule schedule;
      };
      std::vector<Run> runs = {{ExchangeKind::kRowExact, CpSchedule::kSplit},
                               {ExchangeKind::kRowExact, CpSchedule::kWhole}};
      if (iter % 2 == 0) {
        runs.push_back({ExchangeKind::kAllGather,
                        iter % 4 == 0 ? CpSchedule::kSplit : CpSchedule::kWhole});
      }
      for (const auto [exchange, schedule] : runs) {
        absl::StatusOr<CpMaps> maps = BuildCpMaps(*plan, c.config, exchange, schedule);
        ASSERT_TRUE(maps.ok()) << maps.status();
        absl::StatusOr<CpuCpResult> cp_result =
            CpuCpAttention(*maps, c.in.q, c.in.k, c.in.v, c.in.dout);
        ASSERT_TRUE(cp_result.ok()) << cp_result.status();
        const std::string where = absl::StrFormat(
            "iter %d, C %d, %s (used %s), %s, %s, %d tokens", iter, cp,
            ShardStrategyName(strategy), ShardStrategyName(plan->strategy),
            ExchangeKindName(exchange), CpScheduleName(schedule), c.mb.tokens);
        // Whole: same rows, same key order, only the dK/dV summation order differs. Split: the
        // log-sum-exp merge of two exact parts.
        ASSERT_LE(MaxError(cp_result->out, c.whole_f.out), 1e-13) << where;
        ASSERT_LE(MaxError(cp_result->lse, c.whole_f.lse), 1e-13) << where;
        ASSERT_LE(MaxError(cp_result->dq, c.whole_g.dq), 1e-12) << where;
        ASSERT_LE(MaxError(cp_result->dk, c.whole_g.dk), 1e-12) << where;
        ASSERT_LE(MaxError(cp_result->dv, c.whole_g.dv), 1e-12) << where;
        // The rows moved are the planner's: exactly the rows needed, or every other buffer.
        for (int r = 0; r < cp; ++r) {
          const int64_t all = int64_t{cp - 1} * plan->rank_capacity;
          const bool exact = exchange == ExchangeKind::kRowExact;
          ASSERT_EQ(cp_result->received_rows[r], exact ? predicted[r].recv_rows : all) << where;
          ASSERT_EQ(cp_result->sent_rows[r], exact ? predicted[r].send_rows : all) << where;
          moved += exact && predicted[r].recv_rows > 0;
        }
        ++plans;
        for (const CpRankMaps& m : maps->ranks) {
          multi_segment_ranks += m.problem.batch() > 1;
          split_prefixes += m.problem.batch() > 0 && schedule == CpSchedule::kSplit;
        }
      }
    }
  }
  EXPECT_EQ(plans, 2500 * static_cast<int>(std::size(kStrategies)));
  EXPECT_GT(split_prefixes, 10000);  // split ranks with both a diagonal and a prefix part
  EXPECT_GT(multi_segment_ranks, 6000);  // the maps were exercised with several segments per rank
  EXPECT_GT(moved, 5000);                // and the row-exact exchange with rows to move
}

// The property above has power: one wrong key index or one lost dK contribution breaks it.
TEST(CpMapsPropertyTest, CorruptedMapsAreCaught) {
  std::mt19937_64 rng(7);
  const MicroBatch mb = Batch({40, 7, 90, 4});
  const CpAttentionConfig config = SmallConfig();
  const AttentionProblem whole = *WholeBatchProblem(mb, config);
  const testing::Inputs in = testing::RandomInputs(whole, rng);
  const CpuGradients g = *CpuAttentionBackward(whole, in.q, in.k, in.v, in.dout);
  const CpuForward f = *CpuAttentionForward(whole, in.q, in.k, in.v);
  const CpMaps good =
      *BuildCpMaps(*PlanShards(mb, 4, ShardStrategy("per-doc"), KernelModel::Default()), config);
  ASSERT_LE(MaxError(CpuCpAttention(good, in.q, in.k, in.v, in.dout)->out, f.out), 1e-13);

  // Keys are a set to a query that sees all of them, so exchange the first key of rank 1's first
  // segment with its last, which the segment's first query does not see.
  CpMaps swapped = good;
  std::vector<int32_t>& keys = swapped.ranks[1].key_rows;
  ASSERT_GE(swapped.ranks[1].problem.seqlen_q(0), 2);
  std::swap(keys[0], keys[swapped.ranks[1].problem.cu_seqlens_k[1] - 1]);
  EXPECT_GT(MaxError(CpuCpAttention(swapped, in.q, in.k, in.v, in.dout)->out, f.out), 1e-6);

  CpMaps padding = good;  // a key pointing at a padding row reads NaN
  const auto short_rank = std::find_if(good.ranks.begin(), good.ranks.end(), [&](const auto& r) {
    return r.tokens < good.rank_capacity;
  });
  ASSERT_NE(short_rank, good.ranks.end()) << "141 tokens over 4 ranks leave one short";
  padding.ranks[0].key_rows[0] =
      static_cast<int32_t>((short_rank->rank + 1) * good.rank_capacity - 1);
  EXPECT_TRUE(
      std::isinf(MaxError(CpuCpAttention(padding, in.q, in.k, in.v, in.dout)->out, f.out)));

  // Row-exact: a key that reads the wrong received row, and a returned gradient dropped.
  const CpMaps exact =
      *BuildCpMaps(*PlanShards(mb, 4, ShardStrategy("per-doc"), KernelModel::Default()), config,
                   ExchangeKind::kRowExact);
  ASSERT_LE(MaxError(CpuCpAttention(exact, in.q, in.k, in.v, in.dout)->dk, g.dk), 1e-12);
  CpMaps misread = exact;
  CpRankMaps& reader = misread.ranks[3];
  ASSERT_GT(reader.source_rows, reader.tokens + 1) << "rank 3 receives rows";
  for (int32_t& row : reader.key_rows) {
    if (row == reader.tokens) row = static_cast<int32_t>(reader.tokens + 1);
  }
  EXPECT_GT(MaxError(CpuCpAttention(misread, in.q, in.k, in.v, in.dout)->out, f.out), 1e-6);
  CpMaps unreturned = exact;
  CpRankMaps& owner = unreturned.ranks[0];
  ASSERT_FALSE(owner.return_sources.empty());
  size_t sent = 0;
  while (owner.return_offsets[sent + 1] == owner.return_offsets[sent]) ++sent;
  owner.return_sources.erase(owner.return_sources.begin() + owner.return_offsets[sent]);
  for (size_t i = sent + 1; i < owner.return_offsets.size(); ++i) --owner.return_offsets[i];
  EXPECT_GT(MaxError(CpuCpAttention(unreturned, in.q, in.k, in.v, in.dout)->dk, g.dk), 1e-6);
  CpMaps miscounted = exact;  // the two sides of the all-to-all-v disagree
  miscounted.ranks[1].recv_counts[0] += 1;
  EXPECT_THAT(CpuCpAttention(miscounted, in.q, in.k, in.v, in.dout).status().message(),
              HasSubstr("rank 0 sends"));

  // Split: a prefix query read from the wrong local row, a diagonal dK contribution dropped.
  const CpMaps split =
      *BuildCpMaps(*PlanShards(mb, 4, ShardStrategy("per-doc"), KernelModel::Default()), config,
                   ExchangeKind::kRowExact, CpSchedule::kSplit);
  ASSERT_LE(MaxError(CpuCpAttention(split, in.q, in.k, in.v, in.dout)->dk, g.dk), 1e-12);
  CpMaps shifted = split;
  ASSERT_GE(shifted.ranks[1].query_rows.size(), 2u) << "rank 1 has prefix queries";
  std::swap(shifted.ranks[1].query_rows.front(), shifted.ranks[1].query_rows.back());
  EXPECT_GT(MaxError(CpuCpAttention(shifted, in.q, in.k, in.v, in.dout)->out, f.out), 1e-6);
  CpMaps no_diagonal = split;
  CpRankMaps& d = no_diagonal.ranks[2];
  const auto diagonal_key = std::find_if(d.key_sources.begin(), d.key_sources.end(), [&](int32_t e) {
    return e >= d.problem.total_k();
  });
  ASSERT_NE(diagonal_key, d.key_sources.end());
  const int64_t at = diagonal_key - d.key_sources.begin();
  d.key_sources.erase(diagonal_key);
  for (int32_t& o : d.key_offsets) o -= o > at;
  EXPECT_GT(MaxError(CpuCpAttention(no_diagonal, in.q, in.k, in.v, in.dout)->dk, g.dk), 1e-6);

  CpMaps lost = good;  // one dK contribution dropped from the transpose
  CpRankMaps& m = lost.ranks[2];
  size_t row = 0;
  while (m.key_offsets[row + 1] == m.key_offsets[row]) ++row;
  m.key_sources.erase(m.key_sources.begin() + m.key_offsets[row]);
  for (size_t i = row + 1; i < m.key_offsets.size(); ++i) --m.key_offsets[i];
  EXPECT_GT(MaxError(CpuCpAttention(lost, in.q, in.k, in.v, in.dout)->dk, g.dk), 1e-6);
}

}  // namespace
}  // namespace wlb::cuda

namespace wlb::cuda {
namespace {

// The profiler's CSV (bench/kernel_profiler.cc) puts its provenance in the header's last column
// and leaves it empty in the rows; the kernel model must keep reading that layout.
TEST(KernelProfileFormatTest, ProvenanceColumnParses) {
  const char* csv =
      "q_len,kv_len,ms,bwd_ms,measured 2025-01-01T00:00:00Z on NVIDIA H200: "
      "wlb_cuda_kernel_profiler --out=p.csv\n"
      "128,128,0.010,0.030,\n"
      "128,1024,0.050,0.140,\n"
      "1024,1024,0.200,0.550,\n";
  absl::StatusOr<KernelModel> m = ParseKernelProfileCsv(csv, "profile");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->analytic());
  EXPECT_NEAR(m->SegmentMs(128, 1024), 0.050, 1e-9);
}

}  // namespace
}  // namespace wlb::cuda
