// End-to-end tests of the wlb-plan binary: outputs, determinism and bad input.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_util.hpp"
#include "wlb/wlb.hpp"

namespace wlb {
namespace wlb_plan_cli_test {

using ::testing::HasSubstr;

struct Result {
  int exit_code;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Result RunPlan(const std::string& args, const std::string& stdin_text = "") {
  // Per-test file names: ctest runs the tests of this binary in parallel.
  const std::string dir = ::testing::TempDir() + "/wlb_cli_" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string in = dir + "_in", out = dir + "_out", err = dir + "_err";
  std::ofstream(in) << stdin_text;
  const std::string cmd =
      std::string(WLB_PLAN_BINARY) + " " + args + " <" + in + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WEXITSTATUS(status), Slurp(out), Slurp(err)};
}

TEST(WlbPlan, DefaultRunPrintsStepsAndComparesOriginalWithWlb) {
  Result r = RunPlan("--steps 12");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("embedded default distribution"));
  EXPECT_THAT(r.out, HasSubstr("| original"));
  EXPECT_THAT(r.out, HasSubstr("| wlb"));
  EXPECT_THAT(r.out, HasSubstr("   11  |"));  // a row per step
}

TEST(WlbPlan, HelpListsItsOwnFlagsByGroupAndThePackers) {
  Result r = RunPlan("--help");
  EXPECT_THAT(r.out, HasSubstr("Packing:"));
  EXPECT_THAT(r.out, HasSubstr("CP shard plans:"));
  EXPECT_THAT(r.out, HasSubstr("--micro-batches ("));
  for (const PackerInfo& p : kPackers) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrFormat("    %-17s %s\n", p.name, p.summary)));
  }
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("--flagfile")));  // Abseil's stay in --helpfull
  EXPECT_EQ(RunPlan("--helpshort").out, r.out);
}

// The help lists every plan setting wlb-plan offers (kPlanSettings) with its default, and every
// name of the packer and CP strategy registries: none is written into a help text by hand.
// --helpfull lists every wlb-plan flag (the plan settings too, which are not Abseil flags) and
// then Abseil's own: Abseil's listing alone had none of the plan settings.
TEST(WlbPlan, HelpfullListsItsOwnFlagsToo) {
  const Result r = RunPlan("--helpfull");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(r.out, RunPlan("--help").out));
  for (const char* flag : {"--docs", "--fit-cost", "--attention-range", "--packer", "--flagfile",
                           "--fromenv"}) {
    EXPECT_THAT(r.out, HasSubstr(flag)) << flag;
  }
}

TEST(WlbPlan, HelpListsEveryPlanSettingAndRegistryName) {
  const std::string help = RunPlan("--help").out;
  for (const PlanSetting& row : kPlanSettings) {
    if ((row.fronts & kWlbPlanFlag) == 0) continue;
    std::string flag = row.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string shown = row.show(PlanSpec{});
    EXPECT_THAT(help,
                HasSubstr(absl::StrFormat("  --%s (%s); default: %s;\n", flag, PlanSettingHelp(row),
                                          shown.empty() ? "\"\"" : shown)));
  }
  const std::string packer_line = help.substr(help.find("  --packer ("));
  const std::string sharding_line = help.substr(help.find("  --sharding ("));
  for (const PackerInfo& p : kPackers) {
    EXPECT_THAT(packer_line.substr(0, packer_line.find('\n')), HasSubstr(p.name));
  }
  for (const ShardStrategyInfo& s : ShardStrategies()) {
    EXPECT_THAT(sharding_line.substr(0, sharding_line.find('\n')), HasSubstr(std::string(s.name)));
  }
}

// Every plan setting is a wlb-plan flag whose example value parses (a run may still find it
// unused or the file absent, but never an unknown flag or a malformed value).
TEST(WlbPlan, EveryPlanSettingIsAFlag) {
  for (const PlanSetting& row : kPlanSettings) {
    if ((row.fronts & kWlbPlanFlag) == 0) continue;
    std::string flag = row.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const Result r = RunPlan(absl::StrFormat("--steps 2 --format json --%s=%s", flag, row.example));
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("unknown flag"))) << row.key;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr(absl::StrFormat("--%s: ", row.key)))) << row.key;
    if (r.exit_code != 0) {  // the one wording of a setting this run does not use, if any
      EXPECT_THAT(r.err,
                  ::testing::AnyOf(HasSubstr("is not used by this run"), HasSubstr(row.example)))
          << row.key << ": " << r.err;
    }
  }
}

TEST(WlbPlan, ListPrintsTheRegistriesNames) {
  std::string packers, strategies;
  for (const char* name : kPackerNames) packers += std::string(name) + "\n";
  for (const ShardStrategyInfo& s : ShardStrategies()) strategies += std::string(s.name) + "\n";
  Result p = RunPlan("--list packers");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, packers);
  Result s = RunPlan("--list=sharding");
  EXPECT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out, strategies);
  std::string costs;
  for (const std::string& name : CostPresetNames()) costs += name + "\n";
  for (const MaskedModel& m : MaskedModelPresets()) costs += m.name + "\n";
  Result c = RunPlan("--list costs");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out, costs);
  EXPECT_THAT(c.out, HasSubstr("\nh100-flash-llama2-7b-tp8\nh100-cudnn-wlb-550m-tp2\n"));
  Result bad = RunPlan("--list knobs");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("--list must be packers, sharding or costs, got 'knobs'"));
  Result more = RunPlan("--list packers --steps 3");
  EXPECT_EQ(more.exit_code, 1);
  EXPECT_THAT(more.err, HasSubstr("--list prints the registry's names and takes no other flag"));
  EXPECT_TRUE(more.out.empty());
}

