// wlb-plan's output: the table, the JSON (streamed step by step) and the output file (stdout, or
// --out written through a temporary file renamed over it).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/wlb.hpp"
#include "wlb_plan.h"
#include "wlb_plan_internal.h"

namespace wlb::cli {
namespace {

std::string Mega(int64_t tokens) { return absl::StrFormat("%.1fM", tokens / 1e6); }

std::string SummaryRow(const Result& r) {
  const StreamSummary& s = r.summary;
  return absl::StrFormat(
      "| %-13s | %9.3f | %5.3f | %5.3f | %5.3f | %6.3f | %6.3f | %5.2f | %3.0f | %3.0f | %7.3f "
      "|\n",
      r.packer, s.imbalance_mean, s.imbalance_p90, s.imbalance_p99, s.imbalance_max,
      s.imbalance_mean - s.lower_bound_mean, s.imbalance_mean - s.cap_lower_bound_mean,
      s.delay.mean, s.delay.p99, s.delay.max, Median(r.run.plan_ms));
}

constexpr char kSummaryHeader[] =
    "| packer        | imbalance |   p90 |   p99 |   max | gap LB | gap CB | delay |  p99 | max | "
    "ms/step |\n"
    "|---------------|-----------|-------|-------|-------|--------|--------|-------|------|-----|--"
    "-"
    "------|\n";

constexpr char kStepTableHeader[] =
    "\n step | docs |   tokens | tokens per micro-batch (min..max) | imbalance | lower bound | "
    "cap bound | held back\n";
constexpr char kStepTableFooter[] =
    "(* = drain step after the end of input, + = partial step planned from the short last step "
    "of the input; both left out of the summary)\n";

// One row of the per-step table.
std::string StepRow(const StepPlan& s, const DocumentCost& cost, int64_t max_tokens) {
  int64_t docs = 0, tokens = 0, lo = INT64_MAX, hi = 0;
  for (const MicroBatch& mb : s.micro_batches) {
    docs += static_cast<int64_t>(mb.documents.size());
    tokens += mb.tokens;
    lo = std::min(lo, mb.tokens);
    hi = std::max(hi, mb.tokens);
  }
  return absl::StrFormat("%5d%s | %4d | %8d | %15d..%-16d | %9.3f | %11.3f | %9.3f | %d docs\n",
                         s.step, s.drain ? "*" : (s.partial ? "+" : " "), docs, tokens, lo, hi,
                         ImbalanceDegree(s.micro_batches), LowerBound(s.micro_batches, cost),
                         CapLowerBound(s.micro_batches, cost, max_tokens), s.held_back_documents);
}

// The per-step summary of the chosen packer (its rows; a streamed run's were written already).
std::string StepTable(const Result& r, const DocumentCost& cost, int64_t max_tokens) {
  std::string out = kStepTableHeader;
  for (const StepPlan& s : r.run.steps) absl::StrAppend(&out, StepRow(s, cost, max_tokens));
  return out;
}

// The JSON writer's step hook with --cp-size: plans each micro-batch's CP shard plans into the
// step's JSON and adds them to `cp_summary`.
PlanJsonWriter::StepHook CpHook(const Settings& settings, const KernelModel& kernel_model,
                                CpSummary& cp_summary) {
  if (settings.plan.cp_size <= 0) return nullptr;
  return [&](const StepPlan& step, nlohmann::json& step_json) {
    return PlanStepCp(step, settings.plan, kernel_model, cp_summary, &step_json);
  };
}

absl::Status SpoolError() {
  return absl::UnavailableError(absl::StrFormat(
      "cannot write the planned steps to a temporary file: %s", std::strerror(errno)));
}

absl::Status WriteSpool(std::FILE* spool, std::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), spool) != text.size()) return SpoolError();
  return absl::OkStatus();
}

absl::Status CannotWrite(const std::string& path, const std::string& why) {
  return absl::UnavailableError(
      absl::StrFormat("cannot write output file %s: %s", QuoteForMessage(path, 256), why));
}

