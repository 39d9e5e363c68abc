// Unit tests of each packer on small hand-made streams.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"
#include "wlb/pack/make_packer.hpp"

namespace wlb {
namespace {

using ::testing::HasSubstr;

CostModel Quadratic() { return CostModel{.attn_quadratic = 1.0, .unit = "tokens^2"}; }

std::vector<Document> Docs(std::vector<int64_t> lengths, int64_t context) {
  return *MakeDocuments(lengths, context);
}

std::vector<int64_t> Lengths(const MicroBatch& mb) {
  std::vector<int64_t> out;
  for (const Document& d : mb.documents) out.push_back(d.length);
  return out;
}

TEST(OriginalPacker, NextFitKeepsDocumentsWhole) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 2};
  auto packer = *MakePacker("original-nextfit", config, Quadratic(), {});
  EXPECT_EQ(packer->name(), "original-nextfit");
  // 7, 8, 2, 9 (26 tokens >= 2 x 10): [7], then 8 + 2 = 10; 9 waits for the next step.
  auto steps = *packer->Push(Docs({7, 8, 2, 9}, 10));
  ASSERT_EQ(steps.size(), 1u);
  const auto& mbs = steps[0].micro_batches;
  EXPECT_THAT(Lengths(mbs[0]), ::testing::ElementsAre(7));
  EXPECT_THAT(Lengths(mbs[1]), ::testing::ElementsAre(8, 2));
  EXPECT_EQ(mbs[1].documents[0].piece, 0);
  ASSERT_EQ(packer->Pending().size(), 1u);
  EXPECT_EQ(packer->Pending()[0].length, 9);
  auto drained = packer->Flush();
  ASSERT_EQ(drained.size(), 1u);
  EXPECT_THAT(Lengths(drained[0].micro_batches[0]), ::testing::ElementsAre(9));
  EXPECT_TRUE(drained[0].micro_batches[1].documents.empty());
}

TEST(OriginalPacker, CutsTheStreamIntoSequencesOfExactlyS) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 2};
  auto packer = *MakePacker("original", config, Quadratic(), {});
  // 7 + 8 + 9 = 24 tokens: one step of 2 x 10, 4 tokens left.
  auto steps = *packer->Push(Docs({7, 8, 9}, 10));
  ASSERT_EQ(steps.size(), 1u);
  const auto& mbs = steps[0].micro_batches;
  EXPECT_THAT(Lengths(mbs[0]), ::testing::ElementsAre(7, 3));
  EXPECT_THAT(Lengths(mbs[1]), ::testing::ElementsAre(5, 5));
  // Document 1 was cut: parts numbered in emission order, offsets contiguous.
  EXPECT_EQ(mbs[0].documents[1].piece, 0);
  EXPECT_EQ(mbs[1].documents[0].piece, 1);
  EXPECT_EQ(mbs[1].documents[0].offset, 3);
  EXPECT_EQ(mbs[1].documents[1].id, 2);
  EXPECT_EQ(packer->Pending().size(), 1u);
  EXPECT_EQ(packer->Pending()[0].length, 4);
  EXPECT_EQ(packer->Pending()[0].offset, 5);
  auto drained = packer->Flush();
  ASSERT_EQ(drained.size(), 1u);
  EXPECT_TRUE(drained[0].drain);
  EXPECT_EQ(drained[0].micro_batches[0].documents[0].piece, 1);
  EXPECT_TRUE(packer->Pending().empty());
}

TEST(FixedGreedyPacker, PlacesLongestFirstOnTheLeastAttentionCostUnderS) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 2};
  auto packer = *MakePacker("fixed-greedy", config, Quadratic(), {.window = 1});
  auto steps = *packer->Push(Docs({2, 9, 3, 5}, 10));
  ASSERT_EQ(steps.size(), 1u);
  // 9 -> mb0 (81), 5 -> mb1 (25), 3 -> mb1 (34), 2 -> mb1 (38; mb0 has no room).
  EXPECT_THAT(Lengths(steps[0].micro_batches[0]), ::testing::ElementsAre(9));
  EXPECT_THAT(Lengths(steps[0].micro_batches[1]), ::testing::ElementsAre(5, 3, 2));
  EXPECT_TRUE(packer->Pending().empty());
}

TEST(FixedGreedyPacker, WindowEmitsWStepsEveryWPushes) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 2};
  auto packer = *MakePacker("fixed-greedy", config, Quadratic(), {.window = 3});
  EXPECT_TRUE(packer->Push(Docs({4, 4}, 10))->empty());
  EXPECT_TRUE(packer->Push(Docs({4, 4}, 10))->empty());
  auto steps = *packer->Push(Docs({4, 4}, 10));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].step, 0);
  EXPECT_EQ(steps[2].step, 2);
}

