// CUDA error codes as absl::Status values.
//
// Every CUDA runtime call of the backend goes through WLB_CUDA_RETURN_IF_ERROR, which turns a
// failing cudaError_t into a Status naming the error, the call and its file:line:
//
//   absl::Status Copy(void* dst, const void* src, size_t n, cudaStream_t s) {
//     WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
//     return absl::OkStatus();
//   }
#ifndef WLB_CUDA_CUDA_STATUS_H_
#define WLB_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace wlb::cuda {

// OK for cudaSuccess; otherwise a Status whose message names the error, `expr` and file:line.
// No device or driver maps to FailedPrecondition, out of memory to ResourceExhausted, bad
// arguments to InvalidArgument, everything else to Internal.
absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line);

// Number of CUDA devices, or a Status explaining why none can be used (no driver, no device).
absl::Status CudaDeviceAvailable();

}  // namespace wlb::cuda

#define WLB_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                  \
    const cudaError_t wlb_cuda_error_ = (expr);                                         \
    if (wlb_cuda_error_ != cudaSuccess) {                                               \
      return ::wlb::cuda::CudaStatus(wlb_cuda_error_, #expr, __FILE__, __LINE__);       \
    }                                                                                   \
  } while (false)

#endif  // WLB_CUDA_CUDA_STATUS_H_
