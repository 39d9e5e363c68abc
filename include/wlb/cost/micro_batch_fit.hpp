// A cost model fitted to measured whole micro-batches, and how well models predict measurements.
//
//   std::vector<wlb::MicroBatchSample> samples = {
//       {.lengths = {4096, 812, 30000}, .ms = 12.5, .step = 0}, ...};   // one per micro-batch
//   absl::StatusOr<wlb::MicroBatchFit> fit = wlb::FitMicroBatchCost(samples);
//   auto packer = wlb::MakePacker("wlb", config, fit->model, options);  // W(d) in ms
//   double held_out = fit->held_out.mean_relative;                      // e.g. 0.009
//
// The fit: ms = a * sum d^2 + b * sum d + c * documents + per_call over each micro-batch's
// document lengths d (the per-document attention family; under the dense family, a * T^2 with T
// = sum d, the micro-batch's tokens: CostModel's dense_quadratic), every coefficient >= 0 (exact
// non-negative least squares over the four terms, NonNegativeLeastSquares of cost_fit.hpp),
// minimising the squared relative error so short and long micro-batches count alike. `model` is
// W(d) = a d^2 + b d + c (a in the attention part, b and c in the linear part): what a packer
// balances; per_call is the same for every micro-batch of a step, so it shifts costs without
// changing which packing is balanced. A sum of single-document times (FitCostModel) overcounts a
// packed call: a short document alone pays a launch and an idle GPU that it does not pay inside a
// micro-batch.
//
// Held-out error (the rule): the samples are split in two halves, by step parity when every
// sample has a step (even steps / odd steps), else by position (samples 0, 2, 4, ... / 1, 3, 5,
// ...); a fit on each half predicts the other half, and the errors of all predicted samples are
// pooled. Each half needs at least kMicroBatchFitTerms samples.
//
// Reading measurement CSVs is wlb/io/micro_batch_csv.hpp.
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
#include "absl/strings/str_join.h"
#include "wlb/core/limits.hpp"
#include "wlb/cost/cost_fit.hpp"
#include "wlb/cost/cost_model.hpp"

namespace wlb {

// The fit's unknowns: a (sum d^2), b (sum d), c (documents), per_call.
inline constexpr int kMicroBatchFitTerms = 4;

// How well predictions track measurements: relative errors |scale * p - m| / m.
struct PredictionError {
  double scale = 1.0;  // the fitted scale (ComparePredictions with fit_scale), else 1
  double mean_relative = 0.0;
  double max_relative = 0.0;
  int64_t points = 0;
};

// The relative errors of `predicted` against `measured` (same length, at least one, all > 0 and
// finite), after the scale s that minimises sum (s p / m - 1)^2 when `fit_scale` (a FLOP count
// has no time unit: "the FLOP model at its best time scale"), or with s = 1 (a model in ms).
inline absl::StatusOr<PredictionError> ComparePredictions(std::span<const double> predicted,
                                                          std::span<const double> measured,
                                                          bool fit_scale) {
  if (predicted.size() != measured.size() || predicted.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "comparing %d predictions with %d measurements: need equal, non-zero counts",
        predicted.size(), measured.size()));
  }
  double sum_r = 0.0, sum_r2 = 0.0;  // r = p / m
  for (size_t i = 0; i < predicted.size(); ++i) {
    for (double v : {predicted[i], measured[i]}) {
      if (!(v > 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("point %d: prediction %g and measurement %g must be > 0 and finite", i,
                            predicted[i], measured[i]));
      }
    }
    const double r = predicted[i] / measured[i];
    sum_r += r;
    sum_r2 += r * r;
  }
  PredictionError e;
  e.points = static_cast<int64_t>(predicted.size());
  e.scale = fit_scale ? sum_r / sum_r2 : 1.0;  // argmin_s sum (s r - 1)^2
  for (size_t i = 0; i < predicted.size(); ++i) {
    const double rel = std::abs(e.scale * predicted[i] - measured[i]) / measured[i];
    e.mean_relative += rel / static_cast<double>(predicted.size());
    e.max_relative = std::max(e.max_relative, rel);
  }
  return e;
}

// One measured micro-batch.
struct MicroBatchSample {
  std::vector<int64_t> lengths;  // its documents' lengths, each in [1, kMaxContext]
  double ms = 0.0;               // its measured time, in [kMinProfileMs, kMaxProfileMs]
  std::optional<int64_t> step;   // the step it was measured in (>= 0), if known: the split
  std::string where;             // names it in messages ("file.csv:12"); empty: "micro-batch i"
};

