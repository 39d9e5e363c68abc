// wlb-plan: plans packed micro-batches for a stream of documents and reports their balance.
// See wlb_plan.h, and README.md ("wlb-plan") for every flag and the JSON schema.
#include "wlb_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli_help.h"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "lengths file (one integer per line, or a JSON array); '-' reads stdin; empty samples "
          "the embedded distribution named by --distribution");
ABSL_FLAG(std::string, distribution, "default",
          "when --docs is empty: default (the embedded WLB-LLM-like histogram) or heavy-tail");
ABSL_FLAG(int64_t, context, 131072, "context window S in tokens (longest piece)");
ABSL_FLAG(int64_t, max_tokens, 0, "variable-length cap S_max per micro-batch; 0 = S + S/4");
ABSL_FLAG(int32_t, micro_batches, 4, "micro-batches per step N (= PP x DP)");
ABSL_FLAG(std::string, packer, "wlb",
          "original, original-nextfit, fixed-greedy, wlb, wlb-refine or wlb-lookahead");
ABSL_FLAG(int32_t, lookahead, 1,
          "wlb-lookahead: K in [0, 8], steps of prefetched arrivals it sees ahead");
ABSL_FLAG(int32_t, window, 1, "fixed-greedy: steps packed together");
ABSL_FLAG(std::string, thresholds, "",
          "wlb/wlb-refine/wlb-lookahead: comma-separated outlier thresholds L_1<L_2<... in tokens, "
          "or 'none'");
ABSL_FLAG(int32_t, queues, 2,
          "wlb/wlb-refine/wlb-lookahead: number of outlier queues with default thresholds "
          "(instead of --thresholds)");
ABSL_FLAG(bool, tune, false,
          "wlb/wlb-refine/wlb-lookahead: pick thresholds with the tuner on the planned stream "
          "itself, within --delay_budget");
ABSL_FLAG(double, delay_budget, 1.0,
          "--tune, wlb-lookahead: max mean token delay in steps (wlb-lookahead: default none "
          "beyond wlb's delay, 1 with --tune)");
ABSL_FLAG(std::string, cost, "llama2-7b",
          "cost model: a preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m), a masked preset "
          "(llama2-7b-swa4k, llama2-7b-chunk8k, llama2-7b-causal: FLOPs under a layer mix of "
          "attention masks; doc-degree CP plans for its masks too) or a profile CSV of length -> "
          "latency to fit");
ABSL_FLAG(std::string, profile_cost, "fit",
          "with a profile CSV in --cost: 'fit' (least-squares quadratic) or 'table' (tile-aware "
          "interpolation of the measured points)");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the default distribution");
ABSL_FLAG(int64_t, steps, 0,
          "steps to plan: default distribution samples this many (0 = 100); a file is cut after "
          "this many (0 = all)");
ABSL_FLAG(int32_t, cp, -1,
          "context-parallel size C in [1, 4096]: add CP shard plans to every micro-batch (omit "
          "for none)");
ABSL_FLAG(std::string, sharding, "adaptive",
          "with --cp or --estimate: " + wlb::ShardStrategyNameList(" or "));
ABSL_FLAG(double, cp_link_gbps, wlb::kDefaultCpLinkGbps,
          "with --sharding doc-degree: K/V link bandwidth per rank and direction in GB/s "
          "(default 450: NVLink 4, 900 GB/s both ways); in (0, 1e6]");
ABSL_FLAG(std::string, kernel_profile, "",
          "with --cp or --estimate: kernel profile CSV (q_len,kv_len,ms) for the kernel model; "
          "empty = the analytic default (tile 128)");
ABSL_FLAG(std::string, estimate, "",
          "TP,CP,PP,DP: estimate step time with the 1F1B step-time model (wlb/sim) for this "
          "job, against Plain-4D (original packing, per-seq CP) on the same stream; needs a "
          "preset --cost and --micro-batches = PP x DP; CP shards with --sharding");
ABSL_FLAG(double, gemm_tflops, 500.0,
          "--estimate: achieved GEMM TFLOP/s per GPU for the linear part (> 0)");
ABSL_FLAG(bool, dp_assign, false,
          "with --estimate: also place each step's micro-batches on the DP ranks by the 1F1B "
          "model (wlb/sim/dp_assign.hpp) and report the step time against round-robin");
ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(std::string, out, "", "write the output to this file instead of stdout");
ABSL_FLAG(bool, timing, true, "json: include planning times in the summary (they vary run to run)");
ABSL_FLAG(bool, compare, true, "table: also run original and wlb packing on the same stream");

