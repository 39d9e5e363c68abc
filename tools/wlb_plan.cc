// wlb-plan: plans packed micro-batches for a stream of documents and reports their balance.
// See wlb_plan.h, and README.md ("wlb-plan") for every flag and the JSON schema.
#include "wlb_plan.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, "",
          "lengths file (one integer per line, or a JSON array); '-' reads stdin; empty samples "
          "the embedded default distribution");
ABSL_FLAG(int64_t, context, 131072, "context window S in tokens (longest piece)");
ABSL_FLAG(int64_t, max_tokens, 0, "variable-length cap S_max per micro-batch; 0 = S + S/4");
ABSL_FLAG(int32_t, micro_batches, 4, "micro-batches per step N (= PP x DP)");
ABSL_FLAG(std::string, packer, "wlb", "original, fixed-greedy, wlb or wlb-refine");
ABSL_FLAG(int32_t, window, 1, "fixed-greedy: steps packed together");
ABSL_FLAG(std::string, thresholds, "",
          "wlb/wlb-refine: comma-separated outlier thresholds L_1<L_2<... in tokens, or 'none'");
ABSL_FLAG(int32_t, queues, 2,
          "wlb/wlb-refine: number of outlier queues with default thresholds (instead of "
          "--thresholds)");
ABSL_FLAG(bool, tune, false,
          "wlb/wlb-refine: pick thresholds with the tuner on the planned stream itself, within "
          "--delay_budget");
ABSL_FLAG(double, delay_budget, 1.0, "--tune: max mean token delay in steps");
ABSL_FLAG(std::string, cost, "llama2-7b",
          "cost model: a preset (llama2-7b, llama2-13b, llama2-70b, wlb-550m) or a profile CSV "
          "of length -> latency to fit");
ABSL_FLAG(uint64_t, seed, 1, "seed for sampling the default distribution");
ABSL_FLAG(int64_t, steps, 0,
          "steps to plan: default distribution samples this many (0 = 100); a file is cut after "
          "this many (0 = all)");
ABSL_FLAG(int32_t, cp, -1,
          "context-parallel size C in [1, 4096]: add CP shard plans to every micro-batch (omit "
          "for none)");
ABSL_FLAG(std::string, sharding, "adaptive", "with --cp: per-seq, per-doc, adaptive or hybrid");
ABSL_FLAG(std::string, kernel_profile, "",
          "with --cp: kernel profile CSV (q_len,kv_len,ms) for the kernel model; empty = the "
          "analytic default (tile 128)");
ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(std::string, out, "", "write the output to this file instead of stdout");
ABSL_FLAG(bool, timing, true, "json: include planning times in the summary (they vary run to run)");
ABSL_FLAG(bool, compare, true, "table: also run original and wlb packing on the same stream");

namespace wlb::cli {
namespace {

// wlb-plan's own flags (Abseil registers others, e.g. --flagfile, that wlb-plan does not offer).
constexpr const char* kFlagNames[] = {
    "docs",     "context",        "max_tokens",   "micro_batches", "packer", "window", "thresholds",
    "queues",   "tune",           "delay_budget", "cost",          "seed",   "steps",  "cp",
    "sharding", "kernel_profile", "format",       "out",           "timing", "compare"};
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

absl::StatusOr<std::vector<int64_t>> LoadLengths(const Settings& settings,
                                                 std::string& input_name) {
  const std::string docs = absl::GetFlag(FLAGS_docs);
  if (!docs.empty()) {
    input_name = docs == "-" ? "<stdin>" : absl::CHexEscape(docs);
    absl::StatusOr<std::vector<int64_t>> lengths = ReadLengthsFile(docs);
    if (lengths.ok() && lengths->empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lengths file %s holds no document lengths: nothing to plan",
                          docs == "-" ? "<stdin>" : QuoteForMessage(docs, 256)));
    }
    return lengths;
  }
  const int64_t n = settings.steps > 0 ? settings.steps : 100;
  absl::StatusOr<int64_t> tokens = StreamTokensForSteps(settings.config, n);
  if (!tokens.ok()) return tokens.status();
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  input_name = absl::StrFormat("the embedded default distribution (%d steps, seed %d)", n, seed);
  return SampleDefaultLengths(*tokens, seed);
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
                            const CostModel& cost, const PackerOptions& options,
                            const std::vector<std::vector<Document>>& arrivals) {
  absl::StatusOr<std::unique_ptr<Packer>> packer = MakePacker(name, config, cost, options);
  if (!packer.ok()) return packer.status();
  absl::StatusOr<PackRun> run = RunPacker(**packer, arrivals);
  if (!run.ok()) return run.status();
  Result r{.packer = name, .run = *std::move(run)};
  r.summary = Summarize(r.run.steps, cost);
  r.pending = (*packer)->Pending();
  return r;
}