TEST(WlbPlan, JsonCoversEveryTokenAndIsByteIdenticalForASeed) {
  const std::string args =
      "--steps 20 --seed 3 --packer wlb-refine --format json --timing=false --micro-batches 3";
  Result a = RunPlan(args);
  Result b = RunPlan(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, RunPlan("--steps 20 --seed 4 --packer wlb-refine --format json --timing=false "
                           "--micro-batches 3")
                       .out);
  nlohmann::json j = nlohmann::json::parse(a.out);
  EXPECT_TRUE(j["pending"].empty());
  std::vector<Document> docs;
  for (const auto& step : j["steps"]) {
    ASSERT_EQ(step["micro_batches"].size(), 3u);
    for (const auto& mb : step["micro_batches"]) {
      int64_t tokens = 0;
      for (const auto& d : mb["documents"]) {
        docs.push_back(
            {.id = d["id"], .length = d["length"], .piece = d["piece"], .offset = d["offset"]});
        tokens += d["length"].get<int64_t>();
      }
      EXPECT_EQ(mb["tokens"].get<int64_t>(), tokens);
      EXPECT_LE(tokens, DefaultMaxTokens(131072));
    }
    EXPECT_GE(step["imbalance"].get<double>(), step["lower_bound"].get<double>() - 1e-12);
  }
  // The same lengths, sampled by the library with the same seed, are exactly covered.
  std::vector<int64_t> lengths = SampleDefaultLengths(int64_t{20} * 3 * 131072, 3);
  EXPECT_TRUE(testing::CoversExactlyOnce(lengths, docs));
  for (const char* key : {"imbalance_mean", "delay_mean", "delay_p99", "delay_max", "steps"}) {
    EXPECT_TRUE(j["summary"].contains(key)) << key;
  }
  EXPECT_FALSE(j["summary"].contains("planning_ms_per_step_median"));
  EXPECT_TRUE(nlohmann::json::parse(RunPlan("--steps 2 --format json").out)["summary"].contains(
      "planning_ms_per_step_median"));
}