namespace wlb::cli {
namespace {

// wlb-plan's own flags (Abseil registers others, e.g. --flagfile, that wlb-plan does not offer).
constexpr const char* kFlagNames[] = {
    "docs",        "distribution", "context",  "max_tokens",     "micro_batches",
    "packer",      "lookahead",    "window",   "thresholds",     "queues",
    "tune",        "delay_budget", "cost",     "profile_cost",   "seed",
    "steps",       "cp",           "sharding", "kernel_profile", "estimate",
    "gemm_tflops", "format",       "out",      "timing",         "compare",
    "dp_assign",   "cp_link_gbps"};
constexpr const char* kHelpFlags[] = {"help", "helpfull", "helpshort", "helppackage", "version"};

// The flags given on the command line (set by ParseArgs).
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}
bool Given(const char* name) { return GivenFlags().count(name) > 0; }

absl::StatusOr<std::vector<int64_t>> ParseThresholds(const std::string& text) {
  std::vector<int64_t> values;
  if (text == "none") return values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--thresholds: %s is not an integer token count", QuoteForMessage(part)));
    }
    if (values.size() >= static_cast<size_t>(kMaxOutlierQueues)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--thresholds: more than %d thresholds (one per outlier queue)", kMaxOutlierQueues));
    }
    values.push_back(v);
  }
  return values;
}

std::string Mega(int64_t tokens) { return absl::StrFormat("%.1fM", tokens / 1e6); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string packer;
  PackRun run;
  StreamSummary summary;
  std::vector<Document> pending;
};

absl::StatusOr<Result> Plan(const std::string& name, const PackerConfig& config,
                            const DocumentCost& cost, const PackerOptions& options,
                            const std::vector<std::vector<Document>>& arrivals) {
  absl::StatusOr<std::unique_ptr<Packer>> packer = MakePacker(name, config, cost, options);
  if (!packer.ok()) return packer.status();
  absl::StatusOr<PackRun> run = RunPacker(**packer, arrivals);
  if (!run.ok()) return run.status();
  Result r{.packer = name, .run = *std::move(run)};
  r.summary = Summarize(r.run.steps, cost, config.max_tokens);
  r.pending = (*packer)->Pending();
  return r;
}

std::string SummaryRow(const Result& r) {
  const StreamSummary& s = r.summary;
  return absl::StrFormat(
      "| %-13s | %9.3f | %5.3f | %5.3f | %6.3f | %6.3f | %5.2f | %3.0f | %3.0f | %7.3f |\n",
      r.packer, s.imbalance_mean, s.imbalance_p90, s.imbalance_max,
      s.imbalance_mean - s.lower_bound_mean, s.imbalance_mean - s.cap_lower_bound_mean,
      s.delay.mean, s.delay.p99, s.delay.max, Median(r.run.plan_ms));
}

// CP shard plans of one step's micro-batches, one at a time: each is added to `summary` (steady
// steps only) and, with `step_json`, written into its micro-batch there; none is kept, so a run
// at C = 4096 holds one shard plan at a time, not one per micro-batch of the run.
absl::Status PlanStepCp(const StepPlan& step, int cp_size, ShardStrategy strategy,
                        const KernelModel& model, const CpPlanOptions& options,
                        CpSummary& summary, nlohmann::json* step_json) {
  for (size_t m = 0; m < step.micro_batches.size(); ++m) {
    absl::StatusOr<ShardPlan> plan =
        PlanShards(step.micro_batches[m], cp_size, strategy, model, options);
    if (!plan.ok()) return plan.status();
    const CpBalance balance = MeasureCpBalance(*plan, model);
    if (!step.drain) summary.Add(*plan, balance);
    if (step_json != nullptr) {
      nlohmann::json& mb = (*step_json)["micro_batches"][m];
      mb.update(ShardPlanToJson(*plan));
      mb["cp_balance"] = CpBalanceToJson(balance);
    }
  }
  return absl::OkStatus();
}

// `value`.dump(1) as it reads nested `depth` levels deep in a dump(1) of the whole document (JSON
// strings hold no raw newline, so every newline starts a line of the value).
std::string DumpNested(const nlohmann::json& value, int depth) {
  const std::string text = value.dump(1);
  return absl::StrReplaceAll(text, {{"\n", "\n" + std::string(static_cast<size_t>(depth), ' ')}});
}

// --estimate: modelled step time of the planned stream and of Plain-4D on the same stream.
struct Estimate {
  ParallelSizes sizes;
  double seconds = 0.0;           // the chosen packer with --sharding
  double baseline_seconds = 0.0;  // original packing, per-seq CP
  int64_t steps = 0;
  // --dp-assign: the chosen packer's steps with micro-batches placed on DP ranks by the model,
  // and with micro-batch k on rank k % DP.
  std::optional<double> dp_assigned_seconds;
  double dp_round_robin_seconds = 0.0;
};

