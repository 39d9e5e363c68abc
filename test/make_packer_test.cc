// Tests of include/wlb/pack/make_packer.hpp: every name builds its packer, every option is
// range-checked with an error naming the value, and the default thresholds.
#include "wlb/pack/make_packer.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace make_packer_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CostModel Quadratic() { return CostModel{.attn_quadratic = 1.0, .unit = "tokens^2"}; }

TEST(PackerRegistry, NamesSummariesAndTheOptionsEachPackerChecks) {
  ASSERT_EQ(std::size(kPackerNames), std::size(kPackers));
  const PackerConfig config{.context = 100, .max_tokens = 125, .micro_batches = 2};
  for (size_t i = 0; i < std::size(kPackers); ++i) {
    const PackerInfo& p = kPackers[i];
    SCOPED_TRACE(p.name);
    EXPECT_STREQ(kPackerNames[i], p.name);
    EXPECT_EQ(FindPacker(p.name), &p);
    EXPECT_GT(std::string_view(p.summary).size(), 10u);
    auto made = MakePacker(p.name, config, Quadratic(), {});
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ((*made)->name(), p.name);
    // An option a packer declares is checked by its factory; one it does not declare is not read.
    EXPECT_EQ(MakePacker(p.name, config, Quadratic(), {.window = 0}).ok(), !p.Uses(kUsesWindow));
    EXPECT_EQ(MakePacker(p.name, config, Quadratic(), {.thresholds = {90, 10}}).ok(),
              !p.Uses(kUsesThresholds));
    EXPECT_EQ(MakePacker(p.name, config, Quadratic(), {.lookahead = -1}).ok(),
              !p.Uses(kUsesLookahead));
    EXPECT_EQ(MakePacker(p.name, config, Quadratic(), {.delay_budget = -1.0}).ok(),
              !p.Uses(kUsesDelayBudget));
  }
  EXPECT_EQ(FindPacker("best-fit"), nullptr);
}

TEST(MakePacker, EveryKnownNameBuildsAPackerOfThatName) {
  const PackerConfig config{.context = 1024, .max_tokens = 1280, .micro_batches = 4};
  for (const char* name : kPackerNames) {
    auto packer = MakePacker(name, config, Quadratic(), {.thresholds = {256, 512}});
    ASSERT_TRUE(packer.ok()) << name << ": " << packer.status();
    EXPECT_EQ((*packer)->name(), name);
    EXPECT_EQ((*packer)->config().context, 1024);
    EXPECT_EQ((*packer)->config().max_tokens, 1280);
    EXPECT_EQ((*packer)->config().micro_batches, 4);
    EXPECT_EQ((*packer)->ConfigJson().at("packer"), name);
  }
}

