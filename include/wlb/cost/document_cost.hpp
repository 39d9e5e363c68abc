// Pluggable document costs: anything that gives W_a(d) and W_l(d) can drive packers and bounds.
//
//   wlb::DocumentCost flops = *wlb::CostModelFromPreset("llama2-7b");   // implicit: the fast path
//   absl::StatusOr<wlb::TabulatedCost> table = wlb::TabulatedCost::Create(points);  // measured
//   wlb::DocumentCost measured = wlb::DocumentCost::From(*table, "ms", "H100 attention table");
//   auto packer = wlb::MakePacker("wlb", config, measured, options);
//
// DocumentCost is a small type-erased value. Built from the polynomial CostModel (implicitly, so
// every call site that passes a CostModel keeps compiling) it evaluates the polynomial inline;
// built from any other type satisfying CostFunction it calls that type's Attention / Linear
// through one indirect call. Packers branch once per call on which of the two it holds
// (bench/plan_step_benchmark: BM_PlanStep vs BM_PlanStepCustomCost).
//
// TabulatedCost is the tile-aware cost of a measured latency table (length -> ms of one
// document's attention, e.g. ../shared/data/h100/compute-attn-H100.csv at cp = tp = 1):
//  - below the shortest measured length the latency is flat (a kernel computes whole tiles, so
//    a document shorter than a tile costs what the shortest measurement cost);
//  - a length is rounded up to the next multiple of `tile` tokens (never past the next measured
//    length), so the cost is a step function with a step per tile, as a tiled kernel is;
//  - between measured lengths it interpolates linearly in (log length, log ms): exact for a
//    power law between two points, and at the measured lengths it returns the measurement;
//  - above the longest measured length it extrapolates the last segment's power law.
// W_l(d) = linear_ms_per_token * d (0 unless given: the table holds attention only).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/cost/cost_model.hpp"

namespace wlb {

// A cost of one document of d tokens split into its attention and linear parts.
template <typename T>
concept CostFunction = requires(const T& c, int64_t d) {
  { c.Attention(d) } -> std::convertible_to<double>;
  { c.Linear(d) } -> std::convertible_to<double>;
};

// Any CostFunction as a value (see the file comment); CostModel is its inline fast path.
class DocumentCost {
 public:
  // The polynomial W(d): implicit, so a CostModel is accepted wherever a DocumentCost is.
  DocumentCost(CostModel polynomial) : polynomial_(std::move(polynomial)) {}  // NOLINT

  // Any other cost function; `unit` says what a cost counts ("ms", "flop").
  template <CostFunction F>
  requires(!std::same_as<std::decay_t<F>, CostModel> &&
           !std::same_as<std::decay_t<F>, DocumentCost>) static DocumentCost
      From(F function, std::string unit, std::string description) {
    CostModel labels;
    labels.unit = std::move(unit);
    labels.description = std::move(description);
    DocumentCost cost(std::move(labels));
    cost.custom_ = std::make_shared<const Holder<F>>(std::move(function));
    return cost;
  }

  double Attention(int64_t d) const {
    return custom_ ? custom_->Attention(d) : polynomial_.Attention(d);
  }
  double Linear(int64_t d) const { return custom_ ? custom_->Linear(d) : polynomial_.Linear(d); }
  double operator()(int64_t d) const {
    return custom_ ? custom_->Attention(d) + custom_->Linear(d) : polynomial_(d);
  }

  const std::string& unit() const { return polynomial_.unit; }
  const std::string& description() const { return polynomial_.description; }
  // The polynomial, or nullptr for a custom cost function.
  const CostModel* polynomial() const { return custom_ ? nullptr : &polynomial_; }

 private:
  struct Interface {
    virtual ~Interface() = default;
    virtual double Attention(int64_t d) const = 0;
    virtual double Linear(int64_t d) const = 0;
  };
  template <typename F>
  struct Holder final : Interface {
    explicit Holder(F f) : function(std::move(f)) {}
    double Attention(int64_t d) const override { return function.Attention(d); }
    double Linear(int64_t d) const override { return function.Linear(d); }
    F function;
  };

