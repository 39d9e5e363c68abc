// End to end on one GPU: documents → WLB packing → adaptive CP sharding → execution of every
// micro-batch of the first step with C emulated ranks → check against single-device attention →
// per-rank times and measured balance.
//
//   cp_end_to_end [--lengths=FILE] [--context=65536] [--micro_batches=2] [--cp=4]
//       [--heads=8] [--kv_heads=2] [--head_dim=128] [--kernel=flash|cudnn|reference]
//
// --lengths reads document lengths (JSON array or one per line, wlb::ReadLengthsFile); without
// it the embedded WLB-LLM-like distribution is sampled. Exit status 0 only when every
// micro-batch matches (relative L2 <= 4e-3 for out, <= 1e-2 for dQ/dK/dV). Output is line-
// buffered, so a run killed by `timeout` keeps every micro-batch it finished; with
// --kernel=cudnn the last line says how many cuDNN graphs were built and the seconds that took.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/cp_bench_util.h"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cp_packed_run.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/wlb.hpp"

namespace {

using namespace wlb::cuda;  // NOLINT: a small program

std::vector<float> Host(const __nv_bfloat16* d, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Flags flags(argc, argv);
  std::string lengths_file;
  int64_t context = 65536, n = 2, cp = 4, heads = 8, kv_heads = 2, dim = 128;
  AttentionKernel kernel = AttentionKernel::kFlash;
  if (!(flags.Kernel("kernel", &kernel) && flags.Str("lengths", &lengths_file) &&
        flags.Int("context", &context) && flags.Int("micro_batches", &n) && flags.Int("cp", &cp) &&
        flags.Int("heads", &heads) && flags.Int("kv_heads", &kv_heads) &&
        flags.Int("head_dim", &dim) && flags.AllUsed())) {
    return 2;
  }
  if (!bench::RequireDevice(argv[0])) return 3;

  // 1. Documents, cut by the loader into pieces of at most the context window.
  // (wlb::LoadLengths + wlb::CutSteps: the input path wlb-plan and the bench tables use).
  absl::StatusOr<wlb::Lengths> lengths =
      wlb::LoadLengths({.docs = lengths_file, .seed = 3}, 2 * context * n);
  if (!lengths.ok()) return std::fprintf(stderr, "%s\n", lengths.status().ToString().c_str()), 2;
  absl::StatusOr<wlb::Input> input = wlb::CutSteps(*lengths, context, static_cast<int32_t>(n));
  if (!input.ok()) return std::fprintf(stderr, "%s\n", input.status().ToString().c_str()), 2;

  // 2. WLB packing: variable-length micro-batches (cap 1.25 S) with outlier queues.
  const wlb::PackerConfig pc{.context = context,
                             .max_tokens = wlb::DefaultMaxTokens(context),
                             .micro_batches = static_cast<int32_t>(n)};
  const wlb::CostModel cost = *wlb::CostModelFromPreset("llama2-7b");
  auto packer =
      wlb::MakePacker("wlb", pc, cost, {.thresholds = wlb::DefaultThresholds(context, 2)});
  if (!packer.ok()) return std::fprintf(stderr, "%s\n", packer.status().ToString().c_str()), 2;
  absl::StatusOr<wlb::PackRun> run = wlb::RunPacker(**packer, input->steps);
  if (!run.ok() || run->steps.empty()) return std::fprintf(stderr, "packing failed\n"), 1;
  const wlb::StepPlan& step = run->steps.front();

  wlb::KernelShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  const wlb::KernelModel model = *wlb::KernelModel::Analytic({.shape = shape});
  const CpAttentionConfig config{.num_heads = int(heads),
                                 .num_kv_heads = int(kv_heads),
                                 .head_dim = int(dim),
                                 .kernel = kernel};
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(int(cp));
  if (!comm.ok()) return std::fprintf(stderr, "%s\n", comm.status().ToString().c_str()), 1;

  bool all_ok = true;
  for (size_t i = 0; i < step.micro_batches.size(); ++i) {
    const wlb::MicroBatch& mb = step.micro_batches[i];
    if (mb.tokens == 0) continue;
    // 3. Adaptive sharding (per micro-batch), 4. CP execution.
    absl::StatusOr<wlb::ShardPlan> plan =
        wlb::PlanShards(mb, int(cp), wlb::ShardStrategy("adaptive"), model);
    if (!plan.ok()) return std::fprintf(stderr, "%s\n", plan.status().ToString().c_str()), 1;
    const size_t nq = size_t(mb.tokens) * heads * dim, nk = size_t(mb.tokens) * kv_heads * dim;
    bench::DeviceBf16 q = bench::RandomDevice(nq, 10 * i + 1, 2),
                      k = bench::RandomDevice(nk, 10 * i + 2, 2),
                      v = bench::RandomDevice(nk, 10 * i + 3, 1),
                      dout = bench::RandomDevice(nq, 10 * i + 4, 1);
    bench::DeviceBf16 out = bench::EmptyDevice(nq), dq = bench::EmptyDevice(nq),
                      dk = bench::EmptyDevice(nk), dv = bench::EmptyDevice(nk);
    bench::DeviceBf16 ref[4] = {bench::EmptyDevice(nq), bench::EmptyDevice(nq),
                                bench::EmptyDevice(nk), bench::EmptyDevice(nk)};
    bench::DeviceBf16 lse = bench::EmptyDevice(size_t(heads) * mb.tokens * 2);
    if (!q || !k || !v || !dout || !out || !dq || !dk || !dv || !ref[3] || !lse) return 1;
    absl::StatusOr<std::unique_ptr<CpPackedRunner>> cp_run =
        CpPackedRunner::Create(*plan, config, **comm, {.isolate_ranks = true});
    if (!cp_run.ok()) return std::fprintf(stderr, "%s\n", cp_run.status().ToString().c_str()), 1;
    absl::Status s = (*cp_run)->Run(
        {q.get(), k.get(), v.get(), dout.get(), out.get(), dq.get(), dk.get(), dv.get()},
        /*backward=*/true);
    absl::StatusOr<std::vector<CpRankTimes>> times = (*cp_run)->executor().RankTimes();
    if (!s.ok() || !times.ok()) {
      std::fprintf(stderr, "CP run: %s\n", (s.ok() ? times.status() : s).ToString().c_str());
      return 1;
    }
    // 5. Single-device reference over the whole packed micro-batch.
    absl::StatusOr<VarlenAttention> whole =
        VarlenAttention::Create(*WholeBatchProblem(mb, config), {.kernel = kernel});
    if (!whole.ok()) return std::fprintf(stderr, "%s\n", whole.status().ToString().c_str()), 1;
    const int64_t t = mb.tokens;
    auto* lse_f = reinterpret_cast<float*>(lse.get());
    s = whole->Forward({{q.get(), t, heads, dim},
                        {k.get(), t, kv_heads, dim},
                        {v.get(), t, kv_heads, dim},
                        {ref[0].get(), t, heads, dim},
                        {lse_f, heads, t}},
                       nullptr);
    if (s.ok()) {
      s = whole->Backward({{q.get(), t, heads, dim},
                           {k.get(), t, kv_heads, dim},
                           {v.get(), t, kv_heads, dim},
                           {ref[0].get(), t, heads, dim},
                           {dout.get(), t, heads, dim},
                           {lse_f, heads, t},
                           {ref[1].get(), t, heads, dim},
                           {ref[2].get(), t, kv_heads, dim},
                           {ref[3].get(), t, kv_heads, dim}},
                          nullptr);
    }
    if (!s.ok() || cudaDeviceSynchronize() != cudaSuccess) {
      return std::fprintf(stderr, "reference: %s\n", s.ToString().c_str()), 1;
    }
    const double e_out = RelL2(Host(out.get(), nq), Host(ref[0].get(), nq));
    const double e_dq = RelL2(Host(dq.get(), nq), Host(ref[1].get(), nq));
    const double e_dk = RelL2(Host(dk.get(), nk), Host(ref[2].get(), nk));
    const double e_dv = RelL2(Host(dv.get(), nk), Host(ref[3].get(), nk));
    const bool ok = e_out <= 4e-3 && std::max({e_dq, e_dk, e_dv}) <= 1e-2;
    all_ok &= ok;
    // 6. Per-rank times and balance.
    std::vector<double> total, predicted = wlb::PredictRankMs(*plan, model);
    std::printf(
        "micro-batch %zu: %ld tokens, %zu documents, adaptive chose %s; rel L2 out %.1e "
        "dq %.1e dk %.1e dv %.1e -> %s\n",
        i, long(t), mb.documents.size(),
        std::string(wlb::ShardStrategyName(plan->strategy)).c_str(), e_out, e_dq, e_dk, e_dv,
        ok ? "MATCH" : "MISMATCH");
    for (const CpRankTimes& r : *times) {
      total.push_back(r.forward_ms + r.backward_ms);
      std::printf("  rank %d: fwd %8.3f ms  bwd %8.3f ms  (model fwd %8.3f ms)\n", r.rank,
                  r.forward_ms, r.backward_ms, predicted[size_t(r.rank)]);
    }
    std::printf("  measured CP imbalance (max/mean fwd+bwd) %.3f; causal-pair imbalance %.3f\n",
                wlb::MaxOverMean(total), wlb::MaxOverMean(wlb::RankCausalPairs(*plan)));
  }
  std::printf("%s\n", all_ok ? "all micro-batches match single-device attention"
                             : "MISMATCH against single-device attention");
  if (kernel == AttentionKernel::kCudnn) std::printf("%s\n", bench::CudnnGraphLine().c_str());
  return all_ok ? 0 : 1;
}