TEST(WlbPlan, ReadsStdinAndFiles) {
  Result r = RunPlan("--docs - --context 32 --micro-batches 1 --format json --packer original",
                     "5\n19\n8\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["steps"].size(), 1u);
  EXPECT_EQ(j["steps"][0]["micro_batches"][0]["tokens"], 32);
  const std::string path = ::testing::TempDir() + "/wlb_cli_docs.json";
  std::ofstream(path) << "[5, 19, 8]";
  Result f = RunPlan("--docs " + path + " --context 32 --micro-batches 1 --format json");
  ASSERT_EQ(f.exit_code, 0) << f.err;
}

// A Megatron index (uint16 tokens, one document) of sequences of `lengths`, 0 for an empty one.
std::string WriteMegatronIndex(const std::vector<uint32_t>& lengths, const std::string& name) {
  std::string out(kMegatronIndexMagic);
  auto put = [&](uint64_t v, int width) {
    for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(1, 8);
  put(8, 1);
  put(lengths.size(), 8);
  put(2, 8);
  for (uint32_t n : lengths) put(n, 4);
  uint64_t pointer = 0;
  for (uint32_t n : lengths) {
    put(pointer, 8);
    pointer += 2 * uint64_t{n};
  }
  put(0, 8);
  put(lengths.size(), 8);
  const std::string path = ::testing::TempDir() + "/" + name + ".idx";
  std::ofstream(path, std::ios::binary) << out;
  return path;
}

// Empty sequences of a Megatron index are skipped and reported once: a line of the table and a
// key of the JSON summary (absent when there are none).
TEST(WlbPlan, ReportsTheEmptySequencesItSkipped) {
  const std::string idx = WriteMegatronIndex({5, 0, 19, 8, 0, 40}, "wlb_cli_empty");
  Result t = RunPlan("--docs " + idx + " --context 32 --micro-batches 2");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_THAT(t.out, HasSubstr(": 4 documents, "));
  EXPECT_THAT(t.out, HasSubstr("skipped 2 empty sequences of the input (no token to plan)\n"));
  Result j = RunPlan("--docs " + idx + " --context 32 --micro-batches 2 --format json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  nlohmann::json summary = nlohmann::json::parse(j.out)["summary"];
  EXPECT_EQ(summary["empty_sequences_skipped"], 2);
  EXPECT_EQ(summary["documents"], 4);
  EXPECT_EQ(summary["tokens"], 72);
  const std::string full = WriteMegatronIndex({5, 19, 8, 40}, "wlb_cli_full");
  Result none = RunPlan("--docs " + full + " --context 32 --micro-batches 2 --format json");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_FALSE(nlohmann::json::parse(none.out)["summary"].contains("empty_sequences_skipped"));
  Result table = RunPlan("--docs " + full + " --context 32 --micro-batches 2");
  EXPECT_THAT(table.out, ::testing::Not(HasSubstr("empty sequences")));
}

// A plan's document ids name the index's sequences, empty ones counted: the trainer fetches
// sequence `id` of the index. Streamed (the default for an index) and planned whole (--estimate
// needs every step at once), every piece inside its sequence and every sequence planned whole.
TEST(WlbPlan, IndexDocumentIdsNameTheIndexSequences) {
  const std::vector<uint32_t> lengths = {0, 5, 0, 0, 19, 8, 0, 40, 70, 0};
  const std::string idx = WriteMegatronIndex(lengths, "wlb_cli_ids");
  for (const std::string extra : {"", " --estimate 1,1,2,1"}) {
    Result r = RunPlan("--docs " + idx + " --context 32 --micro-batches 2 --format json" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::map<int64_t, int64_t> planned;  // id -> tokens
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    for (const auto& step : plan["steps"]) {
      for (const auto& mb : step["micro_batches"]) {
        for (const auto& d : mb["documents"]) {
          const int64_t id = d["id"];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, static_cast<int64_t>(lengths.size()));
          EXPECT_LE(d["offset"].get<int64_t>() + d["length"].get<int64_t>(), lengths[id]) << id;
          planned[id] += d["length"].get<int64_t>();
        }
      }
    }
    EXPECT_EQ(planned, (std::map<int64_t, int64_t>{{1, 5}, {4, 19}, {5, 8}, {7, 40}, {8, 70}}))
        << extra;
  }
}

// Every command that writes to stdout (a plan as a table or JSON, a streamed index, --list,
// --fit-cost) fails with rc 1 when stdout cannot be written, never a silent rc 0.
TEST(WlbPlan, EveryOutputStreamChecksItsWrites) {
  const std::string idx = WriteMegatronIndex({5, 19, 8, 40}, "wlb_cli_writes");
  const std::string csv =
      std::string(WLB_SOURCE_DIR) + "/docs/results/gpu/h100_layer_550m_64k_measurements.csv";
  const std::string err = ::testing::TempDir() + "/wlb_cli_writes_err";
  for (const std::string& args : std::vector<std::string>{
           "--steps 2", "--steps 2 --format json", "--docs " + idx + " --context 32",
           "--list packers", "--list costs", "--fit-cost " + csv}) {
    ASSERT_EQ(RunPlan(args).exit_code, 0) << args;
    for (const std::string redirect : {">/dev/full", ">&-"}) {
      const std::string cmd =
          std::string(WLB_PLAN_BINARY) + " " + args + " " + redirect + " 2>" + err;
      const int status = std::system(cmd.c_str());
      EXPECT_EQ(WEXITSTATUS(status), 1) << args << " " << redirect;
      EXPECT_THAT(Slurp(err), HasSubstr("cannot write the output to stdout")) << args << redirect;
    }
  }
}

// --fit-cost refuses measurements that cannot identify the fit's terms (every micro-batch one
// document: documents and calls move together), naming them, rc 1.
TEST(WlbPlan, FitCostRefusesMeasurementsThatCannotTellTheTermsApart) {
  std::string csv = "step,ms,lengths\n";
  for (int i = 0; i < 12; ++i) absl::StrAppend(&csv, i, ",", 1 + i, ",", 1000 * (i + 1), "\n");
  const std::string path = ::testing::TempDir() + "/wlb_cli_single_docs.csv";
  std::ofstream(path) << csv;
  for (const std::string& args :
       std::vector<std::string>{"--fit-cost " + path, "--steps 2 --cost " + path}) {
    Result r = RunPlan(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_THAT(r.err, HasSubstr("cannot tell apart the terms c (documents), per call")) << args;
  }
}

// A valid --out file name as long as the name limit allows (NAME_MAX, 255 on common file
// systems) is written: the temporary beside it must not exceed the limit with its suffix.
TEST(WlbPlan, LongOutFileNamesWork) {
  const std::string dir = ::testing::TempDir() + "/wlb_cli_long";
  std::filesystem::create_directories(dir);
  for (const size_t n : {size_t{200}, size_t{245}, size_t{250}, size_t{255}}) {
    const std::string out = dir + "/" + std::string(n - 5, 'p') + ".json";
    Result r = RunPlan("--steps 2 --format json --out " + out);
    ASSERT_EQ(r.exit_code, 0) << n << ": " << r.err;
    EXPECT_FALSE(nlohmann::json::parse(Slurp(out))["steps"].empty()) << n;
    // Written twice: the second run's temporary (cut name) replaces the first file.
    ASSERT_EQ(RunPlan("--steps 3 --format json --timing=false --out " + out).exit_code, 0) << n;
    EXPECT_EQ(Slurp(out), RunPlan("--steps 3 --format json --timing=false").out) << n;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".wlb-"), std::string::npos) << "temporary left behind";
  }
  std::filesystem::remove_all(dir);
}

// A Megatron index is planned as a stream (each step cut, planned and written as it comes, the
// summaries accumulated): the same output as the same lengths in a text file, planned whole, for
// seeded random corpora, both formats, --steps, CP shard plans and the compared packers.
TEST(WlbPlan, StreamedIndexGivesTheWholeRunsOutput) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<uint32_t> lengths(20 + rng() % 300);
    std::string text;
    for (uint32_t& n : lengths) {
      n = 1 + static_cast<uint32_t>(rng() % (rng() % 5 == 0 ? 20000 : 900));
      text += std::to_string(n) + "\n";
    }
    const std::string idx = WriteMegatronIndex(lengths, "wlb_cli_stream");
    const std::string txt = ::testing::TempDir() + "/wlb_cli_stream.txt";
    std::ofstream(txt) << text;
    for (const std::string flags :
         {"--format json --timing=false", "--format json --timing=false --steps 3 --cp 4", "--cp 2",
          "--compare=false --packer wlb-refine"}) {
      const std::string args =
          " --context 4096 --micro-batches " + std::to_string(2 + trial) + " " + flags;
      Result a = RunPlan("--docs " + idx + args);
      Result b = RunPlan("--docs " + txt + args);
      ASSERT_EQ(a.exit_code, 0) << a.err;
      ASSERT_EQ(b.exit_code, 0) << b.err;
      // The table names the input and times the packers (its last column): leave both out.
      auto comparable = [](std::string out, const std::string& name) {
        out = absl::StrReplaceAll(out, {{name, "INPUT"}});
        std::string kept;
        for (absl::string_view line : absl::StrSplit(out, '\n')) {
          if (absl::StartsWith(line, "| ")) line = line.substr(0, line.rfind('|', line.size() - 2));
          absl::StrAppend(&kept, line, "\n");
        }
        return kept;
      };
      EXPECT_EQ(comparable(a.out, idx), comparable(b.out, txt)) << "trial " << trial << flags;
    }
  }
}

