// CP benchmark: per-rank attention time (forward + backward) of WLB-LLM-like micro-batches under
// per-seq, per-seq-ordered, per-doc and hybrid sharding (or the --strategies given) and under
// adaptive's plan; measured CP imbalance; adaptive against the measured per-micro-batch oracle;
// the kernel model's forward prediction error per strategy.
//
//   wlb_cuda_cp_bench [--tokens=131072] [--cp=4] [--micro_batches=8] [--heads=32]
//       [--kv_heads=8] [--head_dim=128] [--warmup=2] [--iters=5] [--seed=1]
//       [--profile=PATH] [--packed_profile=PATH] [--json=PATH] [--kernel=flash|cudnn|reference]
//       [--schedule=whole|split] [--exchange=all-gather|row-exact|rule] [--kv_one_collective=0|1]
//       [--strategies=per-seq,per-seq-ordered,per-doc,hybrid] [--gather_gbps=0]
//
// adaptive's plan (ranked by kernel time alone, bench::KernelTimeOnly) is a row of its own,
// "adaptive" with the strategy it chose in "chosen": when it is the plan of a measured strategy
// that measurement is reused, else it runs (adaptive also picks balanced-chunks and doc-degree's
// greedy plan, which the default --strategies leave out). The oracle is the fastest measured
// row of each micro-batch.
// The defaults are the executor's (CpExecutorOptions: the paths that ran on a GPU). --schedule
// (cp_maps.h, CpSchedule): whole (one bottom-right causal call per rank) or split (each segment's
// square causal diagonal plus its maskless key prefix, merged by log-sum-exp); run both in one
// device session to compare them. --exchange: the all-gather, the row-exact all-to-all-v, or the
// one the planner's rule picks (ChooseCpExchange over the default link). --kv_one_collective=1
// moves K and V (dK and dV) in one collective each way instead of one per tensor.
// --packed_profile (wlb_cuda_kernel_profiler --packed_micro_batches=N) adds its packed-call fit
// to the model (wlb::WithPackedCallProfile): adaptive then ranks the candidate plans by each
// rank's predicted forward + backward as one packed call; the strategies' plans and the
// predicted_fwd_ms column (summed single-segment forward) do not change.
// All C ranks are emulated on one GPU (LocalCommunicator) and their kernels run one at a time
// (CpExecutorOptions::isolate_ranks), so each rank's time is its own; the step waits for the
// slowest rank, so a strategy's cost for a micro-batch is its max-rank fwd+bwd time. Per rank
// and strategy the median over --iters is used. The model (--profile CSV, else the analytic
// default) predicts forward ms per rank; its error is reported against measured forward ms.
// The K/V bytes each plan's forward moved per rank, as the communicator counted them, are
// printed beside the planner's prediction (the bench fails if they differ) and the all-gather's.
// Apart from the kernels each rank's key-row copies are timed (CpRankTimes::gather_ms and
// key_gradients_ms: every segment's keys [0, end) are gathered into one contiguous run, so a rank
// copies cu_seqlens_k.back() K and V rows forward and sums as many dK/dV rows backward); the last
// lines give their cost per 1000 key rows, the price the kernel model leaves out. Every row's
// total is also given with those copies added to each rank (max over ranks of fwd + bwd + gather
// + dK/dV sums). --gather_gbps=G (> 0) adds a row "adaptive+copy": adaptive planned with the copy
// priced at G GB/s (wlb::CommModel::gather_gbps, e.g. 3350), measured beside unpriced adaptive on
// the same micro-batches: whether pricing the copy makes the default faster (issue 57).
// Output is line-buffered and every JSON line flushed, so a run killed by `timeout` keeps every
// micro-batch it finished; with --kernel=cudnn the last line says how many cuDNN graphs were
// built and the seconds that took.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/cp_bench_util.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cp_packed_run.h"
#include "wlb/cuda/cp_workload.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"

