// Kernel latency model: how long one CP rank's varlen causal attention call takes.
//
//   wlb::KernelModel model = wlb::KernelModel::Default();          // measured H100 table
//   double ms = model.SegmentMs(/*q_len=*/512, /*kv_len=*/2048);   // queries [1536, 2048) of a doc
//
//   absl::StatusOr<wlb::KernelModel> measured =
//       wlb::ReadKernelProfileCsv("h200-fwd.csv");  // q_len,kv_len,ms rows
//       (wlb/io/kernel_profile.hpp)
//
// A segment holds q_len queries of a document whose keys are the first kv_len tokens (kv_len >=
// q_len, causal mask aligned bottom-right: query row i sees keys [0, kv_len - q_len + i]). A
// tiled kernel computes whole tile_q x tile_k blocks, so the model counts FLOPs block by block:
// query tile t visits ceil(keys its last row sees / tile_k) key tiles, and each visited block
// costs 4 * head_dim * heads * tile_q * tile_k FLOPs (QK^T and PV, 2 FLOPs per multiply-add).
// The predicted latency of a segment is those padded FLOPs divided by the throughput the kernel
// achieves at that shape, plus a fixed per-segment overhead:
//
//   SegmentMs(q, kv) = PaddedFlops(q, kv) / Throughput(q, kv) + segment_overhead_ms
//
// Throughput comes from one of two sources:
//  - Analytic (DefaultAnalytic(), or Analytic() with fitted constants): peak * qp / (qp + q_half) *
//    kvp / (kvp + kv_half), qp and kvp the lengths padded to the tiles. Few query rows leave the
//    GPU's SMs idle, hence the q_half term; it makes latency flat for q_len 1..tile_q and lifts
//    achieved TFLOP/s between 128 and 256 query rows, as the WLB-LLM paper measured. The defaults
//    (tile 128, peak 345 TFLOP/s, q_half 160, kv_half 0, 1 us per segment; 32 heads x 128
//    head_dim, one LLaMA-2-7B layer forward) are a least-squares fit in log space to the
//    FlashAttention-2 H100 causal forward figures 191 / 298 / 335 TFLOP/s at 512 / 2K / 16K
//    tokens (public FlashAttention benchmarks, FLOPs counted unpadded); the model gives
//    192 / 299 / 339.
//  - A profile table (CSV with columns q_len, kv_len, ms; other columns ignored) of single-segment
//    calls: each row gives the throughput PaddedFlops(q_len, kv_len) / ms; other shapes
//    interpolate it linearly in (log2 q_len, log2 kv_len) and clamp outside the table. The
//    table's ms already contain the per-call cost, so its per-segment overhead defaults to 0.
//    Default() is such a table, embedded: wlb's flash kernel forward on an H100, 103 shapes.
//
// Latencies are forward-pass milliseconds of one layer for `heads` query heads (heads per GPU
// after tensor parallelism).
//
// One CP rank runs all its segments as ONE varlen call, and two more readings predict such a call
// (CallSegment lists; a rank's segments as {q_len, q_end}):
//  - PackedMs, the packed reading of the throughput above: each segment's padded FLOPs at the
//    throughput of the call's total query rows (the segments fill the GPU together; a short
//    segment timed alone runs on a mostly idle GPU). Forward only.
//  - A packed-call fit (WithPackedCalls; fitted by FitPackedCalls in wlb/cost/cost_fit.hpp from
//    the calls wlb_cuda_kernel_profiler --packed_micro_batches=N times, read by
//    ReadPackedCallProfile in wlb/io/kernel_profile.hpp): per call, forward ms and, when the
//    profile has it, backward ms as non-negative weights on PackedCallFeatures (padded GFLOPs,
//    masked GFLOPs, query and key rows, segments, the call). Backward is not a constant multiple
//    of forward: cuDNN's bottom-right causal backward computes the masked tiles (the masked
//    GFLOPs feature), so plans with longer CP segments pay more backward per forward ms.
// CallMs ranks plans: the fit's forward + backward when the model has one, else the summed
// SegmentMs of the call (every model without a fit ranks exactly as before).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"

