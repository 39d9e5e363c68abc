// Host-side checks of FillUniformBf16: bad arguments are refused before any launch, and a
// machine without a device gets a Status, not a crash. (The values themselves need a device.)
#include "wlb/cuda/device_fill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {
namespace {

// A 16-byte aligned fake address, never dereferenced on the host.
__nv_bfloat16* Fake() { return reinterpret_cast<__nv_bfloat16*>(uintptr_t{1} << 40); }

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "message '" << s.message() << "' lacks '" << needle << "'";
}

TEST(FillUniformBf16, RefusesBadArgumentsBeforeAnyLaunch) {
  ExpectInvalid(FillUniformBf16(Fake(), -1, 1, 1.f), "n = -1");
  // One thread per value: past the grid's 2^31 - 1 blocks of 256 the launch would wrap.
  ExpectInvalid(FillUniformBf16(Fake(), int64_t{0x7fffffff} * 256 + 1, 1, 1.f), "outside");
  ExpectInvalid(FillUniformBf16(Fake(), std::numeric_limits<int64_t>::max(), 1, 1.f), "outside");
  ExpectInvalid(FillUniformBf16(nullptr, 8, 1, 1.f), "null");
  // A zero scale would give all-zero inputs; the others are not a range.
  for (float scale : {0.f, -1.f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
    ExpectInvalid(FillUniformBf16(Fake(), 8, 1, scale), "scale");
  }
}

TEST(FillUniformBf16, EmptyFillTouchesNothing) {
  // No launch, so this holds with and without a device.
  EXPECT_TRUE(FillUniformBf16(nullptr, 0, 1, 1.f).ok());
  EXPECT_TRUE(FillUniformBf16(Fake(), 0, 1, 2.f).ok());
}

TEST(FillUniformBf16, ReportsMissingDeviceAsStatus) {
  if (CudaDeviceAvailable().ok()) {
    GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
  }
  const absl::Status s = FillUniformBf16(Fake(), 1024, 1, 1.f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("CUDA error"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("device_fill.cc:"), std::string::npos) << s;
}

}  // namespace
}  // namespace wlb::cuda