// Writes all of `text` to the open descriptor `fd`; false with errno set on a failure.
bool WriteAll(int fd, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Where the output goes, written piece by piece (a large plan is streamed, never built whole):
// stdout without --out. With --out, an existing FIFO, character device (/dev/stdout) or other
// special file is written through; a regular file (or a new one) is written as a uniquely named
// temporary file in the same directory (mkstemp: created exclusively, never through a planted
// symlink) and renamed over it at Commit(), so a failed run never leaves a partial file (the
// destructor removes an uncommitted temporary). A symlink at `path` is followed: its target is
// what gets written or replaced, the link stays. Every write failure (a full disk, a closed stdout,
// a broken pipe) is an error, never a silent success.
// The mkstemp template of the temporary beside `path`: its name plus ".wlb-XXXXXX", the name cut
// so that the whole stays within the directory's name limit (NAME_MAX, usually 255 bytes): a
// valid file name of up to that limit must not fail for its temporary's suffix. mkstemp makes the
// cut name unique.
std::string TemporaryName(const std::filesystem::path& path) {
  constexpr std::string_view kSuffix = ".wlb-XXXXXX";
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);  // NOLINT(runtime/int): POSIX type
  const size_t name_max = limit > 0 ? static_cast<size_t>(limit) : 255;
  std::string name = path.filename().string();
  if (name.size() + kSuffix.size() > name_max) name.resize(name_max - kSuffix.size());
  return (path.parent_path() / (name + std::string(kSuffix))).string();
}

class Output {
 public:
  Output() = default;
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output() {
    if (fd_ >= 0) ::close(fd_);
    if (!tmp_.empty()) {
      std::error_code ignored;
      std::filesystem::remove(tmp_, ignored);
    }
  }

  // Opens --out (nothing to open for stdout).
  absl::Status Open(const std::string& path) {
    path_ = path;
    if (path.empty()) return absl::OkStatus();
    std::error_code ec;
    const std::filesystem::file_status target = std::filesystem::status(path, ec);
    if (std::filesystem::exists(target) && !std::filesystem::is_regular_file(target)) {
      if (std::filesystem::is_directory(target)) return CannotWrite(path, "it is a directory");
      fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd_ < 0) return CannotWrite(path, std::strerror(errno));
      return absl::OkStatus();
    }
    real_ = path;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
      real_ = std::filesystem::weakly_canonical(path, ec);
      if (ec) return CannotWrite(path, "cannot resolve the symlink: " + ec.message());
    }
    std::string tmp = TemporaryName(real_);
    fd_ = ::mkstemp(tmp.data());
    if (fd_ < 0) {
      return CannotWrite(path,
                         std::string("cannot create a temporary file: ") + std::strerror(errno));
    }
    tmp_ = tmp;
    const mode_t mask = ::umask(0);  // mkstemp makes 0600; give the file the usual 0666 & ~umask
    ::umask(mask);
    if (::fchmod(fd_, 0666 & ~mask) != 0) return CannotWrite(path, std::strerror(errno));
    return absl::OkStatus();
  }

  absl::Status Write(std::string_view text) {
    if (path_.empty()) {
      if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::ferror(stdout)) {
        return absl::UnavailableError(
            absl::StrFormat("cannot write the output to stdout: %s", std::strerror(errno)));
      }
      return absl::OkStatus();
    }
    if (!WriteAll(fd_, text)) return CannotWrite(path_, std::strerror(errno));
    return absl::OkStatus();
  }

  // Flushes stdout, or closes --out and renames its temporary over it.
  absl::Status Commit() {
    if (path_.empty()) {
      if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        return absl::UnavailableError(
            absl::StrFormat("cannot write the output to stdout: %s", std::strerror(errno)));
      }
      return absl::OkStatus();
    }
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return CannotWrite(path_, std::strerror(errno));
    if (tmp_.empty()) return absl::OkStatus();
    std::error_code ec;
    std::filesystem::rename(tmp_, real_, ec);
    if (ec) return CannotWrite(path_, ec.message());
    tmp_.clear();  // renamed: nothing to remove
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::filesystem::path real_;
  std::string tmp_;  // the temporary until it is renamed
  int fd_ = -1;
};

// Copies a streamed run's spooled step text to `output`, 1 MiB at a time.
absl::Status CopySpool(const StreamedSteps& streamed, Output& output) {
  if (std::fflush(streamed.spool) != 0) return SpoolError();
  std::rewind(streamed.spool);
  std::string buffer(size_t{1} << 20, '\0');
  while (true) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), streamed.spool);
    if (n > 0) {
      if (absl::Status s = output.Write(std::string_view(buffer.data(), n)); !s.ok()) return s;
    }
    if (n < buffer.size()) break;
  }
  if (std::ferror(streamed.spool)) {
    return absl::UnavailableError("cannot read back the temporary file of the planned steps");
  }
  return absl::OkStatus();
}

