// Tests of include/wlb/shard/placement.hpp: another balancer's placement (a rank per packed
// token) priced as PlanShards' plans are.
#include "wlb/shard/placement.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/shard/shard_strategies.hpp"
#include "wlb/shard/validate_plan.hpp"

namespace wlb {
namespace placement_test {

using ::testing::HasSubstr;
using ::wlb::testing::MakeMicroBatch;

// owner[t] of a plan: the rank whose segment holds packed token t.
std::vector<int64_t> OwnersOf(const ShardPlan& plan) {
  std::vector<int64_t> owner(static_cast<size_t>(plan.tokens), -1);
  for (const RankShard& r : plan.ranks) {
    for (const Segment& s : r.segments) {
      std::fill(owner.begin() + s.q_pos, owner.begin() + s.q_pos + s.q_len(), r.rank);
    }
  }
  return owner;
}

// The plan with each rank's segments in packed order and a rank's adjacent segments of one
// document merged, its buffer the largest rank's tokens: what a placement of its tokens is,
// rebuilt here without PlanBuilder.
ShardPlan Canonical(ShardPlan plan) {
  int64_t largest = 0;
  for (RankShard& r : plan.ranks) {
    std::sort(r.segments.begin(), r.segments.end(),
              [](const Segment& a, const Segment& b) { return a.q_pos < b.q_pos; });
    std::vector<Segment> merged;
    for (const Segment& s : r.segments) {
      if (!merged.empty() && merged.back().doc_index == s.doc_index &&
          merged.back().q_end == s.q_begin) {
        merged.back().q_end = s.q_end;
      } else {
        merged.push_back(s);
      }
    }
    r.segments = merged;
    r.cu_seqlens_q.assign(1, 0);
    r.cu_seqlens_k.assign(1, 0);
    r.tokens = r.causal_pairs = r.max_seqlen_q = r.max_seqlen_k = 0;
    for (const Segment& s : r.segments) {
      r.tokens += s.q_len();
      r.causal_pairs += CausalPairs(s.q_begin, s.q_end);
      r.max_seqlen_q = std::max(r.max_seqlen_q, s.q_len());
      r.max_seqlen_k = std::max(r.max_seqlen_k, s.q_end);
      r.cu_seqlens_q.push_back(static_cast<int32_t>(r.tokens));
      r.cu_seqlens_k.push_back(r.cu_seqlens_k.back() + static_cast<int32_t>(s.q_end));
    }
    largest = std::max(largest, r.tokens);
  }
  plan.rank_capacity = largest;
  plan.strategy = plan.requested = ShardStrategy("per-seq");
  return plan;
}

TEST(PlacementTest, ConsecutiveTokensOfADocumentOnOneRankAreOneSegment) {
  // Documents of 4 and 2 tokens at C = 2: rank 0 holds tokens 0, 1 and 5, rank 1 tokens 2-4.
  const MicroBatch mb = MakeMicroBatch({4, 2});
  const std::vector<int64_t> owner = {0, 0, 1, 1, 1, 0};
  absl::StatusOr<ShardPlan> plan = detail::PlanOfPlacement(mb, {0, 4, 6}, 2, owner);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ValidateShardPlan(*plan, mb).ok()) << ValidateShardPlan(*plan, mb);
  EXPECT_EQ(plan->rank_capacity, 3);
  ASSERT_EQ(plan->ranks[0].segments.size(), 2u);
  EXPECT_EQ(plan->ranks[0].segments[0].doc_index, 0);
  EXPECT_EQ(plan->ranks[0].segments[0].q_begin, 0);
  EXPECT_EQ(plan->ranks[0].segments[0].q_end, 2);
  EXPECT_EQ(plan->ranks[0].segments[1].doc_index, 1);
  EXPECT_EQ(plan->ranks[0].segments[1].q_begin, 1);
  EXPECT_EQ(plan->ranks[0].segments[1].q_end, 2);
  ASSERT_EQ(plan->ranks[1].segments.size(), 2u);
  EXPECT_EQ(plan->ranks[1].segments[0].q_begin, 2);
  EXPECT_EQ(plan->ranks[1].segments[0].q_end, 4);
  EXPECT_EQ(plan->ranks[1].segments[1].doc_index, 1);
  EXPECT_EQ(plan->ranks[1].segments[1].q_end, 1);
  // Rank 1 needs keys [0, 2) of document 0, which rank 0 holds; rank 0 needs key 0 of
  // document 1 from rank 1.
  const absl::StatusOr<CpPrediction> p =
      PredictCpOfPlacement(mb, 2, owner, KernelModel::Default(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank_pairs, (std::vector<int64_t>{3 + 2, 7 + 1}));
}

// Every strategy's plan, as a placement, prices as the same plan with its segments in packed
// order and adjacent ones merged, under every layer mix and link: PlanOfPlacement is PlanBuilder
// over maximal runs.
TEST(PlacementTest, EveryStrategysPlanAsAPlacementPricesAsItsRuns) {
  std::mt19937_64 rng(57);
  const KernelModel model = KernelModel::Default();
  const absl::StatusOr<LayerMix> window = LayerMix::Parse("window:512x3,causal");
  ASSERT_TRUE(window.ok()) << window.status();
  const int iterations = testing::PropertyIterations(200);
  for (int iter = 0; iter < iterations; ++iter) {
    std::vector<int64_t> lengths(std::uniform_int_distribution<size_t>(1, 40)(rng));
    for (int64_t& l : lengths) {
      l = std::uniform_int_distribution<int>(0, 7)(rng) == 0
              ? std::uniform_int_distribution<int64_t>(2000, 30000)(rng)
              : std::uniform_int_distribution<int64_t>(1, 1500)(rng);
    }
    const MicroBatch mb = MakeMicroBatch(lengths);
    const int cp = 1 << std::uniform_int_distribution<int>(0, 4)(rng);
    CpPlanOptions options{.comm = {.link_gbps = iter % 2 == 0 ? 450.0 : 25.0}};
    if (iter % 3 == 0) options.mix = *window;
    for (const ShardStrategy s : ShardStrategy::All()) {
      SCOPED_TRACE(absl::StrFormat("iter %d C %d %s", iter, cp, ShardStrategyName(s)));
      const absl::StatusOr<ShardPlan> plan = PlanShards(mb, cp, s, model, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<int64_t> owner = OwnersOf(*plan);
      ASSERT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
      const absl::StatusOr<ShardPlan> placed =
          detail::PlanOfPlacement(mb, *detail::CheckMicroBatch(mb, cp), cp, owner);
      ASSERT_TRUE(placed.ok()) << placed.status();
      ASSERT_TRUE(ValidateShardPlan(*placed, mb).ok()) << ValidateShardPlan(*placed, mb);
      const ShardPlan canonical = Canonical(*plan);
      EXPECT_EQ(*placed, canonical);
      const absl::StatusOr<CpPrediction> p = PredictCpOfPlacement(mb, cp, owner, model, options);
      ASSERT_TRUE(p.ok()) << p.status();
      const CpPrediction expected = PredictCp(canonical, model, options);
      EXPECT_EQ(p->max_ms, expected.max_ms);
      EXPECT_EQ(p->rank_ms, expected.rank_ms);
      EXPECT_EQ(p->exchanged_bytes, expected.exchanged_bytes);
    }
  }
}

TEST(PlacementTest, ABadPlacementIsAnErrorNamingIt) {
  const MicroBatch mb = MakeMicroBatch({3, 2});
  const KernelModel model = KernelModel::Default();
  auto error = [&](const std::vector<int64_t>& owner, int cp, const CpPlanOptions& options = {}) {
    const absl::StatusOr<CpPrediction> p = PredictCpOfPlacement(mb, cp, owner, model, options);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : std::string(p.status().message());
  };
  EXPECT_THAT(error({0, 1, 0, 1}, 2), HasSubstr("4 owners for a micro-batch of 5 tokens"));
  EXPECT_THAT(error({0, 1, 0, 1, 0, 1}, 2), HasSubstr("6 owners for a micro-batch of 5 tokens"));
  EXPECT_THAT(error({0, 1, -1, 1, 0}, 2), HasSubstr("token 2 is on rank -1, outside [0, 2)"));
  EXPECT_THAT(error({0, 1, 0, 1, 2}, 2), HasSubstr("token 4 is on rank 2, outside [0, 2)"));
  EXPECT_THAT(error({0, 0, 0, 0, 0}, 0), HasSubstr("0"));  // PlanShards' C error
  EXPECT_FALSE(error({0, 1, 0, 1, 0}, 2, {.comm = {.link_gbps = -1.0}}).empty());
}

// A placement scattered into more segments than any plan may have is an error before any is
// built (kMaxCpDocumentRanks), not an allocation of gigabytes.
TEST(PlacementTest, TooManySegmentsIsAnError) {
  const int64_t per_document = kMaxContext;
  const int64_t documents = kMaxCpDocumentRanks / per_document + 1;
  const MicroBatch mb = MakeMicroBatch(std::vector<int64_t>(documents, per_document));
  std::vector<int64_t> owner(static_cast<size_t>(mb.tokens), 0);
  for (size_t t = 0; t < owner.size(); t += 2) owner[t] = 1;
  const absl::StatusOr<CpPrediction> p =
      PredictCpOfPlacement(mb, 2, owner, KernelModel::Default(), {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(p.status().message(),
              HasSubstr(absl::StrFormat("placement: %d segments", mb.tokens)));
  // The same micro-batch in two contiguous halves is a plan.
  const auto half = owner.begin() + static_cast<int64_t>(owner.size() / 2);
  std::fill(owner.begin(), half, 0);
  std::fill(half, owner.end(), 1);
  EXPECT_TRUE(detail::PlanOfPlacement(mb, *detail::CheckMicroBatch(mb, 2), 2, owner).ok());
}

}  // namespace placement_test
}  // namespace wlb
