// Cost models W(d) = W_a(d) + W_l(d): how much work one document of d tokens is.
//
//   // From a transformer shape: forward FLOPs.
//   absl::StatusOr<wlb::CostModel> w = wlb::CostModelFromPreset("llama2-7b");
//   double flops = (*w)(4096);
//
//   // A shipped calibration: fwd+bwd ms of a layer measured on a GPU (CalibratedPresets).
//   absl::StatusOr<wlb::CostModel> ms = wlb::CostModelFromPreset("h100-flash-llama2-7b-tp8");
//
// A model fitted to measured attention latency (FitCostModel) is in wlb/cost/cost_fit.hpp, one
// fitted to measured micro-batches (FitMicroBatchCost) in wlb/cost/micro_batch_fit.hpp.
//
// FLOP formula (forward pass, one document of d tokens, summed over `layers` layers; h = hidden,
// f = ffn, hd = h / heads, kv = kv_heads * hd):
//   W_l(d) = layers * d * (2*h*(h + 2*kv)   [Q, K, V projections]
//                          + 2*h*h          [output projection]
//                          + 6*h*f)         [SwiGLU MLP: gate, up, down]
//   W_a(d) = layers * 4*h * d*(d+1)/2       [causal: d(d+1)/2 (query, key) pairs, 2*hd FLOPs for
//                                            QK^T and 2*hd for PV per pair and query head]
// Embeddings and the LM head are left out: they are linear in tokens and the same for any packing
// of a step, so they shift costs but do not change which packing is balanced.
//
// Attention families (AttentionFamilies): "per-document" kernels (FlashAttention varlen, wlb's CP
// attention) attend within each document, so a micro-batch costs the sum of W(d) over its
// documents. "dense" ones (PyTorch sdpa / eager over a packed mask, padded layouts) compute the
// whole T x T score matrix of a micro-batch of T tokens and mask it: the attention costs
// dense_quadratic * T^2 per micro-batch, whatever its documents (from a shape: 4h FLOPs per
// (query, key) pair and layer, T^2 pairs: nothing is skipped below the diagonal).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// The shape of a LLaMA-style decoder (SwiGLU MLP, grouped-query attention).
struct TransformerShape {
  std::string name;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t layers = 0;
};

// Built-in shapes. "wlb-550m" is the ~550M-parameter model of the paper's 550M runs as wlb assumes
// it (the paper does not publish it): hidden 1536, ffn 4096, 16 heads, 16 KV heads, 16 layers
// = 453M in the blocks + 98M in 32K-vocabulary embeddings and head.
inline const std::vector<TransformerShape>& TransformerPresets() {
  static const std::vector<TransformerShape> presets = {
      {"llama2-7b", 4096, 11008, 32, 32, 32},
      {"llama2-13b", 5120, 13824, 40, 40, 40},
      {"llama2-70b", 8192, 28672, 64, 8, 80},
      {"wlb-550m", 1536, 4096, 16, 16, 16},
  };
  return presets;
}

// How a micro-batch's attention is computed (file comment): one registry row per family.
enum class AttentionFamily { kPerDocument, kDense };
struct AttentionFamilyInfo {
  AttentionFamily family;
  std::string_view name;
  std::string_view description;
};
inline constexpr AttentionFamilyInfo kAttentionFamilies[] = {
    {AttentionFamily::kPerDocument, "per-document",
     "attention within each document (FlashAttention varlen, wlb_cp): sum of a*d^2"},
    {AttentionFamily::kDense, "dense",
     "the packed micro-batch's whole T x T scores, masked (sdpa, eager): a*T^2"},
};

// The family named `name`; an unknown name is an error listing the known ones.
inline absl::StatusOr<AttentionFamily> FindAttentionFamily(std::string_view name) {
  std::vector<std::string> known;
  for (const AttentionFamilyInfo& f : kAttentionFamilies) {
    if (f.name == name) return f.family;
    known.emplace_back(f.name);
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown attention family %s (known: %s)",
                                                    QuoteForMessage(name),
                                                    absl::StrJoin(known, ", ")));
}

inline std::string_view AttentionFamilyName(AttentionFamily family) {
  for (const AttentionFamilyInfo& f : kAttentionFamilies) {
    if (f.family == family) return f.name;
  }
  return "?";
}

// W(d) = attn_quadratic*d^2 + attn_linear*d + linear_per_token*d + per_document per document, and
// dense_quadratic*T^2 per micro-batch of T tokens (the dense family), all >= 0. `unit` says what
// a cost counts ("flop" or "ms").
struct CostModel {
  double attn_quadratic = 0.0;
  double attn_linear = 0.0;
  double linear_per_token = 0.0;
  double per_document = 0.0;
  double dense_quadratic = 0.0;
  std::string unit = "flop";
  std::string description;

