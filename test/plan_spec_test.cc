// Tests of wlb::PlanSpec: parsing key/value pairs, the one Validate() and the cost it resolves.
#include "wlb/plan_spec.hpp"

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace plan_spec_test {

using ::testing::HasSubstr;
using Pairs = std::vector<std::pair<std::string, std::string>>;

std::string ValidateError(const Pairs& pairs) {
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec(pairs);
  if (!spec.ok()) return std::string(spec.status().message());
  absl::StatusOr<PlanSettings> plan = spec->Validate();
  return plan.ok() ? "" : std::string(plan.status().message());
}

TEST(PlanSpec, DefaultsAreWlbPlansDefaults) {
  absl::StatusOr<PlanSettings> plan = PlanSpec{}.Validate();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->packer, "wlb");
  EXPECT_EQ(plan->config.context, 131072);
  EXPECT_EQ(plan->config.max_tokens, DefaultMaxTokens(131072));
  EXPECT_EQ(plan->config.micro_batches, 4);
  EXPECT_EQ(plan->options.thresholds, DefaultThresholds(131072, 2));
  EXPECT_EQ(plan->cp_size, -1);
  EXPECT_EQ(plan->strategy, ShardStrategy("adaptive"));
}

TEST(PlanSpec, ParsesKeysSpelledLikeTheFlags) {
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec({{"packer", "wlb-lookahead"},
                                                 {"micro-batches", "8"},
                                                 {"max_tokens", "200000"},
                                                 {"thresholds", "1000,5000"},
                                                 {"lookahead", "2"},
                                                 {"delay-budget", "0.5"},
                                                 {"bound-delay", "true"},
                                                 {"cp", "4"},
                                                 {"sharding", "per-doc"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<PlanSettings> plan = spec->Validate();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config.micro_batches, 8);
  EXPECT_EQ(plan->config.max_tokens, 200000);
  EXPECT_EQ(plan->options.thresholds, (std::vector<int64_t>{1000, 5000}));
  EXPECT_EQ(plan->options.lookahead, 2);
  EXPECT_EQ(plan->options.delay_budget, 0.5);
  EXPECT_TRUE(plan->options.bound_delay);
  EXPECT_EQ(plan->cp_size, 4);
  EXPECT_EQ(plan->strategy, ShardStrategy("per-doc"));
}

TEST(PlanSpec, ErrorsNameTheValue) {
  EXPECT_THAT(ValidateError({{"colour", "red"}}), HasSubstr("unknown plan setting 'colour'"));
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"cp", "8"}}), HasSubstr("--cp is given more than once"));
  EXPECT_THAT(ValidateError({{"context", "big"}}), HasSubstr("--context: 'big' is not an integer"));
  EXPECT_THAT(ValidateError({{"thresholds", "1,x"}}), HasSubstr("'x' is not an integer"));
  EXPECT_THAT(ValidateError({{"delay_budget", "-1"}}),
              HasSubstr("--delay-budget must be a finite number >= 0, got -1"));
  EXPECT_THAT(ValidateError({{"packer", "best-fit"}}), HasSubstr("unknown packer 'best-fit'"));
  EXPECT_THAT(ValidateError({{"profile_cost", "exact"}}),
              HasSubstr("--profile-cost must be fit or table, got 'exact'"));
  EXPECT_THAT(ValidateError({{"queues", "17"}}), HasSubstr("--queues must be in [0, 16], got 17"));
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"sharding", "diagonal"}}), HasSubstr("diagonal"));
  EXPECT_THAT(ValidateError({{"cp", "0"}}), HasSubstr("--cp must be a context-parallel size"));
}