// The JSON's summary: the stream's, the CP plans' (`cp_summary`), the estimate's and the settings.
nlohmann::json JsonSummary(const Planned& p, const CpSummary& cp_summary) {
  const Settings& settings = p.settings;
  const PackerConfig& config = settings.plan.config;
  nlohmann::json summary = SummaryToJson(p.main.summary);
  if (settings.plan.cp_size > 0) {
    summary["cp"] = CpSummaryToJson(cp_summary);
    summary["cp"]["cp_size"] = settings.plan.cp_size;
    summary["cp"]["sharding"] = settings.spec.sharding;
  }
  if (p.estimate) {
    summary["estimate"] = {
        {"tp", p.estimate->sizes.tp},
        {"cp", p.estimate->sizes.cp},
        {"pp", p.estimate->sizes.pp},
        {"dp", p.estimate->sizes.dp},
        {"sharding", settings.spec.sharding},
        {"gemm_tflops", settings.gemm_tflops},
        {"steps", p.estimate->steps},
        {"seconds", p.estimate->seconds},
        {"baseline_seconds", p.estimate->baseline_seconds},
        {"speedup", p.estimate->baseline_seconds / p.estimate->seconds},
    };
    if (p.estimate->dp_assigned_seconds) {
      summary["estimate"]["dp_assign"] = {
          {"seconds", *p.estimate->dp_assigned_seconds},
          {"round_robin_seconds", p.estimate->dp_round_robin_seconds},
          {"speedup", p.estimate->dp_round_robin_seconds / *p.estimate->dp_assigned_seconds}};
    }
  }
  summary["packer"] = settings.plan.packer;
  summary["context"] = config.context;
  summary["max_tokens"] = config.max_tokens;
  summary["micro_batches"] = config.micro_batches;
  summary["thresholds"] = p.options.thresholds;
  summary["window"] = p.options.window;
  summary["cost_model"] = p.cost.description();
  summary["cost_unit"] = p.cost.unit();
  summary["documents"] = p.input.lengths.size();
  summary["tokens"] = p.input.tokens;
  // Empty sequences (a Megatron index holds them) have no token to plan: skipped, counted here.
  if (p.input.empty > 0) summary["empty_sequences_skipped"] = p.input.empty;
  if (settings.timing) {
    summary["planning_ms_per_step_median"] = Median(p.main.run.plan_ms);
    double total = 0.0;
    for (double ms : p.main.run.plan_ms) total += ms;
    summary["planning_ms_total"] = total;
  }
  return summary;
}

}  // namespace

absl::Status BeginStreamed(const Settings& settings, const DocumentCost& cost,
                           const KernelModel& kernel_model, StreamedSteps& streamed) {
  if (settings.format != "json") return absl::OkStatus();
  auto to_spool = [spool = streamed.spool](std::string_view text) {
    return WriteSpool(spool, text);
  };
  streamed.json.emplace(to_spool, cost, settings.plan.config.max_tokens,
                        CpHook(settings, kernel_model, streamed.cp_summary));
  // Pending comes first in the document, and is known now: the run ends in a flush, which leaves
  // nothing pending (Packer::Flush; WriteJson checks it).
  return streamed.json->Pending({});
}

