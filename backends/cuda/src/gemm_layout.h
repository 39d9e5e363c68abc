// A row-major GEMM as cuBLASLt (column-major) sees it. Host only, no CUDA: the layer runner builds
// its descriptors from it and a CPU test checks it against a column-major GEMM emulated by hand.
//
// Row-major D (rows, cols) = op(A) (rows, inner) . op(B) (inner, cols), where A is stored
// row-major as (rows, inner), or (inner, rows) when trans_a, and B as (inner, cols), or
// (cols, inner) when trans_b. A row-major (r, c) matrix is a column-major (c, r) one with leading
// dimension c, so cuBLASLt computes D^T (cols, rows) = op(B)^T op(A)^T: its first operand is the
// user's B, its second the user's A.
#ifndef WLB_CUDA_SRC_GEMM_LAYOUT_H_
#define WLB_CUDA_SRC_GEMM_LAYOUT_H_

#include <cstdint>

namespace wlb::cuda::detail {

struct ColumnMajorGemm {
  // cuBLASLt's A (the user's B): transposed?, stored column-major shape and leading dimension.
  bool trans_first = false;
  int64_t first_rows = 0, first_cols = 0, first_ld = 0;
  // cuBLASLt's B (the user's A).
  bool trans_second = false;
  int64_t second_rows = 0, second_cols = 0, second_ld = 0;
  // C and D: column-major (cols, rows), leading dimension cols.
  int64_t out_rows = 0, out_cols = 0, out_ld = 0;
};

inline ColumnMajorGemm RowMajorGemm(int64_t rows, int64_t cols, int64_t inner, bool trans_a,
                                    bool trans_b) {
  ColumnMajorGemm g;
  g.trans_first = trans_b;  // B (inner, cols) row-major is (cols, inner) column-major: op N
  g.first_rows = trans_b ? inner : cols;
  g.first_cols = trans_b ? cols : inner;
  g.first_ld = g.first_rows;
  g.trans_second = trans_a;  // A (rows, inner) row-major is (inner, rows) column-major: op N
  g.second_rows = trans_a ? rows : inner;
  g.second_cols = trans_a ? inner : rows;
  g.second_ld = g.second_rows;
  g.out_rows = cols;
  g.out_cols = rows;
  g.out_ld = cols;
  return g;
}

}  // namespace wlb::cuda::detail

#endif  // WLB_CUDA_SRC_GEMM_LAYOUT_H_
