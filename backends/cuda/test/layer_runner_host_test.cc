// The layer runner's host side on the CPU: its row-major → cuBLASLt column-major GEMM mapping
// (src/gemm_layout.h) against a column-major GEMM emulated by hand with cuBLASLt's semantics
// (D = op(A) op(B), shapes and leading dimensions from the layouts) on the memory of row-major
// operands, for every transpose combination and random sizes; its memory estimate; and the
// errors Create reports before touching a device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/gemm_layout.h"
#include "wlb/cuda/layer_runner.h"

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

TEST(LayerRunnerHost, DeviceBytesCountsEveryBufferAndRejectsOverflow) {
  const LayerShape s{
      .name = "t", .hidden = 64, .heads = 2, .kv_heads = 1, .head_dim = 32, .ffn = 96};
  // Per token: bf16 forward x a h b y dy (6 x 64) q o (2 x 64) k v (2 x 32) gu s (3 x 96), fp32
  // rstd1 rstd2, fp32 LSE per head, int32 position; weights once; 32 MiB GEMM workspace.
  const int64_t fwd_row = 2 * (6 * 64 + 2 * 64 + 2 * 32 + 3 * 96) + 8 + 4 * 2 + 4;
  const int64_t bwd_row = 2 * (4 * 64 + 2 * 64 + 2 * 32 + 3 * 96);
  const int64_t weights = 2 * 64 + 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96;
  absl::StatusOr<int64_t> fwd = LayerRunner::DeviceBytes(s, 1000, false);
  absl::StatusOr<int64_t> both = LayerRunner::DeviceBytes(s, 1000, true);
  ASSERT_TRUE(fwd.ok() && both.ok());
  EXPECT_EQ(*fwd, 1000 * fwd_row + 2 * weights + 8 * 64 + (int64_t{32} << 20));
  EXPECT_EQ(*both, 1000 * (fwd_row + bwd_row) + 4 * weights + 8 * 64 + (int64_t{32} << 20));
  const LayerShape wide{.name = "w",
                        .hidden = 1 << 20,
                        .heads = 1 << 20,
                        .kv_heads = 1 << 20,
                        .head_dim = 256,
                        .ffn = 1 << 20};
  EXPECT_THAT(LayerRunner::DeviceBytes(wide, int64_t{1} << 40, true).status().message(),
              ::testing::HasSubstr("overflows 64 bits"));
}

TEST(LayerRunnerHost, CreateRejectsBadArgumentsBeforeTheDevice) {
  LayerShape s{.name = "t", .hidden = 64, .heads = 2, .kv_heads = 1, .head_dim = 32, .ffn = 96};
  const LayerParams w = RandomLayerParams(s, 1);
  EXPECT_THAT(LayerRunner::Create(s, w, 0, {}).status().message(),
              ::testing::HasSubstr("capacity must be in [1, 2^31) tokens, got 0"));
  LayerParams short_w = w;
  short_w.wo.pop_back();
  EXPECT_THAT(LayerRunner::Create(s, short_w, 10, {}).status().message(),
              ::testing::HasSubstr("wo has 4095 values, the shape needs 4096"));
  LayerShape wide = s;
  wide.hidden = 16384;
  EXPECT_THAT(LayerRunner::Create(wide, RandomLayerParams(wide, 1), 10, {}).status().message(),
              ::testing::HasSubstr("hidden 16384 is over the RMSNorm kernels' limit of 12288"));
  s.kv_heads = 2;
  s.heads = 3;
  EXPECT_THAT(LayerRunner::Create(s, w, 10, {}).status().message(),
              ::testing::HasSubstr("kv_heads (2) must divide heads (3)"));
}

}  // namespace
}  // namespace wlb::cuda::detail
