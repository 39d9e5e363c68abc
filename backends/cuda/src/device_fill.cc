#include "wlb/cuda/device_fill.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "src/layer_kernels.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {

absl::Status FillUniformBf16(__nv_bfloat16* data, int64_t n, uint64_t seed, float scale,
                             cudaStream_t stream) {
  if (n < 0 || n > detail::kMaxFillUniform) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FillUniformBf16: n = %d is outside [0, %d] (one thread per value)", n,
                        detail::kMaxFillUniform));
  }
  if (data == nullptr && n > 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FillUniformBf16: data is null for n = %d values", n));
  }
  if (!std::isfinite(scale) || !(scale > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FillUniformBf16: scale = %g must be finite and positive", scale));
  }
  if (n == 0) return absl::OkStatus();
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchFillUniform(data, n, seed, scale, stream));
  return absl::OkStatus();
}

}  // namespace wlb::cuda