  AttentionFamily family() const {
    return dense_quadratic > 0.0 ? AttentionFamily::kDense : AttentionFamily::kPerDocument;
  }
  // The cost of a micro-batch of these documents: sum of W(d) plus the dense term.
  double MicroBatch(std::span<const int64_t> lengths) const {
    double cost = 0.0, tokens = 0.0;
    for (int64_t d : lengths) {
      cost += (*this)(d);
      tokens += static_cast<double>(d);
    }
    return cost + dense_quadratic * tokens * tokens;
  }
  // What a packer balances under a micro-batch cap of `max_tokens`: packers add W(d) per
  // document, and the dense term of a micro-batch of T <= max_tokens tokens is at most
  // dense_quadratic * max_tokens * T (equal when full), so it is charged as that many units a
  // token. It rises with T alone, so balancing it is balancing tokens, which also minimises the
  // largest dense_quadratic * T^2.
  CostModel ForPacking(int64_t max_tokens) const {
    CostModel m = *this;
    m.linear_per_token += dense_quadratic * static_cast<double>(max_tokens);
    m.dense_quadratic = 0.0;
    return m;
  }

  // The attention part W_a(d).
  double Attention(int64_t d) const {
    const double x = static_cast<double>(d);
    return attn_quadratic * x * x + attn_linear * x;
  }
  // The linear part W_l(d), including the per-document constant.
  double Linear(int64_t d) const {
    return linear_per_token * static_cast<double>(d) + per_document;
  }
  // W(d).
  double operator()(int64_t d) const { return Attention(d) + Linear(d); }
};

// Checks a shape: every size positive, hidden divisible by heads, kv_heads dividing heads.
inline absl::Status ValidateShape(const TransformerShape& s) {
  const std::array<std::pair<const char*, int64_t>, 5> sizes = {{{"hidden", s.hidden},
                                                                 {"ffn", s.ffn},
                                                                 {"heads", s.heads},
                                                                 {"kv_heads", s.kv_heads},
                                                                 {"layers", s.layers}}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("transformer shape '%s': %s must be > 0, got %d", s.name, name, value));
    }
  }
  if (s.hidden % s.heads != 0 || s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transformer shape '%s': heads (%d) must divide hidden (%d) and kv_heads (%d) must divide "
        "heads",
        s.name, s.heads, s.hidden, s.kv_heads));
  }
  return absl::OkStatus();
}

// Forward-FLOP cost model of a shape (formulas in the file comment) under an attention family.
inline absl::StatusOr<CostModel> CostModelFromShape(
    const TransformerShape& s, AttentionFamily family = AttentionFamily::kPerDocument) {
  if (absl::Status st = ValidateShape(s); !st.ok()) return st;
  const double h = static_cast<double>(s.hidden);
  const double kv = static_cast<double>(s.kv_heads * (s.hidden / s.heads));
  const double layers = static_cast<double>(s.layers);
  CostModel m;
  if (family == AttentionFamily::kDense) {
    m.dense_quadratic = layers * 4.0 * h;  // every (query, key) pair of the micro-batch
  } else {
    m.attn_quadratic = layers * 2.0 * h;  // 4h * d(d+1)/2 = 2h d^2 + 2h d
    m.attn_linear = layers * 2.0 * h;
  }
  m.linear_per_token = layers * (2.0 * h * (h + 2.0 * kv) + 2.0 * h * h + 6.0 * h * s.ffn);
  m.unit = "flop";
  m.description = absl::StrFormat("%s forward FLOPs (hidden %d, ffn %d, heads %d/%d, layers %d%s)",
                                  s.name, s.hidden, s.ffn, s.heads, s.kv_heads, s.layers,
                                  family == AttentionFamily::kDense ? ", dense attention" : "");
  return m;
}

// The shape of a named preset; an unknown name is an error listing the known ones.
inline absl::StatusOr<TransformerShape> FindTransformerShape(std::string_view name) {
  std::vector<std::string> known;
  for (const TransformerShape& s : TransformerPresets()) {
    if (s.name == name) return s;
    known.push_back(s.name);
  }
  return absl::NotFoundError(absl::StrFormat("unknown cost preset %s (known: %s)",
                                             QuoteForMessage(name), absl::StrJoin(known, ", ")));
}

