// Attention masks beyond full causal, exact (query, key) pair counts, and layer mixes.
//
//   wlb::AttentionMask swa = *wlb::AttentionMask::SlidingWindow(4096);
//   int64_t pairs = swa.Pairs(0, 16384);                  // pairs of a 16K document, one layer
//   absl::StatusOr<wlb::MaskedModel> m = wlb::FindMaskedModel("llama2-7b-swa4k");  // 27 : 5 mix
//   wlb::DocumentCost cost = m->Cost();                   // mask-aware W(d) for any packer
//
// Every mask is per document (a query never sees another document) and causal inside it; query i
// of a document (0-based) sees the keys [KeyBegin(i), i]:
//  - kCausal:        KeyBegin(i) = 0                     -> i + 1 keys
//  - kSlidingWindow: KeyBegin(i) = max(0, i - w + 1)     -> min(i + 1, w) keys (window w >= 1)
//  - kChunkedLocal:  KeyBegin(i) = floor(i / c) * c      -> (i mod c) + 1 keys (chunk c >= 1)
// Pairs(q_begin, q_end) counts the (query, key) pairs of queries [q_begin, q_end) exactly as
// P(q_end) - P(q_begin), where P(n) is the pairs of the first n queries:
//  - causal:  P(n) = n(n+1)/2
//  - window:  P(n) = n(n+1)/2 for n <= w, else w(w+1)/2 + (n - w) * w
//  - chunked: P(n) = floor(n/c) * c(c+1)/2 + r(r+1)/2, r = n mod c
// in int64 (n <= kMaxContext = 2^24 keeps every term below 2^48).
//
// A layer mix says how many layers of a model use which mask (Gemma-3-style 5 local : 1 global,
// Llama-4-style chunked-local : global). Its document cost replaces the causal pair count of the
// FLOP cost model (4 * hidden FLOPs per pair and layer, see cost_model.hpp) by the sum over the
// mix of layers x Pairs(0, d) of that layer's mask; the linear part is unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/document_cost.hpp"

namespace wlb {

enum class MaskKind { kCausal, kSlidingWindow, kChunkedLocal };

// "causal", "window" or "chunk".
inline std::string_view MaskKindName(MaskKind k) {
  switch (k) {
    case MaskKind::kCausal:
      return "causal";
    case MaskKind::kSlidingWindow:
      return "window";
    case MaskKind::kChunkedLocal:
      return "chunk";
  }
  return "unknown";
}

// One layer's attention mask (see the file comment). `size` is the window w or chunk c; 0 for
// causal.
class AttentionMask {
 public:
  AttentionMask() = default;  // causal
  static AttentionMask Causal() { return AttentionMask(); }
  static absl::StatusOr<AttentionMask> SlidingWindow(int64_t window) {
    return Make(MaskKind::kSlidingWindow, window);
  }
  static absl::StatusOr<AttentionMask> ChunkedLocal(int64_t chunk) {
    return Make(MaskKind::kChunkedLocal, chunk);
  }

