// Tests of include/wlb/shard/shard_maps.hpp.
#include "wlb/shard/shard_maps.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/shard/cp_prediction.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace wlb {
namespace shard_maps_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::wlb::testing::MakeMicroBatch;

TEST(ShardMapsTest, WorkedExamplePerSequence) {
  // Documents 5, 19, 8 at CP 2: rank 0 holds packed rows [0, 8) and [24, 32).
  const ShardPlan plan =
      *PlanShards(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy("per-seq"), KernelModel::Default());
  const ShardMaps maps = *BuildShardMaps(plan);
  ASSERT_EQ(maps.ranks.size(), 2u);
  EXPECT_THAT(maps.ranks[0].local_to_packed,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31));
  // Rank 0's keys: document 0 [0, 5), document 1's prefix [5, 8), document 2 [24, 32) -- all
  // its own rows, gathered rows 0..15.
  EXPECT_THAT(maps.ranks[0].key_rows,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  EXPECT_EQ(maps.packed_to_gathered[8], 16);  // rank 1's first row
}

TEST(ShardMapsTest, RandomPlansHoldEveryTokenOnceAndFindTheirKeys) {
  std::mt19937_64 rng(7);
  const auto strategies = ShardStrategy::All();
  const int kStrategies = static_cast<int>(strategies.size());
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 10);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 3000);
    const MicroBatch mb = MakeMicroBatch(lengths);
    const int cp = 1 + static_cast<int>(rng() % 8);
    // doc-degree also under a slow link (documents stay whole) and a fast one (sharded).
    const CpPlanOptions options{.comm = {.link_gbps = trial % 3 == 0 ? 0.5 : 4000.0}};
    const ShardPlan plan =
        *PlanShards(mb, cp, strategies[trial % kStrategies], KernelModel::Default(), options);
    absl::StatusOr<ShardMaps> maps = BuildShardMaps(plan);
    ASSERT_TRUE(maps.ok()) << maps.status();
    // The gathered buffer: rank r's local row i at r * rank_capacity + i.
    std::vector<int64_t> gathered(static_cast<size_t>(cp * plan.rank_capacity), -1);
    std::vector<int> held(static_cast<size_t>(mb.tokens), 0);
    for (int r = 0; r < cp; ++r) {
      const RankMaps& m = maps->ranks[static_cast<size_t>(r)];
      ASSERT_EQ(static_cast<int64_t>(m.local_to_packed.size()), plan.ranks[r].tokens);
      for (size_t i = 0; i < m.local_to_packed.size(); ++i) {
        gathered[static_cast<size_t>(r * plan.rank_capacity) + i] = m.local_to_packed[i];
        ++held[static_cast<size_t>(m.local_to_packed[i])];
      }
    }
    for (int h : held) ASSERT_EQ(h, 1) << "trial " << trial;
    for (int64_t p = 0; p < mb.tokens; ++p) {
      ASSERT_EQ(gathered[static_cast<size_t>(maps->packed_to_gathered[p])], p);
    }
    for (int r = 0; r < cp; ++r) {
      const RankMaps& m = maps->ranks[static_cast<size_t>(r)];
      // Causal maps keep the plan's segments as kernel segments.
      const RankShard& shard = plan.ranks[r];
      ASSERT_EQ(m.cu_seqlens_q, shard.cu_seqlens_q);
      ASSERT_EQ(m.cu_seqlens_k, shard.cu_seqlens_k);
      ASSERT_EQ(m.max_seqlen_q, shard.max_seqlen_q);
      ASSERT_EQ(m.max_seqlen_k, shard.max_seqlen_k);
      ASSERT_EQ(m.key_begin, std::vector<int64_t>(shard.segments.size(), 0));
      ASSERT_EQ(m.segment.size(), shard.segments.size());
      ASSERT_EQ(static_cast<int64_t>(m.key_rows.size()), plan.ranks[r].cu_seqlens_k.back());
      size_t k = 0;
      for (const Segment& s : plan.ranks[r].segments) {
        for (int64_t j = 0; j < s.q_end; ++j, ++k) {
          ASSERT_EQ(gathered[static_cast<size_t>(m.key_rows[k])], s.k_pos + j);
        }
      }
    }
  }
}

