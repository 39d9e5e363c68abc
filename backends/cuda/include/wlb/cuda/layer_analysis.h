// Host-side analysis of measured per-micro-batch layer latency (layer_bench): the paper's
// Table 2 with measured imbalance beside the FLOP model's, prediction errors of the FLOP and
// fitted cost models, a fitted cost profile that `wlb-plan --cost` reads, measured times run
// through the 1F1B step-time model (wlb/sim/step_time.hpp), and measured CP imbalance. No CUDA:
// tested on the CPU with synthetic measurements.
//
//   std::vector<wlb::cuda::MicroBatchMeasurement> m = ...;          // from layer_bench
//   std::string csv = wlb::cuda::MeasurementsCsv(m, "H100, 2026-..., layer_bench ...");
//   absl::StatusOr<std::vector<wlb::cuda::ImbalanceRow>> t2 = wlb::cuda::ImbalanceTable(m);
//   absl::StatusOr<double> s = wlb::cuda::MeasuredSecondsPerToken(wlb_rows, {8, 2, 4, 1}, 32);
#ifndef WLB_CUDA_LAYER_ANALYSIS_H_
#define WLB_CUDA_LAYER_ANALYSIS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "wlb/cost/cost_model.hpp"
#include "wlb/cost/micro_batch_fit.hpp"
#include "wlb/sim/step_time.hpp"

namespace wlb::cuda {

// One micro-batch run through one layer.
struct MicroBatchMeasurement {
  std::string method;            // packer label, e.g. "fixed-greedy-w8" (no comma)
  int64_t step = 0;              // step of the stream
  int64_t index = 0;             // micro-batch within the step
  std::vector<int64_t> lengths;  // its documents, in order (none: an empty micro-batch, 0 ms)
  double predicted = 0.0;        // FLOP-model cost W (the packer's cost model)
  double forward_ms = 0.0;       // measured, one layer
  double backward_ms = 0.0;      // measured, one layer (0: forward only)
  double attention_forward_ms = 0.0;
  double attention_backward_ms = 0.0;

