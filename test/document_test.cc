#include "wlb/core/document.hpp"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wlb {
namespace document_test {

using ::testing::HasSubstr;

TEST(MakeDocuments, SplitsLongDocumentsIntoPiecesOfAtMostTheContext) {
  const std::vector<int64_t> lengths = {5, 300000, 19, 131072};
  absl::StatusOr<std::vector<Document>> docs = MakeDocuments(lengths, 131072);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 6u);
  EXPECT_EQ((*docs)[0], (Document{.id = 0, .length = 5, .piece = 0, .offset = 0}));
  EXPECT_EQ((*docs)[1], (Document{.id = 1, .length = 131072, .piece = 0, .offset = 0}));
  EXPECT_EQ((*docs)[2], (Document{.id = 1, .length = 131072, .piece = 1, .offset = 131072}));
  EXPECT_EQ((*docs)[3], (Document{.id = 1, .length = 37856, .piece = 2, .offset = 262144}));
  EXPECT_EQ((*docs)[4], (Document{.id = 2, .length = 19, .piece = 0, .offset = 0}));
  EXPECT_EQ((*docs)[5], (Document{.id = 3, .length = 131072, .piece = 0, .offset = 0}));
  EXPECT_EQ(TotalTokens(*docs), 5 + 300000 + 19 + 131072);
}

TEST(MakeDocuments, RejectsNonPositiveLengthsNamingTheDocument) {
  const std::vector<int64_t> lengths = {5, 0, 3};
  absl::StatusOr<std::vector<Document>> docs = MakeDocuments(lengths, 100);
  ASSERT_FALSE(docs.ok());
  EXPECT_EQ(docs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(docs.status().message(), HasSubstr("document 1"));
  EXPECT_THAT(docs.status().message(), HasSubstr("got 0"));
  const std::vector<int64_t> negative = {-7};
  EXPECT_THAT(MakeDocuments(negative, 100).status().message(), HasSubstr("-7"));
}

TEST(MakeDocuments, RejectsNonPositiveContext) {
  const std::vector<int64_t> lengths = {5};
  absl::StatusOr<std::vector<Document>> docs = MakeDocuments(lengths, 0);
  ASSERT_FALSE(docs.ok());
  EXPECT_THAT(docs.status().message(),
              HasSubstr("context window (S) must be in [1, 16777216] tokens, got 0"));
}

TEST(MakeDocuments, RejectsStreamsBeyondTheLimitsBeforeAllocating) {
  // INT64_MAX tokens used to be split into ~7e13 pieces until std::bad_alloc.
  const std::vector<int64_t> huge = {5, INT64_MAX};
  auto docs = MakeDocuments(huge, 131072);
  ASSERT_FALSE(docs.ok());
  EXPECT_THAT(docs.status().message(),
              HasSubstr("document 1: length 9223372036854775807 is above the limit of "
                        "34359738368 tokens"));
  const std::vector<int64_t> many_pieces = {kMaxPieces + 1};
  EXPECT_THAT(MakeDocuments(many_pieces, 1).status().message(),
              HasSubstr("over the limit of 16777216 pieces"));
  const std::vector<int64_t> too_many_tokens = {kMaxStreamTokens, 1};
  EXPECT_THAT(MakeDocuments(too_many_tokens, kMaxContext).status().message(),
              HasSubstr("over the limit of 34359738368 tokens in one stream"));
  EXPECT_THAT(MakeDocuments(huge, kMaxContext + 1).status().message(), HasSubstr("got 16777217"));
}

}  // namespace document_test
}  // namespace wlb