TEST(ShardMapsTest, WorkedExampleWindowAndChunk) {
  // Documents 5, 19, 8 at CP 2 per sequence: rank 1 holds document 1's queries [3, 11) and
  // [11, 19) (packed rows [8, 16) and [16, 24)).
  const ShardPlan plan =
      *PlanShards(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy("per-seq"), KernelModel::Default());
  const ShardMaps window = *BuildShardMaps(plan, *AttentionMask::SlidingWindow(3));
  EXPECT_EQ(window.mask, *AttentionMask::SlidingWindow(3));
  // Query 3 sees keys [1, 3]: the first segment's keys start at 1 (packed row 6, rank 0's row
  // 6), the second's at 11 - 3 + 1 = 9.
  EXPECT_THAT(window.ranks[1].key_begin, ElementsAre(1, 9));
  EXPECT_THAT(window.ranks[1].cu_seqlens_k, ElementsAre(0, 10, 20));
  EXPECT_EQ(window.ranks[1].key_rows[0], 6);
  EXPECT_EQ(window.ranks[1].key_rows[2], 16);  // packed 8: rank 1's first row
  // Chunks of 4 cut [3, 11) into [3, 4), [4, 8), [8, 11) and [11, 19) into [11, 12), [12, 16),
  // [16, 19).
  const ShardMaps chunk = *BuildShardMaps(plan, *AttentionMask::ChunkedLocal(4));
  EXPECT_THAT(chunk.ranks[1].key_begin, ElementsAre(0, 4, 8, 8, 12, 16));
  EXPECT_THAT(chunk.ranks[1].segment, ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_THAT(chunk.ranks[1].cu_seqlens_q, ElementsAre(0, 1, 5, 8, 9, 13, 16));
  EXPECT_THAT(chunk.ranks[1].cu_seqlens_k, ElementsAre(0, 4, 8, 11, 15, 19, 22));
  EXPECT_EQ(chunk.ranks[1].max_seqlen_k, 4);
}

// Every query row of random plans under random masks: the keys an executor keeps (bottom-right
// causal in its kernel segment, the last KernelWindow keys under a window) are exactly the
// packed rows of the mask's [KeyBegin(p), p]; pair counts equal the closed form, and the other
// ranks' rows a rank needs equal ExchangedKvRows.
TEST(ShardMapsTest, RandomMasksGiveEveryQueryExactlyItsKeys) {
  std::mt19937_64 rng(11);
  const auto strategies = ShardStrategy::All();
  const int kStrategies = static_cast<int>(strategies.size());
  for (int trial = 0; trial < 600; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 6);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % 200);
    const MicroBatch mb = MakeMicroBatch(lengths);
    const int cp = 1 + static_cast<int>(rng() % 8);
    // Sizes below, at and above the document lengths.
    const int64_t size = rng() % 4 == 0 ? lengths[0] : 1 + static_cast<int64_t>(rng() % 300);
    const AttentionMask mask = trial % 3 == 0   ? AttentionMask::Causal()
                               : trial % 3 == 1 ? *AttentionMask::SlidingWindow(size)
                                                : *AttentionMask::ChunkedLocal(size);
    const CpPlanOptions options{.comm = {.link_gbps = trial % 2 == 0 ? 0.5 : 4000.0},
                                .mix = LayerMix{{{mask, 1}}}};
    const ShardPlan plan =
        *PlanShards(mb, cp, strategies[trial % kStrategies], KernelModel::Default(), options);
    absl::StatusOr<ShardMaps> maps = BuildShardMaps(plan, mask);
    ASSERT_TRUE(maps.ok()) << maps.status();
    std::vector<int64_t> packed_of(static_cast<size_t>(cp * plan.rank_capacity), -1);
    for (int64_t p = 0; p < mb.tokens; ++p) packed_of[maps->packed_to_gathered[p]] = p;
    const std::vector<RankExchange> exchange = ExchangedKvRows(plan, mask);
    const CpPrediction prediction = PredictCp(plan, KernelModel::Default(), options);
    std::vector<std::set<std::pair<int, int32_t>>> sent(static_cast<size_t>(cp));
    for (int r = 0; r < cp; ++r) {
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << " rank " << r << " " << mask.Name());
      const RankMaps& m = maps->ranks[static_cast<size_t>(r)];
      const std::vector<Segment>& segments = plan.ranks[r].segments;
      const int64_t window = KernelWindow(mask);
      int64_t pairs = 0, closed_form = 0;
      for (const Segment& s : segments) closed_form += mask.Pairs(s.q_begin, s.q_end);
      // Walk the kernel segments; next_query[i]: the next query of plan segment i.
      std::vector<int64_t> next_query;
      for (const Segment& s : segments) next_query.push_back(s.q_begin);
      ASSERT_EQ(m.cu_seqlens_q.size(), m.key_begin.size() + 1);
      ASSERT_EQ(m.segment.size(), m.key_begin.size());
      for (size_t k = 0; k < m.key_begin.size(); ++k) {
        const Segment& s = segments[static_cast<size_t>(m.segment[k])];
        const int64_t n_q = m.cu_seqlens_q[k + 1] - m.cu_seqlens_q[k];
        const int64_t n_k = m.cu_seqlens_k[k + 1] - m.cu_seqlens_k[k];
        ASSERT_GE(n_q, 1);
        ASSERT_LE(n_q, m.max_seqlen_q);
        ASSERT_LE(n_k, m.max_seqlen_k);
        const int64_t q0 = next_query[static_cast<size_t>(m.segment[k])];
        next_query[static_cast<size_t>(m.segment[k])] += n_q;
        ASSERT_EQ(m.key_begin[k] + n_k, q0 + n_q);  // keys end at the last query
        for (int64_t t = 0; t < n_q; ++t) {
          const int64_t p = q0 + t;  // the query's piece position
          ASSERT_EQ(m.local_to_packed[static_cast<size_t>(m.cu_seqlens_q[k] + t)], s.k_pos + p);
          const int64_t last = n_k - n_q + t;
          const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
          ASSERT_EQ(m.key_begin[k] + first, mask.KeyBegin(p));
          for (int64_t j = first; j <= last; ++j) {
            const int32_t g = m.key_rows[static_cast<size_t>(m.cu_seqlens_k[k] + j)];
            ASSERT_EQ(packed_of[static_cast<size_t>(g)], s.k_pos + m.key_begin[k] + j);
          }
          pairs += last - first + 1;
        }
      }
      for (size_t i = 0; i < segments.size(); ++i) ASSERT_EQ(next_query[i], segments[i].q_end);
      EXPECT_EQ(pairs, closed_form);
      EXPECT_EQ(pairs, prediction.rank_pairs[static_cast<size_t>(r)]);
      // The other ranks' rows this rank's keys need, and who sends them.
      std::set<int32_t> needed;
      for (int32_t g : m.key_rows) {
        const int from = static_cast<int>(g / plan.rank_capacity);
        if (from != r) {
          needed.insert(g);
          sent[static_cast<size_t>(from)].insert({r, g});
        }
      }
      EXPECT_EQ(static_cast<int64_t>(needed.size()), exchange[static_cast<size_t>(r)].recv_rows);
    }
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(static_cast<int64_t>(sent[static_cast<size_t>(r)].size()),
                exchange[static_cast<size_t>(r)].send_rows)
          << "trial " << trial << " rank " << r;
    }
  }
}