absl::StatusOr<Estimate> EstimateSteps(const StepTimeModel& model, ShardStrategy strategy,
                                       const Result& planned, const Result& baseline) {
  Estimate e{.sizes = model.job().sizes, .steps = static_cast<int64_t>(planned.run.steps.size())};
  absl::StatusOr<double> t = model.StreamSeconds(planned.run.steps, {.candidates = {strategy}});
  if (!t.ok()) return t.status();
  absl::StatusOr<double> b =
      model.StreamSeconds(baseline.run.steps, {.candidates = {ShardStrategy::kPerSequence}});
  if (!b.ok()) return b.status();
  e.seconds = *t;
  e.baseline_seconds = *b;
  if (absl::GetFlag(FLAGS_dp_assign)) {
    e.dp_assigned_seconds = 0.0;
    for (const StepPlan& step : planned.run.steps) {
      absl::StatusOr<DpAssignment> a = AssignStepDpRanks(model, step, {.candidates = {strategy}});
      if (!a.ok()) return a.status();
      *e.dp_assigned_seconds += a->step_seconds;
      e.dp_round_robin_seconds += a->round_robin_seconds;
    }
  }
  return e;
}

constexpr char kSummaryHeader[] =
    "| packer        | imbalance |   p90 |   max | gap LB | gap CB | delay |  p99 | max | ms/step "
    "|\n"
    "|---------------|-----------|-------|-------|--------|--------|-------|------|-----|---------|"
    "\n";

// The per-step summary of the chosen packer, then its stream summary.
std::string StepTable(const Result& r, const DocumentCost& cost, int64_t max_tokens) {
  std::string out =
      "\n step | docs |   tokens | tokens per micro-batch (min..max) | imbalance | lower bound | "
      "cap bound | held back\n";
  for (const StepPlan& s : r.run.steps) {
    int64_t docs = 0, tokens = 0, lo = INT64_MAX, hi = 0;
    for (const MicroBatch& mb : s.micro_batches) {
      docs += static_cast<int64_t>(mb.documents.size());
      tokens += mb.tokens;
      lo = std::min(lo, mb.tokens);
      hi = std::max(hi, mb.tokens);
    }
    absl::StrAppendFormat(&out,
                          "%5d%s | %4d | %8d | %15d..%-16d | %9.3f | %11.3f | %9.3f | %d docs\n",
                          s.step, s.drain ? "*" : (s.partial ? "+" : " "), docs, tokens, lo, hi,
                          ImbalanceDegree(s.micro_batches), LowerBound(s.micro_batches, cost),
                          CapLowerBound(s.micro_batches, cost, max_tokens), s.held_back_documents);
  }
  absl::StrAppend(&out,
                  "(* = drain step after the end of input, + = partial step planned from the "
                  "short last step of the input; both left out of the summary)\n");
  return out;
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
    std::string tmp = real_.string() + ".wlb-XXXXXX";
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

absl::Status WriteOutput(const std::string& text) {
  Output out;
  if (absl::Status s = out.Open(absl::GetFlag(FLAGS_out)); !s.ok()) return s;
  if (absl::Status s = out.Write(text); !s.ok()) return s;
  return out.Commit();
}

// --out must not name a file the run reads: it would be replaced by the output.
absl::Status CheckOutputIsNotAnInput() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::OkStatus();
  for (const auto& [flag, input] : {std::pair{"--docs", absl::GetFlag(FLAGS_docs)},
                                    std::pair{"--cost", absl::GetFlag(FLAGS_cost)},
                                    std::pair{"--kernel-profile",
                                              absl::GetFlag(FLAGS_kernel_profile)}}) {
    std::error_code ec;
    if (!input.empty() && input != "-" && std::filesystem::equivalent(out, input, ec) && !ec) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--out %s is the same file as %s %s: refusing to overwrite an input",
                          QuoteForMessage(out, 256), flag, QuoteForMessage(input, 256)));
    }
  }
  return absl::OkStatus();
}

// "--flag applies to ..., not to this run": a flag the run would not use is an error, never
// silently ignored.
absl::Status Unused(std::string flag, const std::string& why) {
  std::replace(flag.begin(), flag.end(), '_', '-');  // as the README spells flags
  return absl::InvalidArgumentError(absl::StrFormat("--%s is not used by this run: %s", flag, why));
}

}  // namespace