// A fitted micro-batch cost (see the file comment).
struct MicroBatchFit {
  CostModel model;            // W(d) = a d^2 + b d + c, in ms
  double per_call_ms = 0.0;   // + this once per micro-batch
  PredictionError in_sample;  // the fit on all samples, predicting them
  PredictionError held_out;   // the two half fits, each predicting the other half
  std::string held_out_rule;  // "by step parity" or "by position parity"
  int64_t samples = 0;
};

// The fit's prediction of one micro-batch: sum of W(d) over its documents, plus per_call_ms.
inline double PredictMicroBatchMs(const MicroBatchFit& fit, std::span<const int64_t> lengths) {
  return fit.per_call_ms + fit.model.MicroBatch(lengths);
}

namespace detail {

inline std::string SampleName(const MicroBatchSample& s, size_t i) {
  return s.where.empty() ? absl::StrFormat("micro-batch %d", i) : s.where;
}

// Checks one sample; the error names it and the bad value.
inline absl::Status ValidateSample(const MicroBatchSample& s, size_t i) {
  if (s.lengths.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: no document lengths (a measured micro-batch holds documents)", SampleName(s, i)));
  }
  for (int64_t d : s.lengths) {
    if (d < 1 || d > kMaxContext) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: document length %d is not in [1, %d]",
                                                        SampleName(s, i), d, kMaxContext));
    }
  }
  if (!(s.ms >= kMinProfileMs) || !(s.ms <= kMaxProfileMs)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: time %g ms is not a number in [%g, %g]",
                                                      SampleName(s, i), s.ms, kMinProfileMs,
                                                      kMaxProfileMs));
  }
  if (s.step.has_value() && (*s.step < 0 || *s.step > kMaxStateCounter)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: step %d is not in [0, %d]",
                                                      SampleName(s, i), *s.step, kMaxStateCounter));
  }
  return absl::OkStatus();
}

// The fit's terms, as messages name them.
inline constexpr const char* kMicroBatchTermNames[kMicroBatchFitTerms] = {
    "a (sum of d^2)", "b (sum of d)", "c (documents)", "per call"};

// Refuses a design whose columns (unit norm, one row per micro-batch) do not identify the four
// terms: then infinitely many fits match the measurements equally well, and the solver's pick is
// arbitrary (a "0.0%" held-out error proves nothing). The error names the terms that cannot be
// told apart (those of the design's null space) and what to measure. The rank is the number of
// singular values above kRankTolerance times the largest: measured times carry noise far above
// it, so only exact (or rounding-level) dependence is refused.
inline absl::Status CheckMicroBatchDesign(const Eigen::MatrixXd& a, const char* what) {
  constexpr double kRankTolerance = 1e-9;
  const Eigen::JacobiSVD<Eigen::MatrixXd> svd(a, Eigen::ComputeFullV);
  const Eigen::VectorXd& sigma = svd.singularValues();
  Eigen::Index rank = 0;
  while (rank < sigma.size() && sigma(rank) > kRankTolerance * sigma(0)) ++rank;
  if (rank == kMicroBatchFitTerms) return absl::OkStatus();
  std::vector<std::string> confounded;
  const Eigen::MatrixXd null = svd.matrixV().rightCols(kMicroBatchFitTerms - rank);
  for (int j = 0; j < kMicroBatchFitTerms; ++j) {
    if (null.row(j).norm() > 1e-6) confounded.push_back(kMicroBatchTermNames[j]);
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: the %d micro-batches cannot tell apart the terms %s (the measurement design has rank "
      "%d of %d, so the split between them would be arbitrary): measure micro-batches that vary "
      "the number of documents, the total tokens and the spread of lengths independently, e.g. "
      "one long document, several short ones, and a mix, at more than one total size",
      what, a.rows(), absl::StrJoin(confounded, ", "), rank, kMicroBatchFitTerms));
}

