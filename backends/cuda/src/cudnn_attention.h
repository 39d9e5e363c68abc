// The `cudnn` attention engine behind VarlenAttention (AttentionKernel::kCudnn): cuDNN's fused
// SDPA through cudnn-frontend graphs over the packed THD tensors, with ragged offsets, padding
// masks from the per-segment lengths, bottom-right causal alignment and GQA. Graphs are built
// once per shape class (cudnn_layout.h) and device, cached process-wide; Create sizes the
// workspaces and uploads the ragged layout, so Forward/Backward only execute. Internal header:
// the public entry point is VarlenAttention.
#ifndef WLB_CUDA_SRC_CUDNN_ATTENTION_H_
#define WLB_CUDA_SRC_CUDNN_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/varlen_attention.h"

namespace wlb::cuda::detail {

class CudnnAttention;

// Plans `problem` (valid for AttentionKernel::kCudnn, at least one query) on the current device:
// checks the cuDNN version at run time, builds or reuses the graphs, allocates the workspaces.
// FailedPrecondition when the engine is compiled out or cuDNN is too old (naming the version
// found and needed), Unimplemented when cuDNN refuses the configuration (naming the shape and
// cuDNN's reason), a CUDA error's Status when there is no device.
absl::StatusOr<std::shared_ptr<const CudnnAttention>> CreateCudnnAttention(
    const AttentionProblem& problem, bool backward, cudaStream_t stream);

// Run the planned graphs; the tensors are already validated against the problem.
absl::Status CudnnForward(const CudnnAttention& engine, const ForwardTensors& t,
                          cudaStream_t stream);
absl::Status CudnnBackward(const CudnnAttention& engine, const BackwardTensors& t,
                           cudaStream_t stream);

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_CUDNN_ATTENTION_H_