absl::Status ParseArgs(const std::vector<std::string>& args) {
  GivenFlags().clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unexpected argument %s (wlb-plan takes only flags; input goes in --docs)",
          QuoteForMessage(arg)));
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    std::string name = arg.substr(dashes, eq == std::string::npos ? eq : eq - dashes);
    std::replace(name.begin(), name.end(), '-', '_');
    std::optional<std::string> value;
    if (eq != std::string::npos) value = arg.substr(eq + 1);
    auto ours = [](const std::string& n) {
      return std::find_if(std::begin(kFlagNames), std::end(kFlagNames),
                          [&](const char* f) { return n == f; }) != std::end(kFlagNames);
    };
    absl::CommandLineFlag* flag = ours(name) ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr && name.size() > 2 && name.compare(0, 2, "no") == 0 && !value &&
        ours(name.substr(2))) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) {
        name = name.substr(2);
        value = "false";
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown flag %s (README.md lists the flags; --help prints them)",
                          QuoteForMessage(arg.substr(0, eq))));
    }
    if (!GivenFlags().insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s is given more than once", name));
    }
    if (!value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      const char* kind = flag->IsOfType<bool>()       ? "true or false"
                         : flag->IsOfType<double>()   ? "a number"
                         : flag->IsOfType<uint64_t>() ? "an integer in [0, 2^64)"
                         : flag->IsOfType<int64_t>()  ? "an integer in [-2^63, 2^63)"
                                                      : "an integer in [-2^31, 2^31)";
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: %s is not %s", name, QuoteForMessage(*value), kind));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Settings> SettingsFromFlags() {
  Settings s;
  s.config = {.context = absl::GetFlag(FLAGS_context),
              .micro_batches = absl::GetFlag(FLAGS_micro_batches)};
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max-tokens must be >= 0 (0 = S + S/4), got %d", max_tokens));
  }
  s.config.max_tokens = max_tokens > 0 ? max_tokens : DefaultMaxTokens(s.config.context);
  if (absl::Status st = ValidateConfig(s.config); !st.ok()) return st;
  s.format = absl::GetFlag(FLAGS_format);
  if (s.format != "table" && s.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--format must be table or json, got %s", QuoteForMessage(s.format)));
  }
  s.steps = absl::GetFlag(FLAGS_steps);
  if (s.steps < 0 || s.steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps must be in [0, %d] (0 = all), got %d", kMaxSteps, s.steps));
  }
  const bool default_input = absl::GetFlag(FLAGS_docs).empty();
  if (default_input) {
    absl::StatusOr<int64_t> tokens = StreamTokensForSteps(s.config, s.steps > 0 ? s.steps : 100);
    if (!tokens.ok()) return tokens.status();
    const std::string distribution = absl::GetFlag(FLAGS_distribution);
    if (distribution != "default" && distribution != "heavy-tail") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--distribution must be default or heavy-tail, got %s", QuoteForMessage(distribution)));
    }
  } else {
    if (Given("seed")) {
      return Unused("seed", "it seeds the sampled distribution, and --docs is given");
    }
    if (Given("distribution")) {
      return Unused("distribution", "it picks the sampled distribution, and --docs is given");
    }
  }

  // The cost model is resolved (and a profile read) in Run(); here only what the flags say.
  const std::string cost_name = absl::GetFlag(FLAGS_cost);
  const bool cost_is_preset = CostModelFromPreset(cost_name).ok();
  const absl::StatusOr<MaskedModel> masked_model = FindMaskedModel(cost_name);
  if (const std::string pc = absl::GetFlag(FLAGS_profile_cost); pc != "fit" && pc != "table") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--profile-cost must be fit or table, got %s", QuoteForMessage(pc)));
  }
  if (Given("profile_cost") && (cost_is_preset || masked_model.ok())) {
    return Unused("profile-cost", absl::StrFormat("it applies to a profile CSV in --cost, and "
                                                  "--cost is the preset %s",
                                                  QuoteForMessage(cost_name)));
  }

  s.packer = absl::GetFlag(FLAGS_packer);
  const bool wlb_family =
      s.packer == "wlb" || s.packer == "wlb-refine" || s.packer == "wlb-lookahead";
  const bool table_compares = s.format == "table" && absl::GetFlag(FLAGS_compare);
  s.options.window = absl::GetFlag(FLAGS_window);
  s.options.lookahead = absl::GetFlag(FLAGS_lookahead);
  if (Given("lookahead") && s.packer != "wlb-lookahead") {
    return Unused("lookahead", "it sets wlb-lookahead's K, and --packer is " + s.packer);
  }
  if (Given("window") && s.packer != "fixed-greedy") {
    return Unused("window", "it sets fixed-greedy's window, and --packer is " + s.packer);
  }
  // Thresholds are used by wlb/wlb-refine/wlb-lookahead, and by the table's wlb comparison row.
  const bool thresholds_used = wlb_family || table_compares;
  if (!thresholds_used) {
    for (const char* flag : {"thresholds", "queues"}) {
      if (Given(flag)) {
        return Unused(flag, "it sets wlb's outlier queues, and neither --packer (" + s.packer +
                                ") nor a wlb comparison row (--format table --compare) uses them");
      }
    }
  }
  if (Given("thresholds") && Given("queues")) {
    return absl::InvalidArgumentError(
        "--thresholds and --queues both choose the outlier queues: give one of them");
  }
  if (const std::string thresholds = absl::GetFlag(FLAGS_thresholds); !thresholds.empty()) {
    absl::StatusOr<std::vector<int64_t>> t = ParseThresholds(thresholds);
    if (!t.ok()) return t.status();
    if (absl::Status st = ValidateThresholds(*t, s.config.context); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--thresholds%s: %s", wlb_family ? "" : " (used by the table's wlb comparison row)",
          st.message()));
    }
    s.options.thresholds = *std::move(t);
  } else if (thresholds_used) {
    const int queues = absl::GetFlag(FLAGS_queues);
    if (queues < 0 || queues > kMaxOutlierQueues) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--queues must be in [0, %d], got %d", kMaxOutlierQueues, queues));
    }
    s.options.thresholds = DefaultThresholds(s.config.context, queues);
    if (!ValidateThresholds(s.options.thresholds, s.config.context).ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--context %d is too small for %d default outlier queues (their thresholds would be "
          "%s, not strictly increasing): give fewer --queues, --thresholds or a larger --context",
          s.config.context, queues, absl::StrJoin(s.options.thresholds, ",")));
    }
  }
  // Validate the packer and its options before reading any input.
  if (auto p = MakePacker(s.packer, s.config, CostModel{}, s.options); !p.ok()) return p.status();
  if (!wlb_family) {
    for (const char* flag : {"tune", "delay_budget"}) {
      if (Given(flag)) {
        return Unused(flag, "--tune applies to wlb, wlb-refine and wlb-lookahead only");
      }
    }
  } else if (Given("delay_budget") && !absl::GetFlag(FLAGS_tune) && s.packer != "wlb-lookahead") {
    return Unused("delay-budget", "it bounds --tune and wlb-lookahead, and neither is used");
  }
  const double budget = absl::GetFlag(FLAGS_delay_budget);
  if (!(budget >= 0.0) || !std::isfinite(budget)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--delay-budget must be a finite number >= 0, got %g", budget));
  }
  // wlb-lookahead spends at most the budget (and the tuner tunes it so).
  if (s.packer == "wlb-lookahead" && (Given("delay_budget") || absl::GetFlag(FLAGS_tune))) {
    s.options.delay_budget = budget;
  }
  const double gemm_tflops = absl::GetFlag(FLAGS_gemm_tflops);
  if (!(gemm_tflops >= kMinGemmTflops) || gemm_tflops > kMaxGemmTflops) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--gemm-tflops must be in [%g, %.0f] TFLOP/s per GPU, got %g",
                        kMinGemmTflops, kMaxGemmTflops, gemm_tflops));
  }
  if (const std::string estimate = absl::GetFlag(FLAGS_estimate); !estimate.empty()) {
    absl::StatusOr<ParallelSizes> sizes = ParseParallelSizes(estimate);
    if (!sizes.ok())
      return absl::InvalidArgumentError(absl::StrCat("--estimate: ", sizes.status().message()));
    const int64_t pp_dp = int64_t{sizes->pp} * sizes->dp;
    if (pp_dp != s.config.micro_batches) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--estimate %s needs --micro-batches = PP x DP = %d, got %d",
                          QuoteForMessage(estimate), pp_dp, s.config.micro_batches));
    }
    if (Given("cp") && absl::GetFlag(FLAGS_cp) != sizes->cp) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--cp %d differs from the CP size %d of --estimate %s",
                          absl::GetFlag(FLAGS_cp), sizes->cp, QuoteForMessage(estimate)));
    }
    if (!cost_is_preset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--estimate needs a model shape: --cost must be a preset (llama2-7b, llama2-13b, "
          "llama2-70b, wlb-550m), got %s",
          QuoteForMessage(cost_name)));
    }
    s.estimate = *sizes;
  } else if (Given("gemm_tflops")) {
    return Unused("gemm-tflops", "it applies to --estimate, which is not given");
  } else if (absl::GetFlag(FLAGS_dp_assign)) {
    return Unused("dp-assign", "it applies to --estimate, which is not given");
  }
  s.cp_size = absl::GetFlag(FLAGS_cp);
  if (s.cp_size == -1 && !Given("cp")) {
    for (const char* flag : {"sharding", "kernel_profile"}) {
      if (Given(flag) && !s.estimate) {
        return Unused(flag,
                      "it applies to CP shard plans (--cp) and --estimate, and neither is "
                      "given");
      }
    }
  } else if (s.cp_size < 1 || s.cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cp must be a context-parallel size in [1, %d] (omit it for no shard plans), got %d",
        kMaxCpSize, s.cp_size));
  }
  absl::StatusOr<ShardStrategy> strategy = ParseShardStrategy(absl::GetFlag(FLAGS_sharding));
  if (!strategy.ok()) return strategy.status();
  s.strategy = *strategy;
  s.cp_options.comm.link_gbps = absl::GetFlag(FLAGS_cp_link_gbps);
  if (masked_model.ok()) s.cp_options.mix = masked_model->mix;  // doc-degree plans for its masks
  if (Given("cp_link_gbps")) {
    if (!FindShardStrategy(s.strategy)->uses.cp_link || s.cp_size < 1) {
      return Unused("cp-link-gbps",
                    "it applies to --cp with --sharding " +
                        ShardStrategyNameList(
                            " or ", [](const ShardStrategyInfo& i) { return i.uses.cp_link; }));
    }
    if (absl::Status st = ValidateCommModel(s.cp_options.comm); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("--cp-link-gbps: %s", st.message()));
    }
  }
  if (Given("timing") && s.format != "json") {
    return Unused("timing", "it applies to --format json");
  }
  if (Given("compare") && s.format != "table") {
    return Unused("compare", "it applies to --format table");
  }
  return s;
}

