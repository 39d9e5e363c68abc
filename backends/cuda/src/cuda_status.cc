#include "wlb/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace wlb::cuda {

absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrFormat("CUDA error %s (%d: %s) in `%s` at %s:%d", cudaGetErrorName(error),
                      static_cast<int>(error), cudaGetErrorString(error), expr, file, line);
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorNotSupported:
      return absl::FailedPreconditionError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaDeviceAvailable() {
  int count = 0;
  WLB_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount reported 0 devices");
  return absl::OkStatus();
}

}  // namespace wlb::cuda
