#include "wlb/cuda/layer_shape.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "wlb/cost/cost_model.hpp"

namespace wlb::cuda {

absl::Status ValidateLayerShape(const LayerShape& s) {
  const std::pair<const char*, int64_t> sizes[] = {{"hidden", s.hidden},
                                                   {"heads", s.heads},
                                                   {"kv_heads", s.kv_heads},
                                                   {"head_dim", s.head_dim},
                                                   {"ffn", s.ffn}};
  for (const auto& [name, value] : sizes) {
    // 2^20 bounds every width product (tokens < 2^31 times width < 2^21 fits in int64).
    if (value <= 0 || value > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layer shape '%s': %s must be in [1, 2^20], got %d", s.name, name, value));
    }
  }
  if (s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer shape '%s': kv_heads (%d) must divide heads (%d)", s.name, s.kv_heads, s.heads));
  }
  if (s.head_dim % 2 != 0 || s.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer shape '%s': head_dim must be even and <= 256 (RoPE pairs), got %d",
                        s.name, s.head_dim));
  }
  if (!(s.rope_theta > 1.0) || !std::isfinite(s.rope_theta)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer shape '%s': rope_theta must be > 1 and finite, got %g", s.name, s.rope_theta));
  }
  if (!(s.norm_eps > 0.0) || !std::isfinite(s.norm_eps)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer shape '%s': norm_eps must be > 0 and finite, got %g", s.name, s.norm_eps));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerShape> LayerShapeFromPreset(std::string_view preset, int tp) {
  absl::StatusOr<TransformerShape> model = FindTransformerShape(preset);
  if (!model.ok()) return model.status();
  if (tp < 1 || model->heads % tp != 0 || model->kv_heads % tp != 0 || model->ffn % tp != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TP = %d must be >= 1 and divide %s's heads (%d), kv_heads (%d) and ffn (%d)", tp,
        model->name, model->heads, model->kv_heads, model->ffn));
  }
  LayerShape s;
  s.name = absl::StrFormat("%s/tp%d", model->name, tp);
  s.hidden = model->hidden;
  s.heads = model->heads / tp;
  s.kv_heads = model->kv_heads / tp;
  s.head_dim = model->hidden / model->heads;
  s.ffn = model->ffn / tp;
  if (absl::Status st = ValidateLayerShape(s); !st.ok()) return st;
  return s;
}

absl::StatusOr<PackedDocuments> PackDocuments(absl::Span<const int64_t> lengths) {
  if (lengths.empty()) {
    return absl::InvalidArgumentError("a packed micro-batch needs at least one document, got 0");
  }
  PackedDocuments mb;
  mb.cu_seqlens.push_back(0);
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t d = lengths[i];
    if (d < 1 || d > std::numeric_limits<int32_t>::max() - total) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d: length %d must be >= 1 and keep the micro-batch below 2^31 tokens "
          "(%d before it)",
          i, d, total));
    }
    total += d;
    mb.cu_seqlens.push_back(static_cast<int32_t>(total));
    mb.max_length = std::max(mb.max_length, static_cast<int32_t>(d));
  }
  mb.positions.reserve(static_cast<size_t>(total));
  for (int64_t d : lengths) {
    for (int64_t p = 0; p < d; ++p) mb.positions.push_back(static_cast<int32_t>(p));
  }
  return mb;
}

}  // namespace wlb::cuda