namespace {

absl::Status Run() {
  absl::StatusOr<Settings> settings = SettingsFromFlags();
  if (!settings.ok()) return settings.status();
  const PackerConfig& config = settings->config;
  const std::string& format = settings->format;
  const std::string& packer = settings->packer;
  PackerOptions options = settings->options;
  const int64_t steps = settings->steps;
  const int32_t cp_size = settings->cp_size;
  // A masked model preset (llama2-7b-swa4k, ...): the mask-aware FLOP cost of its layer mix.
  const absl::StatusOr<MaskedModel> masked = FindMaskedModel(absl::GetFlag(FLAGS_cost));
  absl::StatusOr<ProfileFit> cost =
      masked.ok() ? ProfileFit{} : ResolveCostModel(absl::GetFlag(FLAGS_cost));
  if (!cost.ok()) return cost.status();
  DocumentCost doc_cost = cost->model;
  if (masked.ok()) {
    absl::StatusOr<DocumentCost> mixed = masked->MakeCost();
    if (!mixed.ok()) return mixed.status();
    doc_cost = *std::move(mixed);
  }
  if (absl::GetFlag(FLAGS_profile_cost) == "table") {
    if (cost->model.unit != "ms") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--profile-cost table needs a profile CSV in --cost, got %s",
                          QuoteForMessage(absl::GetFlag(FLAGS_cost))));
    }
    absl::StatusOr<std::vector<ProfilePoint>> points = ReadProfileCsv(absl::GetFlag(FLAGS_cost));
    if (!points.ok()) return points.status();
    absl::StatusOr<TabulatedCost> table = TabulatedCost::Create(*points);
    if (!table.ok()) return table.status();
    doc_cost = DocumentCost::From(
        *std::move(table), "ms",
        absl::StrFormat("tile-aware table of %d measured lengths from %s (128-token tiles, "
                        "log-log interpolation)",
                        points->size(), absl::CHexEscape(absl::GetFlag(FLAGS_cost))));
  }
  KernelModel kernel_model = KernelModel::Default();
  if (const std::string profile = absl::GetFlag(FLAGS_kernel_profile); !profile.empty()) {
    absl::StatusOr<KernelModel> m = ReadKernelProfileCsv(profile);
    if (!m.ok()) return m.status();
    kernel_model = *std::move(m);
  }

  std::optional<StepTimeModel> step_model;
  if (settings->estimate) {
    absl::StatusOr<TransformerShape> shape = FindTransformerShape(absl::GetFlag(FLAGS_cost));
    if (!shape.ok()) return shape.status();
    absl::StatusOr<PipelineJob> job =
        MakePipelineJob(*shape, *settings->estimate, absl::GetFlag(FLAGS_gemm_tflops));
    if (!job.ok()) return job.status();
    if (!absl::GetFlag(FLAGS_kernel_profile).empty()) job->kernel = kernel_model;
    absl::StatusOr<StepTimeModel> m = StepTimeModel::Create(*std::move(job));
    if (!m.ok()) return m.status();
    step_model = *std::move(m);
  }

  absl::StatusOr<Input> input = LoadInput({.docs = absl::GetFlag(FLAGS_docs),
                                           .distribution = absl::GetFlag(FLAGS_distribution),
                                           .seed = absl::GetFlag(FLAGS_seed),
                                           .steps = steps},
                                          config.context, config.micro_batches);
  if (!input.ok()) return input.status();
  const std::vector<std::vector<Document>>& arrivals = input->steps;

  std::string tune_note;
  if (absl::GetFlag(FLAGS_tune)) {
    if (packer != "wlb" && packer != "wlb-refine" && packer != "wlb-lookahead") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tune applies to wlb, wlb-refine and wlb-lookahead, not %s", QuoteForMessage(packer)));
    }
    absl::StatusOr<TunedThresholds> tuned =
        TuneThresholds(arrivals, config, doc_cost,
                       {.delay_budget = absl::GetFlag(FLAGS_delay_budget), .packer = packer});
    if (!tuned.ok()) return tuned.status();
    options.thresholds = tuned->thresholds;
    tune_note = absl::StrFormat(" (tuned over %d sets for mean delay <= %g)", tuned->evaluated,
                                absl::GetFlag(FLAGS_delay_budget));
  }

  absl::StatusOr<Result> main = Plan(packer, config, doc_cost, options, arrivals);
  if (!main.ok()) return main.status();
  CpSummary cp_summary;                   // over steady steps
  if (cp_size > 0 && format != "json") {  // json plans them while it writes them
    for (const StepPlan& step : main->run.steps) {
      if (absl::Status s =
              PlanStepCp(step, cp_size, settings->strategy, kernel_model, settings->cp_options,
                         cp_summary, nullptr);
          !s.ok()) {
        return s;
      }
    }
  }

  std::optional<Estimate> estimate;
  if (step_model) {
    absl::StatusOr<Result> baseline =
        packer == "original" ? main : Plan("original", config, doc_cost, options, arrivals);
    if (!baseline.ok()) return baseline.status();
    absl::StatusOr<Estimate> e = EstimateSteps(*step_model, settings->strategy, *main, *baseline);
    if (!e.ok()) return e.status();
    estimate = *e;
  }

  if (format == "json") {
    // Streamed step by step, byte for byte what PlanToJson(...).dump(1) of the whole run with the
    // summary would be ({"pending", "steps", "summary"}: nlohmann orders keys), without building
    // that tree: a step's JSON and its shard plans are written and dropped.
    Output output;
    if (absl::Status s = output.Open(absl::GetFlag(FLAGS_out)); !s.ok()) return s;
    nlohmann::json pending = nlohmann::json::array();
    for (const Document& d : main->pending) pending.push_back(DocumentToJson(d));
    std::string text = "{\n \"pending\": " + DumpNested(pending, 1) + ",\n \"steps\": ";
    text += main->run.steps.empty() ? "[]" : "[\n";
    for (size_t i = 0; i < main->run.steps.size(); ++i) {
      const StepPlan& step = main->run.steps[i];
      nlohmann::json step_json = StepToJson(step, doc_cost, config.max_tokens);
      if (cp_size > 0) {
        if (absl::Status s =
                PlanStepCp(step, cp_size, settings->strategy, kernel_model, settings->cp_options,
                           cp_summary, &step_json);
            !s.ok()) {
          return s;
        }
      }
      absl::StrAppend(&text, "  ", DumpNested(step_json, 2),
                      i + 1 < main->run.steps.size() ? ",\n" : "\n ]");
      if (absl::Status s = output.Write(text); !s.ok()) return s;
      text.clear();
    }
    nlohmann::json summary = SummaryToJson(main->summary);
    if (cp_size > 0) {
      summary["cp"] = CpSummaryToJson(cp_summary);
      summary["cp"]["cp_size"] = cp_size;
      summary["cp"]["sharding"] = absl::GetFlag(FLAGS_sharding);
    }
    if (estimate) {
      summary["estimate"] = {
          {"tp", estimate->sizes.tp},
          {"cp", estimate->sizes.cp},
          {"pp", estimate->sizes.pp},
          {"dp", estimate->sizes.dp},
          {"sharding", absl::GetFlag(FLAGS_sharding)},
          {"gemm_tflops", absl::GetFlag(FLAGS_gemm_tflops)},
          {"steps", estimate->steps},
          {"seconds", estimate->seconds},
          {"baseline_seconds", estimate->baseline_seconds},
          {"speedup", estimate->baseline_seconds / estimate->seconds},
      };
      if (estimate->dp_assigned_seconds) {
        summary["estimate"]["dp_assign"] = {
            {"seconds", *estimate->dp_assigned_seconds},
            {"round_robin_seconds", estimate->dp_round_robin_seconds},
            {"speedup", estimate->dp_round_robin_seconds / *estimate->dp_assigned_seconds}};
      }
    }
    summary["packer"] = packer;
    summary["context"] = config.context;
    summary["max_tokens"] = config.max_tokens;
    summary["micro_batches"] = config.micro_batches;
    summary["thresholds"] = options.thresholds;
    summary["window"] = options.window;
    summary["cost_model"] = doc_cost.description();
    summary["cost_unit"] = doc_cost.unit();
    summary["documents"] = input->lengths.size();
    summary["tokens"] = TotalTokens(input->pieces);
    if (absl::GetFlag(FLAGS_timing)) {
      summary["planning_ms_per_step_median"] = Median(main->run.plan_ms);
      double total = 0.0;
      for (double ms : main->run.plan_ms) total += ms;
      summary["planning_ms_total"] = total;
    }
    absl::StrAppend(&text, ",\n \"summary\": ", DumpNested(summary, 1), "\n}\n");
    if (absl::Status s = output.Write(text); !s.ok()) return s;
    return output.Commit();
  }

  std::string header = absl::StrFormat(
      "wlb-plan: %s: %d documents, %s tokens, %d steps\n"
      "packer %s: S = %d, S_max = %d, N = %d, thresholds = %s%s, window = %d\n"
      "cost: %s\n",
      input->name, input->lengths.size(), Mega(TotalTokens(input->pieces)), arrivals.size(), packer,
      config.context, config.max_tokens, config.micro_batches,
      options.thresholds.empty() ? "none" : absl::StrJoin(options.thresholds, ","), tune_note,
      options.window, doc_cost.description());
  std::string out = header + StepTable(*main, doc_cost, config.max_tokens);
  absl::StrAppend(
      &out,
      absl::StrFormat("\nsummary over the %d steady steps (%d drain, %d partial left out; "
                      "imbalance = max/mean micro-batch cost; gap LB / gap CB = mean imbalance - "
                      "mean lower bound / cap-aware bound; delay in steps, per token):\n",
                      main->summary.steps, main->summary.drain_steps, main->summary.partial_steps),
      kSummaryHeader);
  std::vector<std::string> compared = {"original", "wlb"};
  if (packer != "original" && packer != "wlb") compared.push_back(packer);
  if (!absl::GetFlag(FLAGS_compare)) compared = {packer};
  for (const std::string& name : compared) {
    if (name == packer) {
      absl::StrAppend(&out, SummaryRow(*main));
      continue;
    }
    absl::StatusOr<Result> other = Plan(name, config, doc_cost, options, arrivals);
    if (!other.ok()) return other.status();
    absl::StrAppend(&out, SummaryRow(*other));
  }
  if (cp_size > 0) {
    const CpSummary& c = cp_summary;
    absl::StrAppendFormat(
        &out,
        "\nCP shard plans of %s (C = %d, --sharding %s; %d micro-batches: %s):\n"
        "CP imbalance (max/mean over ranks) in causal pairs: mean %.3f, max %.3f; under the kernel "
        "model: mean %.3f, max %.3f; predicted slowest-rank attention %.1f ms in all\n",
        packer, cp_size, absl::GetFlag(FLAGS_sharding), c.micro_batches,
        CpStrategyCounts(c, /*optional=*/false), c.pair_imbalance_mean, c.pair_imbalance_max,
        c.model_imbalance_mean, c.model_imbalance_max, c.max_rank_ms_total);
    if (const std::string used = CpStrategyCounts(c, /*optional=*/true); !used.empty()) {
      absl::StrAppendFormat(&out, "(%s micro-batches)\n", used);
    }
  }
  if (estimate) {
    const Estimate& e = *estimate;
    absl::StrAppendFormat(
        &out,
        "\nEstimated step time (1F1B step-time model, wlb/sim; (TP,CP,PP,DP) = (%d,%d,%d,%d), "
        "%s, linear part at %g TFLOP/s per GPU, attention by the kernel model, drain steps "
        "included):\n"
        "%s with %s CP: %.3f s per step, %.1f s in all\n"
        "Plain-4D (original packing, per-seq CP) on the same stream: %.1f s in all\n"
        "estimated speedup over Plain-4D: %.3fx\n",
        e.sizes.tp, e.sizes.cp, e.sizes.pp, e.sizes.dp, absl::GetFlag(FLAGS_cost),
        absl::GetFlag(FLAGS_gemm_tflops), packer, absl::GetFlag(FLAGS_sharding),
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
  return WriteOutput(out);
}

}  // namespace

int Main(int argc, char** argv) {
  ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "plans balanced micro-batches for a document stream; see README.md for the flags");
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    std::string name = a.substr(
        a.find_first_not_of('-') == std::string::npos ? a.size() : a.find_first_not_of('-'));
    name = name.substr(0, name.find('='));
    if (a.size() > 1 && a[0] == '-' &&
        std::find(std::begin(kHelpFlags), std::end(kHelpFlags), name) != std::end(kHelpFlags)) {
      absl::ParseCommandLine(argc, argv);  // prints the usage and exits
    }
  }
  absl::Status status = ParseArgs(args);
  if (status.ok()) status = CheckOutputIsNotAnInput();
  if (status.ok()) status = Run();
  if (!status.ok()) {
    std::string message(status.message());
    std::replace(message.begin(), message.end(), '\n', ' ');  // always one line
    std::fprintf(stderr, "wlb-plan: error: ");
    std::fwrite(message.data(), 1, message.size(), stderr);
    std::fprintf(stderr, "\n");
    return 1;
  }
  return 0;
}

}  // namespace wlb::cli