TEST(WlbPlan, WritesOutFileAtomically) {
  const std::string path = ::testing::TempDir() + "/wlb_cli_plan.json";
  std::filesystem::remove(path);
  ASSERT_EQ(RunPlan("--steps 3 --format json --out " + path).exit_code, 0);
  EXPECT_FALSE(nlohmann::json::parse(Slurp(path))["steps"].empty());
  std::filesystem::remove(path);
  Result bad = RunPlan("--docs - --format json --out " + path, "5\nx\n");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(path));  // never a partial output file
}

TEST(WlbPlan, TunesThresholdsAndFitsProfiles) {
  Result r = RunPlan("--steps 30 --tune --delay-budget 0.8 --compare=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tuned over 93 sets for mean delay <= 0.8"));
  Result bad = RunPlan("--steps 30 --tune --packer original");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(
      bad.err,
      HasSubstr("--tune is not used by this run: only wlb, wlb-refine, wlb-lookahead read"));

  const std::string profile = ::testing::TempDir() + "/wlb_cli_profile.csv";
  std::ofstream(profile) << "seq_len,latency(ms)\n128,0.02\n1024,0.1\n8192,3.1\n65536,190\n";
  Result fit = RunPlan("--steps 5 --compare=false --cost " + profile);
  ASSERT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_THAT(fit.out, HasSubstr("fitted:"));
  EXPECT_THAT(fit.out, HasSubstr("rms rel. error"));
  // The tile-aware table instead of the fit: micro-batch costs are sums of the table's values.
  Result table =
      RunPlan("--steps 5 --format json --timing=false --profile-cost table --cost " + profile);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  const nlohmann::json j = nlohmann::json::parse(table.out);
  EXPECT_THAT(j["summary"]["cost_model"].get<std::string>(), HasSubstr("tile-aware table"));
  EXPECT_EQ(j["summary"]["cost_unit"], "ms");
  const std::vector<ProfilePoint> points = {{128, 0.02}, {1024, 0.1}, {8192, 3.1}, {65536, 190}};
  const TabulatedCost cost = *TabulatedCost::Create(points);
  for (const auto& mb : j["steps"][0]["micro_batches"]) {
    double sum = 0.0;
    for (const auto& d : mb["documents"]) sum += cost.Attention(d["length"].get<int64_t>());
    EXPECT_NEAR(mb["cost"].get<double>(), sum, 1e-9 * sum);
  }
  Result preset = RunPlan("--steps 5 --profile-cost table");
  EXPECT_NE(preset.exit_code, 0);
  EXPECT_THAT(preset.err, HasSubstr("--profile-cost is not used by this run: it applies to a "
                                    "profile CSV in --cost, and --cost is the preset 'llama2-7b'"));
  Result unknown = RunPlan("--steps 5 --profile-cost spline --cost " + profile);
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("--profile-cost must be fit or table, got 'spline'"));
}

