// The shape of one variable-length attention call, independent of any device.
//
// A packed batch holds `batch` segments. Segment b owns query tokens
// [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key/value tokens [cu_seqlens_k[b], cu_seqlens_k[b+1])
// of THD tensors (tokens, heads, head_dim). With `causal`, the mask is aligned bottom-right: the
// last query of a segment sees every key of it, so a CP segment holding queries [a, b) of a
// document, with keys [0, b) gathered, sees exactly what a causal pass over the whole document
// gives those queries. Query row i of a segment (0-based) sees key j iff
// j <= i + (len_k - len_q).
//
//   wlb::cuda::AttentionProblem p;
//   p.cu_seqlens_q = {0, 100, 164};   // two segments: a whole document, then queries [36, 100)
//   p.cu_seqlens_k = {0, 100, 200};   // ... of another whole document of 100 tokens
//   p.max_seqlen_q = 100;  p.max_seqlen_k = 100;
//   p.num_heads = 32;  p.num_kv_heads = 8;  p.head_dim = 128;
//   p.softmax_scale = 1.0f / std::sqrt(128.0f);
//   absl::Status s = wlb::cuda::ValidateProblem(p, wlb::cuda::AttentionKernel::kFlash);
#ifndef WLB_CUDA_ATTENTION_PROBLEM_H_
#define WLB_CUDA_ATTENTION_PROBLEM_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wlb/cuda/attention_tiles.h"

namespace wlb::cuda {

// Which implementation runs the attention.
enum class AttentionKernel {
  kFlash,      // tiled tensor-core kernel; head_dim 64 or 128
  kReference,  // one thread per row, fp32 accumulation; any head_dim up to kMaxReferenceHeadDim
  kCudnn,      // cuDNN fused attention (cudnn-frontend SDPA graphs); head_dim 8..128, x8
};

// The kernel's name as the command-line flags spell it: "flash", "reference", "cudnn".
const char* AttentionKernelName(AttentionKernel kernel);

// The kernel a name spells ("flash", "reference" or "cudnn"); InvalidArgument naming `name` and
// the allowed names otherwise.
absl::StatusOr<AttentionKernel> ParseAttentionKernel(std::string_view name);

// The flash backward configuration's name as the command-line flags spell it: "q64",
// "q64_pass32", "q32", "q64_w8"; "unknown" for a value outside the enum.
const char* FlashBackwardConfigName(FlashBackwardConfig config);

// The configuration a name spells; InvalidArgument naming `name` and the allowed names otherwise.
absl::StatusOr<FlashBackwardConfig> ParseFlashBackwardConfig(std::string_view name);

// OK for the enum's values; InvalidArgument naming the integer value otherwise (a value cast from
// an unchecked integer).
absl::Status ValidateFlashBackwardConfig(FlashBackwardConfig config);

// One varlen attention call's shape; see the file comment for the semantics.
struct AttentionProblem {
  std::vector<int32_t> cu_seqlens_q;  // batch + 1 prefix offsets, starting at 0
  std::vector<int32_t> cu_seqlens_k;  // batch + 1 prefix offsets, starting at 0
  int32_t max_seqlen_q = 0;           // >= every segment's query length
  int32_t max_seqlen_k = 0;           // >= every segment's key length
  int num_heads = 0;                  // query heads
  int num_kv_heads = 0;               // key/value heads; must divide num_heads (GQA)
  int head_dim = 0;
  float softmax_scale = 0.0f;  // > 0 and finite; usually 1 / sqrt(head_dim)
  bool causal = true;          // bottom-right aligned causal mask

  int batch() const { return cu_seqlens_q.empty() ? 0 : static_cast<int>(cu_seqlens_q.size()) - 1; }
  int32_t total_q() const { return cu_seqlens_q.empty() ? 0 : cu_seqlens_q.back(); }
  int32_t total_k() const { return cu_seqlens_k.empty() ? 0 : cu_seqlens_k.back(); }
  int32_t seqlen_q(int b) const { return cu_seqlens_q[b + 1] - cu_seqlens_q[b]; }
  int32_t seqlen_k(int b) const { return cu_seqlens_k[b + 1] - cu_seqlens_k[b]; }
};

// OK when `problem` is a valid input for `kernel`; otherwise InvalidArgument naming the bad
// value and what is allowed. Checks: head counts positive, num_kv_heads divides num_heads,
// head_dim (64 or 128 for kFlash, multiples of 8 up to 128 for kCudnn, 1..kMaxReferenceHeadDim
// for kReference), equal-size cu_seqlens starting at 0 and non-decreasing, max lengths covering
// every segment, softmax_scale finite and positive, every non-empty causal segment having at least
// as many keys as queries (so every query sees a key), and every non-empty non-causal segment
// having a key.
absl::Status ValidateProblem(const AttentionProblem& problem, AttentionKernel kernel);

// Pairs (query, key) that the mask lets through, summed over segments (one head).
int64_t VisiblePairs(const AttentionProblem& problem);

// Useful forward FLOPs: 4 * head_dim * num_heads * VisiblePairs (two GEMMs, 2 FLOPs per MAC).
double ForwardFlops(const AttentionProblem& problem);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_ATTENTION_PROBLEM_H_
