// model_error_table: packers planned with one cost and scored under another (the truth), the
// table of "Planning under model error" (docs/guides/calibration.md).
//
//   build/bench/model_error_table --docs ../shared/data/doc_lengths_wlbllm_like.json \
//       --csv docs/results/packing/model_error.csv
//
// Streams: the lengths file (--docs; the WLB-LLM-like public lengths), the embedded default
// histogram and the embedded heavy-tail distribution, and the generated shapes of
// wlb::kDistributions (rare-long, bimodal, pile-like, prolong-like), each for every seed of
// --seeds (the file once), --steps steps at S = --context, S_max = --max_tokens,
// N = --micro_batches. Truths: each shipped calibration (wlb::CalibratedPresets(), fitted to the
// committed H100 layer measurements), the FLOP preset with its attention weighed 1x, 0.5x and
// 2.5x, and with --truth_csv a cost fitted to measured micro-batches (wlb::FitMicroBatchCost).
// Each truth is planned with the default FLOP preset `llama2-7b` (what a user who calibrated
// nothing plans with) and, for a calibration, with the calibration itself (the right cost).
// Planners: wlb, wlb-refine and wlb-lookahead (--lookahead), each with refinement's attention
// range at the cost's default (DefaultAttentionRange: [1, 2.5] for a FLOP cost, exact for a
// measured one) and, with --exact_rows, with the planning cost taken as exact. Columns over the
// steady steps scored under the truth (max / mean of the micro-batches' truth costs): mean, p99
// and worst step imbalance, and mean token delay in steps. Then, per stream, truth and planning
// cost, wlb-lookahead against wlb (mean, worst step, delay) and against wlb-refine. Markdown on
// stdout; --csv also writes every row as CSV.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "wlb/wlb.hpp"

ABSL_FLAG(std::string, docs, WLB_SHARED_DATA_DIR "/doc_lengths_wlbllm_like.json",
          "the lengths file of the first stream (the WLB-LLM-like public lengths)");
ABSL_FLAG(std::vector<std::string>, seeds, {"1"},
          "sampling seeds of the embedded and generated distributions (each a stream)");
ABSL_FLAG(std::string, truth_csv, "",
          "measured micro-batches (lengths, ms; wlb-plan --fit-cost's input): one more truth, the "
          "cost fitted to them");
ABSL_FLAG(bool, exact_rows, false,
          "also plan wlb-refine and wlb-lookahead with the planning cost taken as exact");
ABSL_FLAG(int64_t, steps, 200, "steps of each stream (the file is cut after this many)");
ABSL_FLAG(int64_t, context, 131072, "S, tokens per micro-batch");
ABSL_FLAG(int64_t, max_tokens, 163840, "S_max, the token cap of a micro-batch");
ABSL_FLAG(int, micro_batches, 4, "N, micro-batches per step");
ABSL_FLAG(int, lookahead, 1, "wlb-lookahead's K");
ABSL_FLAG(std::string, csv, "", "also write every row as CSV to this file");
ABSL_FLAG(std::vector<std::string>, ranges, {},
          "more attention ranges LOW:HIGH for wlb-refine and wlb-lookahead rows (e.g. 1:2.5)");