std::string SummaryRow(const Result& r) {
  const StreamSummary& s = r.summary;
  return absl::StrFormat(
      "| %-12s | %9.3f | %5.3f | %5.3f | %6.3f | %5.2f | %3.0f | %3.0f | %7.3f |\n", r.packer,
      s.imbalance_mean, s.imbalance_p90, s.imbalance_max, s.imbalance_mean - s.lower_bound_mean,
      s.delay.mean, s.delay.p99, s.delay.max, Median(r.run.plan_ms));
}

// CP shard plans of every micro-batch of a run (empty when --cp is not given).
struct CpPlans {
  int cp_size = 0;
  std::vector<std::vector<ShardPlan>> plans;  // [step][micro-batch]
  std::vector<std::vector<CpBalance>> balance;
  CpSummary summary;  // over steady steps
};

absl::StatusOr<CpPlans> PlanCp(const Result& r, int cp_size, ShardStrategy strategy,
                               const KernelModel& model) {
  CpPlans cp{.cp_size = cp_size};
  for (const StepPlan& step : r.run.steps) {
    std::vector<ShardPlan>& plans = cp.plans.emplace_back();
    std::vector<CpBalance>& balance = cp.balance.emplace_back();
    for (const MicroBatch& mb : step.micro_batches) {
      absl::StatusOr<ShardPlan> plan = PlanShards(mb, cp_size, strategy, model);
      if (!plan.ok()) return plan.status();
      balance.push_back(MeasureCpBalance(*plan, model));
      if (!step.drain) cp.summary.Add(*plan, balance.back());
      plans.push_back(*std::move(plan));
    }
  }
  return cp;
}

constexpr char kSummaryHeader[] =
    "| packer       | imbalance |   p90 |   max | gap LB | delay |  p99 | max | ms/step |\n"
    "|--------------|-----------|-------|-------|--------|-------|------|-----|---------|\n";

// The per-step summary of the chosen packer, then its stream summary.
std::string StepTable(const Result& r, const CostModel& cost) {
  std::string out =
      "\n step | docs |   tokens | tokens per micro-batch (min..max) | imbalance | lower bound | "
      "held back\n";
  for (const StepPlan& s : r.run.steps) {
    int64_t docs = 0, tokens = 0, lo = INT64_MAX, hi = 0;
    for (const MicroBatch& mb : s.micro_batches) {
      docs += static_cast<int64_t>(mb.documents.size());
      tokens += mb.tokens;
      lo = std::min(lo, mb.tokens);
      hi = std::max(hi, mb.tokens);
    }
    absl::StrAppendFormat(&out, "%5d%s | %4d | %8d | %15d..%-16d | %9.3f | %11.3f | %d docs\n",
                          s.step, s.drain ? "*" : " ", docs, tokens, lo, hi,
                          ImbalanceDegree(s.micro_batches), LowerBound(s.micro_batches, cost),
                          s.held_back_documents);
  }
  absl::StrAppend(&out, "(* = drain step at the end of input, left out of the summary)\n");
  return out;
}

absl::Status CannotWrite(const std::string& path, const std::string& why) {
  return absl::UnavailableError(
      absl::StrFormat("cannot write output file %s: %s", QuoteForMessage(path, 256), why));
}

// Writes `text` to `path` in one go: an existing FIFO, character device (/dev/stdout) or other
// special file is written through; a regular file (or a new one) is written as a sibling
// temporary file and renamed over it, so a failed run never leaves a partial file. A symlink is
// followed: its target is what gets written or replaced, the link stays.
absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::error_code ec;
  const std::filesystem::file_status target = std::filesystem::status(path, ec);
  if (std::filesystem::exists(target) && !std::filesystem::is_regular_file(target)) {
    if (std::filesystem::is_directory(target)) return CannotWrite(path, "it is a directory");
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return CannotWrite(path, std::strerror(errno));
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) return CannotWrite(path, std::strerror(errno));
    return absl::OkStatus();
  }
  std::filesystem::path real = path;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
    real = std::filesystem::weakly_canonical(path, ec);
    if (ec) return CannotWrite(path, "cannot resolve the symlink: " + ec.message());
  }
  // Write a sibling temporary file and rename it, so a failure never leaves a partial file.
  const std::string tmp = real.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::filesystem::remove(tmp, ec);
      return CannotWrite(path, "cannot create " + tmp);
    }
  }
  std::filesystem::rename(tmp, real, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return CannotWrite(path, ec.message());
  }
  return absl::OkStatus();
}