namespace wlb {

// Attention shape and kernel tiling shared by both throughput sources.
struct KernelShape {
  int64_t heads = 32;      // query heads on one GPU
  int64_t head_dim = 128;  // per head
  int64_t tile_q = 128;    // query rows per kernel block
  int64_t tile_k = 128;    // key rows per kernel block
};

// Constants of the analytic throughput curve (see the file comment for where they come from).
struct AnalyticKernelParams {
  KernelShape shape;
  double peak_tflops = 345.0;         // asymptotic TFLOP/s on padded FLOPs
  double q_half = 160.0;              // query rows at which throughput is half of peak
  double kv_half = 0.0;               // key rows at which throughput is half of peak (0: none)
  double segment_overhead_ms = 1e-3;  // fixed cost of one more segment in a varlen call
};

// One measured single-segment call.
struct KernelProfilePoint {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  double ms = 0.0;
};

// One segment of a packed varlen call: q_len queries whose keys are the first kv_len tokens of
// their document (a CP rank's Segment is {q_len(), q_end}).
struct CallSegment {
  int64_t q_len = 0;
  int64_t kv_len = 0;
};

// The features a packed-call fit weighs, in this order (PackedCallFeatures computes them).
inline constexpr int kPackedCallFeatureCount = 6;
inline constexpr std::array<const char*, kPackedCallFeatureCount> kPackedCallFeatureNames = {
    "padded_gflop",  // sum of PaddedFlops / 1e9 (the tiles a causal kernel visits)
    "masked_gflop",  // sum of 4 * heads * head_dim * q_len * (q_len - 1) / 2 / 1e9: the masked
                     // part of each segment's q_len x kv_len rectangle
    "q_krows",       // query rows / 1000
    "kv_krows",      // key rows (sum of kv_len) / 1000
    "segments",      // segments in the call
    "call",          // 1: the fixed cost of a call
};

// One measured packed call (a CP rank's segments as one varlen call): its forward ms and, when
// measured, its backward ms (0: not measured).
struct PackedCallPoint {
  std::vector<CallSegment> segments;
  double fwd_ms = 0.0;
  double bwd_ms = 0.0;
};

// A packed-call fit: per call, ms = sum_j weight[j] * feature[j], for the forward and (when
// has_backward) the backward. Weights are ms per feature unit and must be >= 0 and finite.
struct PackedCallFit {
  std::array<double, kPackedCallFeatureCount> fwd{};
  std::array<double, kPackedCallFeatureCount> bwd{};
  bool has_backward = false;
  int points = 0;                 // calls it was fitted to
  double fwd_rms_relative = 0.0;  // on those calls: sqrt(mean(((fit - ms) / ms)^2))
  double bwd_rms_relative = 0.0;  // (0 without backward)
};

// Predicts the latency of causal varlen attention segments; immutable once built.
class KernelModel {
 public:
  // The model used when nothing was measured on the user's machine: the single-segment forward
  // table of wlb's flash kernel on an H100 (docs/results/gpu/h100_kernel_profile_flash.csv,
  // embedded by tools/gen_default_kernel_profile.py; 32 heads x 128 head_dim, one LLaMA-2-7B
  // layer). Ranking CP plans needs each shape's cost to about 1%: the analytic curve is off this
  // table by an RMS log error of 0.62 (up to 3.5x on short segments), which left adaptive up to
  // 6.7% slower than the fastest plan under the table (docs/results/cp/balance.md); it stays
  // available as DefaultAnalytic(). Built once; a reference, so passing it copies no table.
  static const KernelModel& Default() {
    static const KernelModel model = [] {
      static constexpr KernelProfilePoint kH100Flash[] = {
#include "wlb/cost/default_kernel_profile.inc"
      };
      absl::StatusOr<KernelModel> m = FromProfile(kH100Flash);
      if (!m.ok()) std::abort();  // the embedded rows are valid (kernel_model_test reads them)
      return *std::move(m);
    }();
    return model;
  }

  // The analytic model with the documented defaults (see the file comment).
  static KernelModel DefaultAnalytic() { return KernelModel(AnalyticKernelParams{}); }