absl::Status AppendStreamedStep(const StepPlan& step, const Settings& settings,
                                const DocumentCost& cost, const KernelModel& kernel_model,
                                StreamedSteps& streamed) {
  if (streamed.json) return streamed.json->Step(step);
  if (settings.plan.cp_size > 0) {
    if (absl::Status s =
            PlanStepCp(step, settings.plan, kernel_model, streamed.cp_summary, nullptr);
        !s.ok()) {
      return s;
    }
  }
  return WriteSpool(streamed.spool, StepRow(step, cost, settings.plan.config.max_tokens));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status CheckOutputIsNotAnInput(const Settings& settings) {
  const std::string& out = settings.out;
  if (out.empty()) return absl::OkStatus();
  for (const auto& [flag, input] :
       {std::pair{"--docs", settings.docs}, std::pair{"--cost", settings.spec.cost},
        std::pair{"--kernel-profile", settings.spec.kernel_profile}}) {
    std::error_code ec;
    if (!input.empty() && input != "-" && std::filesystem::equivalent(out, input, ec) && !ec) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--out %s is the same file as %s %s: refusing to overwrite an input",
                          QuoteForMessage(out, 256), flag, QuoteForMessage(input, 256)));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteJson(const Planned& p) {
  Output output;
  if (absl::Status s = output.Open(p.settings.out); !s.ok()) return s;
  if (p.streamed != nullptr) {  // pending and the steps went to the spool as they were planned
    if (!p.main.pending.empty()) {
      return absl::InternalError(absl::StrFormat(
          "packer %s holds %d documents after its flush (Packer::Flush leaves none pending)",
          p.main.packer, p.main.pending.size()));
    }
    absl::Status s = p.streamed->json->Summary(JsonSummary(p, p.streamed->cp_summary));
    if (s.ok()) s = CopySpool(*p.streamed, output);
    return s.ok() ? output.Commit() : s;
  }
  CpSummary cp_summary;  // over steady steps, planned while the steps are written
  PlanJsonWriter writer([&output](std::string_view text) { return output.Write(text); }, p.cost,
                        p.settings.plan.config.max_tokens,
                        CpHook(p.settings, p.kernel_model, cp_summary));
  absl::Status s = writer.Pending(p.main.pending);
  for (size_t i = 0; s.ok() && i < p.main.run.steps.size(); ++i) {
    s = writer.Step(p.main.run.steps[i]);
  }
  if (s.ok()) s = writer.Summary(JsonSummary(p, cp_summary));
  return s.ok() ? output.Commit() : s;
}

absl::Status WriteTable(const Planned& p, const CpSummary& cp_summary) {
  const Settings& settings = p.settings;
  const Result& main = p.main;
  const Input& input = p.input;
  const DocumentCost& cost = p.cost;
  const PackerConfig& config = settings.plan.config;
  const PackerOptions& options = p.options;
  const std::string& packer = settings.plan.packer;
  const int32_t cp_size = settings.plan.cp_size;
  std::string header = absl::StrFormat(
      "wlb-plan: %s: %d documents, %s tokens, %d steps\n"
      "packer %s: S = %d, S_max = %d, N = %d, thresholds = %s%s, window = %d\n"
      "cost: %s\n",
      input.name, input.lengths.size(), Mega(input.tokens),
      p.streamed != nullptr ? p.streamed->arrival_steps : static_cast<int64_t>(input.steps.size()),
      packer, config.context, config.max_tokens, config.micro_batches,
      options.thresholds.empty() ? "none" : absl::StrJoin(options.thresholds, ","), p.tune_note,
      options.window, cost.description());
  if (input.empty > 0) {  // a Megatron index's empty sequences: no token to plan
    absl::StrAppendFormat(&header, "skipped %d empty sequences of the input (no token to plan)\n",
                          input.empty);
  }
  Output output;
  if (absl::Status s = output.Open(settings.out); !s.ok()) return s;
  std::string out = header + StepTable(main, cost, config.max_tokens);
  if (p.streamed != nullptr) {  // the rows were written as the steps were planned
    if (absl::Status s = output.Write(out); !s.ok()) return s;
    out.clear();
    if (absl::Status s = CopySpool(*p.streamed, output); !s.ok()) return s;
  }
  absl::StrAppend(&out, kStepTableFooter);
  absl::StrAppend(
      &out,
      absl::StrFormat("\nsummary over the %d steady steps (%d drain, %d partial left out; "
                      "imbalance = max/mean micro-batch cost; gap LB / gap CB = mean imbalance - "
                      "mean lower bound / cap-aware bound; delay in steps, per token):\n",
                      main.summary.steps, main.summary.drain_steps, main.summary.partial_steps),
      kSummaryHeader);
  for (const Result* row : p.rows) absl::StrAppend(&out, SummaryRow(*row));
  if (cp_size > 0) {
    const CpSummary& c = cp_summary;
    absl::StrAppendFormat(
        &out,
        "\nCP shard plans of %s (C = %d, --sharding %s; %d micro-batches: %s):\n"
        "CP imbalance (max/mean over ranks) in causal pairs: mean %.3f, max %.3f; under the kernel "
        "model: mean %.3f, max %.3f; predicted slowest-rank attention %.1f ms in all\n",
        packer, cp_size, settings.spec.sharding, c.micro_batches,
        CpStrategyCounts(c, /*optional=*/false), c.pair_imbalance_mean, c.pair_imbalance_max,
        c.model_imbalance_mean, c.model_imbalance_max, c.max_rank_ms_total);
    if (const std::string used = CpStrategyCounts(c, /*optional=*/true); !used.empty()) {
      absl::StrAppendFormat(&out, "(%s micro-batches)\n", used);
    }
  }
  if (p.estimate) {
    const Estimate& e = *p.estimate;
    absl::StrAppendFormat(
        &out,
        "\nEstimated step time (1F1B step-time model, wlb/sim; (TP,CP,PP,DP) = (%d,%d,%d,%d), "
        "%s, linear part at %g TFLOP/s per GPU, attention by the kernel model, drain steps "
        "included):\n"
        "%s with %s CP: %.3f s per step, %.1f s in all\n"
        "Plain-4D (original packing, per-seq CP) on the same stream: %.1f s in all\n"
        "estimated speedup over Plain-4D: %.3fx\n",
        e.sizes.tp, e.sizes.cp, e.sizes.pp, e.sizes.dp, settings.spec.cost, settings.gemm_tflops,
        packer, settings.spec.sharding,
        e.seconds / static_cast<double>(std::max<int64_t>(1, e.steps)), e.seconds,
        e.baseline_seconds, e.baseline_seconds / e.seconds);
    if (e.dp_assigned_seconds) {
      absl::StrAppendFormat(
          &out,
          "DP assignment by the 1F1B model (--dp-assign): %.3f s per step, %.1f s in all; "
          "round-robin (micro-batch k on DP rank k %% DP): %.1f s in all; speedup %.3fx\n",
          *e.dp_assigned_seconds / static_cast<double>(std::max<int64_t>(1, e.steps)),
          *e.dp_assigned_seconds, e.dp_round_robin_seconds,
          e.dp_round_robin_seconds / *e.dp_assigned_seconds);
    }
  }
  if (absl::Status s = output.Write(out); !s.ok()) return s;
  return output.Commit();
}

}  // namespace wlb::cli

