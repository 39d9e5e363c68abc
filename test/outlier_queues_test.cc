#include "wlb/pack/outlier_queues.hpp"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "wlb/core/document.hpp"

namespace wlb {
namespace outlier_queues_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Document Doc(int64_t id, int64_t length, int64_t arrival) {
  return Document{.id = id, .length = length, .arrival_step = arrival};
}
std::vector<int64_t> Ids(const std::vector<Document>& docs) {
  std::vector<int64_t> ids;
  for (const Document& d : docs) ids.push_back(d.id);
  return ids;
}

TEST(OutlierQueues, LevelsFollowTheThresholds) {
  const OutlierQueues<Document> q({32, 64}, 100);
  EXPECT_EQ(q.Level(31), -1);
  EXPECT_EQ(q.Level(32), 0);
  EXPECT_EQ(q.Level(63), 0);
  EXPECT_EQ(q.Level(64), 1);
  EXPECT_EQ(q.Level(100), 1);
  EXPECT_EQ(q.MinLength(0), 32);
  EXPECT_EQ(q.MaxLength(0), 63);
  EXPECT_EQ(q.MaxLength(1), 100);
}

TEST(OutlierQueues, ReleasesTheOldestOfFullLevelsFirstInFirstOut) {
  OutlierQueues<Document> q({32, 64}, 100);
  EXPECT_FALSE(q.Enqueue(Doc(0, 10, 0)));  // not an outlier: nothing queued
  for (int64_t id = 1; id <= 3; ++id) EXPECT_TRUE(q.Enqueue(Doc(id, 40, id)));
  EXPECT_TRUE(q.Enqueue(Doc(4, 70, 4)));
  EXPECT_EQ(q.held().documents, 4);
  EXPECT_EQ(q.held().tokens, 190);
  std::vector<Document> released;
  q.ReleaseFull(2, released);  // level 0 holds 3 >= 2, level 1 holds 1 < 2
  EXPECT_THAT(Ids(released), ElementsAre(1, 2));
  EXPECT_THAT(Ids(q.queue(0)), ElementsAre(3));
  EXPECT_EQ(q.held().documents, 2);
  EXPECT_EQ(q.held().tokens, 110);
  released.clear();
  q.Release(1, std::vector<size_t>{0}, released);
  EXPECT_THAT(Ids(released), ElementsAre(4));
  released.clear();
  q.ReleaseAll(released);
  EXPECT_THAT(Ids(released), ElementsAre(3));
  EXPECT_TRUE(q.empty());
}

TEST(OutlierQueues, StateRoundTripsAndIsCheckedWithoutThrowing) {
  OutlierQueues<Document> q({32}, 64);
  q.Enqueue(Doc(1, 40, 0));
  q.Enqueue(Doc(2, 50, 1));
  OutlierQueues<Document> loaded({32}, 64);
  ASSERT_TRUE(loaded.LoadStateJson(q.StateJson()).ok());
  EXPECT_EQ(loaded.StateJson(), q.StateJson());
  EXPECT_EQ(loaded.held().tokens, 90);
  EXPECT_TRUE(loaded.Validate(2).ok());
  EXPECT_THAT(loaded.Validate(1).message(), HasSubstr("queued document 2 arrived at step 1"));

  // Malformed states are errors, and leave the queues as they were.
  const absl::Status count = loaded.LoadStateJson(nlohmann::json::array());
  EXPECT_THAT(count.message(), HasSubstr("queue count does not match thresholds"));
  EXPECT_THAT(loaded.LoadStateJson(nlohmann::json::parse("[[[1, 40.5, 0, 0, 0]]]")).message(),
              HasSubstr("document length must be an integer"));
  EXPECT_EQ(loaded.StateJson(), q.StateJson());

  // Loaded but not what queues hold: a length of another level, or out of arrival order.
  ASSERT_TRUE(loaded.LoadStateJson(nlohmann::json::parse("[[[1, 5, 0, 0, 0]]]")).ok());
  EXPECT_THAT(loaded.Validate(1).message(),
              HasSubstr("queued: document 1 piece 0 of length 5 is outside [32, 64] (it is in "
                        "outlier queue 0, not its queue -1)"));
  ASSERT_TRUE(
      loaded.LoadStateJson(nlohmann::json::parse("[[[1, 40, 0, 0, 1], [2, 40, 0, 0, 0]]]")).ok());
  EXPECT_THAT(loaded.Validate(2).message(),
              HasSubstr("outlier queue 0: document 1 (arrival step 1) is queued after document 2"));
}

TEST(OutlierQueues, ArrivedTokensAreReadWithTheirLevelRange) {
  OutlierQueues<ArrivedTokens> q({32}, 64);
  EXPECT_TRUE(q.Enqueue({.arrival_step = 0, .length = 40}));
  EXPECT_EQ(q.StateJson(), nlohmann::json::parse("[[[0, 40]]]"));
  OutlierQueues<ArrivedTokens> loaded({32}, 64);
  EXPECT_THAT(loaded.LoadStateJson(nlohmann::json::parse("[[[0, 20]]]"), "shadow").message(),
              HasSubstr("shadow queued length must be an integer in [32, 64]"));
  ASSERT_TRUE(loaded.LoadStateJson(nlohmann::json::parse("[[[3, 40]]]"), "shadow").ok());
  EXPECT_THAT(loaded.Validate(2, "shadow").message(),
              HasSubstr("shadow: queued length 40 arrived at step 3, not before step 2"));
}

TEST(ValidateThresholds, RejectsUnorderedOrOutOfRangeThresholds) {
  EXPECT_TRUE(ValidateThresholds({32, 64}, 64).ok());
  EXPECT_THAT(ValidateThresholds({64, 32}, 100).message(), HasSubstr("strictly increasing"));
  EXPECT_THAT(ValidateThresholds({0}, 100).message(), HasSubstr("outside [1, 100]"));
}

}  // namespace outlier_queues_test
}  // namespace wlb
