// Tests of include/wlb/pack/windowed_packer.hpp through a minimal windowed packer defined here:
// what PackWindow() is handed (the carry and the window's arrivals, longest first), when steps
// come out, how Flush() drains, and the state blob.
#include "wlb/pack/windowed_packer.hpp"

#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace windowed_packer_test {

using ::testing::HasSubstr;

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

// Places the first `bins` documents (carry first, then arrivals) one per micro-batch, in order,
// and leaves the rest over. Records what each PackWindow() call was given.
class OnePerBinPacker final : public WindowedPacker {
 public:
  struct Call {
    std::vector<Document> carry;
    std::vector<Document> fresh;
    int steps;
  };
  OnePerBinPacker(PackerConfig config, int window) : WindowedPacker(config, kSquares, window) {}
  std::string_view name() const override { return "one-per-bin"; }
  std::vector<Call> calls;

 protected:
  std::vector<MicroBatch> PackWindow(const std::vector<Document>& carry,
                                     const std::vector<Document>& fresh, int steps,
                                     std::vector<Document>& leftover) override {
    calls.push_back({carry, fresh, steps});
    std::vector<MicroBatch> mbs(static_cast<size_t>(steps) * config_.micro_batches);
    size_t next = 0;
    for (const auto* group : {&carry, &fresh}) {
      for (const Document& d : *group) {
        if (next < mbs.size()) {
          Add(mbs[next++], d);
        } else {
          leftover.push_back(d);
        }
      }
    }
    return mbs;
  }
};

std::vector<int64_t> Lengths(const std::vector<Document>& docs) {
  std::vector<int64_t> out;
  for (const Document& d : docs) out.push_back(d.length);
  return out;
}

std::vector<Document> Arrivals(std::vector<int64_t> lengths, int64_t first_id) {
  std::vector<Document> docs;
  for (int64_t l : lengths) docs.push_back({.id = first_id++, .length = l});
  return docs;
}

TEST(WindowedPacker, PlansWStepsEveryWPushesFromTheCarryAndTheWindowLongestFirst) {
  OnePerBinPacker packer({.context = 10, .max_tokens = 12, .micro_batches = 2}, 2);
  EXPECT_EQ(packer.window(), 2);
  auto first = packer.Push(Arrivals({3, 7, 3}, 0));
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->empty());
  EXPECT_EQ(packer.Held().documents, 3);
  EXPECT_EQ(packer.Held().tokens, 13);
  auto second = packer.Push(Arrivals({5, 9, 1, 2}, 3));
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->size(), 2u);
  EXPECT_EQ((*second)[0].step, 0);
  EXPECT_EQ((*second)[1].step, 1);
  ASSERT_EQ(packer.calls.size(), 1u);
  EXPECT_TRUE(packer.calls[0].carry.empty());
  EXPECT_EQ(packer.calls[0].steps, 2);
  // The whole window's arrivals, longest first; equal lengths keep their arrival order.
  EXPECT_THAT(Lengths(packer.calls[0].fresh), ::testing::ElementsAre(9, 7, 5, 3, 3, 2, 1));
  EXPECT_EQ(packer.calls[0].fresh[3].id, 0);
  EXPECT_EQ(packer.calls[0].fresh[4].id, 2);
  // 4 bins took 9, 7, 5, 3; the rest (3, 2, 1) is carried, and held back after each step.
  EXPECT_EQ((*second)[0].held_back_documents, 3);
  EXPECT_EQ((*second)[1].held_back_tokens, 6);
  EXPECT_THAT(Lengths(packer.Pending()), ::testing::ElementsAre(3, 2, 1));
  // The next window is handed the carry (longest first) and its own arrivals apart.
  ASSERT_TRUE(packer.Push(Arrivals({4}, 7)).ok());
  ASSERT_TRUE(packer.Push(Arrivals({8}, 8)).ok());
  ASSERT_EQ(packer.calls.size(), 2u);
  EXPECT_THAT(Lengths(packer.calls[1].carry), ::testing::ElementsAre(3, 2, 1));
  EXPECT_THAT(Lengths(packer.calls[1].fresh), ::testing::ElementsAre(8, 4));
}