TEST(FixedGreedyPacker, CarriesWhatDoesNotFit) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 1};
  auto packer = *MakePacker("fixed-greedy", config, Quadratic(), {.window = 1});
  auto steps = *packer->Push(Docs({6, 6}, 10));
  EXPECT_EQ(steps[0].micro_batches[0].tokens, 6);
  ASSERT_EQ(packer->Pending().size(), 1u);
  EXPECT_EQ(steps[0].held_back_documents, 1);
  EXPECT_EQ(packer->Flush().size(), 1u);
}

TEST(WlbPacker, OutlierQueueReleasesNOnlyWhenFull) {
  PackerConfig config{.context = 100, .max_tokens = 150, .micro_batches = 2};
  auto packer = *MakePacker("wlb", config, Quadratic(), {.thresholds = {50}});
  // One outlier (80) waits; the short ones are packed.
  auto s0 = *packer->Push(Docs({80, 10, 10}, 100));
  EXPECT_EQ(s0[0].micro_batches[0].tokens + s0[0].micro_batches[1].tokens, 20);
  ASSERT_EQ(packer->Pending().size(), 1u);
  EXPECT_EQ(packer->Pending()[0].length, 80);
  // A second outlier fills the queue: both are released, one per micro-batch.
  auto s1 = *packer->Push(Docs({70, 5}, 100));
  const auto& mbs = s1[0].micro_batches;
  EXPECT_TRUE(packer->Pending().empty());
  EXPECT_EQ(mbs[0].documents.front().length + mbs[1].documents.front().length, 150);
  EXPECT_NE(mbs[0].documents.front().length, mbs[1].documents.front().length);
  // The 5-token document joins the lighter micro-batch (70^2 < 80^2).
  const MicroBatch& light = mbs[0].documents.front().length == 70 ? mbs[0] : mbs[1];
  EXPECT_EQ(light.tokens, 75);
  // The outlier that waited has a token delay of one step.
  for (const MicroBatch& mb : mbs) {
    for (const Document& d : mb.documents) {
      if (d.length == 80) EXPECT_EQ(s1[0].step - d.arrival_step, 1);
    }
  }
}

TEST(WlbPacker, FallsBackToFewestTokensThenCarriesUnderTheCap) {
  PackerConfig config{.context = 10, .max_tokens = 12, .micro_batches = 2};
  auto packer = *MakePacker("wlb", config, Quadratic(), {});
  // 10 -> mb0, 9 -> mb1, 3 -> mb1 (least cost, 12 tokens fit); 2: least cost mb1 (90) is full,
  // so the fewest-tokens mb0 takes it (12); 1: fits nowhere under 12 -> carried.
  auto steps = *packer->Push(Docs({10, 9, 3, 2, 1}, 10));
  EXPECT_EQ(steps[0].micro_batches[0].tokens, 12);
  EXPECT_EQ(steps[0].micro_batches[1].tokens, 12);
  ASSERT_EQ(packer->Pending().size(), 1u);
  EXPECT_EQ(packer->Pending()[0].length, 1);
}

TEST(WlbRefine, NeverWorseAndFixesAGreedyMistake) {
  // Costs are squares; {7,5} = 74 against {6,2} = 40 needs a swap to reach the optimum.
  std::vector<MicroBatch> mbs(2);
  auto add = [](MicroBatch& mb, int64_t len) {
    mb.documents.push_back({.id = len, .length = len});
    mb.tokens += len;
    mb.cost += static_cast<double>(len * len);
  };
  add(mbs[0], 7);
  add(mbs[0], 5);  // 74
  add(mbs[1], 6);
  add(mbs[1], 2);  // 40
  const CostModel cost = Quadratic();
  RefineMicroBatches(mbs, 100, cost, 16);
  const double heavy = std::max(mbs[0].cost, mbs[1].cost);
  // Best split of {7,6,5,2}: {7,2}=53 / {6,5}=61 -> 61.
  EXPECT_DOUBLE_EQ(heavy, 61);
  EXPECT_EQ(mbs[0].tokens + mbs[1].tokens, 20);
}

