// kernel_model_table: the analytic kernel model against measured kernel profile tables.
//
//   cd docs/results/gpu && ../../../build/bench/kernel_model_table
//       --profiles h100_kernel_profile_flash.csv,h100_kernel_profile_cudnn.csv
//
// A profile table (written by backends/cuda's wlb_cuda_kernel_profiler on a GPU: single causal
// segments of q_len queries over the first kv_len keys, forward ms) is what the planner reads
// with --kernel-profile. Per table this prints how far the analytic model (wlb::KernelModel::
// Default(), fitted to FlashAttention-2's published H100 figures) predicts each measured forward
// time, and how far the analytic curve refitted to the table (wlb::FitAnalyticKernelParams)
// does: mean, median and largest relative error |predicted - measured| / measured, overall and
// for short (q_len <= 256) and long query segments. --heads and --head_dim must be the shape the
// table was measured at (the profiler's defaults: 32 and 128).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli_help.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/io/kernel_profile.hpp"

ABSL_FLAG(std::string, profiles, "",
          "comma-separated kernel profile CSVs (q_len,kv_len,ms columns)");
ABSL_FLAG(int64_t, heads, 32, "query heads the tables were measured with");
ABSL_FLAG(int64_t, head_dim, 128, "head_dim the tables were measured with");
ABSL_FLAG(std::string, csv, "",
          "also write profile,q_len,kv_len,measured_ms,analytic_ms,fitted_ms per point");

namespace {

struct Errors {
  double mean = 0, median = 0, max = 0;
  size_t n = 0;
};

// Relative errors in percent of the points `keep` selects.
template <typename Keep>
Errors Summarise(const std::vector<wlb::KernelProfilePoint>& points,
                 const std::vector<double>& predicted, Keep keep) {
  std::vector<double> e;
  for (size_t i = 0; i < points.size(); ++i) {
    if (keep(points[i])) e.push_back(100.0 * std::abs(predicted[i] - points[i].ms) / points[i].ms);
  }
  Errors out;
  out.n = e.size();
  if (e.empty()) return out;
  std::sort(e.begin(), e.end());
  for (double x : e) out.mean += x / static_cast<double>(e.size());
  out.median = e[e.size() / 2];
  out.max = e.back();
  return out;
}

std::string Cells(const Errors& e) {
  return e.n == 0 ? "n/a | n/a | n/a"
                  : absl::StrFormat("%.1f | %.1f | %.1f", e.mean, e.median, e.max);
}

absl::Status Run() {
  const std::string list = absl::GetFlag(FLAGS_profiles);
  if (list.empty()) return absl::InvalidArgumentError("--profiles is required");
  const wlb::KernelShape shape{.heads = absl::GetFlag(FLAGS_heads),
                               .head_dim = absl::GetFlag(FLAGS_head_dim)};
  absl::StatusOr<wlb::KernelModel> analytic =
      wlb::KernelModel::Analytic(wlb::AnalyticKernelParams{.shape = shape});
  if (!analytic.ok()) return analytic.status();
  std::ofstream csv;
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    csv.open(path);
    if (!csv) return absl::InvalidArgumentError(absl::StrFormat("cannot write --csv %s", path));
    csv << "profile,q_len,kv_len,measured_ms,analytic_ms,fitted_ms\n";
  }
  std::printf(
      "Forward latency of single causal segments: measured tables vs the analytic kernel model "
      "(%lld heads x head_dim %lld); relative error in %%, mean | median | max.\n\n",
      static_cast<long long>(shape.heads), static_cast<long long>(shape.head_dim));
  std::printf(
      "| profile | points | model | peak TFLOP/s | q_half | kv_half | all: mean | median | max | "
      "q_len <= 256: mean | median | max | q_len > 256: mean | median | max |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (absl::string_view path_view : absl::StrSplit(list, ',')) {
    const std::string path(path_view);
    absl::StatusOr<std::vector<wlb::KernelProfilePoint>> points =
        wlb::ReadKernelProfilePoints(path);
    if (!points.ok()) return points.status();
    absl::StatusOr<wlb::AnalyticKernelParams> fit = wlb::FitAnalyticKernelParams(*points, shape);
    if (!fit.ok()) return fit.status();
    absl::StatusOr<wlb::KernelModel> fitted = wlb::KernelModel::Analytic(*fit);
    if (!fitted.ok()) return fitted.status();
    const auto short_q = [](const wlb::KernelProfilePoint& p) { return p.q_len <= 256; };
    const auto long_q = [](const wlb::KernelProfilePoint& p) { return p.q_len > 256; };
    const auto all = [](const wlb::KernelProfilePoint&) { return true; };
    std::vector<double> a, f;
    for (const wlb::KernelProfilePoint& p : *points) {
      a.push_back(analytic->SegmentMs(p.q_len, p.kv_len));
      f.push_back(fitted->SegmentMs(p.q_len, p.kv_len));
      if (csv) {
        csv << absl::StrFormat("%s,%d,%d,%.6f,%.6f,%.6f\n", path, p.q_len, p.kv_len, p.ms, a.back(),
                               f.back());
      }
    }
    const wlb::AnalyticKernelParams d;
    std::printf("| %s | %zu | analytic default | %.0f | %.0f | %.0f | %s | %s | %s |\n",
                path.c_str(), points->size(), d.peak_tflops, d.q_half, d.kv_half,
                Cells(Summarise(*points, a, all)).c_str(),
                Cells(Summarise(*points, a, short_q)).c_str(),
                Cells(Summarise(*points, a, long_q)).c_str());
    std::printf("| %s | %zu | analytic refitted | %.0f | %.0f | %.0f | %s | %s | %s |\n",
                path.c_str(), points->size(), fit->peak_tflops, fit->q_half, fit->kv_half,
                Cells(Summarise(*points, f, all)).c_str(),
                Cells(Summarise(*points, f, short_q)).c_str(),
                Cells(Summarise(*points, f, long_q)).c_str());
  }
  if (csv && !csv.good()) return absl::DataLossError("writing --csv failed");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  wlb::cli::ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "kernel_model_table --profiles A.csv[,B.csv]: the analytic kernel model's error against "
      "measured kernel profile tables");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = Run(); !s.ok()) {
    std::fprintf(stderr, "kernel_model_table: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