TEST(WlbPlan, PlansWithMicroBatchMeasurementsAndShippedCalibrations) {
  const std::string measured =
      std::string(WLB_SOURCE_DIR) + "/docs/results/gpu/h100_layer_7b_128k_measurements.csv";
  // The layer bench's CSV, unmodified, as --cost: the fit and its held-out error in the output.
  Result r = RunPlan("--steps 5 --compare=false --cost " + measured);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cost: fitted to 288 measured micro-batches: 1.59511e-08*d^2"));
  EXPECT_THAT(r.out, HasSubstr("held out by step parity mean 0.9%, max 3.7%"));
  // The shipped calibration of the same CSV plans the same steps.
  Result named = RunPlan("--steps 5 --format json --timing=false --cost h100-flash-llama2-7b-tp8");
  Result file = RunPlan("--steps 5 --format json --timing=false --cost " + measured);
  ASSERT_EQ(named.exit_code, 0) << named.err;
  ASSERT_EQ(file.exit_code, 0) << file.err;
  nlohmann::json a = nlohmann::json::parse(named.out), b = nlohmann::json::parse(file.out);
  EXPECT_THAT(a["summary"]["cost_model"].get<std::string>(),
              HasSubstr("h100-flash-llama2-7b-tp8: fwd+bwd ms"));
  EXPECT_EQ(a["summary"]["cost_unit"], "ms");
  ASSERT_EQ(a["steps"].size(), b["steps"].size());
  for (size_t s = 0; s < a["steps"].size(); ++s) {
    for (size_t m = 0; m < a["steps"][s]["micro_batches"].size(); ++m) {
      const auto& x = a["steps"][s]["micro_batches"][m];
      const auto& y = b["steps"][s]["micro_batches"][m];
      EXPECT_EQ(x["documents"], y["documents"]);
      EXPECT_NEAR(x["cost"].get<double>(), y["cost"].get<double>(), 1e-7 * y["cost"].get<double>());
    }
  }
  // --fit-cost: the coefficients the preset ships, beside the FLOP preset's error.
  Result fit = RunPlan("--fit-cost " + measured);
  ASSERT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_THAT(fit.out, HasSubstr("288 measured micro-batches; held out by step parity"));
  EXPECT_THAT(fit.out, HasSubstr("a = 1.59510802e-08 ms per token^2"));
  EXPECT_THAT(fit.out, HasSubstr("the shipped calibration h100-flash-llama2-7b-tp8"));
  EXPECT_THAT(fit.out, HasSubstr("| micro-batch fit | 0.88% | 3.69% | 0.89% | 3.75% |"));
  EXPECT_THAT(fit.out, HasSubstr("| FLOP preset llama2-7b, best time scale"));
  Result other = RunPlan("--fit-cost " + measured + " --cost wlb-550m");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_THAT(other.out, HasSubstr("| FLOP preset wlb-550m, best time scale"));
  // Bad files and flags: one line naming the row and value.
  const std::string bad = ::testing::TempDir() + "/wlb_cli_bad_measurements.csv";
  std::ofstream(bad) << "# x\nstep,ms,lengths\n0,1.5,100;200\n1,2.5,100;x\n";
  for (const std::string& args : {"--steps 5 --cost " + bad, "--fit-cost " + bad}) {
    Result e = RunPlan(args);
    EXPECT_EQ(e.exit_code, 1) << args;
    EXPECT_THAT(e.err, HasSubstr("bad_measurements.csv:4: document length 'x' is not an integer"));
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
  }
  Result flags = RunPlan("--fit-cost " + measured + " --steps 3");
  EXPECT_EQ(flags.exit_code, 1);
  EXPECT_THAT(flags.err, HasSubstr("--fit-cost prints a fit and plans nothing: it takes only "
                                   "--cost (the FLOP preset to compare with), not --steps"));
  Result calibrated = RunPlan("--fit-cost " + measured + " --cost h100-flash-llama2-7b-tp8");
  EXPECT_EQ(calibrated.exit_code, 1);
  EXPECT_THAT(calibrated.err, HasSubstr("--fit-cost compares with a FLOP preset: --cost must be "
                                        "one of llama2-7b, llama2-13b, llama2-70b, wlb-550m"));
  Result estimate = RunPlan("--steps 5 --cost h100-flash-llama2-7b-tp8 --estimate 8,1,2,2");
  EXPECT_EQ(estimate.exit_code, 1);
  EXPECT_THAT(estimate.err, HasSubstr("--estimate needs a model shape: --cost must be a FLOP "
                                      "preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m)"));
}

TEST(WlbPlan, CpShardPlansReproduceTheArtifactsWorkedExample) {
  // Context 32, C = 2, documents 5, 19, 8 in one micro-batch (WLB-LLM-CP's example).
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"per-seq", {57, 184}}, {"per-doc", {121, 120}}};
  for (const auto& [sharding, pairs] : expected) {
    Result r = RunPlan(
        "--docs - --context 32 --micro-batches 1 --packer original --cp 2 "
        "--format json --sharding " +
            sharding,
        "5\n19\n8\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json mb = nlohmann::json::parse(r.out)["steps"][0]["micro_batches"][0];
    EXPECT_EQ(mb["sharding"], sharding);
    ASSERT_EQ(mb["shards"].size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      const nlohmann::json& shard = mb["shards"][rank];
      EXPECT_EQ(shard["rank"], rank);
      EXPECT_EQ(shard["causal_pairs"].get<int64_t>(), pairs[rank]) << sharding << " rank " << rank;
      int64_t pair_sum = 0;  // recount from the segments: keys [0, q_end) per query row
      for (const auto& seg : shard["segments"]) {
        for (int64_t q = seg["q_begin"]; q < seg["q_end"].get<int64_t>(); ++q) pair_sum += q + 1;
      }
      EXPECT_EQ(pair_sum, pairs[rank]);
      EXPECT_EQ(shard["cu_seqlens_q"].size(), shard["segments"].size() + 1);
    }
  }
  Result table = RunPlan("--steps 5 --cp 4 --sharding adaptive");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("CP imbalance (max/mean over ranks) in causal pairs"));
}

// JSON is written step by step; the bytes are exactly one dump(1) of the whole document, with and
// without shard plans, and for an input of one document.
TEST(WlbPlan, StreamedJsonIsTheWholeTreesDump) {
  for (const std::string args :
       {"--steps 6 --format json --timing=false --packer wlb-lookahead",
        "--steps 4 --format json --timing=false --cp 4 --sharding per-doc",
        "--docs - --format json --timing=false --context 32 --micro-batches 4"}) {
    Result r = RunPlan(args, args.find("--docs -") != std::string::npos ? "5\n" : "");
    ASSERT_EQ(r.exit_code, 0) << args << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(r.out, j.dump(1) + "\n") << args;
    EXPECT_FALSE(j["steps"].empty()) << args;
  }
}