TEST(ShardMapsTest, InconsistentPlansAreRejected) {
  const ShardPlan good =
      *PlanShards(MakeMicroBatch({5, 19, 8}), 2, ShardStrategy("per-doc"), KernelModel::Default());
  ShardPlan twice = good;
  twice.ranks[1].segments.push_back(twice.ranks[0].segments[0]);
  twice.rank_capacity += 100;
  EXPECT_THAT(BuildShardMaps(twice).status().message(), HasSubstr("is held by rank 1"));
  ShardPlan missing = good;
  missing.ranks[0].segments.pop_back();
  EXPECT_THAT(BuildShardMaps(missing).status().message(), HasSubstr("held by no rank"));
  ShardPlan outside = good;
  outside.ranks[0].segments[0].k_pos = 40;
  outside.ranks[0].segments[0].q_pos = 40 + outside.ranks[0].segments[0].q_begin;
  EXPECT_THAT(BuildShardMaps(outside).status().message(), HasSubstr("do not lie in the"));
  ShardPlan huge = good;
  huge.rank_capacity = int64_t{1} << 31;
  EXPECT_EQ(BuildShardMaps(huge).status().code(), absl::StatusCode::kOutOfRange);
  ShardPlan small = good;
  small.rank_capacity = 3;
  EXPECT_THAT(BuildShardMaps(small).status().message(), HasSubstr("more than rank_capacity 3"));
  ShardPlan ranks = good;
  ranks.ranks.pop_back();
  EXPECT_THAT(BuildShardMaps(ranks).status().message(), HasSubstr("cp_size 2 and 1 ranks"));
}

// One document of 2^24 tokens at C = 4096: the plan is O(C) segments, but its maps would hold
// about C x tokens = 2^36 key rows; BuildShardMaps refuses them at once, naming the limit.
TEST(ShardMapsTest, MapsOverTheRowLimitAreRefusedBeforeAllocating) {
  const MicroBatch mb = MakeMicroBatch({int64_t{1} << 24});
  const ShardPlan plan =
      *PlanShards(mb, kMaxCpSize, ShardStrategy("per-doc"), KernelModel::Default());
  ASSERT_EQ(plan.ranks.size(), static_cast<size_t>(kMaxCpSize));
  const absl::StatusOr<ShardMaps> maps = BuildShardMaps(plan);
  EXPECT_EQ(maps.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(maps.status().message(), HasSubstr("kMaxShardMapRows"));
  EXPECT_THAT(maps.status().message(), HasSubstr("16777216 tokens over 4096 ranks"));
  // A smaller one still builds: 2^12 tokens at C = 4096 is about 2^23 key rows.
  const ShardPlan small = *PlanShards(MakeMicroBatch({int64_t{1} << 12}), kMaxCpSize,
                                      ShardStrategy("per-doc"), KernelModel::Default());
  EXPECT_TRUE(BuildShardMaps(small).ok());
  // A sliding window needs far fewer key rows: 2^22 tokens at C = 4096 under a window of 64
  // build (causal would gather about 2^33 rows).
  const ShardPlan windowed = *PlanShards(MakeMicroBatch({int64_t{1} << 22}), kMaxCpSize,
                                         ShardStrategy("per-doc"), KernelModel::Default());
  EXPECT_EQ(BuildShardMaps(windowed).status().code(), absl::StatusCode::kOutOfRange);
  const absl::StatusOr<ShardMaps> window =
      BuildShardMaps(windowed, *AttentionMask::SlidingWindow(64));
  ASSERT_TRUE(window.ok()) << window.status();
  EXPECT_EQ(window->ranks[0].key_rows.size(), 2 * 512 + 63u);  // two shards of 512, one window
}

}  // namespace shard_maps_test
}  // namespace wlb