TEST(WindowedPacker, FlushPlansThePartialWindowThenOneStepWindowsUntilNothingIsCarried) {
  OnePerBinPacker packer({.context = 10, .max_tokens = 12, .micro_batches = 2}, 3);
  ASSERT_TRUE(packer.Push(Arrivals({1, 2, 3, 4, 5, 6, 7, 8, 9}, 0)).ok());
  // One buffered push of a window of 3: Flush plans a 1-step window (2 documents), then 1-step
  // windows of 2 documents each: 9 documents make 5 steps.
  const std::vector<StepPlan> steps = packer.Flush();
  ASSERT_EQ(steps.size(), 5u);
  ASSERT_EQ(packer.calls.size(), 5u);
  for (const auto& call : packer.calls) EXPECT_EQ(call.steps, 1);
  EXPECT_EQ(packer.calls[0].fresh.size(), 9u);
  for (size_t c = 1; c < packer.calls.size(); ++c) EXPECT_TRUE(packer.calls[c].fresh.empty());
  // Step 0 is the input's one step; the rest are beyond the input: drain steps.
  EXPECT_FALSE(steps[0].drain);
  for (size_t s = 1; s < steps.size(); ++s) EXPECT_TRUE(steps[s].drain) << s;
  EXPECT_TRUE(packer.Pending().empty());
  EXPECT_EQ(packer.Held().documents, 0);
  std::vector<int64_t> lengths;
  for (int64_t l = 1; l <= 9; ++l) lengths.push_back(l);
  EXPECT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(steps)));
  EXPECT_TRUE(packer.Flush().empty()) << "nothing held: nothing to flush";
}

TEST(WindowedPacker, AStateSavedMidWindowRestoresTheSameFuture) {
  const PackerConfig config{.context = 10, .max_tokens = 12, .micro_batches = 2};
  OnePerBinPacker a(config, 3);
  ASSERT_TRUE(a.Push(Arrivals({4, 4, 9, 2, 7}, 0)).ok());
  ASSERT_TRUE(a.Push(Arrivals({1, 8}, 5)).ok());
  ASSERT_TRUE(a.Push(Arrivals({6}, 7)).ok());     // window 1 planned; carry left
  ASSERT_TRUE(a.Push(Arrivals({3, 5}, 8)).ok());  // one push into window 2
  const std::string blob = a.SaveState();
  OnePerBinPacker b(config, 3);
  ASSERT_TRUE(b.RestoreState(blob).ok());
  EXPECT_EQ(b.Pending(), a.Pending());
  EXPECT_EQ(b.StateJson(), a.StateJson());
  for (int64_t id : {10, 11}) {
    auto ra = a.Push(Arrivals({id - 4}, id));
    auto rb = b.Push(Arrivals({id - 4}, id));
    ASSERT_TRUE(ra.ok() && rb.ok());
    ASSERT_EQ(ra->size(), rb->size());
    for (size_t s = 0; s < ra->size(); ++s) {
      EXPECT_EQ((*ra)[s].step, (*rb)[s].step);
      EXPECT_EQ(testing::Collect({(*ra)[s]}), testing::Collect({(*rb)[s]}));
    }
  }
  EXPECT_EQ(testing::Collect(a.Flush()), testing::Collect(b.Flush()));
  // A packer with another window refuses the blob and names both configurations.
  OnePerBinPacker other(config, 2);
  const absl::Status s = other.RestoreState(blob);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("window\\\":3"));  // the saved one, quoted and escaped
  EXPECT_THAT(s.message(), HasSubstr("this packer is {"));
  EXPECT_THAT(s.message(), HasSubstr("\"window\":2"));
  EXPECT_EQ(a.ConfigJson().at("window"), 3);
}

}  // namespace windowed_packer_test
}  // namespace wlb