// The fit on `rows` (indices into `samples`, already validated), or an error prefixed `what`.
inline absl::StatusOr<MicroBatchFit> FitMicroBatchRows(std::span<const MicroBatchSample> samples,
                                                       const std::vector<size_t>& rows,
                                                       const char* what, AttentionFamily family) {
  const bool dense = family == AttentionFamily::kDense;
  const Eigen::Index n = static_cast<Eigen::Index>(rows.size());
  if (n < kMicroBatchFitTerms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d micro-batches for %d unknowns (a, b, c, per call): measure at least %d", what, n,
        kMicroBatchFitTerms, kMicroBatchFitTerms));
  }
  Eigen::MatrixXd a(n, kMicroBatchFitTerms);
  for (Eigen::Index i = 0; i < n; ++i) {
    const MicroBatchSample& s = samples[rows[static_cast<size_t>(i)]];
    double d2 = 0.0, d1 = 0.0;
    for (int64_t d : s.lengths) {
      d2 += static_cast<double>(d) * static_cast<double>(d);
      d1 += static_cast<double>(d);
    }
    const double w = 1.0 / s.ms;  // relative-error weighting
    a.row(i) << (dense ? d1 * d1 : d2) * w, d1 * w, static_cast<double>(s.lengths.size()) * w, w;
  }
  // Columns scaled to unit norm (the solution is rescaled after): sum d^2 and 1 differ by ten
  // orders of magnitude, and a positive column scale leaves the non-negative optimum unchanged.
  Eigen::VectorXd norms = a.colwise().norm().transpose();
  for (Eigen::Index j = 0; j < a.cols(); ++j) a.col(j) /= norms(j);
  if (absl::Status identifiable = CheckMicroBatchDesign(a, what); !identifiable.ok()) {
    return identifiable;
  }
  const std::optional<Eigen::VectorXd> x = NonNegativeLeastSquares(a, Eigen::VectorXd::Ones(n));
  if (!x) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the micro-batches admit no non-negative fit", what));
  }
  const Eigen::VectorXd c = x->cwiseQuotient(norms);
  MicroBatchFit fit;
  (dense ? fit.model.dense_quadratic : fit.model.attn_quadratic) = c(0);
  fit.model.linear_per_token = c(1);
  fit.model.per_document = c(2);
  fit.model.unit = "ms";
  fit.per_call_ms = c(3);
  fit.samples = n;
  return fit;
}

inline absl::StatusOr<PredictionError> FitErrorOn(const MicroBatchFit& fit,
                                                  std::span<const MicroBatchSample> samples,
                                                  const std::vector<size_t>& rows) {
  std::vector<double> predicted, measured;
  for (size_t i : rows) {
    predicted.push_back(PredictMicroBatchMs(fit, samples[i].lengths));
    measured.push_back(samples[i].ms);
  }
  return ComparePredictions(predicted, measured, /*fit_scale=*/false);
}

}  // namespace detail

namespace detail {

// The samples validated and split into the held-out halves (file comment).
struct MicroBatchSplit {
  std::vector<size_t> all;
  std::vector<size_t> half[2];
  std::string rule;  // "by step parity" or "by position parity"
};

inline absl::StatusOr<MicroBatchSplit> SplitMicroBatches(
    std::span<const MicroBatchSample> samples) {
  if (samples.empty()) {
    return absl::InvalidArgumentError("a micro-batch cost fit needs measurements, got none");
  }
  const bool by_step = samples.front().step.has_value();
  MicroBatchSplit split;
  split.rule = by_step ? "by step parity" : "by position parity";
  for (size_t i = 0; i < samples.size(); ++i) {
    const MicroBatchSample& s = samples[i];
    if (absl::Status st = ValidateSample(s, i); !st.ok()) return st;
    if (s.step.has_value() != by_step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has %s step but %s has %s: give every micro-batch a step, or none", SampleName(s, i),
          by_step ? "no" : "a", SampleName(samples[0], 0), by_step ? "one" : "none"));
    }
    split.all.push_back(i);
    split.half[by_step ? (*s.step & 1) : (i & 1)].push_back(i);
  }
  return split;
}

inline std::string HalfName(const MicroBatchSplit& split, int k) {
  return absl::StrFormat("held-out check (%s), %s half", split.rule, k == 0 ? "even" : "odd");
}

}  // namespace detail

