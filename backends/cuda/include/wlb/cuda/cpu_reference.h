// Float64 CPU reference for varlen attention, forward and backward.
//
// The ground truth that the device kernels are checked against on small shapes. Inputs are the
// float values of the bf16 tensors (THD, row-major, contiguous); everything is computed in
// double. Same semantics as the device API (see attention_problem.h); LSE is natural-log,
// laid out (num_heads, total_q).
//
//   wlb::cuda::AttentionProblem p = ...;
//   std::vector<float> q = ..., k = ..., v = ..., dout = ...;
//   absl::StatusOr<wlb::cuda::CpuForward> f = wlb::cuda::CpuAttentionForward(p, q, k, v);
//   absl::StatusOr<wlb::cuda::CpuGradients> g = wlb::cuda::CpuAttentionBackward(p, q, k, v, dout);
#ifndef WLB_CUDA_CPU_REFERENCE_H_
#define WLB_CUDA_CPU_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wlb/cuda/attention_problem.h"

namespace wlb::cuda {

struct CpuForward {
  std::vector<double> out;  // (total_q, num_heads, head_dim)
  std::vector<double> lse;  // (num_heads, total_q)
};

struct CpuGradients {
  std::vector<double> dq;  // (total_q, num_heads, head_dim)
  std::vector<double> dk;  // (total_k, num_kv_heads, head_dim)
  std::vector<double> dv;  // (total_k, num_kv_heads, head_dim)
};

// Forward pass. InvalidArgument when the problem is invalid (reference kernel rules) or a tensor
// has the wrong element count (the message names the tensor and both counts).
absl::StatusOr<CpuForward> CpuAttentionForward(const AttentionProblem& problem,
                                               absl::Span<const float> q,
                                               absl::Span<const float> k,
                                               absl::Span<const float> v);

// Gradients of sum(out * dout) with respect to q, k and v; same errors as the forward.
absl::StatusOr<CpuGradients> CpuAttentionBackward(const AttentionProblem& problem,
                                                  absl::Span<const float> q,
                                                  absl::Span<const float> k,
                                                  absl::Span<const float> v,
                                                  absl::Span<const float> dout);

// The reference on chosen rows only, for problems too large for the whole reference (one 128K
// document is ~10^12 multiply-adds). Row indices are global (packed) indices.
struct CpuRows {
  std::vector<double> out;  // (query_rows, num_heads, head_dim)
  std::vector<double> lse;  // (query_rows, num_heads)
  std::vector<double> dq;   // (query_rows, num_heads, head_dim); backward only
  std::vector<double> dk;   // (key_rows, num_kv_heads, head_dim); backward only
  std::vector<double> dv;   // (key_rows, num_kv_heads, head_dim); backward only
};

// Forward of `query_rows`: the same values as CpuAttentionForward at those rows, at the cost of
// those rows alone. InvalidArgument for the forward's errors or a row outside [0, total_q).
absl::StatusOr<CpuRows> CpuAttentionForwardRows(const AttentionProblem& problem,
                                                absl::Span<const float> q,
                                                absl::Span<const float> k,
                                                absl::Span<const float> v,
                                                absl::Span<const int64_t> query_rows);

// Backward of `query_rows` (dq) and `key_rows` (dk, dv) given the forward's `out` (total_q,
// num_heads, head_dim) and `lse` (num_heads, total_q), as the backward kernels define it:
// P = exp(scale * q.k - lse), D = rowsum(dout * out), dS = P (dout.v - D). With the exact out and
// lse these are CpuAttentionBackward's values; a key row costs one pass over the queries that
// see it. InvalidArgument for the forward's errors, a wrong out/lse/dout size or a row out of
// range. `out` and `lse` are not returned.
absl::StatusOr<CpuRows> CpuAttentionBackwardRows(
    const AttentionProblem& problem, absl::Span<const float> q, absl::Span<const float> k,
    absl::Span<const float> v, absl::Span<const float> out, absl::Span<const float> dout,
    absl::Span<const float> lse, absl::Span<const int64_t> query_rows,
    absl::Span<const int64_t> key_rows);
// The same with the forward's out and lse in float64 (the CP emulation's split schedule passes
// the merged out and lse of a whole row, which no float rounding may perturb).
absl::StatusOr<CpuRows> CpuAttentionBackwardRows(
    const AttentionProblem& problem, absl::Span<const float> q, absl::Span<const float> k,
    absl::Span<const float> v, absl::Span<const double> out, absl::Span<const float> dout,
    absl::Span<const double> lse, absl::Span<const int64_t> query_rows,
    absl::Span<const int64_t> key_rows);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_CPU_REFERENCE_H_