namespace {

wlb::CostModel ScaledAttention(wlb::CostModel m, double scale) {
  m.attn_quadratic *= scale;
  m.attn_linear *= scale;
  m.description = absl::StrFormat("%s, attention x%g", m.description, scale);
  return m;
}

struct Stream {
  std::string name;
  std::vector<std::vector<wlb::Document>> steps;
};

// A truth and the costs it is planned with.
struct Truth {
  std::string name;
  wlb::CostModel cost;
  std::vector<std::pair<std::string, wlb::CostModel>> planned_with;
};

struct Row {
  std::string stream, truth, planned_with, planner, rule;
  wlb::StreamSummary sum;
};

// Recosts every micro-batch under `truth` and summarises the steady steps.
wlb::StreamSummary ScoreUnder(std::vector<wlb::StepPlan> steps, const wlb::CostModel& truth) {
  for (wlb::StepPlan& s : steps) {
    for (wlb::MicroBatch& mb : s.micro_batches) {
      mb.cost = 0.0;
      for (const wlb::Document& d : mb.documents) mb.cost += truth(d.length);
    }
  }
  return wlb::Summarize(steps, truth);
}

int Fail(const absl::Status& s) {
  std::cerr << "model_error_table: " << s.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Scores wlb, wlb-refine and wlb-lookahead planned with one cost under another (the truth).");
  absl::ParseCommandLine(argc, argv);
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int n = absl::GetFlag(FLAGS_micro_batches);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const wlb::PackerConfig config{
      .context = context, .max_tokens = absl::GetFlag(FLAGS_max_tokens), .micro_batches = n};

  std::vector<uint64_t> seeds;
  for (const std::string& text : absl::GetFlag(FLAGS_seeds)) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(text, &seed)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--seeds: %s is not a seed", wlb::QuoteForMessage(text))));
    }
    seeds.push_back(seed);
  }
  std::vector<Stream> streams;
  auto add_stream = [&](const std::string& name, const wlb::InputOptions& in) -> absl::Status {
    absl::StatusOr<wlb::Input> input = wlb::LoadInput(in, context, n);
    if (!input.ok()) return input.status();
    streams.push_back({name, input->steps});
    return absl::OkStatus();
  };
  if (absl::Status s =
          add_stream("wlbllm-like", {.docs = absl::GetFlag(FLAGS_docs), .steps = steps});
      !s.ok()) {
    return Fail(s);
  }
  for (uint64_t seed : seeds) {
    for (const wlb::NamedDistribution& d : wlb::kDistributions) {
      const std::string distribution(d.name);
      if (absl::Status s = add_stream(absl::StrFormat("%s/%d", distribution, seed),
                                      {.distribution = distribution, .seed = seed, .steps = steps});
          !s.ok()) {
        return Fail(s);
      }
    }
  }

  absl::StatusOr<wlb::CostModel> flop = wlb::CostModelFromPreset("llama2-7b");
  if (!flop.ok()) return Fail(flop.status());
  std::vector<Truth> truths;
  for (const wlb::CalibratedCost& c : wlb::CalibratedPresets()) {
    absl::StatusOr<wlb::CostModel> cal = wlb::CostModelFromPreset(c.name);
    if (!cal.ok()) return Fail(cal.status());
    const std::string name(c.name);
    truths.push_back({name, *cal, {{"flop llama2-7b", *flop}, {name, *cal}}});
  }
  for (double scale : {1.0, 0.5, 2.5}) {
    truths.push_back({absl::StrFormat("llama2-7b attention x%g", scale),
                      ScaledAttention(*flop, scale),
                      {{"flop llama2-7b", *flop}}});
  }
  if (const std::string path = absl::GetFlag(FLAGS_truth_csv); !path.empty()) {
    absl::StatusOr<std::vector<wlb::MicroBatchSample>> samples = wlb::ReadMicroBatchCsv(path);
    if (!samples.ok()) return Fail(samples.status());
    absl::StatusOr<wlb::MicroBatchFit> fit = wlb::FitMicroBatchCost(*samples);
    if (!fit.ok()) return Fail(fit.status());
    std::printf("truth measured-fit: %s\n", fit->model.description.c_str());
    truths.push_back({"measured-fit", fit->model, {{"flop llama2-7b", *flop}}});
  }

  struct Planner {
    const char* packer;
    std::optional<wlb::AttentionRange> range;  // nullopt: the cost's default
    const char* rule;
  };
  std::vector<Planner> planners = {{"wlb", std::nullopt, "-"},
                                   {"wlb-refine", std::nullopt, "default"},
                                   {"wlb-lookahead", std::nullopt, "default"}};
  if (absl::GetFlag(FLAGS_exact_rows)) {
    planners.push_back({"wlb-refine", wlb::AttentionRange{}, "exact"});
    planners.push_back({"wlb-lookahead", wlb::AttentionRange{}, "exact"});
  }
  for (const std::string& r : absl::GetFlag(FLAGS_ranges)) {
    wlb::AttentionRange range;
    const std::vector<std::string> parts = absl::StrSplit(r, ':');
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &range.low) ||
        !absl::SimpleAtod(parts[1], &range.high)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--ranges: %s is not LOW:HIGH", wlb::QuoteForMessage(r))));
    }
    if (absl::Status s = wlb::ValidateAttentionRange(range); !s.ok()) return Fail(s);
    for (const char* packer : {"wlb-refine", "wlb-lookahead"}) {
      planners.push_back({packer, range, "given"});
    }
  }

  std::vector<Row> rows;
  for (const Stream& stream : streams) {
    for (const Truth& truth : truths) {
      for (const auto& [planned_name, planned] : truth.planned_with) {
        for (const Planner& p : planners) {
          wlb::PackerOptions options{.thresholds = wlb::DefaultThresholds(context, 2),
                                     .lookahead = absl::GetFlag(FLAGS_lookahead),
                                     .attention_range = p.range};
          absl::StatusOr<std::unique_ptr<wlb::Packer>> packer =
              wlb::MakePacker(p.packer, config, planned, options);
          if (!packer.ok()) return Fail(packer.status());
          absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, stream.steps);
          if (!run.ok()) return Fail(run.status());
          const wlb::StreamSummary sum = ScoreUnder(std::move(run->steps), truth.cost);
          const wlb::AttentionRange used =
              p.range ? *p.range : wlb::DefaultAttentionRange(wlb::DocumentCost(planned));
          rows.push_back({stream.name, truth.name, planned_name, p.packer,
                          p.packer == std::string("wlb")
                              ? "-"
                              : absl::StrFormat("%s %g..%g", p.rule, used.low, used.high),
                          sum});
        }
      }
    }
  }

  std::printf("S = %lld, S_max = %lld, N = %d, %lld steps a stream, wlb-lookahead K = %d\n\n",
              static_cast<long long>(context), static_cast<long long>(config.max_tokens), n,
              static_cast<long long>(steps), absl::GetFlag(FLAGS_lookahead));
  std::printf(
      "| stream | truth | planned with | planner | attention range | mean imbalance | p99 | "
      "worst step | delay |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %s | %s | %.4f | %.4f | %.4f | %.3f |\n", r.stream.c_str(),
                r.truth.c_str(), r.planned_with.c_str(), r.planner.c_str(), r.rule.c_str(),
                r.sum.imbalance_mean, r.sum.imbalance_p99, r.sum.imbalance_max, r.sum.delay.mean);
  }

  // wlb-lookahead (default rule) against wlb and wlb-refine on the same stream, truth and cost.
  auto find = [&](const Row& like, const char* packer) -> const Row* {
    for (const Row& r : rows) {
      if (r.stream == like.stream && r.truth == like.truth && r.planned_with == like.planned_with &&
          r.planner == packer && (r.rule == "-" || r.rule.rfind("default", 0) == 0)) {
        return &r;
      }
    }
    return nullptr;
  };
  std::printf(
      "\nwlb-lookahead (default rule) against wlb and wlb-refine; targets: mean <= wlb + 0.002, "
      "worst step <= wlb's + 0.02, delay <= wlb's\n\n");
  std::printf(
      "| stream | truth | planned with | mean - wlb | worst - wlb | delay - wlb | "
      "mean - wlb-refine | meets |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  int cases = 0, met = 0;
  double worst_mean = -1e9, worst_max = -1e9, worst_delay = -1e9;
  for (const Row& r : rows) {
    if (r.planner != std::string("wlb-lookahead") || r.rule.rfind("default", 0) != 0) continue;
    const Row* wlb_row = find(r, "wlb");
    const Row* refine_row = find(r, "wlb-refine");
    if (wlb_row == nullptr || refine_row == nullptr) continue;
    const double d_mean = r.sum.imbalance_mean - wlb_row->sum.imbalance_mean;
    const double d_max = r.sum.imbalance_max - wlb_row->sum.imbalance_max;
    const double d_delay = r.sum.delay.mean - wlb_row->sum.delay.mean;
    const bool ok = d_mean <= 0.002 && d_max <= 0.02 && d_delay <= 0.0;
    ++cases;
    met += ok;
    worst_mean = std::max(worst_mean, d_mean);
    worst_max = std::max(worst_max, d_max);
    worst_delay = std::max(worst_delay, d_delay);
    std::printf("| %s | %s | %s | %+.4f | %+.4f | %+.3f | %+.4f | %s |\n", r.stream.c_str(),
                r.truth.c_str(), r.planned_with.c_str(), d_mean, d_max, d_delay,
                r.sum.imbalance_mean - refine_row->sum.imbalance_mean, ok ? "yes" : "**no**");
  }
  std::printf(
      "\n%d of %d cases meet all three; largest mean - wlb %+.4f, worst - wlb %+.4f, delay - wlb "
      "%+.3f\n",
      met, cases, worst_mean, worst_max, worst_delay);

  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream out(path);
    out << "stream,truth,planned_with,planner,attention_range,imbalance_mean,imbalance_p99,"
           "imbalance_max,delay_mean\n";
    for (const Row& r : rows) {
      out << absl::StrFormat("%s,%s,%s,%s,%s,%.6f,%.6f,%.6f,%.6f\n", r.stream, r.truth,
                             r.planned_with, r.planner, r.rule, r.sum.imbalance_mean,
                             r.sum.imbalance_p99, r.sum.imbalance_max, r.sum.delay.mean);
    }
    if (!out) return Fail(absl::InternalError("cannot write " + path));
  }
  return 0;
}