TEST(PlanSpec, AnOptionThePlanDoesNotUseIsAnError) {
  EXPECT_THAT(ValidateError({{"window", "2"}}),
              HasSubstr("--window is not used by this run: only fixed-greedy reads it, and the "
                        "packer is 'wlb'"));
  EXPECT_THAT(ValidateError({{"packer", "wlb-refine"}, {"bound_delay", "true"}}),
              HasSubstr("--bound-delay is not used by this run: only wlb-lookahead reads it, and "
                        "the packer is 'wlb-refine'"));
  EXPECT_THAT(ValidateError({{"packer", "wlb-lookahead"}, {"bound_delay", "maybe"}}),
              HasSubstr("--bound_delay: 'maybe' is not true or false"));
  EXPECT_THAT(ValidateError({{"packer", "wlb-refine"}, {"lookahead", "2"}}),
              HasSubstr("--lookahead is not used by this run"));
  EXPECT_THAT(ValidateError({{"packer", "original"}, {"queues", "3"}}),
              HasSubstr("--queues is not used by this run"));
  EXPECT_THAT(ValidateError({{"thresholds", "10"}, {"queues", "3"}}),
              HasSubstr("give one of them"));
  EXPECT_THAT(ValidateError({{"cost", "llama2-7b"}, {"profile_cost", "table"}}),
              HasSubstr("--profile-cost is not used by this run"));
  EXPECT_THAT(ValidateError({{"sharding", "per-doc"}}),
              HasSubstr("--sharding is not used by this run"));
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"sharding", "per-doc"}, {"cp_link_gbps", "100"}}),
              HasSubstr("--cp-link-gbps is not used by this run"));
  // The default sharding, adaptive, ranks its candidates with the exchange over the link.
  EXPECT_EQ(ValidateError({{"cp", "4"}, {"cp_link_gbps", "100"}}), "");
  // Only adaptive and balanced-chunks rank plans with the gathered key rows' copy.
  EXPECT_EQ(ValidateError({{"cp", "4"}, {"cp_gather_gbps", "3350"}}), "");
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"sharding", "doc-degree"}, {"cp_gather_gbps", "3350"}}),
              HasSubstr("--cp-gather-gbps is not used by this run: it applies to --cp with "
                        "--sharding adaptive or balanced-chunks"));
  EXPECT_THAT(ValidateError({{"cp_gather_gbps", "3350"}}),
              HasSubstr("--cp-gather-gbps is not used by this run"));
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"cp_gather_gbps", "-2"}}),
              HasSubstr("--cp-gather-gbps: CP key gather bandwidth must be in [0, 1e6] GB/s (0: "
                        "not priced), got -2"));
  // balanced-chunks keeps the deal priced faster, the copy included.
  EXPECT_EQ(
      ValidateError({{"cp", "4"}, {"sharding", "balanced-chunks"}, {"cp_gather_gbps", "3350"}}),
      "");
  EXPECT_THAT(
      ValidateError({{"cp", "4"}, {"sharding", "balanced-chunks"}, {"cp_gather_gbps", "2e6"}}),
      HasSubstr("--cp-gather-gbps: CP key gather bandwidth must be in [0, 1e6] GB/s (0: "
                "not priced), got 2e+06"));
  // The memory cap: read by the strategies that cap memory, in [100, 409700] percent.
  EXPECT_EQ(ValidateError({{"cp", "4"}, {"cp_memory_cap_percent", "125"}}), "");
  EXPECT_EQ(
      ValidateError({{"cp", "4"}, {"sharding", "contiguous"}, {"cp_memory_cap_percent", "100"}}),
      "");
  EXPECT_THAT(
      ValidateError({{"cp", "4"}, {"sharding", "hybrid"}, {"cp_memory_cap_percent", "125"}}),
      HasSubstr("--cp-memory-cap-percent is not used by this run: it applies to --cp with "
                "--sharding adaptive, doc-degree, balanced-chunks or contiguous"));
  EXPECT_THAT(ValidateError({{"cp_memory_cap_percent", "125"}}),
              HasSubstr("--cp-memory-cap-percent is not used by this run"));
  for (const char* bad : {"99", "0", "-101", "409701", "9223372036854775807"}) {
    EXPECT_THAT(ValidateError({{"cp", "4"}, {"cp_memory_cap_percent", bad}}),
                HasSubstr(absl::StrCat("--cp-memory-cap-percent: CP memory cap must be in [100, "
                                       "409700] percent of T / C (101: 1.01 x T / C), got ",
                                       bad)));
  }
  EXPECT_THAT(ValidateError({{"cp", "4"}, {"cp_memory_cap_percent", "1.25"}}),
              HasSubstr("'1.25' is not an integer"));
  // A wlb comparison (wlb-plan's table) uses the thresholds whatever the packer.
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec({{"packer", "original"}, {"queues", "3"}});
  ASSERT_TRUE(spec.ok());
  spec->wlb_comparison = true;
  EXPECT_TRUE(spec->Validate().ok());
}