namespace wlb::cli {

absl::Status WriteStdout(std::string_view text) {
  Output output;
  if (absl::Status s = output.Open(""); !s.ok()) return s;
  if (absl::Status s = output.Write(text); !s.ok()) return s;
  return output.Commit();
}

absl::StatusOr<std::string> FitCostReport(const std::string& path, const std::string& flop_preset) {
  absl::StatusOr<std::vector<MicroBatchSample>> rows = ReadMicroBatchCsv(path);
  if (!rows.ok()) return rows.status();
  absl::StatusOr<MicroBatchFit> fit = FitMicroBatchCost(*rows);
  if (!fit.ok()) return fit.status();
  absl::StatusOr<CostModel> flop = CostModelFromPreset(flop_preset);
  if (!flop.ok()) return flop.status();
  absl::StatusOr<ModelErrors> flop_errors = CostModelErrors(*flop, *rows, /*fit_scale=*/true);
  if (!flop_errors.ok()) return flop_errors.status();
  std::string out = absl::StrFormat(
      "wlb-plan --fit-cost %s: %d measured micro-batches; held out %s (a fit on each half "
      "predicts the other half)\n"
      "fit: ms = a*sum(d^2) + b*sum(d) + c*documents + per_call, all >= 0, least relative error\n"
      "  a = %.9g ms per token^2 (attn_quadratic)\n"
      "  b = %.9g ms per token (linear_per_token)\n"
      "  c = %.9g ms per document (per_document)\n"
      "  per_call = %.9g ms\n",
      absl::CHexEscape(path), fit->samples, fit->held_out_rule, fit->model.attn_quadratic,
      fit->model.linear_per_token, fit->model.per_document, fit->per_call_ms);
  for (const CalibratedCost& c : CalibratedPresets()) {
    if (std::filesystem::path(path).filename() == std::filesystem::path(c.source).filename()) {
      absl::StrAppendFormat(&out, "  (the shipped calibration %s is fitted to %s)\n", c.name,
                            c.source);
    }
  }
  absl::StrAppend(&out,
                  "\n| cost model | in sample mean | in sample max | held out mean | held out "
                  "max |\n|---|---|---|---|---|\n");
  const auto row = [](std::string_view name, const PredictionError& in,
                      const PredictionError& held) {
    return absl::StrFormat("| %s | %.2f%% | %.2f%% | %.2f%% | %.2f%% |\n", name,
                           100 * in.mean_relative, 100 * in.max_relative, 100 * held.mean_relative,
                           100 * held.max_relative);
  };
  absl::StrAppend(&out, row("micro-batch fit", fit->in_sample, fit->held_out));
  absl::StrAppend(&out, row(absl::StrFormat("FLOP preset %s, best time scale (%.4g ms per TFLOP)",
                                            flop_preset, 1e12 * flop_errors->in_sample.scale),
                            flop_errors->in_sample, flop_errors->held_out));
  return out;
}

}  // namespace wlb::cli
