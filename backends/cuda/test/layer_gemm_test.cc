// The layer runner's row-major → cuBLASLt column-major GEMM mapping (src/gemm_layout.h), checked
// on the CPU: a column-major GEMM emulated by hand with cuBLASLt's semantics (D = op(A) op(B),
// shapes and leading dimensions from the layouts) on the memory of row-major operands must give
// the row-major product, for every transpose combination the layer uses and random sizes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/gemm_layout.h"

namespace wlb::cuda::detail {
namespace {

TEST(RowMajorGemm, ColumnMajorEmulationGivesTheRowMajorProduct) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> size(1, 9);
  std::uniform_real_distribution<double> value(-1, 1);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t rows = size(rng), cols = size(rng), inner = size(rng);
    const bool trans_a = trial % 2 == 1, trans_b = trial % 4 >= 2;
    // The user's operands, row-major: A (rows, inner) or (inner, rows); B (inner, cols) or
    // (cols, inner).
    std::vector<double> a(static_cast<size_t>(rows * inner)), b(static_cast<size_t>(inner * cols));
    for (double& x : a) x = value(rng);
    for (double& x : b) x = value(rng);
    auto op_a = [&](int64_t r, int64_t p) { return trans_a ? a[p * rows + r] : a[r * inner + p]; };
    auto op_b = [&](int64_t p, int64_t c) { return trans_b ? b[c * inner + p] : b[p * cols + c]; };
    std::vector<double> want(static_cast<size_t>(rows * cols), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t p = 0; p < inner; ++p) want[r * cols + c] += op_a(r, p) * op_b(p, c);
      }
    }
    const ColumnMajorGemm g = RowMajorGemm(rows, cols, inner, trans_a, trans_b);
    // cuBLASLt: m, n from D's layout; op(first) is (m, k), op(second) is (k, n).
    const int64_t m = g.out_rows, n = g.out_cols;
    const int64_t k = g.trans_first ? g.first_rows : g.first_cols;
    ASSERT_EQ(g.trans_first ? g.first_cols : g.first_rows, m);
    ASSERT_EQ(g.trans_second ? g.second_cols : g.second_rows, k);
    ASSERT_EQ(g.trans_second ? g.second_rows : g.second_cols, n);
    ASSERT_EQ(g.first_rows * g.first_cols, static_cast<int64_t>(b.size()));
    ASSERT_EQ(g.second_rows * g.second_cols, static_cast<int64_t>(a.size()));
    ASSERT_GE(g.first_ld, g.first_rows);
    ASSERT_GE(g.second_ld, g.second_rows);
    ASSERT_GE(g.out_ld, g.out_rows);
    // The first operand's memory is the user's B, the second's the user's A.
    auto first = [&](int64_t i, int64_t p) {
      return g.trans_first ? b[p + i * g.first_ld] : b[i + p * g.first_ld];
    };
    auto second = [&](int64_t p, int64_t j) {
      return g.trans_second ? a[j + p * g.second_ld] : a[p + j * g.second_ld];
    };
    std::vector<double> d(static_cast<size_t>(g.out_ld * n), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p) d[i + j * g.out_ld] += first(i, p) * second(p, j);
      }
    }
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(d[i], want[i], 1e-12)
          << "rows " << rows << " cols " << cols << " inner " << inner << " trans_a " << trans_a
          << " trans_b " << trans_b << " element " << i;
    }
  }
}

}  // namespace
}  // namespace wlb::cuda::detail
