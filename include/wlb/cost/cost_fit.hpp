// Fitting a cost model to measured attention latency (ms) by non-negative least squares.
//
//   std::vector<wlb::ProfilePoint> points = {{1024, 0.1}, {8192, 3.1}, {65536, 190}};
//   absl::StatusOr<wlb::ProfileFit> fit = wlb::FitCostModel(points);
//   double ms = fit->model(4096);
//
// The only header that includes Eigen: the fit is a small dense least-squares problem.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "Eigen/Dense"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_model.hpp"

namespace wlb {

// A fitted model and how well it reproduces the points it was fitted to.
struct ProfileFit {
  CostModel model;
  double rms_relative_error = 0.0;  // sqrt(mean(((fit - ms) / ms)^2))
  double max_relative_error = 0.0;  // max |fit - ms| / ms
};

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
  Eigen::Vector3d best = Eigen::Vector3d::Zero();
  double best_residual = INFINITY;
  for (int mask = 1; mask < 8; ++mask) {  // every non-empty set of free coefficients
    std::vector<Eigen::Index> cols;
    for (int j = 0; j < 3; ++j) {
      if (mask & (1 << j)) cols.push_back(j);
    }
    Eigen::MatrixXd sub(n, static_cast<Eigen::Index>(cols.size()));
    for (size_t k = 0; k < cols.size(); ++k) sub.col(static_cast<Eigen::Index>(k)) = a.col(cols[k]);
    const Eigen::VectorXd x = sub.colPivHouseholderQr().solve(y);
    if ((x.array() < 0.0).any() || !x.allFinite()) continue;
    Eigen::Vector3d full = Eigen::Vector3d::Zero();
    for (size_t k = 0; k < cols.size(); ++k) full(cols[k]) = x(static_cast<Eigen::Index>(k));
    const double residual = (a * full - y).squaredNorm();
    if (residual < best_residual) {
      best_residual = residual;
      best = full;
    }
  }
  if (!std::isfinite(best_residual)) {
    return absl::InvalidArgumentError("profile points admit no non-negative quadratic fit");
  }
  ProfileFit fit;
  fit.model.attn_quadratic = best(0);
  fit.model.attn_linear = best(1);
  fit.model.per_document = best(2);
  fit.model.unit = "ms";
  double sum_sq = 0.0;
  for (const ProfilePoint& p : points) {
    const double rel = std::abs(fit.model(p.length) - p.ms) / p.ms;
    sum_sq += rel * rel;
    fit.max_relative_error = std::max(fit.max_relative_error, rel);
  }
  fit.rms_relative_error = std::sqrt(sum_sq / static_cast<double>(points.size()));
  fit.model.description = absl::StrFormat(
      "fitted: %.4g*d^2 + %.4g*d + %.4g ms (rms rel. error %.1f%%, max %.1f%%, %d points)", best(0),
      best(1), best(2), 100.0 * fit.rms_relative_error, 100.0 * fit.max_relative_error,
      points.size());
  return fit;
}

}  // namespace wlb