  // The analytic model with custom constants; errors name the bad constant.
  static absl::StatusOr<KernelModel> Analytic(const AnalyticKernelParams& p) {
    if (absl::Status s = ValidateShape(p.shape); !s.ok()) return s;
    if (!(p.peak_tflops > 0.0) || !std::isfinite(p.peak_tflops)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "kernel model: peak_tflops must be > 0 and finite, got %g", p.peak_tflops));
    }
    for (auto [name, v] : {std::pair{"q_half", p.q_half}, std::pair{"kv_half", p.kv_half},
                           std::pair{"segment_overhead_ms", p.segment_overhead_ms}}) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("kernel model: %s must be >= 0 and finite, got %g", name, v));
      }
    }
    return KernelModel(p);
  }

  // A model whose throughput comes from measured points (see the file comment). Rows with the
  // same (q_len, kv_len) are averaged.
  static absl::StatusOr<KernelModel> FromProfile(std::span<const KernelProfilePoint> points,
                                                 const KernelShape& shape = {},
                                                 double segment_overhead_ms = 0.0) {
    if (absl::Status s = ValidateShape(shape); !s.ok()) return s;
    if (!(segment_overhead_ms >= 0.0) || !std::isfinite(segment_overhead_ms)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("kernel model: segment_overhead_ms must be >= 0 and finite, got %g",
                          segment_overhead_ms));
    }
    if (points.empty()) {
      return absl::InvalidArgumentError("kernel profile: no points (need at least one row)");
    }
    std::map<std::pair<int64_t, int64_t>, std::pair<double, int>> acc;
    for (size_t i = 0; i < points.size(); ++i) {
      const KernelProfilePoint& p = points[i];
      if (p.q_len <= 0 || p.kv_len < p.q_len || p.kv_len > kMaxContext) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "kernel profile point %d: need 0 < q_len <= kv_len <= %d, got q_len %d, kv_len %d", i,
            kMaxContext, p.q_len, p.kv_len));
      }
      if (!(p.ms >= kMinProfileMs) || !(p.ms <= kMaxProfileMs)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("kernel profile point %d: ms must be in [%g, %g], got %g", i,
                            kMinProfileMs, kMaxProfileMs, p.ms));
      }
      auto& [sum, n] = acc[{p.q_len, p.kv_len}];
      sum += p.ms;
      ++n;
    }
    KernelModel m(AnalyticKernelParams{.shape = shape, .segment_overhead_ms = segment_overhead_ms});
    m.analytic_ = false;
    for (const auto& [key, sum_n] : acc) {
      const auto [q, kv] = key;
      const double flops_per_ms = m.PaddedFlops(q, kv) / (sum_n.first / sum_n.second);
      if (m.row_q_.empty() || m.row_q_.back() != q) {
        m.row_q_.push_back(q);
        m.rows_.emplace_back().log_q = std::log2(static_cast<double>(q));
      }
      m.rows_.back().kv.push_back(kv);
      m.rows_.back().log_kv.push_back(std::log2(static_cast<double>(kv)));
      m.rows_.back().flops_per_ms.push_back(flops_per_ms);
    }
    for (Row& row : m.rows_) row.kv_starts.Build(row.kv);
    m.row_starts_.Build(m.row_q_);
    m.table_id_ = NewTableId();
    return m;
  }

  // This model with a packed-call fit (see the file comment); CallMs then ranks by it. Errors
  // name the first negative or non-finite weight.
  absl::StatusOr<KernelModel> WithPackedCalls(const PackedCallFit& fit) const {
    for (int pass = 0; pass < 2; ++pass) {
      const auto& w = pass == 0 ? fit.fwd : fit.bwd;
      if (pass == 1 && !fit.has_backward) break;
      for (int j = 0; j < kPackedCallFeatureCount; ++j) {
        if (!(w[j] >= 0.0) || !std::isfinite(w[j])) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "packed-call fit: %s weight of %s must be >= 0 and finite, got %g",
              pass == 0 ? "forward" : "backward", kPackedCallFeatureNames[j], w[j]));
        }
      }
    }
    KernelModel m = *this;
    m.packed_ = fit;
    m.has_packed_ = true;
    return m;
  }

  bool has_packed_calls() const { return has_packed_; }
  // The fit CallMs uses (meaningful only when has_packed_calls()).
  const PackedCallFit& packed_calls() const { return packed_; }

  // The features of one packed call (kPackedCallFeatureNames). Segments with q_len <= 0 add
  // nothing; kv_len >= q_len is required of the others.
  std::array<double, kPackedCallFeatureCount> PackedCallFeatures(
      std::span<const CallSegment> segments) const {
    std::array<double, kPackedCallFeatureCount> f{};
    const double per_pair = 4.0 * static_cast<double>(params_.shape.head_dim * params_.shape.heads);
    for (const CallSegment& s : segments) {
      if (s.q_len <= 0) continue;
      const double q = static_cast<double>(s.q_len);
      f[0] += PaddedFlops(s.q_len, s.kv_len) / 1e9;
      f[1] += per_pair * q * (q - 1.0) / 2.0 / 1e9;
      f[2] += q / 1e3;
      f[3] += static_cast<double>(s.kv_len) / 1e3;
      f[4] += 1.0;
    }
    f[5] = 1.0;
    return f;
  }

  // The packed reading of this model's throughput (forward ms of one call): each segment's
  // padded FLOPs at FlopsPerMs(the call's query rows, its kv_len), plus the segment overhead.
  double PackedMs(std::span<const CallSegment> segments) const {
    int64_t rows = 0;
    for (const CallSegment& s : segments) rows += std::max<int64_t>(s.q_len, 0);
    double ms = 0.0;
    for (const CallSegment& s : segments) {
      if (s.q_len <= 0) continue;
      ms +=
          PaddedFlops(s.q_len, s.kv_len) / FlopsPerMs(rows, s.kv_len) + params_.segment_overhead_ms;
    }
    return ms;
  }

  // The packed-call fit's forward and backward ms of one call (0 without a fit; backward 0
  // without backward in the fit).
  double CallForwardMs(std::span<const CallSegment> segments) const {
    return has_packed_ ? Weigh(packed_.fwd, PackedCallFeatures(segments)) : 0.0;
  }
  double CallBackwardMs(std::span<const CallSegment> segments) const {
    return has_packed_ && packed_.has_backward ? Weigh(packed_.bwd, PackedCallFeatures(segments))
                                               : 0.0;
  }

  // What plans are ranked by, per call: the packed-call fit's forward + backward when the model
  // has one, else the sum of SegmentMs over the segments (forward).
  double CallMs(std::span<const CallSegment> segments) const {
    if (has_packed_) return CallForwardMs(segments) + CallBackwardMs(segments);
    double ms = 0.0;
    for (const CallSegment& s : segments) ms += SegmentMs(s.q_len, s.kv_len);
    return ms;
  }

  // What one more segment adds to CallMs: with a packed-call fit, the fit's forward + backward of
  // the segment less the call's fixed cost; else SegmentMs. Strategies that deal segments by
  // kernel time (balanced-chunks) deal by it, so they balance what adaptive ranks plans by.
  double SegmentCallMs(int64_t q_len, int64_t kv_len) const {
    if (!has_packed_) return SegmentMs(q_len, kv_len);
    if (q_len <= 0) return 0.0;
    const CallSegment one[] = {{q_len, kv_len}};
    std::array<double, kPackedCallFeatureCount> f = PackedCallFeatures(one);
    f[kPackedCallFeatureCount - 1] = 0.0;  // the call's fixed cost is paid once per rank
    return Weigh(packed_.fwd, f) + (packed_.has_backward ? Weigh(packed_.bwd, f) : 0.0);
  }

  // The passes CallMs covers, each moving a plan's K/V exchange once: 2 (forward, and backward
  // returning dK/dV) with a packed-call fit that has backward, else 1 (forward).
  int passes() const { return has_packed_ && packed_.has_backward ? 2 : 1; }

  const KernelShape& shape() const { return params_.shape; }
  int64_t tile_q() const { return params_.shape.tile_q; }
  int64_t tile_k() const { return params_.shape.tile_k; }
  double segment_overhead_ms() const { return params_.segment_overhead_ms; }
  bool analytic() const { return analytic_; }

  // FLOPs the tiled kernel spends on q_len queries whose keys are the first kv_len tokens
  // (0 when q_len <= 0). Requires kv_len >= q_len.
  double PaddedFlops(int64_t q_len, int64_t kv_len) const {
    if (q_len <= 0) return 0.0;
    const int64_t tq = params_.shape.tile_q;
    const int64_t tk = params_.shape.tile_k;
    const int64_t offset = kv_len - q_len;  // keys before the segment's first query
    const int64_t full = q_len / tq;
    int64_t blocks = 0;
    if (tq % tk == 0) {
      // Full tile t's last row sees offset + (t+1)*tq keys: ceil(offset/tk) + (t+1)*tq/tk tiles.
      blocks = full * CeilDiv(offset, tk) + (tq / tk) * full * (full + 1) / 2;
    } else {
      for (int64_t t = 0; t < full; ++t) blocks += CeilDiv(offset + (t + 1) * tq, tk);
    }
    if (q_len % tq != 0) blocks += CeilDiv(kv_len, tk);
    return 4.0 * static_cast<double>(params_.shape.head_dim * params_.shape.heads) *
           static_cast<double>(tq * tk) * static_cast<double>(blocks);
  }

  // Achieved FLOPs per millisecond at this shape.
  double FlopsPerMs(int64_t q_len, int64_t kv_len) const {
    if (analytic_) {
      const double qp = static_cast<double>(CeilDiv(q_len, tile_q()) * tile_q());
      const double kvp = static_cast<double>(CeilDiv(kv_len, tile_k()) * tile_k());
      return params_.peak_tflops * 1e9 * (qp / (qp + params_.q_half)) *
             (kvp / (kvp + params_.kv_half));
    }
    q_len = std::max<int64_t>(q_len, 1);
    kv_len = std::max<int64_t>(kv_len, 1);
    // Planning asks a table for the same shapes many times (a plan is bounded, priced and
    // rebuilt from the same segments): each thread keeps the last shapes it was asked, by table,
    // so a repeat costs a lookup, not two searches and two log2 (adaptive at C = 8 repeats 60% of
    // its shapes). The memo holds what TableFlopsPerMs returned, so the bits are the same.
    ShapeMemo& memo = ShapeMemoOf(q_len, kv_len);
    if (memo.table != table_id_ || memo.q_len != q_len || memo.kv_len != kv_len) {
      memo = {table_id_, q_len, kv_len, TableFlopsPerMs(q_len, kv_len)};
    }
    return memo.flops_per_ms;
  }

  // Predicted latency (ms) of one segment; 0 for an empty one.
  double SegmentMs(int64_t q_len, int64_t kv_len) const {
    if (q_len <= 0) return 0.0;
    if (fast_ && kv_len > 0) {
      // Power-of-two tiles, tile_q a multiple of tile_k: the same operations as PaddedFlops (so
      // the same bits) with tile divisions as shifts and constant factors precomputed; for the
      // analytic model also FlopsPerMs's, the key factor kvp / (kvp + kv_half) skipped when
      // kv_half is 0 (it is exactly 1 for kvp > 0).
      const int64_t full = q_len >> q_shift_;
      const int64_t offset = kv_len - q_len;
      int64_t blocks = full * CeilShift(offset, k_shift_) + tile_ratio_ * full * (full + 1) / 2;
      if ((q_len & (params_.shape.tile_q - 1)) != 0) blocks += CeilShift(kv_len, k_shift_);
      const double flops = flops_per_block_ * static_cast<double>(blocks);
      if (!analytic_) return flops / FlopsPerMs(q_len, kv_len) + params_.segment_overhead_ms;
      const double qp = static_cast<double>(CeilShift(q_len, q_shift_) << q_shift_);
      double per_ms = peak_per_ms_ * (qp / (qp + params_.q_half));
      if (params_.kv_half != 0.0) {
        const double kvp = static_cast<double>(CeilShift(kv_len, k_shift_) << k_shift_);
        per_ms = per_ms * (kvp / (kvp + params_.kv_half));
      }
      return flops / per_ms + params_.segment_overhead_ms;
    }
    return PaddedFlops(q_len, kv_len) / FlopsPerMs(q_len, kv_len) + params_.segment_overhead_ms;
  }

 private:
  // A table's throughput at q_len, kv_len >= 1. Lengths are searched as integers and log2 taken
  // only to interpolate: a length on the grid or outside it gives the row or column itself, the
  // bits the interpolation gives there.
  double TableFlopsPerMs(int64_t q_len, int64_t kv_len) const {
    const size_t upper = row_starts_.UpperBound(row_q_, q_len);
    const double lkv = std::log2(static_cast<double>(kv_len));
    if (upper == 0) return rows_.front().At(kv_len, lkv);
    const Row& lo = rows_[upper - 1];
    if (upper == rows_.size() || row_q_[upper - 1] == q_len) return lo.At(kv_len, lkv);
    const Row& hi = rows_[upper];
    const double w = (std::log2(static_cast<double>(q_len)) - lo.log_q) / (hi.log_q - lo.log_q);
    return (1.0 - w) * lo.At(kv_len, lkv) + w * hi.At(kv_len, lkv);
  }

  // One remembered shape of FlopsPerMs: the table it was asked of (table_id_; 0 is none) and
  // the answer.
  struct ShapeMemo {
    uint64_t table = 0;
    int64_t q_len = 0, kv_len = 0;
    double flops_per_ms = 0.0;
  };
  // This thread's memo slot for a shape: direct-mapped, kShapeMemoSlots slots (32 KiB), indexed
  // by the top bits of a multiplicative hash.
  static constexpr size_t kShapeMemoSlots = 1024;
  static_assert(std::has_single_bit(kShapeMemoSlots));
  static ShapeMemo& ShapeMemoOf(int64_t q_len, int64_t kv_len) {
    static thread_local std::array<ShapeMemo, kShapeMemoSlots> memo{};
    const uint64_t h = (static_cast<uint64_t>(q_len) * 0x9E3779B97F4A7C15ull) ^
                       (static_cast<uint64_t>(kv_len) * 0xC2B2AE3D27D4EB4Full);
    return memo[h >> (64 - std::countr_zero(kShapeMemoSlots))];
  }
  // A number per table built (FromProfile), shared by its copies: the table never changes after.
  static uint64_t NewTableId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  // std::upper_bound over ascending lengths >= 1, started at the first length of x's bit width
  // (a table has a few lengths per octave, so the scan after it is short).
  struct OctaveStarts {
    // By bit width of a positive int64_t (1..63): index of the first length >= 2^(width-1).
    std::array<uint32_t, 64> first{};

    void Build(const std::vector<int64_t>& v) {
      for (int width = 1; width < 64; ++width) {
        first[static_cast<size_t>(width)] = static_cast<uint32_t>(
            std::lower_bound(v.begin(), v.end(), int64_t{1} << (width - 1)) - v.begin());
      }
    }
    size_t UpperBound(const std::vector<int64_t>& v, int64_t x) const {  // x >= 1
      size_t i = first[static_cast<size_t>(std::bit_width(static_cast<uint64_t>(x)))];
      while (i < v.size() && v[i] <= x) ++i;
      return i;
    }
  };

  // One q_len of the table: throughput by kv_len, ascending, interpolated in log2(kv_len).
  struct Row {
    double log_q = 0.0;
    std::vector<int64_t> kv;
    std::vector<double> log_kv;
    std::vector<double> flops_per_ms;
    OctaveStarts kv_starts;

    double At(int64_t kv_len, double lkv) const {
      const size_t i = kv_starts.UpperBound(kv, kv_len);
      if (i == 0) return flops_per_ms.front();
      if (i == kv.size() || kv[i - 1] == kv_len) return flops_per_ms[i - 1];
      const double w = (lkv - log_kv[i - 1]) / (log_kv[i] - log_kv[i - 1]);
      return (1.0 - w) * flops_per_ms[i - 1] + w * flops_per_ms[i];
    }
  };

  explicit KernelModel(const AnalyticKernelParams& p) : params_(p) {
    const int64_t tq = p.shape.tile_q, tk = p.shape.tile_k;
    fast_ = tq > 0 && tk > 0 && (tq & (tq - 1)) == 0 && (tk & (tk - 1)) == 0 && tq % tk == 0;
    if (fast_) {
      while ((int64_t{1} << q_shift_) < tq) ++q_shift_;
      while ((int64_t{1} << k_shift_) < tk) ++k_shift_;
      tile_ratio_ = tq / tk;
    }
    // The leading factors of PaddedFlops and FlopsPerMs, multiplied in their order.
    flops_per_block_ =
        4.0 * static_cast<double>(p.shape.head_dim * p.shape.heads) * static_cast<double>(tq * tk);
    peak_per_ms_ = p.peak_tflops * 1e9;
  }

  static double Weigh(const std::array<double, kPackedCallFeatureCount>& w,
                      const std::array<double, kPackedCallFeatureCount>& f) {
    double ms = 0.0;
    for (int j = 0; j < kPackedCallFeatureCount; ++j) ms += w[j] * f[j];
    return ms;
  }

  // CeilDiv(a, 2^shift).
  static int64_t CeilShift(int64_t a, int shift) {
    return a <= 0 ? 0 : (a >> shift) + ((a & ((int64_t{1} << shift) - 1)) != 0);
  }

  static int64_t CeilDiv(int64_t a, int64_t b) { return a <= 0 ? 0 : a / b + (a % b != 0); }

  static absl::Status ValidateShape(const KernelShape& s) {
    for (auto [name, v] : {std::pair{"heads", s.heads}, std::pair{"head_dim", s.head_dim},
                           std::pair{"tile_q", s.tile_q}, std::pair{"tile_k", s.tile_k}}) {
      if (v <= 0 || v > (int64_t{1} << 20)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("kernel model: %s must be in [1, 1048576], got %d", name, v));
      }
    }
    return absl::OkStatus();
  }

  AnalyticKernelParams params_;
  bool analytic_ = true;
  bool fast_ = false;              // SegmentMs's shortcut applies (power-of-two tiles)
  int q_shift_ = 0, k_shift_ = 0;  // log2 of the tiles (fast_ only)
  int64_t tile_ratio_ = 1;         // tile_q / tile_k (fast_ only)
  double flops_per_block_ = 0.0;   // 4 * head_dim * heads * tile_q * tile_k
  double peak_per_ms_ = 0.0;       // peak_tflops * 1e9
  std::vector<Row> rows_;          // by q_len, ascending (table models only)
  std::vector<int64_t> row_q_;     // rows_[i]'s q_len
  OctaveStarts row_starts_;        // over row_q_
  uint64_t table_id_ = 0;          // FlopsPerMs's memo key (table models only)
  bool has_packed_ = false;        // packed_ holds a packed-call fit
  PackedCallFit packed_;
};

