// Tests of include/wlb/core/varlen_layout.hpp.
#include "wlb/core/varlen_layout.hpp"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.hpp"

namespace wlb {
namespace varlen_layout_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::wlb::testing::MakeMicroBatch;

TEST(VarlenLayoutTest, CuSeqlensAndPositions) {
  const MicroBatch mb = MakeMicroBatch({3, 1, 2});
  EXPECT_THAT(*CuSeqlens(mb), ElementsAre(0, 3, 4, 6));
  EXPECT_THAT(PositionIds(mb), ElementsAre(0, 1, 2, 0, 0, 1));
  EXPECT_THAT(*CuSeqlens(MicroBatch{}), ElementsAre(0));
  EXPECT_TRUE(PositionIds(MicroBatch{}).empty());
}

TEST(VarlenLayoutTest, BadLengthsAndInt32Overflow) {
  EXPECT_THAT(CuSeqlens(MakeMicroBatch({4, 0})).status().message(),
              HasSubstr("document 1: document length must be > 0, got 0"));
  const absl::StatusOr<std::vector<int32_t>> big =
      CuSeqlens(MakeMicroBatch({std::numeric_limits<int32_t>::max(), 1}));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(big.status().message(), HasSubstr("cu_seqlens must fit int32"));
}

}  // namespace varlen_layout_test
}  // namespace wlb
