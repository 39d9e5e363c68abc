// Tests of include/wlb/pack/wlb_packer.hpp on seeded random streams: documents wait in the outlier
// queue of their threshold level and leave it N at a time, oldest first (checked against a model
// of the queues written here); short documents are never delayed while the cap has room; nothing
// is lost or duplicated; the cap S_max holds.
#include "wlb/pack/wlb_packer.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/pack/length_order.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace wlb_packer_test {

using ::testing::HasSubstr;

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

using Key = std::tuple<int64_t, int32_t>;  // (id, piece)

int Level(const std::vector<int64_t>& thresholds, int64_t length) {
  int level = -1;
  for (size_t i = 0; i < thresholds.size(); ++i) {
    if (length >= thresholds[i]) level = static_cast<int>(i);
  }
  return level;
}

// With S_max = 64 S no step can fill a micro-batch (a step holds < (N + 1) S arrivals plus at
// most N outliers of S or fewer tokens per level: < 17 S at N = 4), so nothing is carried and every
// step is exactly: the short arrivals, plus the N oldest of each queue that holds N or more, plus,
// while fewer than N pieces were placed (a micro-batch would be left empty), the oldest queued
// outlier of any level (FillEmptyMicroBatches; the lowest level on equal arrival steps).
TEST(WlbPacker, OutliersLeaveTheirQueueNAtATimeOldestFirst) {
  std::mt19937_64 rng(404);
  for (int trial = 0; trial < 120; ++trial) {
    PackerConfig config;
    config.context = std::uniform_int_distribution<int64_t>(16, 256)(rng);
    config.max_tokens = 64 * config.context;
    config.micro_batches = std::uniform_int_distribution<int32_t>(1, 4)(rng);
    const int levels = std::uniform_int_distribution<int>(1, 3)(rng);
    const std::vector<int64_t> thresholds = DefaultThresholds(config.context, levels);
    const std::vector<int64_t> lengths = testing::RandomLengths(
        rng, config.context, trial, std::uniform_int_distribution<int>(1, 150)(rng));
    auto arrivals = *SplitIntoSteps(*MakeDocuments(lengths, config.context),
                                    config.context * config.micro_batches);
    WlbPacker packer(config, kSquares, thresholds, 0);
    EXPECT_EQ(packer.name(), "wlb");
    EXPECT_EQ(packer.thresholds(), thresholds);
    std::vector<std::deque<Key>> queues(thresholds.size());
    std::map<Key, int64_t> arrival;  // arrival step of every piece
    const size_t n = static_cast<size_t>(config.micro_batches);
    std::vector<StepPlan> steps;
    for (size_t p = 0; p < arrivals.size(); ++p) {
      std::set<Key> expected;
      for (const Document& d : arrivals[p]) {
        arrival[{d.id, d.piece}] = static_cast<int64_t>(p);
        const int level = Level(thresholds, d.length);
        if (level < 0) {
          expected.insert({d.id, d.piece});
        } else {
          queues[level].push_back({d.id, d.piece});
        }
      }
      for (auto& q : queues) {
        if (q.size() < n) continue;
        for (size_t k = 0; k < n; ++k) {
          expected.insert(q.front());
          q.pop_front();
        }
      }
      while (expected.size() < n) {
        std::deque<Key>* oldest = nullptr;
        for (auto& q : queues) {
          if (!q.empty() &&
              (oldest == nullptr || arrival.at(q.front()) < arrival.at(oldest->front()))) {
            oldest = &q;
          }
        }
        if (oldest == nullptr) break;
        expected.insert(oldest->front());
        oldest->pop_front();
      }
      auto ready = packer.Push(arrivals[p]);
      ASSERT_TRUE(ready.ok());
      ASSERT_EQ(ready->size(), 1u) << "wlb plans one step per push";
      const StepPlan& step = (*ready)[0];
      ASSERT_EQ(step.step, static_cast<int64_t>(p));
      std::set<Key> got;
      for (const Document& d : testing::Collect(*ready)) got.insert({d.id, d.piece});
      ASSERT_EQ(got, expected) << "trial " << trial << " step " << p;
      // Held back: exactly the queues (one release per level and step, so a level that got
      // more than N in one step still holds N or more).
      int64_t queued = 0;
      for (const auto& q : queues) queued += static_cast<int64_t>(q.size());
      ASSERT_EQ(step.held_back_documents, queued);
      ASSERT_EQ(packer.Held().documents, queued);
      for (const Document& d : packer.Pending()) ASSERT_GE(d.length, thresholds[0]);
      steps.push_back(step);
    }
    for (StepPlan& s : packer.Flush()) steps.push_back(std::move(s));
    ASSERT_TRUE(packer.Pending().empty());
    ASSERT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(steps)));
  }
}