TEST(MakePacker, AnUnknownNameListsEveryKnownName) {
  auto packer = MakePacker("best-fit\n", {}, Quadratic(), {});
  ASSERT_FALSE(packer.ok());
  EXPECT_EQ(packer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(packer.status().message(), HasSubstr("unknown packer 'best-fit\\n'"));
  EXPECT_THAT(packer.status().message(),
              HasSubstr("(known: original, original-nextfit, fixed-greedy, wlb, wlb-refine, "
                        "wlb-lookahead)"));
  EXPECT_FALSE(MakePacker("", {}, Quadratic(), {}).ok());
  EXPECT_FALSE(MakePacker("WLB", {}, Quadratic(), {}).ok()) << "names are case-sensitive";
}

TEST(MakePacker, OptionsAreCheckedOnlyByThePackersThatUseThem) {
  const PackerOptions bad{.window = 0,
                          .thresholds = {5, 3},
                          .refine_rounds = -1,
                          .lookahead = 99,
                          .delay_budget = -1.0};
  EXPECT_TRUE(MakePacker("original", {}, Quadratic(), bad).ok());
  EXPECT_TRUE(MakePacker("original-nextfit", {}, Quadratic(), bad).ok());
  EXPECT_FALSE(MakePacker("fixed-greedy", {}, Quadratic(), bad).ok());
  EXPECT_TRUE(MakePacker("fixed-greedy", {}, Quadratic(), {.window = 3, .lookahead = 99}).ok());
  EXPECT_TRUE(MakePacker("wlb", {}, Quadratic(), {.window = 0, .lookahead = 99}).ok());
}

TEST(MakePacker, EachOptionsRangeAndItsError) {
  const CostModel cost = Quadratic();
  auto message = [&](const char* name, const PackerOptions& o, const PackerConfig& c = {}) {
    return std::string(MakePacker(name, c, cost, o).status().message());
  };
  // window: [1, kMaxWindow], and W x N <= kMaxWindowMicroBatches.
  EXPECT_TRUE(MakePacker("fixed-greedy", {}, cost, {.window = kMaxWindow}).ok());
  EXPECT_THAT(message("fixed-greedy", {.window = -3}), HasSubstr("got -3"));
  EXPECT_THAT(message("fixed-greedy", {.window = 16}, {.micro_batches = 4097}),
              HasSubstr("got 4097"));  // the config is checked first
  EXPECT_THAT(message("fixed-greedy", {.window = 17}, {.micro_batches = 4096}),
              HasSubstr("W = 17 times N = 4096 is 69632 micro-batches per window"));
  EXPECT_TRUE(MakePacker("fixed-greedy", {.micro_batches = 4096}, cost, {.window = 16}).ok());
  // thresholds: each in [1, S], strictly increasing, at most kMaxOutlierQueues.
  EXPECT_THAT(message("wlb-refine", {.thresholds = {0}}),
              HasSubstr("outlier threshold 0 is outside [1, 131072]"));
  EXPECT_THAT(message("wlb-lookahead", {.thresholds = {7, 7}}),
              HasSubstr("strictly increasing, got 7,7"));
  EXPECT_TRUE(MakePacker("wlb", {}, cost, {.thresholds = {1, 131072}}).ok());
  EXPECT_TRUE(MakePacker("wlb", {}, cost, {.thresholds = {}}).ok()) << "no queues is plain greedy";
  // refine rounds: >= 0.
  EXPECT_THAT(message("wlb-refine", {.refine_rounds = -2}),
              HasSubstr("refine rounds must be >= 0, got -2"));
  EXPECT_THAT(message("wlb", {.refine_rounds = -2}), HasSubstr("got -2"));
  // look-ahead: [0, kMaxLookahead]; delay budget: >= 0 (infinity allowed).
  EXPECT_TRUE(MakePacker("wlb-lookahead", {}, cost, {.lookahead = 0}).ok());
  EXPECT_TRUE(MakePacker("wlb-lookahead", {}, cost, {.lookahead = kMaxLookahead}).ok());
  EXPECT_THAT(
      message("wlb-lookahead", {.lookahead = kMaxLookahead + 1}),
      HasSubstr(absl::StrFormat("[0, %d] steps, got %d", kMaxLookahead, kMaxLookahead + 1)));
  EXPECT_TRUE(MakePacker("wlb-lookahead", {}, cost, {.delay_budget = 0.0}).ok());
  EXPECT_THAT(message("wlb-lookahead", {.delay_budget = -std::numeric_limits<double>::infinity()}),
              HasSubstr("got -inf"));
}

TEST(MakePacker, RefineRoundsDefaultToFourNAndPlainWlbDoesNotRefine) {
  const PackerConfig config{.context = 1024, .max_tokens = 1280, .micro_batches = 6};
  auto rounds = [&](const char* name, int r) {
    return (*MakePacker(name, config, Quadratic(), {.refine_rounds = r}))
        ->ConfigJson()
        .at("refine_rounds")
        .get<int>();
  };
  EXPECT_EQ(rounds("wlb-refine", 0), 24);
  EXPECT_EQ(rounds("wlb-refine", 5), 5);
  EXPECT_EQ(rounds("wlb-lookahead", 0), 24);
  EXPECT_EQ(rounds("wlb-lookahead", 3), 3);
  EXPECT_EQ(rounds("wlb", 0), 0);
  EXPECT_EQ(rounds("wlb", 9), 0);
}

TEST(MakePacker, InvalidCostModelsAreRejected) {
  auto packer = MakePacker("wlb", {}, CostModel{.attn_quadratic = -1.0}, {});
  EXPECT_FALSE(packer.ok());
  auto nan_cost = MakePacker("original", {}, CostModel{.linear_per_token = std::nan("")}, {});
  EXPECT_FALSE(nan_cost.ok());
}

TEST(DefaultThresholds, TheDocumentedFractionsOfS) {
  EXPECT_THAT(DefaultThresholds(131072, 0), ElementsAre());
  EXPECT_THAT(DefaultThresholds(131072, 1), ElementsAre(65536));
  EXPECT_THAT(DefaultThresholds(131072, 2), ElementsAre(32768, 65536));
  EXPECT_THAT(DefaultThresholds(131072, 3), ElementsAre(32768, 65536, 98304));
  EXPECT_THAT(DefaultThresholds(1000, 4), ElementsAre(200, 400, 600, 800));
  // Never below 1 token.
  EXPECT_THAT(DefaultThresholds(1, 1), ElementsAre(1));
  // What it returns is accepted for every level count up to the queue limit (at a large S).
  for (int levels = 1; levels <= kMaxOutlierQueues; ++levels) {
    EXPECT_TRUE(ValidateThresholds(DefaultThresholds(131072, levels), 131072).ok()) << levels;
  }
}

TEST(MakePacker, RejectsBadSettingsNamingTheValue) {
  const CostModel cost = Quadratic();
  EXPECT_THAT(MakePacker("best-fit", {}, cost, {}).status().message(),
              HasSubstr("unknown packer 'best-fit'"));
  EXPECT_THAT(MakePacker("wlb", {.micro_batches = 0}, cost, {}).status().message(),
              HasSubstr("got 0"));
  EXPECT_THAT(MakePacker("wlb", {.context = 100, .max_tokens = 99}, cost, {}).status().message(),
              HasSubstr("S_max) 99 is below the context window (S) 100"));
  EXPECT_THAT(MakePacker("fixed-greedy", {}, cost, {.window = 0}).status().message(),
              HasSubstr("window must be in [1, 4096] steps, got 0"));
  EXPECT_THAT(MakePacker("wlb", {}, cost, {.thresholds = {100, 50}}).status().message(),
              HasSubstr("strictly increasing, got 100,50"));
  EXPECT_THAT(MakePacker("wlb", {}, cost, {.thresholds = {200000}}).status().message(),
              HasSubstr("200000 is outside"));
}

TEST(MakePacker, RejectsABadLookahead) {
  EXPECT_THAT(MakePacker("wlb-lookahead", {}, Quadratic(), {.lookahead = -1}).status().message(),
              HasSubstr("look-ahead must be in [0, 8] steps, got -1"));
  EXPECT_THAT(MakePacker("wlb-lookahead", {}, Quadratic(), {.lookahead = 9}).status().message(),
              HasSubstr("got 9"));
  EXPECT_THAT(
      MakePacker("wlb-lookahead", {}, Quadratic(), {.delay_budget = -0.5}).status().message(),
      HasSubstr("delay budget must be >= 0 steps, got -0.5"));
  EXPECT_THAT(MakePacker("wlb-lookahead", {}, Quadratic(), {.delay_budget = std::nan("")})
                  .status()
                  .message(),
              HasSubstr("got nan"));
}

}  // namespace make_packer_test
}  // namespace wlb
