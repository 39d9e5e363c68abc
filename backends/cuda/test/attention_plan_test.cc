#include "wlb/cuda/attention_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test/test_util.h"

namespace wlb::cuda {
namespace {

using testing::DocumentsProblem;
using testing::SegmentsProblem;

// Random valid problems: whole documents, CP-style segments (keys longer than queries), empty
// segments, tiny and tile-boundary lengths, causal or not.
AttentionProblem RandomProblem(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> n_segments(1, 12);
  std::vector<std::pair<int32_t, int32_t>> segs;
  const bool causal = std::bernoulli_distribution(0.8)(rng);
  const int32_t special[] = {0, 1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257};
  for (int i = n_segments(rng); i > 0; --i) {
    int32_t lk = std::bernoulli_distribution(0.5)(rng)
                     ? special[std::uniform_int_distribution<int>(0, 11)(rng)]
                     : std::uniform_int_distribution<int32_t>(0, 700)(rng);
    int32_t lq = std::bernoulli_distribution(0.5)(rng)
                     ? lk
                     : std::uniform_int_distribution<int32_t>(0, lk)(rng);
    if (!causal && std::bernoulli_distribution(0.2)(rng)) {
      lq = std::uniform_int_distribution<int32_t>(0, 300)(rng);
    }
    if (lk == 0) lq = 0;
    segs.push_back({lq, lk});
  }
  return SegmentsProblem(segs, 4, 2, 64, causal);
}

// Row i (0-based in segment b) sees keys [0, VisibleEnd).
int32_t TrueVisibleEnd(const AttentionProblem& p, int b, int32_t i) {
  return p.causal ? i + p.seqlen_k(b) - p.seqlen_q(b) + 1 : p.seqlen_k(b);
}

// The order `order` promises: kHeaviestFirst, non-increasing weight over the whole list;
// kHeadMajor, each segment's tiles contiguous with non-increasing weight, and segments in
// non-increasing total work (ties in segment order).
template <typename Tile, typename Weight, typename Work>
void ExpectOrder(const std::vector<Tile>& tiles, BlockOrder order, int batch, Weight weight,
                 Work work) {
  if (order == BlockOrder::kHeaviestFirst) {
    for (size_t i = 1; i < tiles.size(); ++i) ASSERT_GE(weight(tiles[i - 1]), weight(tiles[i]));
    return;
  }
  std::vector<int64_t> total(batch, 0);
  for (const Tile& t : tiles) total[t.segment] += work(t);
  std::vector<bool> done(batch, false);
  for (size_t i = 1; i < tiles.size(); ++i) {
    const Tile &a = tiles[i - 1], &b = tiles[i];
    if (a.segment == b.segment) {
      ASSERT_GE(weight(a), weight(b)) << "tile " << i;
      continue;
    }
    done[a.segment] = true;
    ASSERT_FALSE(done[b.segment]) << "segment " << b.segment << " is split at tile " << i;
    ASSERT_TRUE(total[a.segment] > total[b.segment] ||
                (total[a.segment] == total[b.segment] && a.segment < b.segment))
        << "segment " << a.segment << " (work " << total[a.segment] << ") before " << b.segment
        << " (work " << total[b.segment] << ")";
  }
}

class PlanProperties : public ::testing::TestWithParam<int> {};

TEST_P(PlanProperties, ForwardTilesCoverEveryQueryOnceWithTheRightKeys) {
  std::mt19937_64 rng(GetParam());
  for (int trial = 0; trial < 50; ++trial) {
    const AttentionProblem p = RandomProblem(rng);
    ASSERT_TRUE(ValidateProblem(p, AttentionKernel::kFlash).ok());
    for (auto [block_m, order] :
         {std::pair{64, BlockOrder::kHeaviestFirst}, std::pair{128, BlockOrder::kHeaviestFirst},
          std::pair{128, BlockOrder::kHeadMajor}}) {
      const std::vector<ForwardTile> tiles = BuildForwardTiles(p, block_m, order);
      std::vector<int> covered(p.total_q(), 0);
      for (const ForwardTile& t : tiles) {
        ASSERT_GE(t.q_rows, 1);
        ASSERT_LE(t.q_rows, block_m);
        const int b = t.segment;
        ASSERT_GE(t.q_begin, p.cu_seqlens_q[b]);
        ASSERT_LE(t.q_begin + t.q_rows, p.cu_seqlens_q[b + 1]);
        ASSERT_EQ(t.k_begin, p.cu_seqlens_k[b]);
        ASSERT_GE(t.k_len, 1);
        ASSERT_LE(t.k_len, p.seqlen_k(b));
        int32_t max_end = 0;
        for (int32_t r = 0; r < t.q_rows; ++r) {
          ++covered[t.q_begin + r];
          const int32_t i = t.q_begin + r - p.cu_seqlens_q[b];
          ASSERT_EQ(ForwardVisibleEnd(t, r), TrueVisibleEnd(p, b, i))
              << "segment " << b << " row " << i;
          max_end = std::max(max_end, ForwardVisibleEnd(t, r));
        }
        // No key tile is visited that no row of the tile can see.
        ASSERT_EQ(t.k_len, max_end);
      }
      for (int32_t q = 0; q < p.total_q(); ++q) ASSERT_EQ(covered[q], 1) << "query " << q;
      ExpectOrder(
          tiles, order, p.batch(), [](const ForwardTile& t) { return t.k_len; },
          [](const ForwardTile& t) { return int64_t(t.q_rows) * t.k_len; });
    }
  }
}

TEST_P(PlanProperties, BackwardTilesCoverEveryKeyOnceAndStartAtTheFirstSeeingQuery) {
  std::mt19937_64 rng(GetParam() + 1000);
  for (int trial = 0; trial < 50; ++trial) {
    const AttentionProblem p = RandomProblem(rng);
    for (auto [block_n, order] :
         {std::pair{64, BlockOrder::kHeaviestFirst}, std::pair{128, BlockOrder::kHeaviestFirst},
          std::pair{64, BlockOrder::kHeadMajor}}) {
      const std::vector<BackwardTile> tiles = BuildBackwardTiles(p, block_n, order);
      std::vector<int> covered(p.total_k(), 0);
      for (const BackwardTile& t : tiles) {
        const int b = t.segment;
        ASSERT_GE(t.k_rows, 1);
        ASSERT_LE(t.k_rows, block_n);
        ASSERT_GE(t.k_begin, p.cu_seqlens_k[b]);
        ASSERT_LE(t.k_begin + t.k_rows, p.cu_seqlens_k[b + 1]);
        ASSERT_EQ(t.q_begin, p.cu_seqlens_q[b]);
        ASSERT_EQ(t.q_len, p.seqlen_q(b));
        ASSERT_GE(t.q_first, 0);
        ASSERT_LT(t.q_first, t.q_len);
        for (int32_t c = 0; c < t.k_rows; ++c) {
          ++covered[t.k_begin + c];
          const int32_t j = t.k_begin + c - p.cu_seqlens_k[b];
          for (int32_t i = 0; i < t.q_len; ++i) {
            const bool truth = j < TrueVisibleEnd(p, b, i);
            const bool tile = c <= int64_t(i) + t.diag;
            ASSERT_EQ(tile, truth) << "segment " << b << " key " << j << " query " << i;
            if (truth) ASSERT_GE(i, t.q_first);
          }
        }
        // The first query sees at least one key of the tile.
        ASSERT_LT(0, TrueVisibleEnd(p, b, t.q_first) - (t.k_begin - p.cu_seqlens_k[b]));
      }
      for (int b = 0; b < p.batch(); ++b) {
        for (int32_t k = p.cu_seqlens_k[b]; k < p.cu_seqlens_k[b + 1]; ++k) {
          // Keys of a segment without queries get no tile (their gradients are zeroed).
          ASSERT_EQ(covered[k], p.seqlen_q(b) > 0 ? 1 : 0) << "key " << k;
        }
      }
      ExpectOrder(
          tiles, order, p.batch(), [](const BackwardTile& t) { return t.q_len - t.q_first; },
          [](const BackwardTile& t) { return int64_t(t.k_rows) * (t.q_len - t.q_first); });
    }
  }
}

// The backward kernel's walk over a tile's queries (BackwardFirstQueryTile, BackwardPassNeedsMask)
// for each query tiling of FlashBackwardConfig, (tile rows, pass rows) = (64, 64) q64, (64, 32)
// q64_pass32 and q64_w8, (32, 32) q32: the queries before the first tile see no key of the tile,
// and a pass the kernel runs without the mask holds only visible (query, key) pairs.
TEST_P(PlanProperties, BackwardQueryWalkOfEveryTilingSkipsOnlyInvisiblePairs) {
  std::mt19937_64 rng(GetParam() + 2000);
  constexpr int kBlockN = 64;
  for (int trial = 0; trial < 30; ++trial) {
    const AttentionProblem p = RandomProblem(rng);
    for (const BackwardTile& t : BuildBackwardTiles(p, kBlockN)) {
      const int b = t.segment;
      const int32_t k0 = t.k_begin - p.cu_seqlens_k[b];
      auto visible = [&](int32_t i, int32_t c) {
        return i < t.q_len && c < t.k_rows && k0 + c < TrueVisibleEnd(p, b, i);
      };
      for (auto [block_m, pass] : {std::pair{64, 64}, std::pair{64, 32}, std::pair{32, 32}}) {
        SCOPED_TRACE("block_m " + std::to_string(block_m) + " pass " + std::to_string(pass));
        const int32_t first = BackwardFirstQueryTile(t, block_m) * block_m;
        ASSERT_LE(first, t.q_first);
        for (int32_t i = 0; i < first; ++i) {
          for (int32_t c = 0; c < kBlockN; ++c) ASSERT_FALSE(visible(i, c)) << i << " " << c;
        }
        const int32_t end = (t.q_len + block_m - 1) / block_m * block_m;
        for (int32_t q0 = first; q0 < end; q0 += pass) {
          if (BackwardPassNeedsMask(t, q0, pass, kBlockN)) continue;
          for (int32_t i = q0; i < q0 + pass; ++i) {
            for (int32_t c = 0; c < kBlockN; ++c) {
              ASSERT_TRUE(visible(i, c)) << "unmasked pass at " << q0 << ": query " << i
                                         << " key " << c << " of segment " << b;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, PlanProperties, ::testing::Range(1, 6));

TEST(ForwardTiles, WorkedExample) {
  // Queries [100, 300) of a 300-token document (a CP segment) and a whole 129-token document.
  const AttentionProblem p = SegmentsProblem({{200, 300}, {129, 129}}, 1, 1, 128);
  const std::vector<ForwardTile> t = BuildForwardTiles(p, 128);
  ASSERT_EQ(t.size(), 4u);
  // Heaviest first: the segment's second tile sees all 300 keys.
  EXPECT_EQ(t[0].q_begin, 128);
  EXPECT_EQ(t[0].q_rows, 72);
  EXPECT_EQ(t[0].k_len, 300);
  EXPECT_EQ(t[0].diag, 228);
  EXPECT_EQ(t[1].q_begin, 0);
  EXPECT_EQ(t[1].k_len, 228);
  EXPECT_EQ(t[2].q_begin, 328);  // document 2, rows 128..129
  EXPECT_EQ(t[2].q_rows, 1);
  EXPECT_EQ(t[2].k_len, 129);
  EXPECT_EQ(t[3].q_rows, 128);
  EXPECT_EQ(t[3].k_len, 128);
}

TEST(ForwardTiles, HeadMajorWorkedExample) {
  // Documents of 129, 300 and 5 tokens: the 300-token one has the most work, then 129, then 5.
  const AttentionProblem p = DocumentsProblem({129, 300, 5}, 2, 1, 64);
  const std::vector<ForwardTile> t = BuildForwardTiles(p, 128, BlockOrder::kHeadMajor);
  ASSERT_EQ(t.size(), 6u);
  const int32_t want_segment[] = {1, 1, 1, 0, 0, 2};
  const int32_t want_k_len[] = {300, 256, 128, 129, 128, 5};
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].segment, want_segment[i]) << "tile " << i;
    EXPECT_EQ(t[i].k_len, want_k_len[i]) << "tile " << i;
  }
}

TEST(BlockTileHead, EveryOrderRunsEveryTileAndHeadOnce) {
  for (BlockOrder order : {BlockOrder::kHeaviestFirst, BlockOrder::kHeadMajor}) {
    for (auto [tiles, heads] : {std::pair{1u, 1u}, std::pair{7u, 3u}, std::pair{5u, 8u}}) {
      std::vector<int> seen(tiles * heads, 0);
      for (uint32_t block = 0; block < tiles * heads; ++block) {
        const TileHead th = BlockTileHead(order, block, tiles, heads);
        ASSERT_LT(th.tile, tiles);
        ASSERT_LT(th.head, heads);
        ++seen[th.tile * heads + th.head];
      }
      for (int n : seen) ASSERT_EQ(n, 1);
    }
  }
  // Head-major: consecutive blocks walk the tile list for one head.
  EXPECT_EQ(BlockTileHead(BlockOrder::kHeadMajor, 8, 7, 3).head, 1u);
  EXPECT_EQ(BlockTileHead(BlockOrder::kHeadMajor, 8, 7, 3).tile, 1u);
  EXPECT_EQ(BlockTileHead(BlockOrder::kHeaviestFirst, 8, 7, 3).head, 2u);
  EXPECT_EQ(BlockTileHead(BlockOrder::kHeaviestFirst, 8, 7, 3).tile, 2u);
}

TEST(ForwardTiles, DeterministicAndEmptySegmentsSkipped) {
  const AttentionProblem p = SegmentsProblem({{0, 7}, {5, 9}, {0, 0}, {3, 3}}, 2, 1, 64);
  const std::vector<ForwardTile> a = BuildForwardTiles(p, 128);
  const std::vector<ForwardTile> b = BuildForwardTiles(p, 128);
  ASSERT_EQ(a.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].q_begin, b[i].q_begin);
    EXPECT_EQ(a[i].segment, b[i].segment);
  }
  EXPECT_EQ(a[0].segment, 1);
  EXPECT_EQ(a[1].segment, 3);
}

}  // namespace
}  // namespace wlb::cuda