TEST(WlbPacker, RandomStreamsUnderATightCapLoseNothingAndKeepTheCap) {
  std::mt19937_64 rng(505);
  for (int trial = 0; trial < 120; ++trial) {
    const auto [config, lengths, arrivals] = testing::RandomPackingCase(
        rng, trial,
        {.min_context = 8, .max_context = 256, .max_micro_batches = 6, .max_docs = 120});
    for (const char* name : {"wlb", "wlb-refine"}) {
      auto packer = MakePacker(name, config, kSquares,
                               {.thresholds = DefaultThresholds(config.context, 1 + trial % 2)});
      ASSERT_TRUE(packer.ok()) << packer.status();
      auto run = RunPacker(**packer, arrivals);
      ASSERT_TRUE(run.ok());
      ASSERT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(run->steps)))
          << name << " trial " << trial;
      for (const StepPlan& s : run->steps) {
        for (const MicroBatch& mb : s.micro_batches) {
          ASSERT_LE(mb.tokens, config.max_tokens) << name << " trial " << trial;
          int64_t tokens = 0;
          for (const Document& d : mb.documents) {
            tokens += d.length;
            ASSERT_GE(s.step, d.arrival_step) << "wlb never trains a document early";
          }
          ASSERT_EQ(mb.tokens, tokens);
        }
      }
    }
  }
}

TEST(WlbPacker, WithoutThresholdsNothingWaitsWhileTheCapHasRoom) {
  const PackerConfig config{.context = 100, .max_tokens = 1000, .micro_batches = 2};
  WlbPacker packer(config, kSquares, {}, 0);
  auto steps = packer.Push(*MakeDocuments(std::vector<int64_t>{100, 90, 80, 5, 5}, 100));
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_TRUE(packer.Pending().empty());
  // Longest first, each to the least cost: 100 -> mb0; 90 -> mb1; 80 -> mb1 (8100 < 10000);
  // 5 -> mb0 (10000 < 14500); 5 -> mb0 (10025 < 14500).
  const auto& mbs = (*steps)[0].micro_batches;
  EXPECT_EQ(mbs[0].tokens, 110);
  EXPECT_EQ(mbs[1].tokens, 170);
  EXPECT_DOUBLE_EQ(mbs[1].cost, 8100.0 + 6400.0);
}

TEST(ValidateThresholds, ErrorsNameTheBadValue) {
  EXPECT_TRUE(ValidateThresholds({}, 100).ok());
  EXPECT_TRUE(ValidateThresholds({1, 50, 100}, 100).ok());
  EXPECT_THAT(ValidateThresholds({0}, 100).message(),
              HasSubstr("outlier threshold 0 is outside [1, 100]"));
  EXPECT_THAT(ValidateThresholds({50, 101}, 100).message(),
              HasSubstr("outlier threshold 101 is outside [1, 100]"));
  EXPECT_THAT(ValidateThresholds({10, 30, 20}, 100).message(),
              HasSubstr("strictly increasing, got 10,30,20"));
  std::vector<int64_t> many;
  for (int i = 1; i <= kMaxOutlierQueues + 1; ++i) many.push_back(i);
  EXPECT_THAT(ValidateThresholds(many, 100).message(),
              HasSubstr(absl::StrFormat("%d outlier thresholds, at most %d", kMaxOutlierQueues + 1,
                                        kMaxOutlierQueues)));
}