TEST(WlbRefine, RespectsTheTokenCap) {
  std::vector<MicroBatch> mbs(2);
  mbs[0].documents = {{.id = 0, .length = 9}, {.id = 1, .length = 1}};
  mbs[0].tokens = 10;
  mbs[0].cost = 82;
  mbs[1].documents = {{.id = 2, .length = 10}};
  mbs[1].tokens = 10;
  mbs[1].cost = 10;  // cheap per token on purpose: moving anything breaks the cap of 10
  EXPECT_EQ(RefineMicroBatches(mbs, 10, Quadratic(), 16), 0);
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
              HasSubstr("window must be >= 1 step, got 0"));
  EXPECT_THAT(MakePacker("wlb", {}, cost, {.thresholds = {100, 50}}).status().message(),
              HasSubstr("strictly increasing, got 100,50"));
  EXPECT_THAT(MakePacker("wlb", {}, cost, {.thresholds = {200000}}).status().message(),
              HasSubstr("200000 is outside"));
}

TEST(Packer, PushRejectsPiecesLongerThanTheContextWithoutChangingState) {
  PackerConfig config{.context = 10, .max_tokens = 10, .micro_batches = 1};
  auto packer = *MakePacker("wlb", config, Quadratic(), {});
  std::vector<Document> bad = {{.id = 3, .length = 11}};
  auto steps = packer->Push(bad);
  ASSERT_FALSE(steps.ok());
  EXPECT_THAT(steps.status().message(), HasSubstr("document 3 piece 0: length 11"));
  auto ok = *packer->Push(Docs({4}, 10));
  EXPECT_EQ(ok[0].step, 0);  // the failed Push consumed no step
  EXPECT_EQ(ok[0].micro_batches[0].documents[0].arrival_step, 0);
}

TEST(PackerState, RejectsCorruptedAndMismatchedBlobs) {
  PackerConfig config{.context = 100, .max_tokens = 150, .micro_batches = 2};
  auto packer = *MakePacker("wlb", config, Quadratic(), {.thresholds = {50}});
  ASSERT_TRUE(packer->Push(Docs({80, 10, 10, 3}, 100)).ok());
  const std::string blob = packer->SaveState();

  std::string flipped = blob;
  flipped[flipped.size() - 5] ^= 1;
  absl::Status s = packer->RestoreState(flipped);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("corrupted"));
  EXPECT_EQ(packer->RestoreState("garbage").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(packer->RestoreState(blob.substr(0, blob.size() / 2)).code(),
            absl::StatusCode::kDataLoss);

  auto other = *MakePacker("wlb", config, Quadratic(), {.thresholds = {60}});
  absl::Status mismatch = other->RestoreState(blob);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatch.message(), HasSubstr("thresholds"));
  auto fixed = *MakePacker("fixed-greedy", config, Quadratic(), {});
  EXPECT_FALSE(fixed->RestoreState(blob).ok());
  // A failed restore leaves the packer as it was.
  EXPECT_EQ(packer->SaveState(), blob);
}

// The payload of a state blob, and a blob with a valid checksum around an edited payload.
nlohmann::json Payload(const std::string& blob) {
  return nlohmann::json::parse(blob.substr(blob.find('\n', blob.find('\n') + 1) + 1));
}
std::string Blob(const nlohmann::json& payload) {
  const std::string text = payload.dump();
  return absl::StrFormat("%s\n%016x\n%s", Packer::kStateMagic, detail::Fnv1a64(text), text);
}

TEST(LookaheadPacker, ReturnsEachPlanOnceKFurtherStepsAreBuffered) {
  PackerConfig config{.context = 100, .max_tokens = 125, .micro_batches = 2};
  auto packer =
      *MakePacker("wlb-lookahead", config, Quadratic(), {.thresholds = {50}, .lookahead = 2});
  EXPECT_TRUE(packer->Push(Docs({30, 40, 50, 60}, 100))->empty());
  EXPECT_TRUE(packer->Push(Docs({100, 100}, 100))->empty());
  EXPECT_EQ(packer->Held().documents, 6);  // buffered arrivals are held
  auto first = *packer->Push(Docs({70, 70, 60}, 100));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].step, 0);
  auto rest = packer->Flush();
  ASSERT_GE(rest.size(), 2u);
  EXPECT_FALSE(rest[0].drain);  // steps 1 and 2 were owed to the input
  EXPECT_FALSE(rest[1].drain);
  for (size_t k = 2; k < rest.size(); ++k) EXPECT_TRUE(rest[k].drain);
  EXPECT_TRUE(packer->Pending().empty());
}

