// Tests of wlb::kPlanSettings (plan_settings.hpp), iterating the table so a new row is tested
// without a new test: every row round-trips through ParsePlanSpec, and a packer option given to a
// packer that does not read it is the one "not used by this run" error, naming the option, the
// packers that read it and the packer.
#include "wlb/plan_settings.hpp"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wlb/plan_spec.hpp"

namespace wlb {
namespace plan_settings_test {

using ::testing::HasSubstr;

TEST(PlanSettings, KeysAreUniqueAndEveryRowIsComplete) {
  std::set<std::string> keys;
  for (const PlanSetting& row : kPlanSettings) {
    EXPECT_TRUE(keys.insert(row.key).second) << row.key;
    EXPECT_NE(row.parse, nullptr) << row.key;
    EXPECT_NE(row.show, nullptr) << row.key;
    EXPECT_NE(std::string(row.help), "") << row.key;
    EXPECT_NE(row.fronts, 0u) << row.key;
    EXPECT_EQ(row.also_read_by == nullptr, row.also_used == nullptr) << row.key;
    EXPECT_EQ(FindPlanSetting(row.key), &row);
    std::string dashed = row.key;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    EXPECT_EQ(FindPlanSetting(dashed), &row);
    if (row.readers != 0) {  // a packer option some packer of the registry reads
      EXPECT_NE(PlanSettingReaders(row), "") << row.key;
    }
  }
  EXPECT_EQ(FindPlanSetting("no_such_setting"), nullptr);
}

// Each row's example parses into the spec, differs from the default and prints back as given.
TEST(PlanSettings, EveryRowRoundTripsThroughParsePlanSpec) {
  for (const PlanSetting& row : kPlanSettings) {
    SCOPED_TRACE(row.key);
    absl::StatusOr<PlanSpec> spec = ParsePlanSpec({{row.key, row.example}});
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(spec->Given(row.key));
    EXPECT_EQ(spec->given.size(), 1u);
    EXPECT_EQ(row.show(*spec), row.example);
    EXPECT_NE(row.show(*spec), row.show(PlanSpec{}));  // the parser set the field
    // Only this row's value changed: every other row still shows its default.
    for (const PlanSetting& other : kPlanSettings) {
      if (&other != &row) EXPECT_EQ(other.show(*spec), other.show(PlanSpec{})) << other.key;
    }
    // The default, printed, parses back to itself (what --help shows is what a run gets).
    const std::string shown_default = row.show(PlanSpec{});
    if (!shown_default.empty()) {
      absl::StatusOr<PlanSpec> again = ParsePlanSpec({{row.key, shown_default}});
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(row.show(*again), shown_default);
    }
  }
}

TEST(PlanSettings, UnknownAndRepeatedKeysAreErrorsNamingThem) {
  absl::StatusOr<PlanSpec> spec = ParsePlanSpec({{"windw", "2"}});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("unknown plan setting 'windw'"));
  for (const PlanSetting& row : kPlanSettings) {
    EXPECT_THAT(spec.status().message(), HasSubstr(row.key));  // the known keys are listed
  }
  spec = ParsePlanSpec({{"window", "2"}, {"window", "3"}});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("--window is given more than once"));
}

// Every packer option given to every packer of the registry: used where the packer reads it,
// otherwise the one message naming the option, the packers that read it and the packer.
TEST(PlanSettings, APackerOptionThePackerDoesNotReadIsTheOneUnusedError) {
  int unused = 0;
  for (const PlanSetting& row : kPlanSettings) {
    if (row.readers == 0) continue;
    for (const PackerInfo& packer : kPackers) {
      SCOPED_TRACE(std::string(row.key) + " with " + packer.name);
      absl::StatusOr<PlanSpec> spec =
          ParsePlanSpec({{"packer", packer.name}, {"context", "65536"}, {row.key, row.example}});
      ASSERT_TRUE(spec.ok()) << spec.status();
      const absl::Status check = CheckPackerOptionsUsed(*spec, packer);
      const absl::StatusOr<PlanSettings> plan = spec->Validate();
      if (row.Reads(packer)) {
        EXPECT_TRUE(check.ok()) << check;
        EXPECT_THAT(plan.status().message(), ::testing::Not(HasSubstr("is not used by this run")));
        continue;
      }
      ++unused;
      ASSERT_FALSE(plan.ok());
      EXPECT_EQ(plan.status(), check);  // Validate's error is the one check's
      std::string flag = row.key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      const std::string message(plan.status().message());
      EXPECT_THAT(message, HasSubstr("--" + flag + " is not used by this run: only "));
      EXPECT_THAT(message, HasSubstr("the packer is '" + std::string(packer.name) + "'"));
      for (const PackerInfo& reader : kPackers) {
        if (row.Reads(reader)) EXPECT_THAT(message, HasSubstr(reader.name));
      }
    }
  }
  EXPECT_GT(unused, 0);
}

// Help texts name the registries' packers and strategies, never a list written by hand.
TEST(PlanSettings, HelpTakesNamesFromTheRegistries) {
  const std::string packer_help = PlanSettingHelp(*FindPlanSetting("packer"));
  for (const PackerInfo& p : kPackers) EXPECT_THAT(packer_help, HasSubstr(p.name));
  const std::string sharding_help = PlanSettingHelp(*FindPlanSetting("sharding"));
  for (const ShardStrategyInfo& s : ShardStrategies()) {
    EXPECT_THAT(sharding_help, HasSubstr(std::string(s.name)));
  }
  for (const PlanSetting& row : kPlanSettings) {
    const std::string help = PlanSettingHelp(row);
    // Help texts name registry lists as {strategies}-style fields; none may reach the user.
    EXPECT_THAT(help, ::testing::Not(HasSubstr("{"))) << row.key;
    if (row.readers != 0) EXPECT_THAT(help, HasSubstr(PackerNamesReading(row.readers, "/")));
  }
}

}  // namespace plan_settings_test
}  // namespace wlb
