// Tests of include/wlb/wlb.hpp: the umbrella header alone reaches every public header (the ones
// it names and the ones they include: limits, read_file, argmin_tree), and the pieces work
// together end to end.
#include "wlb/wlb.hpp"

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace wlb {
namespace wlb_test {

TEST(Umbrella, EveryHeaderIsReachableAndThePiecesWorkTogether) {
  // Transitively included headers.
  static_assert(kMaxContext * kMaxMicroBatches == int64_t{1} << 36);      // core/limits.hpp
  EXPECT_FALSE(ReadInputFile("/no/such/wlb/file", "lengths file").ok());  // io/read_file.hpp
  detail::ArgminTree<int64_t> tree(3, 5);                                 // pack/argmin_tree.hpp
  tree.Set(2, 1);
  EXPECT_EQ(tree.Min(), 2u);
  // Sample, pack with every packer, summarize, shard a micro-batch and write JSON.
  const PackerConfig config{.context = 8192, .max_tokens = 10240, .micro_batches = 4};
  const std::vector<int64_t> lengths = SampleDefaultLengths(int64_t{6} * 4 * 8192, 1);
  auto arrivals = SplitIntoSteps(*MakeDocuments(lengths, config.context), 4 * 8192);
  ASSERT_TRUE(arrivals.ok());
  const CostModel cost = *CostModelFromPreset("llama2-7b");
  for (const char* name : kPackerNames) {
    auto packer = MakePacker(name, config, cost, {.thresholds = DefaultThresholds(8192, 2)});
    ASSERT_TRUE(packer.ok()) << name;
    auto run = RunPacker(**packer, *arrivals);
    ASSERT_TRUE(run.ok()) << name;
    ASSERT_FALSE(run->steps.empty());
    const StreamSummary summary = Summarize(run->steps, cost, config.max_tokens);
    EXPECT_GE(summary.imbalance_mean, 1.0) << name;
    const nlohmann::json j = PlanToJson(run->steps, (*packer)->Pending(), cost);
    EXPECT_EQ(j.at("steps").size(), run->steps.size());
    const MicroBatch& mb = run->steps[0].micro_batches[0];
    if (mb.tokens == 0) continue;
    auto plan = PlanShards(mb, 2, ShardStrategy("adaptive"), KernelModel::Default());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(ValidateShardPlan(*plan, mb).ok());
    EXPECT_EQ(ShardPlanToJson(*plan).at("cp_size"), 2);
    EXPECT_GE(MeasureCpBalance(*plan, KernelModel::Default()).pair_imbalance, 1.0);
  }
}

namespace fs = std::filesystem;

// The wlb/... headers a header includes directly.
std::set<std::string> IncludesOf(const fs::path& include_dir, const std::string& header) {
  std::ifstream in(include_dir / header);
  EXPECT_TRUE(in.good()) << header;
  static const std::regex kInclude(R"re(^#include "(wlb/[^"]+)")re");
  std::set<std::string> out;
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, kInclude)) out.insert(m[1]);
  }
  return out;
}

// Every wlb/... header reached from `header` through includes.
std::set<std::string> ReachedFrom(const fs::path& include_dir, const std::string& header) {
  std::set<std::string> seen = {header};
  std::vector<std::string> to_visit = {header};
  while (!to_visit.empty()) {
    const std::string h = to_visit.back();
    to_visit.pop_back();
    for (const std::string& next : IncludesOf(include_dir, h)) {
      if (seen.insert(next).second) to_visit.push_back(next);
    }
  }
  return seen;
}

// One umbrella per folder: wlb/F.hpp includes every header at the top level of include/wlb/F
// and reaches every header below it; wlb/wlb.hpp includes exactly the top-level headers (the
// folder umbrellas and plan_spec.hpp), so no list of headers is kept twice.
TEST(Umbrella, OneUmbrellaPerFolderAndWlbHppIncludesExactlyThem) {
  const fs::path include_dir = fs::path(WLB_SOURCE_DIR) / "include";
  std::set<std::string> top_level;
  int folders = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(include_dir / "wlb")) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && e.path().extension() == ".hpp" && name != "wlb.hpp") {
      top_level.insert("wlb/" + name);
    }
    if (!e.is_directory()) continue;
    ++folders;
    const std::string umbrella = "wlb/" + name + ".hpp";
    ASSERT_TRUE(fs::exists(include_dir / umbrella))
        << "folder wlb/" << name << " has no " << umbrella;
    const std::set<std::string> direct = IncludesOf(include_dir, umbrella);
    const std::set<std::string> reached = ReachedFrom(include_dir, umbrella);
    for (const fs::directory_entry& h : fs::recursive_directory_iterator(e.path())) {
      if (h.path().extension() != ".hpp") continue;
      const std::string rel = fs::relative(h.path(), include_dir).generic_string();
      const bool at_top = h.path().parent_path() == e.path();
      if (at_top) {
        EXPECT_TRUE(direct.count(rel)) << umbrella << " does not include " << rel;
      } else {
        EXPECT_TRUE(reached.count(rel)) << umbrella << " does not reach " << rel;
      }
    }
    for (const std::string& d : direct) {
      EXPECT_EQ(d.rfind("wlb/" + name + "/", 0), 0u)
          << umbrella << " includes " << d << " of another folder";
    }
  }
  EXPECT_GE(folders, 7);
  EXPECT_EQ(IncludesOf(include_dir, "wlb/wlb.hpp"), top_level);
}

}  // namespace wlb_test
}  // namespace wlb