  // Parses "causal", "window:W" or "chunk:C" (W, C in [1, kMaxContext]).
  static absl::StatusOr<AttentionMask> Parse(std::string_view text) {
    if (text == "causal") return Causal();
    const size_t colon = text.find(':');
    const std::string_view kind = text.substr(0, colon);
    int64_t size = 0;
    if (colon != std::string_view::npos && (kind == "window" || kind == "chunk") &&
        absl::SimpleAtoi(absl::string_view(text.data() + colon + 1, text.size() - colon - 1),
                         &size)) {
      return Make(kind == "window" ? MaskKind::kSlidingWindow : MaskKind::kChunkedLocal, size);
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown attention mask %s; expected causal, window:W or chunk:C", QuoteForMessage(text)));
  }

  MaskKind kind() const { return kind_; }
  int64_t size() const { return size_; }
  bool causal() const { return kind_ == MaskKind::kCausal; }
  // "causal", "window:4096", "chunk:8192".
  std::string Name() const {
    return causal() ? std::string("causal") : absl::StrFormat("%s:%d", MaskKindName(kind_), size_);
  }

  // First key query i (0-based, in its document) sees; it sees keys [KeyBegin(i), i].
  int64_t KeyBegin(int64_t i) const {
    switch (kind_) {
      case MaskKind::kCausal:
        return 0;
      case MaskKind::kSlidingWindow:
        return i - size_ + 1 > 0 ? i - size_ + 1 : 0;
      case MaskKind::kChunkedLocal:
        return i / size_ * size_;
    }
    return 0;
  }

  // Pairs of the first n queries of a document, P(n) of the file comment. Requires
  // 0 <= n <= kMaxContext.
  int64_t PrefixPairs(int64_t n) const {
    switch (kind_) {
      case MaskKind::kCausal:
        return n * (n + 1) / 2;
      case MaskKind::kSlidingWindow:
        return n <= size_ ? n * (n + 1) / 2 : size_ * (size_ + 1) / 2 + (n - size_) * size_;
      case MaskKind::kChunkedLocal: {
        const int64_t r = n % size_;
        return n / size_ * (size_ * (size_ + 1) / 2) + r * (r + 1) / 2;
      }
    }
    return 0;
  }

  // (query, key) pairs of queries [q_begin, q_end) of one document.
  int64_t Pairs(int64_t q_begin, int64_t q_end) const {
    return PrefixPairs(q_end) - PrefixPairs(q_begin);
  }

  friend bool operator==(const AttentionMask&, const AttentionMask&) = default;

 private:
  AttentionMask(MaskKind kind, int64_t size) : kind_(kind), size_(size) {}
  static absl::StatusOr<AttentionMask> Make(MaskKind kind, int64_t size) {
    if (size < 1 || size > kMaxContext) {
      return absl::InvalidArgumentError(absl::StrFormat("%s size must be in [1, %d], got %d",
                                                        MaskKindName(kind), kMaxContext, size));
    }
    return AttentionMask(kind, size);
  }

  MaskKind kind_ = MaskKind::kCausal;
  int64_t size_ = 0;
};

// Layers of one mix at most: keeps layer-weighted pair counts (< 2^48 per layer) inside int64.
inline constexpr int64_t kMaxMixLayers = 4096;

// How many layers use each mask. Entries have layers >= 1 and at most kMaxMixLayers in all; a
// mix has at least one entry.
struct LayerMix {
  std::vector<std::pair<AttentionMask, int64_t>> layers;  // (mask, layer count)

  // One causal layer: the default of every planner (what plans meant before masks existed).
  static LayerMix Causal() { return LayerMix{{{AttentionMask::Causal(), 1}}}; }

  // Parses "window:4096x27,causalx5" (mask x layers, comma separated; "x1" may be left out).
  static absl::StatusOr<LayerMix> Parse(std::string_view text) {
    LayerMix mix;
    for (size_t pos = 0; pos <= text.size();) {
      const size_t comma = std::min(text.find(',', pos), text.size());
      const std::string_view part = text.substr(pos, comma - pos);
      pos = comma + 1;
      int64_t count = 1;
      std::string_view mask_text = part;
      if (const size_t x = part.rfind('x'); x != std::string_view::npos) {
        const std::string_view digits = part.substr(x + 1);
        if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &count) ||
            count < 1 || count > kMaxMixLayers) {
          return absl::InvalidArgumentError(
              absl::StrFormat("layer mix %s: layer count in %s must be an integer in [1, %d]",
                              QuoteForMessage(text), QuoteForMessage(part), kMaxMixLayers));
        }
        mask_text = part.substr(0, x);
      }
      absl::StatusOr<AttentionMask> m = AttentionMask::Parse(mask_text);
      if (!m.ok()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("layer mix %s: %s", QuoteForMessage(text), m.status().message()));
      }
      mix.layers.push_back({*m, count});
      if (mix.total_layers() > kMaxMixLayers) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "layer mix %s: more than %d layers in all", QuoteForMessage(text), kMaxMixLayers));
      }
    }
    return mix;
  }

  int64_t total_layers() const {
    int64_t n = 0;
    for (const auto& [m, count] : layers) n += count;
    return n;
  }
  bool all_causal() const {
    for (const auto& [m, count] : layers) {
      if (!m.causal()) return false;
    }
    return true;
  }
  // Pairs of queries [q_begin, q_end) summed over the mix's layers (layer-weighted).
  int64_t Pairs(int64_t q_begin, int64_t q_end) const {
    int64_t total = 0;
    for (const auto& [m, count] : layers) total += count * m.Pairs(q_begin, q_end);
    return total;
  }
  // "window:4096x27,causalx5".
  std::string Name() const {
    std::vector<std::string> parts;
    for (const auto& [m, count] : layers)
      parts.push_back(absl::StrFormat("%sx%d", m.Name(), count));
    return absl::StrJoin(parts, ",");
  }
};

