// Fitting a cost model to measured attention latency (ms) by non-negative least squares.
//
//   std::vector<wlb::ProfilePoint> points = {{1024, 0.1}, {8192, 3.1}, {65536, 190}};
//   absl::StatusOr<wlb::ProfileFit> fit = wlb::FitCostModel(points);
//   double ms = fit->model(4096);
//
//   // A packed-call fit of the kernel model (per-call fwd/bwd ms from the features of the call):
//   absl::StatusOr<wlb::PackedCallFit> calls = wlb::FitPackedCalls(points,
//   wlb::KernelModel::Default());
//
// The only header of the library that includes Eigen: the fits are small dense least-squares
// problems (NonNegativeLeastSquares also serves the CUDA backend's micro-batch fit).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "Eigen/Dense"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/kernel_model.hpp"

namespace wlb {

// A fitted model and how well it reproduces the points it was fitted to.
struct ProfileFit {
  CostModel model;
  double rms_relative_error = 0.0;  // sqrt(mean(((fit - ms) / ms)^2))
  double max_relative_error = 0.0;  // max |fit - ms| / ms
};

// argmin ||a x - y|| subject to x >= 0, exactly: every non-empty set of free columns is solved by
// least squares and the best feasible solution kept (2^cols - 1 solves: for a handful of
// columns). nullopt when no set gives a finite non-negative solution (x = 0 is then the
// optimum; the fits report it as no fit), for a column count outside [1, 16], or when y's length
// is not a's row count.
inline std::optional<Eigen::VectorXd> NonNegativeLeastSquares(const Eigen::MatrixXd& a,
                                                              const Eigen::VectorXd& y) {
  const Eigen::Index cols = a.cols();
  if (cols < 1 || cols > 16 || a.rows() != y.size()) return std::nullopt;
  std::optional<Eigen::VectorXd> best;
  double best_residual = INFINITY;
  for (uint32_t mask = 1; mask < (uint32_t{1} << cols); ++mask) {
    std::vector<Eigen::Index> free;
    for (Eigen::Index j = 0; j < cols; ++j) {
      if (mask & (uint32_t{1} << j)) free.push_back(j);
    }
    Eigen::MatrixXd sub(a.rows(), static_cast<Eigen::Index>(free.size()));
    for (size_t k = 0; k < free.size(); ++k) sub.col(static_cast<Eigen::Index>(k)) = a.col(free[k]);
    const Eigen::VectorXd x = sub.colPivHouseholderQr().solve(y);
    if ((x.array() < 0.0).any() || !x.allFinite()) continue;
    Eigen::VectorXd full = Eigen::VectorXd::Zero(cols);
    for (size_t k = 0; k < free.size(); ++k) full(free[k]) = x(static_cast<Eigen::Index>(k));
    const double residual = (a * full - y).squaredNorm();
    if (residual < best_residual) {
      best_residual = residual;
      best = std::move(full);
    }
  }
  return best;
}

// Fits W(d) = a*d^2 + b*d + c (a, b, c >= 0, in ms) to measured latencies, minimising the squared
// relative error (so short and long documents count alike). Non-negativity is exact: with three
// unknowns every active set is tried and the best feasible least-squares solution kept. The
// quadratic and linear terms go to W_a, the constant to the per-document overhead.
inline absl::StatusOr<ProfileFit> FitCostModel(std::span<const ProfilePoint> points) {
  if (points.size() < 3) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a cost fit needs at least 3 profile points (distinct lengths), got %d", points.size()));
  }
  for (const ProfilePoint& p : points) {
    if (p.length <= 0 || p.length > kMaxContext || !(p.ms >= kMinProfileMs) ||
        !(p.ms <= kMaxProfileMs)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "profile point (length %d, %g ms): length must be in [1, %d] and latency in [%g, %g] ms",
          p.length, p.ms, kMaxContext, kMinProfileMs, kMaxProfileMs));
    }
  }
  const Eigen::Index n = static_cast<Eigen::Index>(points.size());
  Eigen::MatrixXd a(n, 3);
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const double d = static_cast<double>(points[i].length);
    const double w = 1.0 / points[i].ms;  // relative-error weighting
    a(i, 0) = d * d * w;
    a(i, 1) = d * w;
    a(i, 2) = w;
    y(i) = 1.0;
  }
  const std::optional<Eigen::VectorXd> best = NonNegativeLeastSquares(a, y);
  if (!best) {
    return absl::InvalidArgumentError("profile points admit no non-negative quadratic fit");
  }
  ProfileFit fit;
  fit.model.attn_quadratic = (*best)(0);
  fit.model.attn_linear = (*best)(1);
  fit.model.per_document = (*best)(2);
  fit.model.unit = "ms";
  double sum_sq = 0.0;
  for (const ProfilePoint& p : points) {
    const double rel = std::abs(fit.model(p.length) - p.ms) / p.ms;
    sum_sq += rel * rel;
    fit.max_relative_error = std::max(fit.max_relative_error, rel);
  }
  fit.rms_relative_error = std::sqrt(sum_sq / static_cast<double>(points.size()));
  fit.model.description = absl::StrFormat(
      "fitted: %.4g*d^2 + %.4g*d + %.4g ms (rms rel. error %.1f%%, max %.1f%%, %d points)",
      (*best)(0), (*best)(1), (*best)(2), 100.0 * fit.rms_relative_error, 100.0 * fit.max_relative_error,
      points.size());
  return fit;
}