  int64_t tokens() const;
};

// CSV: a '#' line with `provenance`, a header, one row per measurement (lengths joined by ';').
std::string MeasurementsCsv(std::span<const MicroBatchMeasurement> rows,
                            std::string_view provenance);
// One row of MeasurementsCsv, newline included: layer_bench writes MeasurementsCsv({}, ...) (the
// header) first, then each row as it is measured, so a killed run keeps what it measured.
std::string MeasurementsCsvRow(const MicroBatchMeasurement& m);
// Parses MeasurementsCsv's text; InvalidArgument naming `source`, the line and the bad field
// (field count, a number that does not parse, negative or non-finite times, no documents, a
// length <= 0).
absl::StatusOr<std::vector<MicroBatchMeasurement>> ParseMeasurementsCsv(std::string_view text,
                                                                        std::string_view source);

// Table 2: per method (in order of first appearance), the mean over steps of max / mean
// micro-batch cost within the step, under the FLOP model and as measured.
struct ImbalanceRow {
  std::string method;
  int64_t steps = 0;
  double flop_model = 0.0;
  double measured_forward = 0.0;
  double measured_forward_backward = 0.0;  // 0 when no backward was measured
};
absl::StatusOr<std::vector<ImbalanceRow>> ImbalanceTable(
    std::span<const MicroBatchMeasurement> rows);

// How well predictions track measurements (relative errors, the best scale for a FLOP count):
// the library's, wlb/cost/micro_batch_fit.hpp.
using ::wlb::ComparePredictions;
using ::wlb::PredictionError;

// A cost model's prediction of a measurement: sum of W(d) over its documents.
double PredictMicroBatch(const CostModel& model, const MicroBatchMeasurement& m);

// The library's micro-batch cost (wlb::FitMicroBatchCost, wlb/cost/micro_batch_fit.hpp: ms =
// a * sum d^2 + b * sum d + c * documents + per_call, all >= 0, least squared relative error)
// fitted to the measured FORWARD ms of the non-empty micro-batches (empty ones measure 0 ms and
// are skipped); held out by step parity (fits on even steps predict odd steps and back).
// InvalidArgument (the library's, naming "method step S micro-batch I") for a forward time that
// is not > 0 and finite, fewer than 4 non-empty micro-batches, or fewer in either step parity.
using ::wlb::MicroBatchFit;
absl::StatusOr<MicroBatchFit> FitMicroBatchCost(std::span<const MicroBatchMeasurement> rows);
double PredictMicroBatch(const MicroBatchFit& fit, const MicroBatchMeasurement& m);

// A profile that wlb-plan --cost (wlb::ResolveCostModel) reads: header "length,ms,<provenance>"
// (commas and line breaks in it replaced), then "length,ms," rows. InvalidArgument for a point
// FitCostModel would reject.
absl::StatusOr<std::string> LayerProfileCsv(std::span<const ProfilePoint> points,
                                            std::string_view provenance);

// Time per trained token (seconds) of `rows` (one method) when every micro-batch costs its
// measured one-layer forward / backward times `layers` / PP per pipeline stage, each step run
// through SimulateStep(PP, DP). Per token, so methods that train different tokens in their first
// K steps (outlier delay) compare fairly. Errors: no rows, layers < 1, a step whose micro-batch
// count DP does not divide (SimulateStep's message).
absl::StatusOr<double> MeasuredSecondsPerToken(std::span<const MicroBatchMeasurement> rows,
                                               const ParallelSizes& sizes, int layers);
// The same steps under the step-time model only (no measurement used).
absl::StatusOr<double> ModelSecondsPerToken(std::span<const MicroBatchMeasurement> rows,
                                            const StepTimeModel& model, const CpPolicy& policy);
// The rows of one method, in their order.
std::vector<MicroBatchMeasurement> RowsOf(std::span<const MicroBatchMeasurement> rows,
                                          std::string_view method);

// One micro-batch's layer under CP: per-rank measured one-layer time (forward + backward).
struct CpMeasurement {
  std::string method;  // packer label
  int64_t step = 0;
  int64_t index = 0;
  int cp = 0;
  std::string strategy;         // ShardStrategyName
  std::vector<double> rank_ms;  // per rank
};
// Per (C, strategy): mean over micro-batches of max / mean rank time (measured CP imbalance),
// total slowest-rank time, and that total over the per-micro-batch oracle's (the fastest
// slowest rank of any measured strategy other than "adaptive", per micro-batch).
struct CpRow {
  int cp = 0;
  std::string strategy;
  int64_t micro_batches = 0;
  double mean_imbalance = 1.0;
  double total_ms = 0.0;
  double vs_oracle = 1.0;
};
// InvalidArgument for an empty rank list, a rank count other than cp, a negative time, or a
// strategy missing for some micro-batch that another strategy at the same C measured.
absl::StatusOr<std::vector<CpRow>> CpTable(std::span<const CpMeasurement> rows);

// The rows of `method` in the steps where `cp_rows` measured it at `cp` under `strategy`, each
// costing its slowest CP rank's layer time instead of the whole micro-batch on one GPU, split
// between forward and backward in the ratio of the row's own measured forward : backward (the CP
// rows hold fwd + bwd per rank), so MeasuredSecondsPerToken gives the step time under CP.
// Empty micro-batches stay at 0 ms. InvalidArgument naming the micro-batch when a non-empty one of
// those steps has no such CP measurement or measured no time, or when no step is covered.
absl::StatusOr<std::vector<MicroBatchMeasurement>> CpStageRows(
    std::span<const MicroBatchMeasurement> rows, std::span<const CpMeasurement> cp_rows,
    std::string_view method, std::string_view strategy, int cp);

}  // namespace wlb::cuda

#endif  // WLB_CUDA_LAYER_ANALYSIS_H_