TEST(LookaheadPacker, HoldsBackOneQueueLevelWhenTwoWouldReleaseIntoOneStep) {
  // Two levels full in step 0 fill it beyond what can be balanced; the look-ahead sees an empty
  // step 1 and gives one level to it.
  PackerConfig config{.context = 100, .max_tokens = 125, .micro_batches = 2};
  const std::vector<Document> step0 = Docs({100, 95, 60, 55, 20, 20, 20, 20, 20}, 100);
  std::vector<Document> step1 = Docs({20, 20, 20, 20, 20, 20, 20, 20, 20, 15}, 100);
  for (Document& d : step1) d.id += 100;
  auto run = [&](const char* name) {
    auto packer = *MakePacker(name, config, Quadratic(), {.thresholds = {50, 90}});
    return Summarize(RunPacker(*packer, {step0, step1})->steps, Quadratic());
  };
  const StreamSummary refine = run("wlb-refine");
  const StreamSummary lookahead = run("wlb-lookahead");
  EXPECT_LT(lookahead.imbalance_mean, refine.imbalance_mean - 0.02)
      << lookahead.imbalance_mean << " vs " << refine.imbalance_mean;
}

TEST(LookaheadPacker, RejectsStatesThatDoNotFitTheConfigurationAndStaysUnchanged) {
  PackerConfig config{.context = 100, .max_tokens = 125, .micro_batches = 2};
  auto packer =
      *MakePacker("wlb-lookahead", config, Quadratic(), {.thresholds = {50, 80}, .lookahead = 2});
  ASSERT_TRUE(packer->Push(Docs({60, 10, 90, 5}, 100)).ok());
  std::vector<Document> second = Docs({55, 7}, 100);
  for (Document& d : second) d.id += 10;
  ASSERT_TRUE(packer->Push(second).ok());
  const std::string blob = packer->SaveState();
  auto restored =
      *MakePacker("wlb-lookahead", config, Quadratic(), {.thresholds = {50, 80}, .lookahead = 2});
  ASSERT_TRUE(restored->RestoreState(blob).ok());
  EXPECT_EQ(restored->SaveState(), blob);

  const nlohmann::json good = Payload(blob);
  ASSERT_EQ(good["state"]["buffer"].size(), 2u);
  auto expect_rejected = [&](const nlohmann::json& bad, const std::string& why) {
    absl::Status s = restored->RestoreState(Blob(bad));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << why;
    EXPECT_THAT(s.message(), HasSubstr(why));
    EXPECT_EQ(restored->SaveState(), blob) << why;  // untouched
  };
  nlohmann::json bad = good;
  bad["state"]["buffer"][0][0][1] = 101;  // a piece longer than S
  expect_rejected(bad, "outside [1, 100]");
  bad = good;
  bad["state"]["buffer"][0][0][1] = 0;
  expect_rejected(bad, "out of range");
  bad = good;
  bad["state"]["buffer"][1].push_back(good["state"]["buffer"][0][0]);  // held twice
  expect_rejected(bad, "arrival step");
  bad = good;
  bad["state"]["carry"].push_back(good["state"]["buffer"][0][1]);
  bad["state"]["carry"][0][4] = -1;  // an earlier arrival, but the same (id, offset)
  expect_rejected(bad, "held twice");
  bad = good;
  bad["state"]["queues"][1].push_back(nlohmann::json::array({50, 60, 0, 0, 0}));  // wrong level
  expect_rejected(bad, "queued: document 50 piece 0 of length 60 is outside [80, 100]");
  bad = good;
  bad["state"]["buffer"].push_back(nlohmann::json::array());  // more than K steps
  expect_rejected(bad, "more buffered steps than the look-ahead allows");
  bad = good;
  bad["state"]["queues"].push_back(nlohmann::json::array());
  expect_rejected(bad, "queue count");
  bad = good;
  bad["state"]["buffer"][0][0][2] = -1;  // negative piece index
  expect_rejected(bad, "outside [1, 100]");
  bad = good;
  bad["short_from"] = 7;
  expect_rejected(bad, "short_from 7");
  auto other_k =
      *MakePacker("wlb-lookahead", config, Quadratic(), {.thresholds = {50, 80}, .lookahead = 1});
  EXPECT_EQ(other_k->RestoreState(blob).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MakePacker, RejectsABadLookahead) {
  EXPECT_THAT(MakePacker("wlb-lookahead", {}, Quadratic(), {.lookahead = -1}).status().message(),
              HasSubstr("look-ahead must be in [0, 8] steps, got -1"));
  EXPECT_THAT(MakePacker("wlb-lookahead", {}, Quadratic(), {.lookahead = 9}).status().message(),
              HasSubstr("got 9"));
}

}  // namespace
}  // namespace wlb