// A shipped calibration: the micro-batch cost (FitMicroBatchCost, wlb/cost/micro_batch_fit.hpp)
// fitted to committed GPU measurements of one layer, as a preset named by GPU, engine and model.
// Each is reproduced by `wlb-plan --fit-cost <source> --cost <flop_preset>` (docs/guides/
// calibration.md); test/calibration_test.cc refits `source` and checks these numbers. Only these
// GPU / engine / layer pairs were measured.
struct CalibratedCost {
  std::string_view name;         // --cost name: gpu-engine-model-tp
  std::string_view gpu;          // the GPU measured
  std::string_view engine;       // the attention kernels that ran
  std::string_view layer;        // the layer measured (one GPU's TP slice of one layer)
  std::string_view flop_preset;  // the FLOP preset of the same model (TransformerPresets)
  std::string_view source;       // the committed measurements, relative to the repository
  double quadratic = 0.0;        // ms per d^2 (attn_quadratic)
  double linear = 0.0;           // ms per token (linear_per_token)
  double per_document = 0.0;     // ms per document
  double per_call_ms = 0.0;      // ms per micro-batch (not in W(d): the same for every one)
  int64_t micro_batches = 0;     // measured micro-batches fitted
  double held_out_mean = 0.0;    // held-out relative error (by step parity), mean
  double held_out_max = 0.0;     // .. and max
};

inline const std::vector<CalibratedCost>& CalibratedPresets() {
  static const std::vector<CalibratedCost> presets = {
      {.name = "h100-flash-llama2-7b-tp8",
       .gpu = "NVIDIA H100 80GB HBM3",
       .engine = "flash (wlb's own kernels)",
       .layer = "llama2-7b TP-8 slice of one layer (hidden 4096, heads 4/4 x 128, ffn 1376)",
       .flop_preset = "llama2-7b",
       .source = "docs/results/gpu/h100_layer_7b_128k_measurements.csv",
       .quadratic = 1.59510802e-08,
       .linear = 0.000337292894,
       .per_document = 0.0,
       .per_call_ms = 0.0,
       .micro_batches = 288,
       .held_out_mean = 0.00886877666,
       .held_out_max = 0.0374799841},
      {.name = "h100-cudnn-wlb-550m-tp2",
       .gpu = "NVIDIA H100 80GB HBM3",
       .engine = "cudnn",
       .layer = "wlb-550m TP-2 slice of one layer (hidden 1536, heads 8/8 x 96, ffn 2048)",
       .flop_preset = "wlb-550m",
       .source = "docs/results/gpu/h100_layer_550m_64k_measurements.csv",
       .quadratic = 1.36066413e-08,
       .linear = 0.000208419334,
       .per_document = 0.0,
       .per_call_ms = 0.0,
       .micro_batches = 576,
       .held_out_mean = 0.0209926904,
       .held_out_max = 0.158153689},
  };
  return presets;
}

// The cost model of a calibration: W(d) in fwd+bwd ms of its layer.
inline CostModel CostModelFromCalibration(const CalibratedCost& c) {
  CostModel m;
  m.attn_quadratic = c.quadratic;
  m.linear_per_token = c.linear;
  m.per_document = c.per_document;
  m.unit = "ms";
  m.description = absl::StrFormat(
      "%s: fwd+bwd ms of a %s on %s, %s engine, fitted to %d measured micro-batches (%s): "
      "%.6g*d^2 + %.6g*d + %.6g ms per document, %.6g ms per call; held out mean %.1f%%, max "
      "%.1f%%",
      c.name, c.layer, c.gpu, c.engine, c.micro_batches, c.source, c.quadratic, c.linear,
      c.per_document, c.per_call_ms, 100 * c.held_out_mean, 100 * c.held_out_max);
  return m;
}

// The FLOP presets' names (TransformerPresets).
inline std::vector<std::string> TransformerPresetNames() {
  std::vector<std::string> names;
  for (const TransformerShape& s : TransformerPresets()) names.push_back(s.name);
  return names;
}

// Every cost preset name CostModelFromPreset accepts: the FLOP presets, then the calibrations.
inline std::vector<std::string> CostPresetNames() {
  std::vector<std::string> names = TransformerPresetNames();
  for (const CalibratedCost& c : CalibratedPresets()) names.emplace_back(c.name);
  return names;
}

// The cost model of a named preset: a FLOP preset (TransformerPresets) or a calibration
// (CalibratedPresets); an unknown name is an error listing the known ones.
inline absl::StatusOr<CostModel> CostModelFromPreset(std::string_view name) {
  for (const CalibratedCost& c : CalibratedPresets()) {
    if (c.name == name) return CostModelFromCalibration(c);
  }
  absl::StatusOr<TransformerShape> shape = FindTransformerShape(name);
  if (!shape.ok()) {
    return absl::NotFoundError(absl::StrFormat("unknown cost preset %s (known: %s)",
                                               QuoteForMessage(name),
                                               absl::StrJoin(CostPresetNames(), ", ")));
  }
  return CostModelFromShape(*shape);
}

// One measurement: a document of `length` tokens took `ms`.
struct ProfilePoint {
  int64_t length = 0;
  double ms = 0.0;
};

}  // namespace wlb