absl::Status WriteOutput(const std::string& text) {
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return absl::OkStatus();
  }
  return WriteFile(path, text);
}

// "--flag applies to ..., not to this run": a flag the run would not use is an error, never
// silently ignored.
absl::Status Unused(const char* flag, const std::string& why) {
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
  } else if (Given("seed")) {
    return Unused("seed", "it seeds the default distribution, and --docs is given");
  }

  s.packer = absl::GetFlag(FLAGS_packer);
  const bool wlb_family = s.packer == "wlb" || s.packer == "wlb-refine";
  const bool table_compares = s.format == "table" && absl::GetFlag(FLAGS_compare);
  s.options.window = absl::GetFlag(FLAGS_window);
  if (Given("window") && s.packer != "fixed-greedy") {
    return Unused("window", "it sets fixed-greedy's window, and --packer is " + s.packer);
  }
  // Thresholds are used by wlb/wlb-refine, and by the table's wlb comparison row.
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
      if (Given(flag)) return Unused(flag, "--tune applies to wlb and wlb-refine only");
    }
  } else if (Given("delay_budget") && !absl::GetFlag(FLAGS_tune)) {
    return Unused("delay-budget", "it bounds --tune, which is not given");
  }
  const double budget = absl::GetFlag(FLAGS_delay_budget);
  if (!(budget >= 0.0) || !std::isfinite(budget)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--delay-budget must be a finite number >= 0, got %g", budget));
  }
  s.cp_size = absl::GetFlag(FLAGS_cp);
  if (s.cp_size == -1 && !Given("cp")) {
    for (const char* flag : {"sharding", "kernel_profile"}) {
      if (Given(flag)) return Unused(flag, "it applies to CP shard plans, and --cp is not given");
    }
  } else if (s.cp_size < 1 || s.cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cp must be a context-parallel size in [1, %d] (omit it for no shard plans), got %d",
        kMaxCpSize, s.cp_size));
  }
  absl::StatusOr<ShardStrategy> strategy = ParseShardStrategy(absl::GetFlag(FLAGS_sharding));
  if (!strategy.ok()) return strategy.status();
  s.strategy = *strategy;
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
  absl::StatusOr<ProfileFit> cost = ResolveCostModel(absl::GetFlag(FLAGS_cost));
  if (!cost.ok()) return cost.status();
  KernelModel kernel_model = KernelModel::Default();
  if (const std::string profile = absl::GetFlag(FLAGS_kernel_profile); !profile.empty()) {
    absl::StatusOr<KernelModel> m = ReadKernelProfileCsv(profile);
    if (!m.ok()) return m.status();
    kernel_model = *std::move(m);
  }

  std::string input_name;
  absl::StatusOr<std::vector<int64_t>> lengths = LoadLengths(*settings, input_name);
  if (!lengths.ok()) return lengths.status();
  absl::StatusOr<std::vector<Document>> pieces = MakeDocuments(*lengths, config.context);
  if (!pieces.ok()) return pieces.status();
  absl::StatusOr<std::vector<std::vector<Document>>> split =
      SplitIntoSteps(*pieces, config.context * config.micro_batches);
  if (!split.ok()) return split.status();
  std::vector<std::vector<Document>> arrivals = *std::move(split);
  if (steps > 0 && static_cast<int64_t>(arrivals.size()) > steps) arrivals.resize(steps);

  std::string tune_note;
  if (absl::GetFlag(FLAGS_tune)) {
    if (packer != "wlb" && packer != "wlb-refine") {
      return absl::InvalidArgumentError(
          absl::StrFormat("--tune applies to wlb and wlb-refine, not '%s'", packer));
    }
    absl::StatusOr<TunedThresholds> tuned =
        TuneThresholds(arrivals, config, cost->model,
                       {.delay_budget = absl::GetFlag(FLAGS_delay_budget), .packer = packer});
    if (!tuned.ok()) return tuned.status();
    options.thresholds = tuned->thresholds;
    tune_note = absl::StrFormat(" (tuned over %d sets for mean delay <= %g)", tuned->evaluated,
                                absl::GetFlag(FLAGS_delay_budget));
  }

  absl::StatusOr<Result> main = Plan(packer, config, cost->model, options, arrivals);
  if (!main.ok()) return main.status();
  CpPlans cp;
  if (cp_size > 0) {
    absl::StatusOr<CpPlans> planned = PlanCp(*main, cp_size, settings->strategy, kernel_model);
    if (!planned.ok()) return planned.status();
    cp = *std::move(planned);
  }

  if (format == "json") {
    nlohmann::json j = PlanToJson(main->run.steps, main->pending, cost->model);
    for (size_t s = 0; s < cp.plans.size(); ++s) {
      for (size_t m = 0; m < cp.plans[s].size(); ++m) {
        nlohmann::json& mb = j["steps"][s]["micro_batches"][m];
        mb.update(ShardPlanToJson(cp.plans[s][m]));
        mb["cp_balance"] = CpBalanceToJson(cp.balance[s][m]);
      }
    }
    nlohmann::json summary = SummaryToJson(main->summary);
    if (cp_size > 0) {
      summary["cp"] = CpSummaryToJson(cp.summary);
      summary["cp"]["cp_size"] = cp_size;
      summary["cp"]["sharding"] = absl::GetFlag(FLAGS_sharding);
    }
    summary["packer"] = packer;
    summary["context"] = config.context;
    summary["max_tokens"] = config.max_tokens;
    summary["micro_batches"] = config.micro_batches;
    summary["thresholds"] = options.thresholds;
    summary["window"] = options.window;
    summary["cost_model"] = cost->model.description;
    summary["cost_unit"] = cost->model.unit;
    summary["documents"] = lengths->size();
    summary["tokens"] = TotalTokens(*pieces);
    if (absl::GetFlag(FLAGS_timing)) {
      summary["planning_ms_per_step_median"] = Median(main->run.plan_ms);
      double total = 0.0;
      for (double ms : main->run.plan_ms) total += ms;
      summary["planning_ms_total"] = total;
    }
    j["summary"] = std::move(summary);
    return WriteOutput(j.dump(1) + "\n");
  }

  std::string header = absl::StrFormat(
      "wlb-plan: %s: %d documents, %s tokens, %d steps\n"
      "packer %s: S = %d, S_max = %d, N = %d, thresholds = %s%s, window = %d\n"
      "cost: %s\n",
      input_name, lengths->size(), Mega(TotalTokens(*pieces)), arrivals.size(), packer,
      config.context, config.max_tokens, config.micro_batches,
      options.thresholds.empty() ? "none" : absl::StrJoin(options.thresholds, ","), tune_note,
      options.window, cost->model.description);
  std::string out = header + StepTable(*main, cost->model);
  absl::StrAppend(&out,
                  "\nsummary over steady steps (imbalance = max/mean micro-batch cost; gap LB = "
                  "mean imbalance - mean lower bound; delay in steps, per token):\n",
                  kSummaryHeader);
  std::vector<std::string> compared = {"original", "wlb"};
  if (packer != "original" && packer != "wlb") compared.push_back(packer);
  if (!absl::GetFlag(FLAGS_compare)) compared = {packer};
  for (const std::string& name : compared) {
    if (name == packer) {
      absl::StrAppend(&out, SummaryRow(*main));
      continue;
    }
    absl::StatusOr<Result> other = Plan(name, config, cost->model, options, arrivals);
    if (!other.ok()) return other.status();
    absl::StrAppend(&out, SummaryRow(*other));
  }
  if (cp_size > 0) {
    const CpSummary& c = cp.summary;
    absl::StrAppendFormat(
        &out,
        "\nCP shard plans of %s (C = %d, --sharding %s; %d micro-batches: %d per-seq, %d per-doc, "
        "%d hybrid):\n"
        "CP imbalance (max/mean over ranks) in causal pairs: mean %.3f, max %.3f; under the kernel "
        "model: mean %.3f, max %.3f; predicted slowest-rank attention %.1f ms in all\n",
        packer, cp_size, absl::GetFlag(FLAGS_sharding), c.micro_batches, c.per_seq, c.per_doc,
        c.hybrid, c.pair_imbalance_mean, c.pair_imbalance_max, c.model_imbalance_mean,
        c.model_imbalance_max, c.max_rank_ms_total);
  }
  return WriteOutput(out);
}

}  // namespace

int Main(int argc, char** argv) {
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