// Algorithm 1's placement as plainly as it can be written: scans for the least-W micro-batch (the
// first on ties) and, when a document does not fit there, the fewest-tokens one.
std::vector<MicroBatch> PlainPackUnderCap(std::vector<Document> released,
                                          std::vector<Document> carry, std::vector<Document> fresh,
                                          const PackerConfig& config, const DocumentCost& cost,
                                          std::vector<Document>& left) {
  std::vector<MicroBatch> mbs(static_cast<size_t>(config.micro_batches));
  auto place = [&](const Document& d) {
    size_t target = 0;
    for (size_t b = 1; b < mbs.size(); ++b) {
      if (mbs[b].cost < mbs[target].cost) target = b;
    }
    if (mbs[target].tokens + d.length > config.max_tokens) {
      target = 0;
      for (size_t b = 1; b < mbs.size(); ++b) {
        if (mbs[b].tokens < mbs[target].tokens) target = b;
      }
      if (mbs[target].tokens + d.length > config.max_tokens) return false;
    }
    mbs[target].documents.push_back(d);
    mbs[target].tokens += d.length;
    mbs[target].cost += cost(d.length);
    return true;
  };
  left.clear();
  for (std::vector<Document>* group : {&released, &carry, &fresh}) {
    std::stable_sort(group->begin(), group->end(), LongerFirst);
    for (const Document& d : *group) {
      if (!place(d)) left.push_back(d);
    }
  }
  std::stable_sort(left.begin(), left.end(), LongerFirst);
  return mbs;
}

// PackUnderCap appends small steps' arrivals as it places them and copies large steps' (from
// kGroupedCopyMicroBatches) in afterwards, micro-batch by micro-batch: both must give the plain
// placement's plans exactly (documents in order, tokens, W summed in the same order) and leave the
// same carry, with and without released outliers, carried documents and sorted arrivals.
TEST(PackUnderCap, MatchesAPlainPlacementOnBothSidesOfTheGroupedCopy) {
  std::mt19937_64 rng(26);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const DocumentCost cost = kSquares;
  const int32_t large = static_cast<int32_t>(detail::kGroupedCopyMicroBatches);
  for (int32_t n : {1, 3, 16, large - 1, large, large + 37}) {
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(::testing::Message() << "N=" << n << " round " << round);
      const PackerConfig config{.context = 256, .max_tokens = 320, .micro_batches = n};
      int64_t id = 0;
      auto documents = [&](int64_t count, int64_t lo, int64_t hi) {
        std::vector<Document> docs;
        for (int64_t i = 0; i < count; ++i) docs.push_back({.id = id++, .length = uniform(lo, hi)});
        return docs;
      };
      // Round 0 fits everything; the others overfill the step, so some documents are left over.
      const int64_t per_mb = round == 0 ? 4 : 12;
      const std::vector<Document> released = documents(round % 2 ? n : 0, 128, 256);
      std::vector<Document> carried = documents(uniform(0, 2 * n), 1, 256);
      std::stable_sort(carried.begin(), carried.end(), LongerFirst);
      std::vector<Document> fresh = documents(per_mb * n, 1, 128);
      const bool fresh_sorted = round == 3;
      if (fresh_sorted) std::stable_sort(fresh.begin(), fresh.end(), LongerFirst);
      std::vector<Document> expected_left;
      const std::vector<MicroBatch> expected =
          PlainPackUnderCap(released, carried, fresh, config, cost, expected_left);
      detail::LengthOrdered carry(carried);
      const std::vector<MicroBatch> mbs =
          detail::PackUnderCap(released, carry, fresh, config, cost, fresh_sorted);
      ASSERT_EQ(mbs.size(), expected.size());
      for (size_t b = 0; b < mbs.size(); ++b) {
        ASSERT_EQ(mbs[b].documents, expected[b].documents) << "micro-batch " << b;
        ASSERT_EQ(mbs[b].tokens, expected[b].tokens) << "micro-batch " << b;
        ASSERT_EQ(mbs[b].cost, expected[b].cost) << "micro-batch " << b;
      }
      EXPECT_EQ(carry.ToVector(), expected_left);
      if (round > 0) EXPECT_FALSE(expected_left.empty());  // the test reaches the carry
    }
  }
}

}  // namespace wlb_packer_test
}  // namespace wlb