// A transformer shape with a layer mix: the cost of documents under mixed masks.
struct MaskedModel {
  std::string name;
  TransformerShape shape;
  LayerMix mix;  // total_layers() == shape.layers

  // Forward FLOPs of one document: the linear part of CostModelFromShape, and attention
  // 4 * hidden FLOPs per (query, key) pair and layer, pairs counted under each layer's mask.
  struct Cost {
    CostModel base;           // the causal FLOP model of the shape (its linear part is used)
    double pair_flops = 0.0;  // 4 * hidden
    LayerMix mix;
    double Attention(int64_t d) const { return pair_flops * static_cast<double>(mix.Pairs(0, d)); }
    double Linear(int64_t d) const { return base.Linear(d); }
  };

  // The mask-aware document cost (for packers and bounds).
  absl::StatusOr<DocumentCost> MakeCost() const {
    absl::StatusOr<CostModel> base = CostModelFromShape(shape);
    if (!base.ok()) return base.status();
    if (mix.layers.empty() || mix.total_layers() != shape.layers) {
      return absl::InvalidArgumentError(
          absl::StrFormat("masked model '%s': the layer mix %s has %d layers, the shape %d", name,
                          mix.Name(), mix.total_layers(), shape.layers));
    }
    Cost c{*base, 4.0 * static_cast<double>(shape.hidden), mix};
    return DocumentCost::From(std::move(c), "flop",
                              absl::StrFormat("%s forward FLOPs, masks %s", name, mix.Name()));
  }
};

// Built-in mixes (the shapes are TransformerPresets' LLaMA-2-7B; the mixes follow public model
// designs, the shapes do not claim to be those models):
//  - "llama2-7b-swa4k": Gemma-3-style 5 local : 1 global; 32 layers -> 27 sliding-window (4096)
//    and 5 causal (layers 6, 12, ..., 30 global).
//  - "llama2-7b-chunk8k": Llama-4-style 3 chunked-local (8192) : 1 global; 24 + 8 layers.
//  - "llama2-7b-causal": all 32 layers causal (the mask-blind reference).
inline const std::vector<MaskedModel>& MaskedModelPresets() {
  static const std::vector<MaskedModel> presets = [] {
    const TransformerShape llama = TransformerPresets()[0];
    return std::vector<MaskedModel>{
        {"llama2-7b-swa4k", llama,
         LayerMix{{{*AttentionMask::SlidingWindow(4096), 27}, {AttentionMask::Causal(), 5}}}},
        {"llama2-7b-chunk8k", llama,
         LayerMix{{{*AttentionMask::ChunkedLocal(8192), 24}, {AttentionMask::Causal(), 8}}}},
        {"llama2-7b-causal", llama, LayerMix{{{AttentionMask::Causal(), 32}}}},
    };
  }();
  return presets;
}

inline absl::StatusOr<MaskedModel> FindMaskedModel(std::string_view name) {
  std::vector<std::string> known;
  for (const MaskedModel& m : MaskedModelPresets()) {
    if (m.name == name) return m;
    known.push_back(m.name);
  }
  return absl::NotFoundError(absl::StrFormat("unknown masked model %s (known: %s)",
                                             QuoteForMessage(name), absl::StrJoin(known, ", ")));
}

}  // namespace wlb