// The analytic curve's constants fitted to measured points: the least-squares fit in log space
// (relative error) of peak_tflops, q_half and kv_half, with no per-segment overhead (measured
// calls already hold theirs). q_half is searched over 0, 8, ..., 4096 and kv_half over 0, 64,
// ..., 16384 with the best peak in closed form for each pair, so the fit is deterministic and
// needs no starting point. This calibrates the planner from a profile table in three numbers.
inline absl::StatusOr<AnalyticKernelParams> FitAnalyticKernelParams(
    std::span<const KernelProfilePoint> points, const KernelShape& shape = {}) {
  absl::StatusOr<KernelModel> checked = KernelModel::FromProfile(points, shape);  // validates
  if (!checked.ok()) return checked.status();
  const KernelModel& m = *checked;
  // log ms = log padded - log peak - log(qp / (qp + q_half)) - log(kvp / (kvp + kv_half)).
  std::vector<double> base(points.size()), qp(points.size()), kvp(points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    const KernelProfilePoint& p = points[i];
    base[i] = std::log(m.PaddedFlops(p.q_len, p.kv_len) / 1e9) - std::log(p.ms);
    qp[i] = static_cast<double>((p.q_len + m.tile_q() - 1) / m.tile_q() * m.tile_q());
    kvp[i] = static_cast<double>((p.kv_len + m.tile_k() - 1) / m.tile_k() * m.tile_k());
  }
  AnalyticKernelParams best{.shape = shape, .segment_overhead_ms = 0.0};
  double best_sse = std::numeric_limits<double>::infinity();
  const size_t n = points.size();
  constexpr int64_t kQStep = 8, kQMax = 4096, kKvStep = 64, kKvMax = 16384;
  std::vector<double> kv_term;  // log(kvp / (kvp + kv_half)), kv_half-major
  for (int64_t kv_half = 0; kv_half <= kKvMax; kv_half += kKvStep) {
    for (size_t i = 0; i < n; ++i) {
      kv_term.push_back(std::log(kvp[i] / (kvp[i] + static_cast<double>(kv_half))));
    }
  }
  std::vector<double> q_residual(n), r(n);
  for (int64_t q_half = 0; q_half <= kQMax; q_half += kQStep) {
    for (size_t i = 0; i < n; ++i) {
      q_residual[i] = base[i] - std::log(qp[i] / (qp[i] + static_cast<double>(q_half)));
    }
    for (int64_t kv_half = 0; kv_half <= kKvMax; kv_half += kKvStep) {
      const double* kv = kv_term.data() + static_cast<size_t>(kv_half / kKvStep) * n;
      double mean = 0.0;
      for (size_t i = 0; i < n; ++i) {
        r[i] = q_residual[i] - kv[i];
        mean += r[i];
      }
      mean /= static_cast<double>(points.size());  // log peak (TFLOP/s)
      double sse = 0.0;
      for (double x : r) sse += (x - mean) * (x - mean);
      if (sse < best_sse) {
        best_sse = sse;
        best.peak_tflops = std::exp(mean);
        best.q_half = static_cast<double>(q_half);
        best.kv_half = static_cast<double>(kv_half);
      }
    }
  }
  return best;
}

}  // namespace wlb
