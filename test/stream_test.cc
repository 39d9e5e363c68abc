// Tests of include/wlb/pack/stream.hpp: running a packer over a stream of steps.
#include "wlb/pack/stream.hpp"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/pack/make_packer.hpp"

namespace wlb {
namespace stream_test {

using ::testing::HasSubstr;

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

std::vector<Document> Docs(std::vector<int64_t> lengths, int64_t context) {
  return *MakeDocuments(lengths, context);
}

TEST(RunPacker, PushesEveryStepThenFlushesAndTimesEachCall) {
  const PackerConfig config{.context = 16, .max_tokens = 20, .micro_batches = 2};
  // Five pieces of >= 12 tokens (16, 16, 16, 14, 13): wlb releases them in pairs, so one is still
  // queued when the input ends.
  const std::vector<int64_t> lengths = {3, 20, 7, 1, 16, 9, 2, 30, 5, 13};
  auto arrivals = SplitIntoSteps(Docs(lengths, config.context), 32);
  ASSERT_TRUE(arrivals.ok());
  for (bool flush : {true, false}) {
    auto packer = MakePacker("wlb", config, kSquares, {.thresholds = {12}});
    ASSERT_TRUE(packer.ok());
    auto run = RunPacker(**packer, *arrivals, flush);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->plan_ms.size(), arrivals->size() + (flush ? 1 : 0));
    for (double ms : run->plan_ms) EXPECT_GE(ms, 0.0);
    for (size_t s = 0; s < run->steps.size(); ++s) {
      EXPECT_EQ(run->steps[s].step, static_cast<int64_t>(s));
    }
    const std::vector<Document> pending = (*packer)->Pending();
    EXPECT_EQ(pending.empty(), flush);
    EXPECT_TRUE(testing::CoversExactlyOnce(lengths, testing::Collect(run->steps, pending)));
  }
}

TEST(RunPacker, ReturnsThePackersErrorForABadStep) {
  const PackerConfig config{.context = 16, .max_tokens = 20, .micro_batches = 2};
  auto packer = MakePacker("original", config, kSquares, {});
  ASSERT_TRUE(packer.ok());
  std::vector<std::vector<Document>> arrivals = {Docs({4, 4}, 16), {{.id = 9, .length = 17}}};
  auto run = RunPacker(**packer, arrivals);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("length 17 is outside [1, 16]"));
}

}  // namespace stream_test
}  // namespace wlb