// The first `steps` steps wlb-plan plans from the default distribution with --seed `seed`.
std::vector<std::vector<Document>> SampledSteps(const PackerConfig& config, int64_t steps,
                                                uint64_t seed) {
  const int64_t per_step = config.context * config.micro_batches;
  std::vector<std::vector<Document>> arrivals = *SplitIntoSteps(
      *MakeDocuments(SampleDefaultLengths(steps * per_step, seed), config.context), per_step);
  if (static_cast<int64_t>(arrivals.size()) > steps) arrivals.resize(static_cast<size_t>(steps));
  return arrivals;
}

// --estimate reports what the library's step-time model computes for the same stream.
TEST(WlbPlan, EstimateIsTheLibrarysStepTimeModel) {
  Result r = RunPlan(
      "--steps 8 --seed 5 --format json --timing=false --estimate 8,2,4,1 --sharding per-doc");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json e = nlohmann::json::parse(r.out)["summary"]["estimate"];
  EXPECT_EQ(e["tp"], 8);
  EXPECT_EQ(e["cp"], 2);
  EXPECT_EQ(e["sharding"], "per-doc");

  const PackerConfig config{
      .context = 131072, .max_tokens = DefaultMaxTokens(131072), .micro_batches = 4};
  const CostModel cost = *CostModelFromPreset("llama2-7b");
  const std::vector<std::vector<Document>> arrivals = SampledSteps(config, 8, 5);
  const StepTimeModel model = *StepTimeModel::Create(
      *MakePipelineJob(*FindTransformerShape("llama2-7b"), {.tp = 8, .cp = 2, .pp = 4, .dp = 1}));
  const auto seconds = [&](const std::string& name, ShardStrategy s) {
    auto packer = *MakePacker(name, config, cost, {.thresholds = DefaultThresholds(131072, 2)});
    const PackRun run = *RunPacker(*packer, arrivals);
    return *model.StreamSeconds(run.steps, {.candidates = {s}});
  };
  const double wlb = seconds("wlb", ShardStrategy("per-doc"));
  const double plain = seconds("original", ShardStrategy("per-seq"));
  EXPECT_NEAR(e["seconds"].get<double>(), wlb, 1e-9 * wlb);
  EXPECT_NEAR(e["baseline_seconds"].get<double>(), plain, 1e-9 * plain);
  EXPECT_NEAR(e["speedup"].get<double>(), plain / wlb, 1e-9);

  Result table = RunPlan("--steps 4 --estimate 8,2,4,1");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("estimated speedup over Plain-4D"));
}

// --dp-assign sums the library's DP assignment (and round-robin) over the planned steps.
TEST(WlbPlan, DpAssignIsTheLibrarysAssignment) {
  Result r = RunPlan(
      "--steps 6 --seed 5 --micro-batches 8 --format json --timing=false --estimate 8,2,4,2 "
      "--dp-assign");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json e = nlohmann::json::parse(r.out)["summary"]["estimate"]["dp_assign"];
  const PackerConfig config{
      .context = 131072, .max_tokens = DefaultMaxTokens(131072), .micro_batches = 8};
  const std::vector<std::vector<Document>> arrivals = SampledSteps(config, 6, 5);
  const StepTimeModel model = *StepTimeModel::Create(
      *MakePipelineJob(*FindTransformerShape("llama2-7b"), {.tp = 8, .cp = 2, .pp = 4, .dp = 2}));
  auto packer = *MakePacker("wlb", config, *CostModelFromPreset("llama2-7b"),
                            {.thresholds = DefaultThresholds(131072, 2)});
  const PackRun run = *RunPacker(*packer, arrivals);
  double assigned = 0.0, round_robin = 0.0;
  for (const StepPlan& step : run.steps) {
    const DpAssignment a = *AssignStepDpRanks(model, step, {});
    assigned += a.step_seconds;
    round_robin += a.round_robin_seconds;
  }
  EXPECT_NEAR(e["seconds"].get<double>(), assigned, 1e-9 * assigned);
  EXPECT_NEAR(e["round_robin_seconds"].get<double>(), round_robin, 1e-9 * round_robin);
  EXPECT_LE(assigned, round_robin);
  Result table = RunPlan("--steps 4 --micro-batches 8 --estimate 8,2,4,2 --dp-assign");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("DP assignment by the 1F1B model (--dp-assign)"));
}

TEST(WlbPlan, NewerFlagsRunWhenTheyApply) {
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"--packer wlb-lookahead --lookahead 2 --steps 6", "packer wlb-lookahead"},
      {"--packer original-nextfit --steps 6 --compare=false", "packer original-nextfit"},
      {"--distribution heavy-tail --steps 6 --compare=false", "embedded heavy-tail distribution"},
      {"--steps 4 --estimate 8,2,4,1 --sharding per-seq-ordered --gemm-tflops 400 --compare=false",
       "with per-seq-ordered CP"},
      {"--steps 3 --cp 4 --sharding te-zigzag --compare=false", "(12 te-zigzag, 0 doc-degree"},
      {"--steps 3 --cost llama2-7b-swa4k --cp 4 --sharding doc-degree --compare=false",
       "masks window:4096x27,causalx5"},
      {"--steps 3 --cp 4 --sharding doc-degree --cp-link-gbps 25 --compare=false",
       "--sharding doc-degree"},
  };
  for (const auto& [args, want] : runs) {
    Result r = RunPlan(args);
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr(want)) << args;
  }
}

