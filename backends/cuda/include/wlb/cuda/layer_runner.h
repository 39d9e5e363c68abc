// One LLaMA-style decoder layer on the GPU (layer_shape.h): forward and backward on a packed
// micro-batch, bf16 tensors with fp32 accumulation, GEMMs (forward, dgrad, wgrad) through
// cuBLASLt, attention through VarlenAttention (the engine is AttentionOptions::kernel), RMSNorm,
// RoPE with per-document positions and SwiGLU in own kernels. Random inputs, measured latency.
//
// Plan/run split, as VarlenAttention: Create allocates the weights and every activation for up
// to `capacity` tokens; Plan(batch) builds the micro-batch's attention plan and GEMM descriptors
// and uploads its positions; Forward/Backward then launch without allocating, and Times() reads
// the CUDA events of the last pass.
//
//   absl::StatusOr<wlb::cuda::LayerShape> shape = wlb::cuda::LayerShapeFromPreset("llama2-7b", 8);
//   auto layer = wlb::cuda::LayerRunner::Create(*shape, wlb::cuda::RandomLayerParams(*shape, 1),
//                                               /*capacity=*/163840, {}, stream);
//   absl::Status s = (*layer)->Plan(*wlb::cuda::PackDocuments({70000, 5000, 300}));
//   s = (*layer)->Forward();  s = (*layer)->Backward();
//   absl::StatusOr<wlb::cuda::LayerTimes> t = (*layer)->Times();   // synchronises
//
// The input x and the output gradient dy are seeded random values (RandomizeInputs), or host
// values (SetInputs) for tests. Weight gradients overwrite (no accumulation across micro-batches).
#ifndef WLB_CUDA_LAYER_RUNNER_H_
#define WLB_CUDA_LAYER_RUNNER_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/layer_reference.h"
#include "wlb/cuda/layer_shape.h"
#include "wlb/cuda/varlen_attention.h"

namespace wlb::cuda {

struct LayerRunnerOptions {
  // The attention engine and its schedule (AttentionOptions::kernel: the engine; `backward` is
  // set from the field below).
  AttentionOptions attention;
  bool backward = true;  // allocate gradient buffers; Backward() fails without them
};

// CUDA-event times (ms) of the last Forward and Backward; the attention part is inside them.
struct LayerTimes {
  double forward_ms = 0.0;
  double attention_forward_ms = 0.0;
  double backward_ms = 0.0;  // 0 when no backward ran since the last Plan
  double attention_backward_ms = 0.0;
};

class LayerRunner {
 public:
  // Validates the shape (also: hidden <= 12288, the RMSNorm kernels' limit) and `params`
  // (layer_reference.h sizes), capacity in [1, 2^31), then allocates and uploads on `stream`.
  // ResourceExhausted when the device lacks the memory (the message gives the bytes asked).
  static absl::StatusOr<std::unique_ptr<LayerRunner>> Create(const LayerShape& shape,
                                                             const LayerParams& params,
                                                             int64_t capacity,
                                                             const LayerRunnerOptions& options,
                                                             cudaStream_t stream = nullptr);
  ~LayerRunner();

  // Bytes of device memory Create allocates for `shape` and `capacity` (checked arithmetic;
  // InvalidArgument on overflow).
  static absl::StatusOr<int64_t> DeviceBytes(const LayerShape& shape, int64_t capacity,
                                             bool backward);

  // Fills x and dy of all `capacity` rows with seeded values uniform in [-1, 1] (on the device).
  absl::Status RandomizeInputs(uint64_t seed);
  // Uploads x and dy (tokens x hidden each, at most capacity rows); for tests.
  absl::Status SetInputs(absl::Span<const double> x, absl::Span<const double> dy);

  // Plans one micro-batch: InvalidArgument if it holds more than `capacity` tokens or the
  // attention engine rejects it (e.g. flash with a head_dim other than 64 or 128).
  absl::Status Plan(const PackedDocuments& batch);

  // y = layer(x) for the planned micro-batch; FailedPrecondition before Plan.
  absl::Status Forward();
  // Gradients of sum(y * dy); needs a Forward since the last Plan.
  absl::Status Backward();
  // Waits for the stream and returns the last pass's times.
  absl::StatusOr<LayerTimes> Times();

  // For tests: y, and dx with the weight gradients, of the planned micro-batch (synchronises).
  absl::StatusOr<LayerForwardResult> DownloadOutput();
  absl::StatusOr<LayerGradients> DownloadGradients();

  const LayerShape& shape() const { return shape_; }

 private:
  struct State;
  explicit LayerRunner(std::unique_ptr<State> state, LayerShape shape);
  std::unique_ptr<State> state_;
  LayerShape shape_;
};

}  // namespace wlb::cuda

#endif  // WLB_CUDA_LAYER_RUNNER_H_