  CostModel polynomial_;  // the cost itself, or only unit and description for a custom one
  std::shared_ptr<const Interface> custom_;
};

// Checks that a cost stays finite and >= 0 for every piece a stream can hold (up to kMaxContext
// tokens) and summed over a whole stream (kMaxPieces pieces), so no plan, mean or imbalance
// overflows to inf or NaN; the error names the cost and W(S) at the limit.
inline absl::Status ValidateCost(const DocumentCost& cost) {
  const double attention = cost.Attention(kMaxContext);
  const double linear = cost.Linear(kMaxContext);
  const double whole = attention + linear;
  if (!(attention >= 0.0) || !(linear >= 0.0) ||
      !std::isfinite(whole * static_cast<double>(kMaxPieces))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cost model %s: W(%d) = %g (attention %g + linear %g) must be >= 0 and stay finite "
        "summed over %d pieces; its coefficients are too large",
        cost.description().empty() ? cost.unit() : cost.description(), kMaxContext, whole,
        attention, linear, kMaxPieces));
  }
  return absl::OkStatus();
}

// The tile-aware interpolation of a measured attention latency table (see the file comment).
class TabulatedCost {
 public:
  // Points with distinct positive lengths (any order; ReadProfileCsv averages duplicates) and
  // positive finite latencies; tile >= 1; linear_ms_per_token >= 0 and finite.
  static absl::StatusOr<TabulatedCost> Create(std::span<const ProfilePoint> points,
                                              int64_t tile = 128,
                                              double linear_ms_per_token = 0.0) {
    if (points.empty()) {
      return absl::InvalidArgumentError("a cost table needs at least one (length, ms) point");
    }
    if (tile < 1 || tile > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cost table tile must be in [1, 1048576] tokens, got %d", tile));
    }
    if (!(linear_ms_per_token >= 0.0) || !std::isfinite(linear_ms_per_token)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cost table linear_ms_per_token must be >= 0 and finite, got %g", linear_ms_per_token));
    }
    TabulatedCost t;
    t.tile_ = tile;
    t.linear_ms_per_token_ = linear_ms_per_token;
    for (const ProfilePoint& p : points) {
      if (p.length <= 0 || !(p.ms > 0.0) || !std::isfinite(p.ms)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "cost table point (length %d, %g ms): length and latency must be positive", p.length,
            p.ms));
      }
      t.points_.push_back(p);
    }
    std::sort(t.points_.begin(), t.points_.end(),
              [](const ProfilePoint& a, const ProfilePoint& b) { return a.length < b.length; });
    for (size_t i = 1; i < t.points_.size(); ++i) {
      if (t.points_[i].length == t.points_[i - 1].length) {
        return absl::InvalidArgumentError(
            absl::StrFormat("cost table has length %d twice", t.points_[i].length));
      }
    }
    return t;
  }

  double Attention(int64_t d) const {
    if (d <= points_.front().length) return points_.front().ms;  // flat below the table
    // First measured length >= d (the table's end when d is beyond it).
    const auto next =
        std::lower_bound(points_.begin(), points_.end(), d,
                         [](const ProfilePoint& p, int64_t length) { return p.length < length; });
    const int64_t tiles = d / tile_ + (d % tile_ != 0 ? 1 : 0);
    int64_t padded = d <= std::numeric_limits<int64_t>::max() / tile_ - 1 ? tiles * tile_ : d;
    if (next != points_.end()) {
      if (next->length == d) return next->ms;
      padded = std::min(padded, next->length);
    }
    // Interpolate between the measured lengths around d, or extrapolate the last segment.
    const auto hi_it = next != points_.end() ? next : points_.end() - 1;
    const ProfilePoint& hi = *hi_it;
    const ProfilePoint& lo = hi_it == points_.begin() ? hi : *(hi_it - 1);
    if (hi.length == lo.length) {
      // One point only: scale quadratically beyond it (causal attention work).
      const double r = static_cast<double>(padded) / static_cast<double>(hi.length);
      return hi.ms * r * r;
    }
    const double x = std::log(static_cast<double>(padded));
    const double x0 = std::log(static_cast<double>(lo.length));
    const double x1 = std::log(static_cast<double>(hi.length));
    const double y0 = std::log(lo.ms), y1 = std::log(hi.ms);
    return std::exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0));
  }

  double Linear(int64_t d) const { return linear_ms_per_token_ * static_cast<double>(d); }

  int64_t tile() const { return tile_; }
  const std::vector<ProfilePoint>& points() const { return points_; }

 private:
  TabulatedCost() = default;

  std::vector<ProfilePoint> points_;  // length ascending
  int64_t tile_ = 128;
  double linear_ms_per_token_ = 0.0;
};

}  // namespace wlb