namespace {

using namespace wlb::cuda;  // NOLINT: a small program

struct Measured {
  std::vector<double> fwd_ms, bwd_ms;  // per rank, median over iterations
  // Per rank, median: the forward's key-row gathers and the backward's dK/dV sums (apart from
  // fwd_ms / bwd_ms, which time the attention kernels alone).
  std::vector<double> gather_ms, key_gradients_ms;
  double max_ms = 0;                   // max over ranks of fwd + bwd
  double max_with_copies_ms = 0;       // max over ranks of fwd + bwd + gather + dK/dV sums
  double imbalance = 1;                // max / mean of fwd + bwd
  wlb::ExchangeKind exchange = wlb::ExchangeKind::kAllGather;
  std::vector<int64_t> sent_bytes, received_bytes;  // per rank: forward K/V, counted
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

absl::StatusOr<Measured> Run(const wlb::ShardPlan& plan, const CpAttentionConfig& config,
                             Communicator& comm, const PackedCpTensors& t, int warmup, int iters,
                             CpExecutorOptions options) {
  options.isolate_ranks = true;
  absl::StatusOr<std::unique_ptr<CpPackedRunner>> run =
      CpPackedRunner::Create(plan, config, comm, options);
  if (!run.ok()) return run.status();
  if (absl::Status s = (*run)->Run(t, true); !s.ok()) return s;
  Measured m;
  m.exchange = (*run)->executor().maps().exchange;
  comm.ResetTraffic();
  if (absl::Status s = (*run)->Rerun(false); !s.ok()) return s;  // one forward: its K/V bytes
  for (int r = 0; r < plan.cp_size; ++r) {
    m.sent_bytes.push_back(comm.traffic(r).sent_bytes);
    m.received_bytes.push_back(comm.traffic(r).received_bytes);
  }
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = (*run)->Rerun(true); !s.ok()) return s;
  }
  const size_t c = size_t(plan.cp_size);
  std::vector<std::vector<double>> f(c), b(c), g(c), kg(c);
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = (*run)->Rerun(true); !s.ok()) return s;
    absl::StatusOr<std::vector<CpRankTimes>> times = (*run)->executor().RankTimes();
    if (!times.ok()) return times.status();
    for (const CpRankTimes& x : *times) {
      f[size_t(x.rank)].push_back(x.forward_ms);
      b[size_t(x.rank)].push_back(x.backward_ms);
      g[size_t(x.rank)].push_back(x.gather_ms);
      kg[size_t(x.rank)].push_back(x.key_gradients_ms);
    }
  }
  std::vector<double> total;
  for (size_t r = 0; r < c; ++r) {
    m.fwd_ms.push_back(Median(f[r]));
    m.bwd_ms.push_back(Median(b[r]));
    m.gather_ms.push_back(Median(g[r]));
    m.key_gradients_ms.push_back(Median(kg[r]));
    total.push_back(m.fwd_ms.back() + m.bwd_ms.back());
    m.max_with_copies_ms = std::max(m.max_with_copies_ms,
                                    total.back() + m.gather_ms.back() + m.key_gradients_ms.back());
  }
  m.max_ms = *std::max_element(total.begin(), total.end());
  m.imbalance = wlb::MaxOverMean(total);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Flags flags(argc, argv);
  int64_t tokens = 131072, cp = 4, mbs = 8, heads = 32, kv_heads = 8, dim = 128, warmup = 2,
          iters = 5, seed = 1, gather_gbps = 0;
  CpExecutorOptions options;
  std::string profile, packed_profile, json,
      strategy_names = "per-seq,per-seq-ordered,per-doc,hybrid",
      schedule_name = CpScheduleName(options.schedule),
      exchange_name = wlb::ExchangeKindName(*options.exchange);
  int64_t kv_one_collective = options.kv_one_collective ? 1 : 0;
  AttentionKernel kernel = AttentionKernel::kFlash;
  const bool ok =
      flags.Kernel("kernel", &kernel) && flags.Int("tokens", &tokens) && flags.Int("cp", &cp) &&
      flags.Int("micro_batches", &mbs) && flags.Int("heads", &heads) &&
      flags.Int("kv_heads", &kv_heads) && flags.Int("head_dim", &dim) &&
      flags.Int("warmup", &warmup) && flags.Int("iters", &iters) && flags.Int("seed", &seed) &&
      flags.Str("profile", &profile) && flags.Str("packed_profile", &packed_profile) &&
      flags.Str("json", &json) && flags.Str("schedule", &schedule_name) &&
      flags.Str("exchange", &exchange_name) && flags.Int("kv_one_collective", &kv_one_collective) &&
      flags.Str("strategies", &strategy_names) && flags.Int("gather_gbps", &gather_gbps) &&
      flags.AllUsed();
  std::vector<wlb::ShardStrategy> measured;
  bool strategies_ok = true;
  for (const std::string& name : std::vector<std::string>(absl::StrSplit(strategy_names, ','))) {
    absl::StatusOr<wlb::ShardStrategy> s = wlb::ParseShardStrategy(name);
    if (!s.ok() || *s == wlb::ShardStrategy("adaptive") ||
        std::find(measured.begin(), measured.end(), *s) != measured.end()) {
      std::fprintf(
          stderr, "--strategies: %s\n",
          s.ok() ? absl::StrFormat("'%s' is given twice or is adaptive (always measured)", name)
                       .c_str()
                 : std::string(s.status().message()).c_str());
      strategies_ok = false;
      continue;
    }
    measured.push_back(*s);
  }
  std::optional<CpSchedule> schedule;
  for (CpSchedule s : {CpSchedule::kSplit, CpSchedule::kWhole}) {
    if (schedule_name == CpScheduleName(s)) schedule = s;
  }
  bool exchange_ok = exchange_name == "rule";
  options.exchange = std::nullopt;
  for (wlb::ExchangeKind x : {wlb::ExchangeKind::kAllGather, wlb::ExchangeKind::kRowExact}) {
    if (exchange_name == wlb::ExchangeKindName(x)) {
      options.exchange = x;
      exchange_ok = true;
    }
  }
  if (!ok || !strategies_ok || !schedule || !exchange_ok ||
      (kv_one_collective != 0 && kv_one_collective != 1) || tokens < 1 || cp < 1 || mbs < 1 ||
      iters < 1 || !wlb::ValidateCommModel({.gather_gbps = double(gather_gbps)}).ok()) {
    std::fprintf(stderr, "usage: see the comment at the top of cp_bench.cc\n");
    return 2;
  }
  options.schedule = *schedule;
  options.kv_one_collective = kv_one_collective == 1;
  wlb::KernelShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  absl::StatusOr<wlb::KernelModel> model =
      profile.empty() ? wlb::KernelModel::Analytic({.shape = shape})
                      : wlb::ReadKernelProfileCsv(profile, shape);
  if (model.ok() && !packed_profile.empty()) {
    model = wlb::WithPackedCallProfile(*model, packed_profile);
  }
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 2;
  }
  if (!bench::RequireDevice(argv[0])) return 3;
  const CpAttentionConfig config{.num_heads = int(heads),
                                 .num_kv_heads = int(kv_heads),
                                 .head_dim = int(dim),
                                 .kernel = kernel};
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(int(cp));
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const size_t nq = size_t(tokens) * heads * dim, nk = size_t(tokens) * kv_heads * dim;
  bench::DeviceBf16 q = bench::RandomDevice(nq, 1, 2), k = bench::RandomDevice(nk, 2, 2),
                    v = bench::RandomDevice(nk, 3, 1), dout = bench::RandomDevice(nq, 4, 1),
                    out = bench::EmptyDevice(nq), dq = bench::EmptyDevice(nq),
                    dk = bench::EmptyDevice(nk), dv = bench::EmptyDevice(nk);
  if (!q || !k || !v || !dout || !out || !dq || !dk || !dv) return 1;
  const PackedCpTensors t{q.get(), k.get(), v.get(), dout.get(),
                          out.get(), dq.get(), dk.get(), dv.get()};
  std::printf(
      "%s | %s kernel, %s schedule, exchange %s, K/V %s | %ld tokens, C=%ld, heads %ld/%ld, "
      "head_dim %ld, model %s%s\n",
      bench::DeviceName().c_str(), AttentionKernelName(kernel), CpScheduleName(*schedule),
      exchange_name.c_str(), kv_one_collective ? "in one collective" : "one collective each",
      long(tokens), long(cp), long(heads), long(kv_heads), long(dim),
      profile.empty() ? "analytic default" : profile.c_str(),
      packed_profile.empty()
          ? ""
          : absl::StrFormat(", adaptive ranked by the packed-call fit of %s (fwd rms "
                            "%.1f%%, bwd %.1f%%, %d calls)",
                            packed_profile, 100 * model->packed_calls().fwd_rms_relative,
                            100 * model->packed_calls().bwd_rms_relative,
                            model->packed_calls().points)
                .c_str());
  // Summed over micro-batches: each strategy's slowest-rank fwd+bwd ms, and its kernel model's
  // forward error (every rank, and the slowest rank).
  struct Totals {
    double max_ms = 0, with_copies_ms = 0, err_sum = 0, err_max_sum = 0;
    int err_n = 0, err_max_n = 0;
  };
  std::map<std::string, Totals> total;
  // Over every rank run measured (reused runs counted once): key rows and their copies' ms.
  double copied_rows = 0, gather_total_ms = 0, key_gradients_total_ms = 0;
  std::ofstream js;
  if (!json.empty()) js.open(json);
  // Runs one plan of micro-batch i (or reuses `reuse`), checks the counted K/V bytes against the
  // planner's, prints its lines and its JSON row ("chosen": the strategy the plan records).
  auto measure = [&](int64_t i, const std::string& name, const wlb::ShardPlan& plan,
                     const Measured* reuse) -> absl::StatusOr<Measured> {
    absl::StatusOr<Measured> r =
        reuse != nullptr ? absl::StatusOr<Measured>(*reuse)
                         : Run(plan, config, **comm, t, int(warmup), int(iters), options);
    if (!r.ok()) return r.status();
    Totals& tot = total[name];
    tot.max_ms += r->max_ms;
    tot.with_copies_ms += r->max_with_copies_ms;
    const std::vector<double> predicted = wlb::PredictRankMs(plan, *model);
    for (size_t rank = 0; rank < predicted.size(); ++rank) {
      if (r->fwd_ms[rank] <= 0) continue;
      tot.err_sum += std::abs(predicted[rank] - r->fwd_ms[rank]) / r->fwd_ms[rank];
      ++tot.err_n;
    }
    const double measured_max = *std::max_element(r->fwd_ms.begin(), r->fwd_ms.end());
    if (measured_max > 0) {
      tot.err_max_sum += std::abs(wlb::detail::MaxOf(predicted) - measured_max) / measured_max;
      ++tot.err_max_n;
    }
    // The counted forward K/V bytes against the planner's rows of the exchange that ran.
    const std::vector<wlb::RankExchange> rows = wlb::ExchangedKvRows(plan);
    const int64_t row_bytes = CpKvRowBytes(config);
    const int64_t gather = (cp - 1) * plan.rank_capacity * row_bytes;
    int64_t max_sent = 0, max_received = 0;
    for (size_t rank = 0; rank < rows.size(); ++rank) {
      const bool exact = r->exchange == wlb::ExchangeKind::kRowExact;
      const int64_t want_sent = exact ? rows[rank].send_rows * row_bytes : gather;
      const int64_t want_received = exact ? rows[rank].recv_rows * row_bytes : gather;
      if (r->sent_bytes[rank] != want_sent || r->received_bytes[rank] != want_received) {
        return absl::InternalError(absl::StrFormat(
            "rank %d: counted %d bytes sent / %d received, the planner predicts %d / %d", rank,
            r->sent_bytes[rank], r->received_bytes[rank], want_sent, want_received));
      }
      max_sent = std::max(max_sent, r->sent_bytes[rank]);
      max_received = std::max(max_received, r->received_bytes[rank]);
    }
    std::printf(
        "mb %ld %-15s exchange %-10s forward K/V per layer, slowest rank: sent %.2f MB, "
        "received %.2f MB (counted = predicted); all-gather %.2f MB\n",
        long(i), name.c_str(), wlb::ExchangeKindName(r->exchange), max_sent / 1e6,
        max_received / 1e6, gather / 1e6);
    std::string fwd, bwd, pred, keys, gathers, key_gradients;
    for (size_t rank = 0; rank < r->fwd_ms.size(); ++rank) {
      fwd += absl::StrFormat(" %.3f", r->fwd_ms[rank]);
      bwd += absl::StrFormat(" %.3f", r->bwd_ms[rank]);
      pred += absl::StrFormat(" %.3f", predicted[rank]);
      keys += absl::StrFormat(" %d", plan.ranks[rank].cu_seqlens_k.back());
      gathers += absl::StrFormat(" %.3f", r->gather_ms[rank]);
      key_gradients += absl::StrFormat(" %.3f", r->key_gradients_ms[rank]);
      if (reuse == nullptr) {
        copied_rows += static_cast<double>(plan.ranks[rank].cu_seqlens_k.back());
        gather_total_ms += r->gather_ms[rank];
        key_gradients_total_ms += r->key_gradients_ms[rank];
      }
    }
    const std::string chosen(wlb::ShardStrategyName(plan.strategy));
    std::printf("mb %ld %-15s max fwd+bwd %8.3f ms  imbalance %.3f  fwd ms [%s ]  bwd ms [%s ]%s\n",
                long(i), name.c_str(), r->max_ms, r->imbalance, fwd.c_str(), bwd.c_str(),
                chosen == name ? "" : absl::StrFormat("  (%s's plan)", chosen).c_str());
    // The copies each segment's keys [0, end) cost, beside the attention kernels' time.
    std::printf("mb %ld %-15s key rows [%s ]  gather ms [%s ]  dK/dV sums ms [%s ]\n", long(i),
                name.c_str(), keys.c_str(), gathers.c_str(), key_gradients.c_str());
    if (js.is_open()) {
      const auto list = [](const std::string& v) {
        return absl::StrReplaceAll(absl::StripLeadingAsciiWhitespace(v), {{" ", ","}});
      };
      js << absl::StrFormat(
          "{\"kernel\":\"%s\",\"schedule\":\"%s\",\"cp\":%d,\"mb\":%d,\"tokens\":%d,\"strategy\":"
          "\"%s\",\"chosen\":\"%s\","
          "\"max_ms\":%.4f,\"imbalance\":%.4f,\"fwd_ms\":[%s],\"bwd_ms\":[%s],"
          "\"predicted_fwd_ms\":[%s],\"exchange\":\"%s\",\"max_sent_bytes\":%d,"
          "\"max_received_bytes\":%d,\"allgather_bytes\":%d,\"kv_one_collective\":%s,"
          "\"key_rows\":[%s],\"gather_ms\":[%s],\"key_gradients_ms\":[%s]}\n",
          AttentionKernelName(kernel), CpScheduleName(*schedule), cp, i, plan.tokens, name, chosen,
          r->max_ms, r->imbalance, list(fwd), list(bwd), list(pred),
          wlb::ExchangeKindName(r->exchange), max_sent, max_received, gather,
          options.kv_one_collective ? "true" : "false", list(keys), list(gathers),
          list(key_gradients));
      js.flush();
    }
    return r;
  };
  double oracle_total = 0, paper_oracle_total = 0;
  const bool paper_oracle =
      std::find(measured.begin(), measured.end(), wlb::ShardStrategy("per-seq")) !=
          measured.end() &&
      std::find(measured.begin(), measured.end(), wlb::ShardStrategy("per-doc")) != measured.end();
  for (int64_t i = 0; i < mbs; ++i) {
    const wlb::MicroBatch mb = WlbLikeMicroBatch(tokens, uint64_t(seed + i));
    std::map<wlb::ShardStrategy, Measured> m;
    std::map<wlb::ShardStrategy, wlb::ShardPlan> plans;
    for (wlb::ShardStrategy s : measured) {
      const std::string name(wlb::ShardStrategyName(s));
      absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, int(cp), s, *model);
      if (!plan.ok()) {
        std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
        return 1;
      }
      absl::StatusOr<Measured> r = measure(i, name, *plan, nullptr);
      if (!r.ok()) {
        std::fprintf(stderr, "micro-batch %ld %s: %s\n", long(i), name.c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
      m[s] = *r;
      plans[s] = *std::move(plan);
    }
    // Adaptive's plan: the measurement of a measured strategy with the same ranks, else its own.
    absl::StatusOr<wlb::ShardPlan> adaptive_plan = wlb::PlanShards(
        mb, int(cp), wlb::ShardStrategy("adaptive"), *model, bench::KernelTimeOnly());
    if (!adaptive_plan.ok()) {
      std::fprintf(stderr, "%s\n", adaptive_plan.status().ToString().c_str());
      return 1;
    }
    // The measurement of a measured strategy's plan with the same ranks (the last such), if any.
    const auto measured_as = [&](const wlb::ShardPlan& p) {
      const Measured* found = nullptr;
      for (const auto& [s, plan] : plans) {
        if (plan.ranks == p.ranks && plan.rank_capacity == p.rank_capacity) found = &m[s];
      }
      return found;
    };
    const Measured* same = measured_as(*adaptive_plan);
    absl::StatusOr<Measured> adaptive = measure(i, "adaptive", *adaptive_plan, same);
    if (!adaptive.ok()) {
      std::fprintf(stderr, "micro-batch %ld adaptive: %s\n", long(i),
                   adaptive.status().ToString().c_str());
      return 1;
    }
    if (gather_gbps > 0) {  // adaptive with the key rows' copy priced, beside it
      wlb::CpPlanOptions priced = bench::KernelTimeOnly();
      priced.comm.gather_gbps = double(gather_gbps);
      absl::StatusOr<wlb::ShardPlan> copy_plan =
          wlb::PlanShards(mb, int(cp), wlb::ShardStrategy("adaptive"), *model, priced);
      if (!copy_plan.ok()) {
        std::fprintf(stderr, "%s\n", copy_plan.status().ToString().c_str());
        return 1;
      }
      const Measured* reuse = measured_as(*copy_plan);
      if (reuse == nullptr && copy_plan->ranks == adaptive_plan->ranks) reuse = &*adaptive;
      if (absl::StatusOr<Measured> r = measure(i, "adaptive+copy", *copy_plan, reuse); !r.ok()) {
        std::fprintf(stderr, "micro-batch %ld adaptive+copy: %s\n", long(i),
                     r.status().ToString().c_str());
        return 1;
      }
    }
    double best = adaptive->max_ms;
    for (const auto& [s, r] : m) best = std::min(best, r.max_ms);
    std::printf("mb %ld adaptive picks %s (%s, %s the measured oracle)\n", long(i),
                std::string(wlb::ShardStrategyName(adaptive_plan->strategy)).c_str(),
                same != nullptr ? "a measured plan" : "measured on its own",
                adaptive->max_ms <= best ? "matches" : "misses");
    oracle_total += best;
    if (paper_oracle) {
      paper_oracle_total += std::min(m[wlb::ShardStrategy("per-seq")].max_ms,
                                     m[wlb::ShardStrategy("per-doc")].max_ms);
    }
  }
  std::printf("\nsum over %ld micro-batches of the slowest rank's fwd+bwd ms (C = %ld):\n",
              long(mbs), long(cp));
  // Ratios over per-seq when it was measured, else over the first row.
  const std::string base = total.contains("per-seq") ? "per-seq" : total.begin()->first;
  for (const auto& [name, tot] : total) {
    std::printf(
        "  %-15s %10.3f ms  (%s / this = %.3fx)  with key copies %10.3f ms  model fwd error "
        "%.1f%% per rank, %.1f%% slowest rank\n",
        name.c_str(), tot.max_ms, base.c_str(), total[base].max_ms / tot.max_ms, tot.with_copies_ms,
        100 * tot.err_sum / std::max(tot.err_n, 1),
        100 * tot.err_max_sum / std::max(tot.err_max_n, 1));
  }
  std::printf("  %-15s %10.3f ms  (fastest measured row per micro-batch)\n", "oracle",
              oracle_total);
  const double adaptive_total = total["adaptive"].max_ms;
  std::printf("adaptive vs oracle %+.1f%%", 100 * (oracle_total / adaptive_total - 1));
  if (paper_oracle) {
    const double per_seq = total["per-seq"].max_ms, per_doc = total["per-doc"].max_ms;
    std::printf(
        ", vs per-seq %+.1f%%, vs per-doc %+.1f%%, vs the paper's oracle (best of "
        "per-seq, per-doc) %+.1f%% (paper, 128K C=4: 7.5%% and 3.4%% faster than per-seq "
        "/ per-doc)",
        100 * (per_seq / adaptive_total - 1), 100 * (per_doc / adaptive_total - 1),
        100 * (paper_oracle_total / adaptive_total - 1));
  }
  std::printf("\n");
  if (copied_rows > 0) {
    // The forward gather as the planner's price: K/V rows of CpKvRowBytes read and written once
    // in gather_total_ms, the GB/s that wlb-plan --cp-gather-gbps (CommModel::gather_gbps) takes.
    const double copy_gbps = gather_total_ms > 0.0
                                 ? 2.0 * static_cast<double>(CpKvRowBytes(config)) * copied_rows /
                                       (gather_total_ms * 1e-3) / 1e9
                                 : 0.0;
    std::printf(
        "key rows' copies (every segment's keys [0, end), %ld K/V heads x %ld): forward gather "
        "%.3f us, backward dK/dV sums %.3f us per 1000 key rows (%.0f rows over the rank runs "
        "measured); the forward gather moves %.0f GB/s read + written (--cp-gather-gbps)\n",
        long(kv_heads), long(dim), 1e3 * gather_total_ms / (copied_rows / 1e3),
        1e3 * key_gradients_total_ms / (copied_rows / 1e3), copied_rows, copy_gbps);
  }
  if (kernel == AttentionKernel::kCudnn) std::printf("%s\n", bench::CudnnGraphLine().c_str());
  return 0;
}