// Fits the micro-batch cost (file comment) of an attention family and measures its in-sample and
// held-out errors.
// InvalidArgument naming the sample and value: a sample without documents, a length outside
// [1, kMaxContext], a time that is NaN or outside [kMinProfileMs, kMaxProfileMs] (zero and
// negative included), a negative step, steps given for some samples only; fewer samples than
// kMicroBatchFitTerms, or than that in either held-out half; measurements (all, or either
// held-out half) that cannot tell the terms apart (CheckMicroBatchDesign: every micro-batch
// alike, or every one a single document, ...), naming the terms.
inline absl::StatusOr<MicroBatchFit> FitMicroBatchCost(
    std::span<const MicroBatchSample> samples,
    AttentionFamily family = AttentionFamily::kPerDocument) {
  absl::StatusOr<detail::MicroBatchSplit> split = detail::SplitMicroBatches(samples);
  if (!split.ok()) return split.status();
  absl::StatusOr<MicroBatchFit> fit =
      detail::FitMicroBatchRows(samples, split->all, "micro-batch fit", family);
  if (!fit.ok()) return fit.status();
  absl::StatusOr<PredictionError> in_sample = detail::FitErrorOn(*fit, samples, split->all);
  if (!in_sample.ok()) return in_sample.status();
  fit->in_sample = *in_sample;
  fit->held_out_rule = split->rule;
  std::vector<MicroBatchFit> parts;
  for (int k : {0, 1}) {  // both halves fitted first: each must hold enough samples
    const std::string what = detail::HalfName(*split, k);
    absl::StatusOr<MicroBatchFit> part =
        detail::FitMicroBatchRows(samples, split->half[k], what.c_str(), family);
    if (!part.ok()) return part.status();
    parts.push_back(*std::move(part));
  }
  PredictionError held;
  for (int k : {0, 1}) {
    absl::StatusOr<PredictionError> e = detail::FitErrorOn(parts[k], samples, split->half[1 - k]);
    if (!e.ok()) return e.status();
    held.mean_relative += e->mean_relative * static_cast<double>(e->points);
    held.max_relative = std::max(held.max_relative, e->max_relative);
    held.points += e->points;
  }
  held.mean_relative /= static_cast<double>(held.points);
  fit->held_out = held;
  const bool dense = family == AttentionFamily::kDense;
  fit->model.description = absl::StrFormat(
      "fitted to %d measured micro-batches: %.6g*%s + %.6g*d + %.6g ms per document, %.6g ms "
      "per call (in sample mean %.1f%%, max %.1f%%; held out %s mean %.1f%%, max %.1f%%)",
      fit->samples, dense ? fit->model.dense_quadratic : fit->model.attn_quadratic,
      dense ? "T^2 per micro-batch" : "d^2", fit->model.linear_per_token, fit->model.per_document,
      fit->per_call_ms, 100 * fit->in_sample.mean_relative, 100 * fit->in_sample.max_relative,
      fit->held_out_rule, 100 * held.mean_relative, 100 * held.max_relative);
  return fit;
}

// A fixed cost model's errors on measured micro-batches (each predicted as the sum of W(d) over
// its documents), beside a fit's. With `fit_scale` (a FLOP model: no time unit) the model gets
// its best time scale (ComparePredictions): in sample, the scale fitted on all samples; held out,
// the scale fitted on each half predicts the other half (the same halves as FitMicroBatchCost).
// Without it the model is taken as ms and both errors are over all samples. Errors as
// FitMicroBatchCost's for bad samples; a half without samples is an error.
struct ModelErrors {
  PredictionError in_sample;
  PredictionError held_out;
};
inline absl::StatusOr<ModelErrors> CostModelErrors(const CostModel& model,
                                                   std::span<const MicroBatchSample> samples,
                                                   bool fit_scale) {
  absl::StatusOr<detail::MicroBatchSplit> split = detail::SplitMicroBatches(samples);
  if (!split.ok()) return split.status();
  std::vector<double> predicted(samples.size()), measured(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    predicted[i] = model.MicroBatch(samples[i].lengths);
    measured[i] = samples[i].ms;
  }
  ModelErrors out;
  absl::StatusOr<PredictionError> all = ComparePredictions(predicted, measured, fit_scale);
  if (!all.ok()) return all.status();
  out.in_sample = *all;
  if (!fit_scale) {
    out.held_out = *all;
    return out;
  }
  const auto pick = [&](const std::vector<double>& v, const std::vector<size_t>& rows,
                        double scale) {
    std::vector<double> r;
    for (size_t i : rows) r.push_back(v[i] * scale);
    return r;
  };
  PredictionError held;
  for (int k : {0, 1}) {
    if (split->half[k].empty() || split->half[1 - k].empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: no micro-batches", detail::HalfName(*split, k)));
    }
    absl::StatusOr<PredictionError> scaled = ComparePredictions(
        pick(predicted, split->half[k], 1.0), pick(measured, split->half[k], 1.0), true);
    if (!scaled.ok()) return scaled.status();
    absl::StatusOr<PredictionError> e =
        ComparePredictions(pick(predicted, split->half[1 - k], scaled->scale),
                           pick(measured, split->half[1 - k], 1.0), false);
    if (!e.ok()) return e.status();
    held.mean_relative += e->mean_relative * static_cast<double>(e->points);
    held.max_relative = std::max(held.max_relative, e->max_relative);
    held.points += e->points;
  }
  held.mean_relative /= static_cast<double>(held.points);
  held.scale = all->scale;
  out.held_out = held;
  return out;
}

}  // namespace wlb
