// The per-GPU shape of one LLaMA-style decoder layer under tensor parallelism, and the packed
// micro-batch it runs on. Host only (no CUDA), shared by the GPU layer runner (layer_runner.h)
// and its float64 reference (layer_reference.h).
//
//   absl::StatusOr<wlb::cuda::LayerShape> s = wlb::cuda::LayerShapeFromPreset("llama2-7b", 8);
//   // hidden 4096, 4 query heads, 4 KV heads, head_dim 128, ffn 1376: one GPU's TP slice
//   absl::StatusOr<wlb::cuda::PackedDocuments> mb = wlb::cuda::PackDocuments({300, 12, 900});
//
// Layer (pre-norm, as LLaMA): a = RMSNorm(x) g1; q, k, v = a Wq, a Wk, a Wv; RoPE on q and k with
// each token's position inside its document; o = varlen causal attention (one segment per
// document); h = x + o Wo; b = RMSNorm(h) g2; [gate | up] = b Wgu; y = h + (silu(gate) * up) Wd.
// Under TP the GPU holds heads / TP query and KV heads and ffn / TP columns of the MLP; the
// all-reduces after Wo and Wd are communication and are not part of the layer's compute.
#ifndef WLB_CUDA_LAYER_SHAPE_H_
#define WLB_CUDA_LAYER_SHAPE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace wlb::cuda {

struct LayerShape {
  std::string name;      // e.g. "llama2-7b/tp8"
  int64_t hidden = 0;    // model width (RMSNorm and residual width; not split by TP)
  int64_t heads = 0;     // query heads on this GPU
  int64_t kv_heads = 0;  // KV heads on this GPU; divides heads
  int64_t head_dim = 0;  // even (RoPE rotates pairs)
  int64_t ffn = 0;       // MLP columns on this GPU
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;

  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
};

// OK when every size is positive, kv_heads divides heads, head_dim is even and at most 256,
// theta > 1 and eps > 0 (finite); InvalidArgument naming the value otherwise.
absl::Status ValidateLayerShape(const LayerShape& shape);

// One GPU's slice of a wlb::TransformerPresets() shape at tensor-parallel size `tp`: tp must
// divide heads, kv_heads and ffn. NotFound for an unknown preset (listing the known ones),
// InvalidArgument for a tp that does not divide.
absl::StatusOr<LayerShape> LayerShapeFromPreset(std::string_view preset, int tp);

// A packed micro-batch: documents back to back, causal attention inside each.
struct PackedDocuments {
  std::vector<int32_t> cu_seqlens;  // documents + 1 offsets, from 0
  std::vector<int32_t> positions;   // per token: its position inside its document
  int32_t max_length = 0;
  int32_t tokens() const { return cu_seqlens.back(); }
  int documents() const { return static_cast<int>(cu_seqlens.size()) - 1; }
};

// Packs `lengths` (each >= 1; at least one; total below 2^31 tokens). InvalidArgument naming
// the bad length or the total otherwise.
absl::StatusOr<PackedDocuments> PackDocuments(absl::Span<const int64_t> lengths);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_LAYER_SHAPE_H_