TEST(PlanSpec, AttentionRange) {
  absl::StatusOr<PlanSpec> spec =
      ParsePlanSpec({{"packer", "wlb-lookahead"}, {"attention-range", "0.5,3"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<PlanSettings> plan = spec->Validate();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->options.attention_range.has_value());
  EXPECT_EQ(*plan->options.attention_range, (AttentionRange{.low = 0.5, .high = 3.0}));
  spec = ParsePlanSpec({{"packer", "wlb-refine"}, {"attention_range", "exact"}});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(*spec->Validate()->options.attention_range, AttentionRange{});
  // Not given: unset, so MakePacker takes the cost's default.
  EXPECT_FALSE(ParsePlanSpec({{"packer", "wlb-refine"}})->Validate()->options.attention_range);
  EXPECT_THAT(ValidateError({{"packer", "wlb-refine"}, {"attention_range", "2"}}),
              HasSubstr("--attention-range: '2' is not LOW,HIGH"));
  EXPECT_THAT(ValidateError({{"packer", "wlb-refine"}, {"attention_range", "1.5,2"}}),
              HasSubstr("0 <= LOW <= 1 <= HIGH (finite), got 1.5,2"));
  EXPECT_THAT(ValidateError({{"packer", "wlb-refine"}, {"attention_range", "0.5,inf"}}),
              HasSubstr("got 0.5,inf"));
  EXPECT_THAT(ValidateError({{"packer", "wlb"}, {"attention_range", "1,2"}}),
              HasSubstr("--attention-range is not used by this run"));
}

// The default range follows the cost: a FLOP cost is not trusted, a measured one is.
TEST(PlanSpec, DefaultAttentionRangeFollowsTheCost) {
  EXPECT_EQ(DefaultAttentionRange(*CostModelFromPreset("llama2-7b")),
            (AttentionRange{.low = 1.0, .high = 2.5}));
  EXPECT_EQ(DefaultAttentionRange(CostModel{.attn_quadratic = 1e-8, .unit = "ms"}),
            AttentionRange{});
}

TEST(PlanSpec, MaskedPresetCostAndLayerMix) {
  absl::StatusOr<PlanSpec> spec =
      ParsePlanSpec({{"cost", "llama2-7b-swa4k"}, {"cp", "4"}, {"sharding", "doc-degree"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<PlanSettings> plan = spec->Validate();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cp_options.mix.total_layers(),
            FindMaskedModel("llama2-7b-swa4k")->mix.total_layers());
  absl::StatusOr<DocumentCost> cost = spec->MakeCost();
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->polynomial(), nullptr);  // mask-aware, not a polynomial
  const DocumentCost causal = *ParsePlanSpec({{"cost", "llama2-7b-causal"}})->MakeCost();
  EXPECT_LT((*cost)(65536), causal(65536));  // a window sees fewer keys
}

TEST(PlanSpec, ProfileCostTableAndFit) {
  const std::string path = ::testing::TempDir() + "/plan_spec_profile.csv";
  {
    std::ofstream csv(path);
    csv << "seq_len,latency(ms)\n128,0.02\n1024,0.1\n8192,3.1\n65536,190\n";
  }
  absl::StatusOr<DocumentCost> fit = ParsePlanSpec({{"cost", path}})->MakeCost();
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NE(fit->polynomial(), nullptr);
  absl::StatusOr<PlanSpec> table = ParsePlanSpec({{"cost", path}, {"profile_cost", "table"}});
  ASSERT_TRUE(table->Validate().ok());
  absl::StatusOr<DocumentCost> tabulated = table->MakeCost();
  ASSERT_TRUE(tabulated.ok()) << tabulated.status();
  EXPECT_EQ(tabulated->polynomial(), nullptr);
  EXPECT_THAT(tabulated->description(), HasSubstr("tile-aware table of 4 measured lengths"));
  EXPECT_EQ(tabulated->unit(), "ms");
}

}  // namespace plan_spec_test
}  // namespace wlb
