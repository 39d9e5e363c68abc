// Tests of include/wlb/pack/original_packer.hpp on seeded random streams: "original" cuts the
// stream, in order, into sequences of exactly S tokens; "original-nextfit" keeps documents whole
// and in order, next-fit into sequences of at most S.
#include "wlb/pack/original_packer.hpp"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace original_packer_test {

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

testing::PackingCase RandomCase(std::mt19937_64& rng, int trial) {
  return testing::RandomPackingCase(
      rng, trial, {.min_context = 4, .max_context = 200, .max_micro_batches = 5, .max_docs = 80});
}

TEST(OriginalPacker, CutsTheStreamInOrderIntoSequencesOfExactlyS) {
  std::mt19937_64 rng(101);
  for (int trial = 0; trial < 150; ++trial) {
    const testing::PackingCase c = RandomCase(rng, trial);
    OriginalPacker packer(c.config, kSquares);
    EXPECT_EQ(packer.name(), "original");
    std::vector<StepPlan> steps;
    int64_t pushed = 0;
    const int64_t step_tokens = c.config.context * c.config.micro_batches;
    for (const auto& a : c.arrivals) {
      absl::StatusOr<std::vector<StepPlan>> ready = packer.Push(a);
      ASSERT_TRUE(ready.ok()) << ready.status();
      for (StepPlan& s : *ready) steps.push_back(std::move(s));
      pushed += TotalTokens(a);
      // A step is cut exactly when the buffer holds a whole one.
      ASSERT_EQ(static_cast<int64_t>(steps.size()), pushed / step_tokens) << "trial " << trial;
      ASSERT_EQ(packer.Held().tokens, pushed % step_tokens);
    }
    const size_t full_steps = steps.size();
    for (StepPlan& s : packer.Flush()) steps.push_back(std::move(s));
    EXPECT_TRUE(packer.Pending().empty());
    ASSERT_TRUE(testing::CoversExactlyOnce(c.lengths, testing::Collect(steps))) << trial;
    // In plan order the parts are the stream: (id, offset) continue where the last part ended,
    // and each document's parts are numbered 0, 1, ... as they are emitted.
    int64_t id = 0, offset = 0;
    std::map<int64_t, int32_t> parts;
    for (size_t s = 0; s < steps.size(); ++s) {
      ASSERT_EQ(steps[s].step, static_cast<int64_t>(s));
      ASSERT_EQ(steps[s].micro_batches.size(), static_cast<size_t>(c.config.micro_batches));
      for (const MicroBatch& mb : steps[s].micro_batches) {
        if (s < full_steps) ASSERT_EQ(mb.tokens, c.config.context) << "trial " << trial;
        ASSERT_LE(mb.tokens, c.config.context);
        for (const Document& d : mb.documents) {
          if (offset == c.lengths[id]) {
            ++id;
            offset = 0;
          }
          ASSERT_EQ(d.id, id) << "trial " << trial;
          ASSERT_EQ(d.offset, offset) << "trial " << trial;
          ASSERT_EQ(d.piece, parts[d.id]++);
          offset += d.length;
        }
      }
    }
  }
}

TEST(OriginalNextFit, KeepsPiecesWholeInOrderAndStartsASequenceOnlyWhenOneDoesNotFit) {
  std::mt19937_64 rng(202);
  for (int trial = 0; trial < 150; ++trial) {
    const testing::PackingCase c = RandomCase(rng, trial);
    auto packer = MakePacker("original-nextfit", c.config, kSquares, {});
    ASSERT_TRUE(packer.ok());
    EXPECT_EQ((*packer)->name(), "original-nextfit");
    auto run = RunPacker(**packer, c.arrivals);
    ASSERT_TRUE(run.ok()) << run.status();
    const std::vector<Document> planned = testing::Collect(run->steps);
    ASSERT_TRUE(testing::CoversExactlyOnce(c.lengths, planned));
    // The pieces as the stream gave them (nothing cut, nothing renumbered), in stream order.
    std::vector<Document> stream;
    for (const auto& a : c.arrivals) stream.insert(stream.end(), a.begin(), a.end());
    ASSERT_EQ(planned.size(), stream.size());
    for (size_t i = 0; i < planned.size(); ++i) {
      ASSERT_EQ(planned[i].id, stream[i].id);
      ASSERT_EQ(planned[i].piece, stream[i].piece);
      ASSERT_EQ(planned[i].offset, stream[i].offset);
      ASSERT_EQ(planned[i].length, stream[i].length);
    }
    for (const StepPlan& s : run->steps) {
      const auto& mbs = s.micro_batches;
      for (size_t m = 0; m < mbs.size(); ++m) {
        ASSERT_LE(mbs[m].tokens, c.config.context);
        if (m + 1 < mbs.size() && !mbs[m + 1].documents.empty()) {
          ASSERT_FALSE(mbs[m].documents.empty()) << "an empty sequence before a used one";
          // Next-fit: the next sequence's first piece did not fit in the rest of this one.
          ASSERT_GT(mbs[m].tokens + mbs[m + 1].documents.front().length, c.config.context)
              << "trial " << trial;
        }
      }
    }
  }
}

TEST(OriginalPacker, APieceIsCutWhereTheSequenceEnds) {
  // S = 10, N = 2: 14 + 9 tokens: sequence 0 = [0, 10) of doc 0, sequence 1 = [10, 14) of doc 0
  // and [0, 6) of doc 1; [6, 9) of doc 1 waits.
  OriginalPacker packer({.context = 10, .max_tokens = 12, .micro_batches = 2}, kSquares);
  auto steps = packer.Push(*MakeDocuments(std::vector<int64_t>{14, 9}, 10));
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 1u);
  const auto& mbs = (*steps)[0].micro_batches;
  ASSERT_EQ(mbs[1].documents.size(), 2u);
  EXPECT_EQ(mbs[0].documents[0].length, 10);
  EXPECT_EQ(mbs[1].documents[0].offset, 10);
  EXPECT_EQ(mbs[1].documents[0].piece, 1);
  EXPECT_EQ(mbs[1].documents[1].length, 6);
  const std::vector<Document> pending = packer.Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].id, 1);
  EXPECT_EQ(pending[0].offset, 6);
  EXPECT_EQ(pending[0].length, 3);
  EXPECT_EQ((*steps)[0].held_back_tokens, 3);
}

}  // namespace original_packer_test
}  // namespace wlb
