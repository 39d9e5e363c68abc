// Tests of include/wlb/io/plan_json.hpp: the JSON form of packing plans and its writer.
#include "wlb/io/plan_json.hpp"

#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/core/steps.hpp"
#include "wlb/pack/make_packer.hpp"
#include "wlb/pack/stream.hpp"

namespace wlb {
namespace plan_json_test {

const CostModel kSquares{.attn_quadratic = 1.0, .unit = "tokens^2"};

std::set<std::string> Keys(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  return keys;
}

MicroBatch Mb(std::vector<Document> docs) {
  MicroBatch mb;
  for (const Document& d : docs) {
    mb.documents.push_back(d);
    mb.tokens += d.length;
    mb.cost += kSquares(d.length);
  }
  return mb;
}

// Two micro-batches: {3, 1} (cost 9 + 1 = 10) and {2} (cost 4). Mean 7.
StepPlan HandStep() {
  StepPlan s;
  s.step = 5;
  s.drain = true;
  s.partial = false;
  s.held_back_documents = 2;
  s.held_back_tokens = 11;
  s.micro_batches.push_back(
      Mb({{.id = 7, .length = 3, .piece = 1, .offset = 8, .arrival_step = 4},
          {.id = 9, .length = 1, .piece = 0, .offset = 0, .arrival_step = 5}}));
  s.micro_batches.push_back(Mb({{.id = 10, .length = 2, .arrival_step = 3}}));
  return s;
}

TEST(DocumentToJson, HoldsEveryFieldOfTheDocument) {
  const Document d{.id = 12, .length = 300, .piece = 2, .offset = 600, .arrival_step = 9};
  const nlohmann::json j = DocumentToJson(d);
  EXPECT_EQ(Keys(j), (std::set<std::string>{"id", "length", "piece", "offset", "arrival_step"}));
  EXPECT_EQ(j.at("id"), 12);
  EXPECT_EQ(j.at("length"), 300);
  EXPECT_EQ(j.at("piece"), 2);
  EXPECT_EQ(j.at("offset"), 600);
  EXPECT_EQ(j.at("arrival_step"), 9);
}

TEST(StepToJson, FieldsAndHandComputedBalance) {
  const nlohmann::json j = StepToJson(HandStep(), kSquares);
  EXPECT_EQ(Keys(j),
            (std::set<std::string>{"step", "drain", "partial", "micro_batches", "imbalance",
                                   "lower_bound", "held_back_documents", "held_back_tokens"}));
  EXPECT_EQ(j.at("step"), 5);
  EXPECT_EQ(j.at("drain"), true);
  EXPECT_EQ(j.at("partial"), false);
  EXPECT_EQ(j.at("held_back_documents"), 2);
  EXPECT_EQ(j.at("held_back_tokens"), 11);
  EXPECT_DOUBLE_EQ(j.at("imbalance").get<double>(), 10.0 / 7.0);
  EXPECT_DOUBLE_EQ(j.at("lower_bound").get<double>(), 9.0 / 7.0);  // the document of cost 9
  const nlohmann::json& mbs = j.at("micro_batches");
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(Keys(mbs[0]), (std::set<std::string>{"documents", "tokens", "cost"}));
  EXPECT_EQ(mbs[0].at("tokens"), 4);
  EXPECT_DOUBLE_EQ(mbs[0].at("cost").get<double>(), 10.0);
  ASSERT_EQ(mbs[0].at("documents").size(), 2u);
  EXPECT_EQ(mbs[0].at("documents")[0].at("id"), 7);
  EXPECT_EQ(mbs[0].at("documents")[0].at("offset"), 8);
  EXPECT_EQ(mbs[1].at("documents")[0].at("arrival_step"), 3);
}

TEST(StepToJson, CapLowerBoundAppearsOnlyWithACap) {
  const StepPlan s = HandStep();
  EXPECT_FALSE(StepToJson(s, kSquares).contains("cap_lower_bound"));
  EXPECT_FALSE(StepToJson(s, kSquares, 0).contains("cap_lower_bound"));
  const nlohmann::json j = StepToJson(s, kSquares, 4);
  ASSERT_TRUE(j.contains("cap_lower_bound"));
  EXPECT_DOUBLE_EQ(j.at("cap_lower_bound").get<double>(),
                   CapLowerBound(s.micro_batches, kSquares, 4));
  EXPECT_GE(j.at("cap_lower_bound").get<double>(), j.at("lower_bound").get<double>());
}

TEST(PlanToJson, StepsInOrderAndPendingDocuments) {
  StepPlan a = HandStep();
  a.step = 0;
  StepPlan b = HandStep();
  b.step = 1;
  const std::vector<StepPlan> steps = {a, b};
  const std::vector<Document> pending = {{.id = 3, .length = 4, .arrival_step = 1}};
  const nlohmann::json j = PlanToJson(steps, pending, kSquares);
  EXPECT_EQ(Keys(j), (std::set<std::string>{"steps", "pending"}));
  ASSERT_EQ(j.at("steps").size(), 2u);
  EXPECT_EQ(j.at("steps")[0].at("step"), 0);
  EXPECT_EQ(j.at("steps")[1].at("step"), 1);
  ASSERT_EQ(j.at("pending").size(), 1u);
  EXPECT_EQ(j.at("pending")[0], DocumentToJson(pending[0]));
  const nlohmann::json empty = PlanToJson({}, {}, kSquares);
  EXPECT_TRUE(empty.at("steps").is_array() && empty.at("steps").empty());
  EXPECT_TRUE(empty.at("pending").is_array() && empty.at("pending").empty());
}

TEST(PlanToJson, APackedStreamRoundTripsThroughItsText) {
  const PackerConfig config{.context = 64, .max_tokens = 80, .micro_batches = 2};
  auto packer = MakePacker("wlb", config, kSquares, {.thresholds = {32}});
  ASSERT_TRUE(packer.ok()) << packer.status();
  std::vector<int64_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(1 + (i * 37) % 90);
  auto pieces = MakeDocuments(lengths, config.context);
  ASSERT_TRUE(pieces.ok());
  auto arrivals = SplitIntoSteps(*pieces, config.context * config.micro_batches);
  ASSERT_TRUE(arrivals.ok());
  auto run = RunPacker(**packer, *arrivals, /*flush=*/false);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<Document> pending = (*packer)->Pending();
  const nlohmann::json j = PlanToJson(run->steps, pending, kSquares, config.max_tokens);
  const nlohmann::json parsed = nlohmann::json::parse(j.dump());
  EXPECT_EQ(parsed, j);
  // Every document of the plan, and of pending, is in the JSON in order.
  ASSERT_EQ(parsed.at("steps").size(), run->steps.size());
  int64_t tokens = 0;
  for (size_t s = 0; s < run->steps.size(); ++s) {
    const auto& mbs = run->steps[s].micro_batches;
    ASSERT_EQ(parsed.at("steps")[s].at("micro_batches").size(), mbs.size());
    for (size_t m = 0; m < mbs.size(); ++m) {
      const nlohmann::json& docs = parsed.at("steps")[s].at("micro_batches")[m].at("documents");
      ASSERT_EQ(docs.size(), mbs[m].documents.size());
      for (size_t k = 0; k < docs.size(); ++k) {
        const Document& d = mbs[m].documents[k];
        EXPECT_EQ(docs[k].at("id").get<int64_t>(), d.id);
        EXPECT_EQ(docs[k].at("length").get<int64_t>(), d.length);
        EXPECT_EQ(docs[k].at("offset").get<int64_t>(), d.offset);
        tokens += docs[k].at("length").get<int64_t>();
      }
    }
  }
  ASSERT_EQ(parsed.at("pending").size(), pending.size());
  for (const nlohmann::json& d : parsed.at("pending")) tokens += d.at("length").get<int64_t>();
  int64_t input = 0;
  for (int64_t l : lengths) input += l;
  EXPECT_EQ(tokens, input);
}

TEST(SummaryToJson, HoldsEverySummaryField) {
  StreamSummary s;
  s.steps = 10;
  s.drain_steps = 2;
  s.partial_steps = 1;
  s.partial_imbalance_max = 3.5;
  s.imbalance_mean = 1.25;
  s.imbalance_p90 = 1.5;
  s.imbalance_p99 = 1.625;
  s.imbalance_max = 1.75;
  s.lower_bound_mean = 1.0625;
  s.cap_lower_bound_mean = 1.125;
  s.delay = {.mean = 0.5, .p99 = 2.0, .max = 3.0};
  const nlohmann::json j = SummaryToJson(s);
  EXPECT_EQ(j, nlohmann::json({{"steps", 10},
                               {"drain_steps", 2},
                               {"partial_steps", 1},
                               {"partial_imbalance_max", 3.5},
                               {"imbalance_mean", 1.25},
                               {"imbalance_p90", 1.5},
                               {"imbalance_p99", 1.625},
                               {"imbalance_max", 1.75},
                               {"lower_bound_mean", 1.0625},
                               {"cap_lower_bound_mean", 1.125},
                               {"delay_mean", 0.5},
                               {"delay_p99", 2.0},
                               {"delay_max", 3.0}}));
}

// The writer's text of a whole run (pending, steps, summary) into `text`.
absl::Status WriteRun(PlanJsonWriter& writer, std::span<const StepPlan> steps,
                      std::span<const Document> pending, const nlohmann::json& summary) {
  absl::Status s = writer.Pending(pending);
  for (size_t i = 0; s.ok() && i < steps.size(); ++i) s = writer.Step(steps[i]);
  return s.ok() ? writer.Summary(summary) : s;
}

PlanJsonWriter::Sink AppendTo(std::string& text) {
  return [&text](std::string_view piece) {
    text.append(piece);
    return absl::OkStatus();
  };
}

// The writer's text is the dump(1) of PlanToJson's tree with the summary, byte for byte: an empty
// run, and seeded random runs (with documents still pending) with and without S_max.
TEST(PlanJsonWriter, TextIsTheDumpOfPlanToJsonWithTheSummary) {
  std::string text;
  PlanJsonWriter empty(AppendTo(text), kSquares);
  ASSERT_TRUE(WriteRun(empty, {}, {}, SummaryToJson(StreamSummary{})).ok());
  nlohmann::json expected = PlanToJson({}, {}, kSquares);
  expected["summary"] = SummaryToJson(StreamSummary{});
  EXPECT_EQ(text, expected.dump(1) + "\n");
  EXPECT_EQ(nlohmann::json::parse(text), expected);

  std::mt19937_64 rng(50);
  for (int i = 0; i < 60; ++i) {
    const testing::PackingCase c =
        testing::RandomPackingCase(rng, i, {.max_context = 256, .max_docs = 40});
    auto packer = MakePacker(i % 2 == 0 ? "wlb" : "wlb-lookahead", c.config, kSquares, {});
    ASSERT_TRUE(packer.ok()) << packer.status();
    auto run = RunPacker(**packer, c.arrivals, /*flush=*/i % 3 != 0);
    ASSERT_TRUE(run.ok()) << run.status();
    const std::vector<Document> pending = (*packer)->Pending();
    const int64_t max_tokens = i % 4 == 0 ? 0 : c.config.max_tokens;
    const nlohmann::json summary = SummaryToJson(Summarize(run->steps, kSquares, max_tokens));
    text.clear();
    PlanJsonWriter writer(AppendTo(text), kSquares, max_tokens);
    ASSERT_TRUE(WriteRun(writer, run->steps, pending, summary).ok());
    expected = PlanToJson(run->steps, pending, kSquares, max_tokens);
    EXPECT_EQ(expected.at("steps").empty(), run->steps.empty());
    for (const nlohmann::json& step : expected.at("steps")) {
      EXPECT_EQ(step.contains("cap_lower_bound"), max_tokens > 0) << "case " << i;
    }
    expected["summary"] = summary;
    ASSERT_EQ(text, expected.dump(1) + "\n") << "case " << i;
    EXPECT_EQ(nlohmann::json::parse(text), expected) << "case " << i;
  }
}

// The hook's keys land in the step (and its micro-batches) in the text as in the tree; a hook's
// error stops that step, which is not written.
TEST(PlanJsonWriter, StepHookAddsKeysAndItsErrorsPropagate) {
  const PlanJsonWriter::StepHook hook = [](const StepPlan& step, nlohmann::json& j) {
    if (step.step == 7) return absl::InvalidArgumentError("no shard plan for step 7");
    for (size_t m = 0; m < step.micro_batches.size(); ++m) j["micro_batches"][m]["rank"] = m;
    j["extra"] = {{"step_again", step.step}};
    return absl::OkStatus();
  };
  StepPlan a = HandStep(), b = HandStep();
  a.step = 0;
  b.step = 1;
  const std::vector<StepPlan> steps = {a, b};
  std::string text;
  PlanJsonWriter writer(AppendTo(text), kSquares, 4, hook);
  ASSERT_TRUE(WriteRun(writer, steps, {}, {{"packer", "hand"}}).ok());
  nlohmann::json tree;
  PlanJsonWriter tree_writer(&tree, kSquares, 4, hook);
  ASSERT_TRUE(WriteRun(tree_writer, steps, {}, {{"packer", "hand"}}).ok());
  EXPECT_EQ(text, tree.dump(1) + "\n");
  const nlohmann::json parsed = nlohmann::json::parse(text);
  EXPECT_EQ(parsed.at("steps")[1].at("extra").at("step_again"), 1);
  EXPECT_EQ(parsed.at("steps")[1].at("micro_batches")[1].at("rank"), 1);
  EXPECT_EQ(parsed.at("summary").at("packer"), "hand");

  text.clear();
  PlanJsonWriter failing(AppendTo(text), kSquares, 0, hook);
  ASSERT_TRUE(failing.Pending({}).ok());
  const std::string before = text;
  StepPlan seven = HandStep();
  seven.step = 7;
  const absl::Status s = failing.Step(seven);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("no shard plan for step 7"));
  EXPECT_EQ(text, before);
}

// A sink's failure is the writer's: the call returns it, and every later call returns it too
// without writing on (no document is continued past a lost piece).
TEST(PlanJsonWriter, SinkFailurePropagatesAndStopsTheWriter) {
  int writes = 0;
  PlanJsonWriter writer(
      [&writes](std::string_view) {
        return ++writes == 2 ? absl::UnavailableError("cannot write plan.json: disk full")
                             : absl::OkStatus();
      },
      kSquares);
  ASSERT_TRUE(writer.Pending({}).ok());
  const absl::Status s = writer.Step(HandStep());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("plan.json: disk full"));
  EXPECT_EQ(writer.Step(HandStep()), s);
  EXPECT_EQ(writer.Summary(nlohmann::json::object()), s);
  EXPECT_EQ(writes, 2);
}

// Pending, then each Step, then Summary: any other order is an error naming the call.
TEST(PlanJsonWriter, CallsOutOfOrderAreErrors) {
  std::string text;
  PlanJsonWriter writer(AppendTo(text), kSquares);
  absl::Status s = writer.Step(HandStep());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("PlanJsonWriter::Step out of order"));
  EXPECT_THAT(writer.Summary(nlohmann::json::object()).message(),
              ::testing::HasSubstr("Summary out of order"));
  EXPECT_TRUE(text.empty());
  ASSERT_TRUE(writer.Pending({}).ok());
  EXPECT_THAT(writer.Pending({}).message(), ::testing::HasSubstr("Pending out of order"));
  ASSERT_TRUE(writer.Summary(nlohmann::json::object()).ok());
  EXPECT_THAT(writer.Step(HandStep()).message(), ::testing::HasSubstr("Step out of order"));
  EXPECT_EQ(nlohmann::json::parse(text), nlohmann::json({{"pending", nlohmann::json::array()},
                                                         {"steps", nlohmann::json::array()},
                                                         {"summary", nlohmann::json::object()}}));
}

}  // namespace plan_json_test
}  // namespace wlb
