#include "wlb/cuda/attention_problem.h"

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"

namespace wlb::cuda {
namespace {

absl::Status CheckCuSeqlens(const std::vector<int32_t>& cu, const char* name) {
  if (cu.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s has %d entries; needs batch + 1 >= 2", name, cu.size()));
  }
  if (cu[0] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s[0] = %d; must be 0", name, cu[0]));
  }
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] < cu[b]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s decreases at segment %d: %s[%d] = %d > %s[%d] = %d", name, b, name, b, cu[b], name,
          b + 1, cu[b + 1]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* AttentionKernelName(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kFlash:
      return "flash";
    case AttentionKernel::kReference:
      return "reference";
    case AttentionKernel::kCudnn:
      return "cudnn";
  }
  return "unknown";
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(std::string_view name) {
  for (AttentionKernel k :
       {AttentionKernel::kFlash, AttentionKernel::kReference, AttentionKernel::kCudnn}) {
    if (name == AttentionKernelName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown attention kernel '%s'; allowed: flash, reference, cudnn", name));
}

constexpr FlashBackwardConfig kFlashBackwardConfigs[] = {
    FlashBackwardConfig::kQ64, FlashBackwardConfig::kQ64Pass32, FlashBackwardConfig::kQ32,
    FlashBackwardConfig::kQ64Warps8};

const char* FlashBackwardConfigName(FlashBackwardConfig config) {
  switch (config) {
    case FlashBackwardConfig::kQ64:
      return "q64";
    case FlashBackwardConfig::kQ64Pass32:
      return "q64_pass32";
    case FlashBackwardConfig::kQ32:
      return "q32";
    case FlashBackwardConfig::kQ64Warps8:
      return "q64_w8";
  }
  return "unknown";
}

absl::StatusOr<FlashBackwardConfig> ParseFlashBackwardConfig(std::string_view name) {
  for (FlashBackwardConfig c : kFlashBackwardConfigs) {
    if (name == FlashBackwardConfigName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown flash backward config '%s'; allowed: q64, q64_pass32, q32, q64_w8", name));
}

absl::Status ValidateFlashBackwardConfig(FlashBackwardConfig config) {
  for (FlashBackwardConfig c : kFlashBackwardConfigs) {
    if (config == c) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("flash_backward = %d is not a FlashBackwardConfig; allowed: 0 (q64), "
                      "1 (q64_pass32), 2 (q32), 3 (q64_w8)",
                      static_cast<int32_t>(config)));
}

absl::Status ValidateProblem(const AttentionProblem& p, AttentionKernel kernel) {
  if (p.num_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("num_heads = %d; must be > 0", p.num_heads));
  }
  if (p.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_kv_heads = %d; must be > 0", p.num_kv_heads));
  }
  if (p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_kv_heads = %d does not divide num_heads = %d", p.num_kv_heads, p.num_heads));
  }
  if (kernel == AttentionKernel::kFlash) {
    if (p.head_dim != 64 && p.head_dim != 128) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "head_dim = %d is not supported by the flash kernel; allowed: 64, 128", p.head_dim));
    }
  } else if (kernel == AttentionKernel::kCudnn) {
    // cuDNN's fused attention takes head dims that are multiples of 8; up to 128 forward and
    // backward on every Hopper release of cuDNN 9 (larger ones need newer releases).
    if (p.head_dim < 8 || p.head_dim > 128 || p.head_dim % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "head_dim = %d is not supported by the cudnn kernel; allowed: multiples of 8 in "
          "[8, 128]",
          p.head_dim));
    }
  } else if (p.head_dim < 1 || p.head_dim > kMaxReferenceHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head_dim = %d is not supported by the reference kernel; allowed: 1..%d",
                        p.head_dim, kMaxReferenceHeadDim));
  }
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("softmax_scale = %g; must be finite and > 0", p.softmax_scale));
  }
  if (absl::Status s = CheckCuSeqlens(p.cu_seqlens_q, "cu_seqlens_q"); !s.ok()) return s;
  if (absl::Status s = CheckCuSeqlens(p.cu_seqlens_k, "cu_seqlens_k"); !s.ok()) return s;
  if (p.cu_seqlens_q.size() != p.cu_seqlens_k.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cu_seqlens_q has %d entries but cu_seqlens_k has %d; must be equal",
                        p.cu_seqlens_q.size(), p.cu_seqlens_k.size()));
  }
  for (int b = 0; b < p.batch(); ++b) {
    const int32_t lq = p.seqlen_q(b);
    const int32_t lk = p.seqlen_k(b);
    if (lq > p.max_seqlen_q) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "segment %d has %d queries > max_seqlen_q = %d", b, lq, p.max_seqlen_q));
    }
    if (lk > p.max_seqlen_k) {
      return absl::InvalidArgumentError(
          absl::StrFormat("segment %d has %d keys > max_seqlen_k = %d", b, lk, p.max_seqlen_k));
    }
    if (lq > 0 && p.causal && lk < lq) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "causal segment %d has %d queries but only %d keys; bottom-right alignment needs "
          "seqlen_k >= seqlen_q",
          b, lq, lk));
    }
    if (lq > 0 && lk == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("segment %d has %d queries and no keys", b, lq));
    }
  }
  return absl::OkStatus();
}

int64_t VisiblePairs(const AttentionProblem& p) {
  int64_t pairs = 0;
  for (int b = 0; b < p.batch(); ++b) {
    const int64_t lq = p.seqlen_q(b);
    const int64_t lk = p.seqlen_k(b);
    if (!p.causal) {
      pairs += lq * lk;
    } else {
      // Row i sees (lk - lq) + i + 1 keys.
      pairs += lq * (lk - lq) + lq * (lq + 1) / 2;
    }
  }
  return pairs;
}

double ForwardFlops(const AttentionProblem& p) {
  return 4.0 * p.head_dim * p.num_heads * static_cast<double>(VisiblePairs(p));
}

}  // namespace wlb::cuda
