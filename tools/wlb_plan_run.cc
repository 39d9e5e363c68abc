// wlb-plan's run: resolve the plan's models, read the input, plan (and tune, estimate), then hand
// the result to the writers of wlb_plan_output.cc. Main() is the whole program.
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "cli_help.h"
#include "wlb/wlb.hpp"
#include "wlb_plan.h"
#include "wlb_plan_internal.h"

namespace wlb::cli {
namespace {

constexpr const char* kHelpFlags[] = {"help", "helpfull", "helpshort", "helppackage", "version"};

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

absl::StatusOr<Estimate> EstimateSteps(const StepTimeModel& model, ShardStrategy strategy,
                                       bool dp_assign, const Result& planned,
                                       const Result& baseline) {
  Estimate e{.sizes = model.job().sizes, .steps = static_cast<int64_t>(planned.run.steps.size())};
  absl::StatusOr<double> t = model.StreamSeconds(planned.run.steps, {.candidates = {strategy}});
  if (!t.ok()) return t.status();
  absl::StatusOr<double> b =
      model.StreamSeconds(baseline.run.steps, {.candidates = {ShardStrategy("per-seq")}});
  if (!b.ok()) return b.status();
  e.seconds = *t;
  e.baseline_seconds = *b;
  if (dp_assign) {
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

// A Megatron index is planned as a stream: its lengths are read chunk by chunk, each step is cut,
// pushed to every packer of the output and written as it is planned (AppendStreamedStep), so the
// run holds the lengths, the steps in flight and a double or two per step (the summary's exact
// p90 and the median planning time), not the plans. --tune and --estimate need every step at
// once: with them an index is planned as any other file.
bool Streams(const Settings& settings) {
  return settings.docs.size() > 4 && settings.docs.ends_with(".idx") && !settings.spec.tune &&
         !settings.estimate;
}

absl::Status RunStreamed(const Settings& settings, const DocumentCost& cost,
                         const KernelModel& kernel_model) {
  const PlanSettings& plan = settings.plan;
  const PackerConfig& config = plan.config;
  absl::StatusOr<Input> input =
      LoadInput({.docs = settings.docs, .steps = settings.steps, .stream = true}, config.context,
                config.micro_batches);
  if (!input.ok()) return input.status();
  std::vector<std::string> names = {plan.packer};  // the chosen packer first
  if (settings.format != "json" && settings.compare) {
    for (const char* other : {"original", "wlb"}) {
      if (plan.packer != other) names.push_back(other);
    }
  }
  struct Lane {
    std::unique_ptr<Packer> packer;
    std::optional<StreamSummaryAccumulator> summary;
    std::vector<double> plan_ms;
  };
  std::vector<Lane> lanes(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    absl::StatusOr<std::unique_ptr<Packer>> packer =
        MakePacker(names[k], config, cost, plan.options);
    if (!packer.ok()) return packer.status();
    lanes[k].packer = *std::move(packer);
    lanes[k].summary.emplace(cost, config.max_tokens);
  }
  StreamedSteps streamed;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> spool(std::tmpfile(), &std::fclose);
  if (spool == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot create a temporary file for the planned steps: %s", std::strerror(errno)));
  }
  streamed.spool = spool.get();
  if (absl::Status s = BeginStreamed(settings, cost, kernel_model, streamed); !s.ok()) return s;
  using Clock = std::chrono::steady_clock;
  // Runs `plan` (a Push or the Flush) on lane k, timed, and takes in the steps it makes ready.
  auto take = [&](size_t k, auto plan) -> absl::Status {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::vector<StepPlan>> ready = plan(*lanes[k].packer);
    lanes[k].plan_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (!ready.ok()) return ready.status();
    for (const StepPlan& step : *ready) {
      lanes[k].summary->Add(step);
      if (k == 0) {
        if (absl::Status s = AppendStreamedStep(step, settings, cost, kernel_model, streamed);
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  };
  StepCutter cutter(input->lengths, config.context, config.micro_batches, input->empty_positions);
  std::vector<Document> arrivals;
  while ((settings.steps == 0 || cutter.steps() < settings.steps) && cutter.Next(arrivals)) {
    for (size_t k = 0; k < lanes.size(); ++k) {
      if (absl::Status s = take(k, [&](Packer& p) { return p.Push(arrivals); }); !s.ok()) {
        return s;
      }
    }
  }
  for (size_t k = 0; k < lanes.size(); ++k) {
    if (absl::Status s =
            take(k, [](Packer& p) -> absl::StatusOr<std::vector<StepPlan>> { return p.Flush(); });
        !s.ok()) {
      return s;
    }
  }
  streamed.arrival_steps = cutter.steps();
  std::vector<Result> results(lanes.size());
  for (size_t k = 0; k < lanes.size(); ++k) {
    results[k].packer = names[k];
    results[k].run.plan_ms = std::move(lanes[k].plan_ms);
    results[k].summary = lanes[k].summary->Finish();
    results[k].pending = lanes[k].packer->Pending();
  }
  Planned planned{.settings = settings,
                  .input = *input,
                  .cost = cost,
                  .kernel_model = kernel_model,
                  .main = results[0],
                  .options = plan.options,
                  .tune_note = "",
                  .estimate = std::nullopt,
                  .streamed = &streamed};
  if (settings.format == "json") return WriteJson(planned);
  // The table's rows in the batch run's order: original, wlb, then the chosen packer.
  std::vector<std::string> order = {"original", "wlb"};
  if (plan.packer != "original" && plan.packer != "wlb") order.push_back(plan.packer);
  if (!settings.compare) order = {plan.packer};
  for (const std::string& name : order) {
    const size_t k =
        static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
    planned.rows.push_back(&results[k]);
  }
  return WriteTable(planned, streamed.cp_summary);
}

absl::Status Run(const Settings& settings) {
  const PlanSettings& plan = settings.plan;
  const PackerConfig& config = plan.config;
  const std::string& packer = plan.packer;
  PackerOptions options = plan.options;
  absl::StatusOr<DocumentCost> cost = settings.spec.MakeCost();
  if (!cost.ok()) return cost.status();
  const DocumentCost& doc_cost = *cost;
  absl::StatusOr<KernelModel> kernel_model = settings.spec.MakeKernelModel();
  if (!kernel_model.ok()) return kernel_model.status();
  if (Streams(settings)) return RunStreamed(settings, doc_cost, *kernel_model);

  std::optional<StepTimeModel> step_model;
  if (settings.estimate) {
    absl::StatusOr<TransformerShape> shape = FindTransformerShape(settings.spec.cost);
    if (!shape.ok()) return shape.status();
    absl::StatusOr<PipelineJob> job =
        MakePipelineJob(*shape, *settings.estimate, settings.gemm_tflops);
    if (!job.ok()) return job.status();
    if (!settings.spec.kernel_profile.empty()) job->kernel = *kernel_model;
    absl::StatusOr<StepTimeModel> m = StepTimeModel::Create(*std::move(job));
    if (!m.ok()) return m.status();
    step_model = *std::move(m);
  }

  absl::StatusOr<Input> input = LoadInput({.docs = settings.docs,
                                           .distribution = settings.distribution,
                                           .seed = settings.seed,
                                           .steps = settings.steps},
                                          config.context, config.micro_batches);
  if (!input.ok()) return input.status();
  const std::vector<std::vector<Document>>& arrivals = input->steps;

  std::string tune_note;
  if (settings.spec.tune) {
    const PackerInfo* info = FindPacker(packer);
    if (info == nullptr || !info->Uses(kUsesThresholds)) {
      return absl::InvalidArgumentError(absl::StrFormat("--tune applies to %s, not %s",
                                                        PackerNamesReading(kUsesThresholds),
                                                        QuoteForMessage(packer)));
    }
    absl::StatusOr<TunedThresholds> tuned = TuneThresholds(
        arrivals, config, doc_cost, {.delay_budget = settings.spec.delay_budget, .packer = packer});
    if (!tuned.ok()) return tuned.status();
    options.thresholds = tuned->thresholds;
    tune_note = absl::StrFormat(" (tuned over %d sets for mean delay <= %g)", tuned->evaluated,
                                settings.spec.delay_budget);
  }

  absl::StatusOr<Result> main = Plan(packer, config, doc_cost, options, arrivals);
  if (!main.ok()) return main.status();
  CpSummary cp_summary;                                 // over steady steps
  if (plan.cp_size > 0 && settings.format != "json") {  // json plans them while it writes them
    for (const StepPlan& step : main->run.steps) {
      if (absl::Status s = PlanStepCp(step, plan, *kernel_model, cp_summary, nullptr); !s.ok()) {
        return s;
      }
    }
  }

  std::optional<Estimate> estimate;
  if (step_model) {
    absl::StatusOr<Result> baseline =
        packer == "original" ? main : Plan("original", config, doc_cost, options, arrivals);
    if (!baseline.ok()) return baseline.status();
    absl::StatusOr<Estimate> e =
        EstimateSteps(*step_model, plan.strategy, settings.dp_assign, *main, *baseline);
    if (!e.ok()) return e.status();
    estimate = *e;
  }

  Planned planned{.settings = settings,
                  .input = *input,
                  .cost = doc_cost,
                  .kernel_model = *kernel_model,
                  .main = *main,
                  .options = options,
                  .tune_note = tune_note,
                  .estimate = estimate};
  if (settings.format == "json") return WriteJson(planned);

  // The table's summary rows: original and wlb on the same stream, then the chosen packer.
  std::vector<std::string> compared = {"original", "wlb"};
  if (packer != "original" && packer != "wlb") compared.push_back(packer);
  if (!settings.compare) compared = {packer};
  std::vector<Result> others;
  others.reserve(compared.size());
  for (const std::string& name : compared) {
    if (name == packer) {
      planned.rows.push_back(&*main);
      continue;
    }
    absl::StatusOr<Result> other = Plan(name, config, doc_cost, options, arrivals);
    if (!other.ok()) return other.status();
    others.push_back(*std::move(other));
    planned.rows.push_back(&others.back());
  }
  return WriteTable(planned, cp_summary);
}

}  // namespace

absl::Status PlanStepCp(const StepPlan& step, const PlanSettings& settings,
                        const KernelModel& model, CpSummary& summary, nlohmann::json* step_json) {
  for (size_t m = 0; m < step.micro_batches.size(); ++m) {
    absl::StatusOr<ShardPlan> plan = PlanShards(step.micro_batches[m], settings.cp_size,
                                                settings.strategy, model, settings.cp_options);
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

int Main(int argc, char** argv) {
  // A standard descriptor closed by the caller (`>&-`) is given /dev/null opened read-only: the
  // next file opened (a spool, --out's temporary) would otherwise take its number and receive
  // the output, and a write to stdout would succeed unseen; now it fails (EBADF) and exits 1.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  ShowOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "plans balanced micro-batches for a document stream; see docs/guides/cli.md for the flags");
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    std::string name = a.substr(
        a.find_first_not_of('-') == std::string::npos ? a.size() : a.find_first_not_of('-'));
    name = name.substr(0, name.find('='));
    if (a.size() > 1 && a[0] == '-' &&
        (name == "help" || name == "helpshort" || name == "helpfull")) {
      // wlb-plan's own flags, grouped, and the packers (--helpfull: then Abseil's flags); rc 1
      // as Abseil's --help exits.
      std::fputs((name == "helpfull" ? HelpFullText() : HelpText()).c_str(), stdout);
      return 1;
    }
    if (a.size() > 1 && a[0] == '-' &&
        std::find(std::begin(kHelpFlags), std::end(kHelpFlags), name) != std::end(kHelpFlags)) {
      absl::ParseCommandLine(argc, argv);  // prints the usage and exits
    }
  }
  absl::Status status = ParseArgs(args);
  absl::StatusOr<Settings> settings = Settings{};
  if (status.ok()) settings = SettingsFromFlags();
  if (status.ok()) status = settings.status();
  if (status.ok() && !settings->list.empty()) {
    status = WriteStdout(RegistryNames(settings->list));
  } else if (status.ok() && !settings->fit_cost.empty()) {
    absl::StatusOr<std::string> report = FitCostReport(settings->fit_cost, settings->spec.cost);
    status = report.ok() ? WriteStdout(*report) : report.status();
  } else {
    if (status.ok()) status = CheckOutputIsNotAnInput(*settings);
    if (status.ok()) status = Run(*settings);
  }
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