struct BadCase {
  std::string args;
  std::string stdin_text;
  std::string message;
};

TEST(WlbPlan, BadInputExitsNonZeroWithOneLineNamingTheProblem) {
  const std::vector<BadCase> cases = {
      {"--docs -", "5\n-3\n", "<stdin>:2: '-3' is not a positive integer"},
      {"--docs -", "5\n0\n", "<stdin>:2: '0'"},
      {"--docs -", "5\nabc\n", "'abc'"},
      {"--micro-batches 0", "", "(N) must be in [1, 4096], got 0"},
      {"--max-tokens 1000", "", "S_max) 1000 is below the context window (S) 131072"},
      {"--cost gpt-9", "", "'gpt-9'"},
      {"--packer best-fit", "", "unknown packer 'best-fit'"},
      {"--docs /nonexistent/lengths.txt", "",
       "cannot open lengths file '/nonexistent/lengths.txt'"},
      {"--thresholds 9,x", "", "'x' is not an integer"},
      {"--thresholds 70000,60000", "", "strictly increasing"},
      {"--format yaml", "", "'yaml'"},
      {"--window 0 --packer fixed-greedy", "", "got 0"},
      {"--cp 0", "", "--cp must be a context-parallel size in [1, 4096]"},
      // Limits: each of these used to crash, hang, overflow or plan nothing with exit 0.
      {"--context 4611686018427387904 --thresholds none", "",
       "context window (S) must be in [1, 16777216] tokens, got 4611686018427387904"},
      {"--context 2305843009213693952", "", "got 2305843009213693952"},
      {"--context 9223372036854775807", "", "got 9223372036854775807"},
      {"--micro-batches 2147483647", "", "(N) must be in [1, 4096], got 2147483647"},
      {"--packer fixed-greedy --window 2147483647", "", "window must be in [1, 4096] steps"},
      {"--packer fixed-greedy --window 4096 --micro-batches 32", "", "over the limit of 65536"},
      {"--steps 100000000000000000", "", "--steps must be in [0, 1048576]"},
      {"--steps 1000000", "", "at most 65536 steps at this S and N"},
      {"--cp 4097", "", "in [1, 4096]"},
      {"--docs -", "9223372036854775807\n", "above the limit of 34359738368 tokens"},
      {"--docs -", std::string(100000, '[') + std::string(100000, ']'), "a nested array"},
      {"--docs -", "", "<stdin> holds no document lengths"},
      {"--docs /tmp", "", "lengths file '/tmp' is a directory"},
      // Messages: what S is too small for, flags a run does not use, unknown flags, positionals.
      {"--context 3", "", "--context 3 is too small for 2 default outlier queues"},
      {"--packer original --thresholds 5,3 --format json", "",
       "--thresholds is not used by this run"},
      {"--packer original --thresholds 5,3", "",
       "--thresholds (used by the table's wlb comparison row): outlier thresholds must be"},
      {"--packer wlb --window 3", "", "--window is not used by this run"},
      {"--sharding per-doc", "", "--sharding is not used by this run"},
      {"--thresholds none --queues 3", "", "give one of them"},
      {"--docs - --seed 3", "5\n", "--seed is not used by this run"},
      {"--steps 1 --steps 2", "", "--steps is given more than once"},
      {"--contxt 5", "", "unknown flag '--contxt'"},
      {"--context abc", "", "--context: 'abc' is not an integer"},
      {"--context", "", "--context needs a value"},
      {"stray.txt", "", "unexpected argument 'stray.txt'"},
      {"--packer " + std::string(20000, 'x'), "", "(20000 bytes in all)"},
      {"--docs -", "5\n" + std::string(1 << 20, '7') + "x\n", "(1048577 bytes in all)"},
      {"--cp 2 --sharding zigzag", "", "'zigzag'"},
      {"--cost llama2-7b-swa4k --profile-cost table", "", "--profile-cost is not used by this run"},
      {"--cost llama2-7b-swa4k --estimate 8,2,4,1", "", "--cost must be a FLOP preset"},
      {"--cp 2 --sharding per-doc --cp-link-gbps 100", "",
       "--cp-link-gbps is not used by this run: it applies to --cp with --sharding adaptive, "
       "doc-degree or balanced-chunks"},
      {"--cp-link-gbps 100", "", "--cp-link-gbps is not used by this run"},
      {"--cp 2 --sharding doc-degree --cp-link-gbps 0", "", "must be in (0, 1e6] GB/s, got 0"},
      {"--cp 2 --sharding doc-degree --cp-link-gbps nan", "", "got nan"},
      {"--cp 2 --kernel-profile /nonexistent/k.csv", "", "/nonexistent/k.csv"},
      {"--estimate 8,2,4", "", "'8,2,4' must be four integers TP,CP,PP,DP"},
      {"--estimate 8,2,4,x", "", "'x' is not an integer"},
      {"--estimate 8,2,4,2", "", "needs --micro-batches = PP x DP = 8, got 4"},
      {"--estimate 8,2,4,1 --cp 4", "", "--cp 4 differs from the CP size 2"},
      {"--dp-assign", "", "--dp-assign is not used by this run"},
      {"--estimate 64,2,4,1", "", "TP must be in [1, heads = 32]"},
      {"--estimate 8,2,4,1 --gemm-tflops 0", "", "--gemm-tflops must be in [0.001, 1000000]"},
      {"--estimate 8,2,4,1 --gemm-tflops 1e-304", "", "got 1e-304"},
      // Main's newer flags follow the same rules: limits, and no flag the run would not use.
      {"--estimate 8,2,4,1 --gemm-tflops 1e308", "", "got 1e+308"},
      {"--estimate 8,2,4,4097", "", "'4097' is not an integer in [1, 4096]"},
      {"--estimate " + std::string(100, '9'), "", "(100 bytes in all)"},
      {"--estimate 8,2,4,1 --cost /nonexistent/profile.csv", "",
       "--estimate needs a model shape: --cost must be a FLOP preset"},
      {"--gemm-tflops 400", "", "--gemm-tflops is not used by this run"},
      {"--lookahead 2", "", "--lookahead is not used by this run"},
      {"--packer wlb-lookahead --lookahead 9", "", "look-ahead must be in [0, 8] steps, got 9"},
      {"--packer wlb-lookahead --lookahead -1", "", "got -1"},
      {"--packer original --tune", "", "--tune is not used by this run"},
      {"--packer wlb-refine --delay-budget 0.5", "",
       "--delay-budget is not used by this run: only wlb-lookahead and --tune read it, and the "
       "packer is 'wlb-refine'"},
      {"--packer wlb-lookahead --delay-budget -1", "", "--delay-budget must be a finite number"},
      {"--docs - --distribution heavy-tail", "5\n", "--distribution is not used by this run"},
      {"--distribution zipf", "",
       "--distribution must be one of default, heavy-tail, rare-long, bimodal, pile-like, "
       "prolong-like, got 'zipf'"},
      {"--kernel-profile /nonexistent/k.csv", "", "--kernel-profile is not used by this run"},
  };
  for (const BadCase& c : cases) {
    Result r = RunPlan(c.args, c.stdin_text);
    EXPECT_EQ(r.exit_code, 1) << c.args;
    EXPECT_THAT(r.err, ::testing::StartsWith("wlb-plan: error: ")) << c.args;
    EXPECT_LT(r.err.size(), 600u) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

TEST(WlbPlan, OutWritesThroughSpecialFilesAndFollowsSymlinks) {
  const std::string dir = ::testing::TempDir() + "/wlb_out_special";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A symlink stays a symlink; its target gets the output.
  const std::string target = dir + "/target.json", link = dir + "/link.json";
  std::ofstream(target) << "old";
  std::filesystem::create_symlink(target, link);
  Result r = RunPlan("--steps 2 --format json --timing=false --out " + link);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(Slurp(target), RunPlan("--steps 2 --format json --timing=false").out);
  // A FIFO stays a FIFO and its reader gets the output.
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string got = dir + "/from_fifo";
  const std::string reader = "cat " + fifo + " > " + got + " &";
  ASSERT_EQ(std::system(reader.c_str()), 0);
  r = RunPlan("--steps 2 --format json --timing=false --out " + fifo);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  for (int i = 0; i < 100 && Slurp(got).size() < 10; ++i) {
    std::system("sleep 0.05");
  }
  EXPECT_THAT(Slurp(got), HasSubstr("\"steps\""));
  // /dev/stdout is written through (it used to be replaced via /dev/stdout.tmp, which fails for
  // a user who cannot write /dev).
  r = RunPlan("--steps 2 --format json --timing=false --out /dev/stdout");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"steps\""));
  EXPECT_FALSE(std::filesystem::exists("/dev/stdout.tmp"));
  // A directory is an error, and nothing is written.
  r = RunPlan("--steps 2 --out " + dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("it is a directory"));
  std::filesystem::remove_all(dir);
}