// Fits KernelModel's packed-call weights (kPackedCallFeatureNames; features from `model`'s shape
// and tiles) to measured calls by non-negative least squares on the relative error, forward and
// backward separately. Backward is fitted when the first point has bwd_ms > 0 (then every point
// needs one; without it every point's bwd_ms must be 0): a mixed profile is an error naming the
// first point that differs. Needs at least kPackedCallFeatureCount
// points; errors name the bad point and value.
inline absl::StatusOr<PackedCallFit> FitPackedCalls(std::span<const PackedCallPoint> points,
                                                    const KernelModel& model) {
  if (points.size() < static_cast<size_t>(kPackedCallFeatureCount)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a packed-call fit needs at least %d calls, got %d",
                        kPackedCallFeatureCount, points.size()));
  }
  const bool backward = points.front().bwd_ms > 0.0;
  for (size_t i = 0; i < points.size(); ++i) {
    const PackedCallPoint& p = points[i];
    if (p.segments.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("packed call %d has no segments", i));
    }
    for (size_t k = 0; k < p.segments.size(); ++k) {
      const CallSegment& s = p.segments[k];
      if (s.q_len <= 0 || s.kv_len < s.q_len || s.kv_len > kMaxContext) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "packed call %d segment %d: need 0 < q_len <= kv_len <= %d, got q_len %d, kv_len %d", i,
            k, kMaxContext, s.q_len, s.kv_len));
      }
    }
    if (!(p.fwd_ms >= kMinProfileMs) || !(p.fwd_ms <= kMaxProfileMs)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("packed call %d: fwd_ms must be in [%g, %g], got %g", i, kMinProfileMs,
                          kMaxProfileMs, p.fwd_ms));
    }
    if (backward ? !(p.bwd_ms >= kMinProfileMs) || !(p.bwd_ms <= kMaxProfileMs) : p.bwd_ms != 0.0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "packed call %d: bwd_ms must be %s, got %g", i,
          backward ? absl::StrFormat("in [%g, %g] (call 0 has a backward time, so every call "
                                     "needs one)",
                                     kMinProfileMs, kMaxProfileMs)
                   : std::string("0 (call 0 has no backward time, so no call may have one)"),
          p.bwd_ms));
    }
  }
  const Eigen::Index n = static_cast<Eigen::Index>(points.size());
  Eigen::MatrixXd feature(n, kPackedCallFeatureCount);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto f = model.PackedCallFeatures(points[static_cast<size_t>(i)].segments);
    for (int j = 0; j < kPackedCallFeatureCount; ++j) feature(i, j) = f[static_cast<size_t>(j)];
  }
  PackedCallFit fit;
  fit.has_backward = backward;
  fit.points = static_cast<int>(points.size());
  for (int pass = 0; pass < (backward ? 2 : 1); ++pass) {
    Eigen::MatrixXd a(n, kPackedCallFeatureCount);
    Eigen::VectorXd y = Eigen::VectorXd::Ones(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      const PackedCallPoint& p = points[static_cast<size_t>(i)];
      a.row(i) = feature.row(i) / (pass == 0 ? p.fwd_ms : p.bwd_ms);  // relative error
    }
    const std::optional<Eigen::VectorXd> w = NonNegativeLeastSquares(a, y);
    if (!w) {
      return absl::InvalidArgumentError(absl::StrFormat("packed calls admit no non-negative %s fit",
                                                        pass == 0 ? "forward" : "backward"));
    }
    auto& out = pass == 0 ? fit.fwd : fit.bwd;
    for (int j = 0; j < kPackedCallFeatureCount; ++j) out[static_cast<size_t>(j)] = (*w)(j);
    const Eigen::VectorXd rel = a * *w - y;
    (pass == 0 ? fit.fwd_rms_relative : fit.bwd_rms_relative) =
        std::sqrt(rel.squaredNorm() / static_cast<double>(n));
  }
  return fit;
}

}  // namespace wlb
