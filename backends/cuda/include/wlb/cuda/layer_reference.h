// Float64 CPU reference of one decoder layer (layer_shape.h), forward and backward.
//
// The ground truth the GPU layer runner is checked against on small shapes, and itself checked
// against central finite differences of its own forward. Every tensor is row-major in double;
// weights are (in, out) matrices: y = x W.
//
//   wlb::cuda::LayerParams w = wlb::cuda::RandomLayerParams(shape, /*seed=*/1);
//   std::vector<double> x = wlb::cuda::RandomValues(mb.tokens() * shape.hidden, 2, 1.0);
//   absl::StatusOr<wlb::cuda::LayerForwardResult> f = wlb::cuda::LayerForward(shape, w, mb, x);
//   absl::StatusOr<wlb::cuda::LayerGradients> g =
//       wlb::cuda::LayerBackward(shape, w, mb, x, dy);   // gradients of sum(y * dy)
#ifndef WLB_CUDA_LAYER_REFERENCE_H_
#define WLB_CUDA_LAYER_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/layer_shape.h"

namespace wlb::cuda {

// The layer's weights; the GPU runner holds the same tensors in bf16.
struct LayerParams {
  std::vector<double> norm1;  // (hidden)
  std::vector<double> wq;     // (hidden, heads * head_dim)
  std::vector<double> wk;     // (hidden, kv_heads * head_dim)
  std::vector<double> wv;     // (hidden, kv_heads * head_dim)
  std::vector<double> wo;     // (heads * head_dim, hidden)
  std::vector<double> norm2;  // (hidden)
  std::vector<double> wgu;    // (hidden, 2 * ffn): gate columns [0, ffn), up columns [ffn, 2 ffn)
  std::vector<double> wd;     // (ffn, hidden)
};

// `n` seeded values uniform in [-scale, scale], each exactly representable in bf16 (so the GPU
// runner and the reference start from identical numbers).
std::vector<double> RandomValues(int64_t n, uint64_t seed, double scale);

// Random weights: matrices uniform with scale 1 / sqrt(fan_in), norm gains uniform in [0.5, 1.5];
// all bf16-representable, never zero tensors.
LayerParams RandomLayerParams(const LayerShape& shape, uint64_t seed);

// Checks every tensor's size against `shape`; InvalidArgument naming the tensor and both sizes.
absl::Status ValidateLayerParams(const LayerShape& shape, const LayerParams& params);

struct LayerForwardResult {
  std::vector<double> y;  // (tokens, hidden)
};

// Gradients of sum(y * dy).
struct LayerGradients {
  std::vector<double> dx;  // (tokens, hidden)
  LayerParams dparams;     // same shapes as the weights
};

// y = layer(x). InvalidArgument for a bad shape, weight or x size.
absl::StatusOr<LayerForwardResult> LayerForward(const LayerShape& shape, const LayerParams& params,
                                                const PackedDocuments& batch,
                                                absl::Span<const double> x);

// Backward by hand (recomputes the forward). Same errors, plus a dy of the wrong size.
absl::StatusOr<LayerGradients> LayerBackward(const LayerShape& shape, const LayerParams& params,
                                             const PackedDocuments& batch,
                                             absl::Span<const double> x,
                                             absl::Span<const double> dy);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_LAYER_REFERENCE_H_