TEST(WlbPlan, OutNeverDestroysInputsOrPlantedFilesAndStdoutFailuresAreErrors) {
  const std::string dir = ::testing::TempDir() + "/wlb_out_safety";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // --out naming an input (directly or through another path to it) is refused; the input stays.
  const std::string docs = dir + "/docs.txt";
  std::ofstream(docs) << "5\n7\n9\n";
  Result r = RunPlan("--docs " + docs + " --out " + docs);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("same file as --docs"));
  r = RunPlan("--docs " + docs + " --out " + dir + "/../wlb_out_safety/docs.txt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(Slurp(docs), "5\n7\n9\n");
  // A symlink planted where a fixed temporary name would be is neither followed nor removed.
  const std::string victim = dir + "/victim", out = dir + "/plan.json";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, out + ".tmp");
  r = RunPlan("--steps 2 --format json --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(out + ".tmp"));
  EXPECT_THAT(Slurp(out), HasSubstr("\"steps\""));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".wlb-"), std::string::npos) << "temporary left behind";
  }
  // The output gets the usual permissions, not mkstemp's 0600.
  const auto perms = std::filesystem::status(out).permissions();
  EXPECT_NE(perms & std::filesystem::perms::others_read, std::filesystem::perms::none);
  // Output that cannot be written is an error (rc 1), never a silent success.
  for (const std::string redirect : {">/dev/full", ">&-"}) {
    const std::string cmd =
        std::string(WLB_PLAN_BINARY) + " --steps 2 " + redirect + " 2>" + dir + "/err";
    const int status = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 1) << redirect;
    EXPECT_THAT(Slurp(dir + "/err"), HasSubstr("cannot write the output to stdout")) << redirect;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace wlb_plan_cli_test
}  // namespace wlb
