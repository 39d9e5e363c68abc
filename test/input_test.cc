#include "wlb/io/input.hpp"

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace input_test {

using ::testing::HasSubstr;

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(LoadInput, AFileIsCutLikeMakeDocumentsAndSplitIntoSteps) {
  const std::string path = WriteTemp("wlb_input_test.txt", "5\n19\n8\n40\n3\n");
  absl::StatusOr<Input> input = LoadInput({.docs = path}, /*context=*/16, /*micro_batches=*/2);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->name, path);
  EXPECT_EQ(input->lengths, (std::vector<int64_t>{5, 19, 8, 40, 3}));
  const std::vector<Document> pieces = *MakeDocuments(input->lengths, 16);
  EXPECT_EQ(input->pieces, pieces);
  EXPECT_EQ(input->steps, *SplitIntoSteps(pieces, 32));
  // The short last step is kept (packers mark it partial); --steps cuts after that many.
  EXPECT_EQ(input->steps.size(), 3u);
  EXPECT_EQ(LoadInput({.docs = path, .steps = 2}, 16, 2)->steps.size(), 2u);
}

TEST(LoadInput, SamplesExactlyTheRequestedFullSteps) {
  for (const NamedDistribution& named : kDistributions) {
    const std::string distribution(named.name);
    absl::StatusOr<Input> input =
        LoadInput({.distribution = distribution, .seed = 7, .steps = 12}, 131072, 4);
    ASSERT_TRUE(input.ok()) << input.status();
    ASSERT_EQ(input->steps.size(), 12u) << distribution;
    for (const auto& step : input->steps) EXPECT_GT(TotalTokens(step), 3 * 131072);
    EXPECT_THAT(input->name, HasSubstr(distribution));
    // The same seed gives the same stream.
    EXPECT_EQ(LoadInput({.distribution = distribution, .seed = 7, .steps = 12}, 131072, 4)->steps,
              input->steps);
  }
  EXPECT_EQ(LoadInput({}, 131072, 4)->steps.size(), 100u);  // the default
}

TEST(LoadInput, HeavyTailHasAboutOneAndAHalfPercentAtHalfTheWindow) {
  const std::vector<int64_t> lengths = SampleHeavyTailLengths(int64_t{1} << 30, 3);
  int64_t long_ones = 0;
  for (int64_t l : lengths) long_ones += l >= 65536;
  const double share = static_cast<double>(long_ones) / static_cast<double>(lengths.size());
  EXPECT_GT(share, 0.013);
  EXPECT_LT(share, 0.017);
}

TEST(CutSteps, ScalesLengthsToTheWindow) {
  const Lengths base{.name = "x", .values = {131072, 65536, 3}};
  absl::StatusOr<Input> input = CutSteps(base, 32768, 2, {.scale_from = 131072});
  ASSERT_TRUE(input.ok());
  EXPECT_EQ(input->lengths, (std::vector<int64_t>{32768, 16384, 1}));  // at least one token
}

TEST(LoadInput, BadInputNamesTheProblem) {
  EXPECT_THAT(LoadInput({.distribution = "zipf"}, 1024, 2).status().message(),
              HasSubstr("unknown distribution 'zipf' (known: default, heavy-tail, rare-long, "
                        "bimodal, pile-like, prolong-like)"));
  EXPECT_THAT(LoadInput({.docs = "/nonexistent/lengths.txt"}, 1024, 2).status().message(),
              HasSubstr("cannot open lengths file '/nonexistent/lengths.txt'"));
  const std::string bad = WriteTemp("wlb_input_bad.txt", "5\n-3\n");
  EXPECT_THAT(LoadInput({.docs = bad}, 1024, 2).status().message(), HasSubstr(":2: '-3'"));
  EXPECT_THAT(LoadInput({.steps = -1}, 1024, 2).status().message(), HasSubstr("got -1"));
  EXPECT_THAT(CutSteps({}, 0, 2).status().message(), HasSubstr("(S) must be in [1, 16777216]"));
  EXPECT_THAT(CutSteps({}, 1024, 4097).status().message(), HasSubstr("got 4097"));
  EXPECT_THAT(CutSteps({}, 1024, 2, {.max_steps = kMaxSteps + 1}).status().message(),
              HasSubstr("max_steps must be in [0, 1048576]"));
  EXPECT_THAT(LoadInput({.steps = kMaxSteps}, 1 << 20, 64).status().message(),
              HasSubstr("cannot sample 1048576 steps of N x S = 64 x 1048576 tokens"));
  EXPECT_THAT(CutSteps({}, INT64_MAX / 2, 4).status().message(),
              HasSubstr(absl::StrFormat("got %d", INT64_MAX / 2)));
  EXPECT_THAT(LoadInput({.steps = kMaxSteps + 1}, 1024, 2).status().message(),
              HasSubstr("steps must be in [0, 1048576]"));
  const std::string empty = WriteTemp("wlb_input_empty.txt", "# nothing\n");
  EXPECT_THAT(LoadInput({.docs = empty}, 1024, 2).status().message(),
              HasSubstr("holds no document lengths"));
  // A split that would make more pieces than one stream may hold is rejected, not allocated.
  const Lengths huge{.name = "huge", .values = {kMaxStreamTokens}};
  EXPECT_THAT(CutSteps(huge, 1, 1).status().message(), HasSubstr("over the limit"));
}

// --steps K cuts the first K steps document by document: the same steps as cutting the whole
// stream and keeping K, for seeded random lengths (long ones too), S, N and K.
TEST(CutSteps, FirstStepsMatchTheWholeCut) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> lengths(1 + rng() % 80);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % (rng() % 4 == 0 ? 900 : 60));
    const int64_t context = 1 + static_cast<int64_t>(rng() % 128);
    const int32_t n = 1 + static_cast<int32_t>(rng() % 4);
    const int64_t keep = 1 + static_cast<int64_t>(rng() % 12);
    absl::StatusOr<Input> whole = CutSteps({.name = "w", .values = lengths}, context, n);
    absl::StatusOr<Input> first =
        CutSteps({.name = "w", .values = lengths}, context, n, {.max_steps = keep});
    ASSERT_TRUE(whole.ok() && first.ok());
    std::vector<std::vector<Document>> expected = whole->steps;
    if (static_cast<int64_t>(expected.size()) > keep) expected.resize(static_cast<size_t>(keep));
    EXPECT_EQ(first->steps, expected) << "trial " << trial;
    EXPECT_EQ(first->tokens, whole->tokens);
    EXPECT_EQ(first->lengths, whole->lengths);
  }
}

// With --steps, a corpus over the limits of one whole stream (2^24 pieces) plans its first
// steps: only their pieces are made; every length is still checked, naming the document.
TEST(CutSteps, FirstStepsOfMoreThan2Pow24Documents) {
  const Lengths many{.name = "many", .values = std::vector<int64_t>((int64_t{1} << 24) + 5, 3)};
  EXPECT_THAT(CutSteps(many, 4096, 2).status().message(), HasSubstr("over the limit"));
  absl::StatusOr<Input> first = CutSteps(many, 4096, 2, {.max_steps = 3});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->steps.size(), 3u);
  EXPECT_EQ(first->tokens, 3 * ((int64_t{1} << 24) + 5));
  EXPECT_EQ(first->pieces.size(), 8192u);  // 3 steps of 8192 tokens, 3 tokens a document
  Lengths bad = many;
  bad.values.back() = 0;
  EXPECT_THAT(CutSteps(bad, 4096, 2, {.max_steps = 3}).status().message(),
              HasSubstr("document 16777220"));
}

}  // namespace input_test
}  // namespace wlb
