// Seeded random bf16 values written on the device, for benchmark and test inputs.
//
// Filling on the host and copying costs seconds per buffer at 128K tokens x 16 heads x 128; the
// device kernel takes microseconds. The values come from a counter-based hash (splitmix64 of
// seed and index), so the same seed gives the same values on any device and stream:
//
//   absl::Status s = wlb::cuda::FillUniformBf16(q, tokens * heads * dim, /*seed=*/1, 1.f, stream);
#ifndef WLB_CUDA_DEVICE_FILL_H_
#define WLB_CUDA_DEVICE_FILL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace wlb::cuda {

// Writes `n` values uniform in [-scale, scale] to device memory `data`, asynchronously on
// `stream` (synchronise before reading them on another stream or the host). InvalidArgument for
// n outside [0, 2^31 - 1 times 256] (one thread per value), a null `data` with n > 0, or a `scale`
// that is not finite and positive (a zero scale would make the inputs all zeros, which times
// nothing real); the launch's CUDA error as a Status (FailedPrecondition without a device). n == 0
// touches nothing.
absl::Status FillUniformBf16(__nv_bfloat16* data, int64_t n, uint64_t seed, float scale,
                             cudaStream_t stream = nullptr);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_DEVICE_FILL_H_
