// Kernel profiler: times a varlen attention engine (--kernel: flash, the default, or cudnn) on
// single causal segments over a grid of (q_len, kv_len) and writes the profile CSV that
// wlb::KernelModel reads (include/wlb/cost/kernel_model.hpp: columns q_len, kv_len, ms; others
// ignored). Each engine gets its own table: tile padding and per-call overhead differ.
//
//   wlb_cuda_kernel_profiler --out=h200_profile.csv [--kernel=flash] [--heads=32]
//       [--kv_heads=32] [--head_dim=128] [--max_q=32768] [--max_kv=131072] [--warmup=3]
//       [--iters=10]
//
// A segment of q_len queries whose keys are the first kv_len tokens of its document (queries
// [kv_len - q_len, kv_len)) is exactly what a CP rank runs. ms is the forward time of one call
// (mean over --iters after --warmup); bwd_ms the backward's. The header's last column names the
// device, the UTC date and this command (commas replaced), so the table carries its provenance;
// rows leave it empty. The header is written before the first measurement and each row as soon
// as it is measured (flushed, like stdout), so a run killed by `timeout` leaves every point it
// finished; a completed grid is read back through wlb::ReadKernelProfileCsv. With --kernel=cudnn
// the last line says how many cuDNN graphs were built and the seconds that took.
//
// Packed mode (--packed_micro_batches=N > 0) profiles the calls CP ranks run instead: for N
// WLB-like micro-batches of --tokens tokens (WlbLikeMicroBatch, seeds --seed.. --seed+N-1; the
// default 101 keeps them apart from cp_bench's 1..12), every C = 2, 4, ..., --max_cp and every
// strategy adaptive ranks (per-seq, per-seq-ordered, per-doc, hybrid, doc-degree, balanced-chunks,
// contiguous; planned with --profile's table, else the analytic model, as cp_bench plans), each
// rank's segments are timed as ONE varlen call (keys of a segment: its document's first q_end
// tokens, as the CP executor's call). Calls with the same segment list are timed once. The CSV
// (columns mb, cp, strategy, rank, segments, ms, bwd_ms, then the provenance note) is what
// wlb::ReadPackedCallProfile reads and FitPackedCalls fits; cp_bench --packed_profile=PATH ranks
// adaptive by that fit.
//
//   wlb_cuda_kernel_profiler --kernel=cudnn --kv_heads=8 --packed_micro_batches=4
//       --profile=docs/results/gpu/h100_kernel_profile_cudnn.csv --out=packed_cudnn.csv
//       [--tokens=131072] [--max_cp=8] [--seed=101] [--warmup=1] [--iters=3]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/cp_bench_util.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/cp_workload.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/io/kernel_profile.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/strategies/adaptive.hpp"

namespace {

using namespace wlb::cuda;  // NOLINT: a small program

struct Point {
  int64_t q, kv;  // total query and key rows of the call
  double fwd_ms, bwd_ms;
};

// Times one varlen call of `segments` (each q_len queries over its document's first kv_len keys).
absl::StatusOr<Point> Measure(AttentionKernel kernel, const std::vector<wlb::CallSegment>& segments,
                              int heads, int kv_heads, int dim, int warmup, int iters,
                              const bench::DeviceBf16* in) {
  AttentionProblem p;
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  for (const wlb::CallSegment& s : segments) {
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + static_cast<int32_t>(s.q_len));
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + static_cast<int32_t>(s.kv_len));
    p.max_seqlen_q = std::max(p.max_seqlen_q, static_cast<int32_t>(s.q_len));
    p.max_seqlen_k = std::max(p.max_seqlen_k, static_cast<int32_t>(s.kv_len));
  }
  const int64_t q = p.cu_seqlens_q.back(), kv = p.cu_seqlens_k.back();
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = dim;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  absl::StatusOr<VarlenAttention> attn = VarlenAttention::Create(p, {.kernel = kernel});
  if (!attn.ok()) return attn.status();
  // in: q, k, v, dout, out, dq, dk, dv (sized for the largest shape), then fp32 lse.
  auto b = [&](int i) { return in[i].get(); };
  float* lse = reinterpret_cast<float*>(b(8));
  ForwardTensors f{{b(0), q, heads, dim}, {b(1), kv, kv_heads, dim}, {b(2), kv, kv_heads, dim},
                   {b(4), q, heads, dim}, {lse, heads, q}};
  BackwardTensors g{{b(0), q, heads, dim},     {b(1), kv, kv_heads, dim},
                    {b(2), kv, kv_heads, dim}, {b(4), q, heads, dim},
                    {b(3), q, heads, dim},     {lse, heads, q},
                    {b(5), q, heads, dim},     {b(6), kv, kv_heads, dim},
                    {b(7), kv, kv_heads, dim}};
  cudaEvent_t e[3];
  for (auto& x : e) WLB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&x));
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = attn->Forward(f, nullptr); !s.ok()) return s;
    if (absl::Status s = attn->Backward(g, nullptr); !s.ok()) return s;
  }
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[0], nullptr));
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = attn->Forward(f, nullptr); !s.ok()) return s;
  }
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[1], nullptr));
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = attn->Backward(g, nullptr); !s.ok()) return s;
  }
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[2], nullptr));
  WLB_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e[2]));
  float fwd = 0, bwd = 0;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&fwd, e[0], e[1]));
  WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&bwd, e[1], e[2]));
  for (auto& x : e) cudaEventDestroy(x);
  return Point{q, kv, fwd / iters, bwd / iters};
}

// One packed call to time: where it comes from and its segments.
struct PackedCall {
  int64_t mb = 0, cp = 0, rank = 0;
  std::string strategy, segments_cell;
  std::vector<wlb::CallSegment> segments;
};

// The distinct rank calls of the packed mode (see the file comment), in order.
absl::StatusOr<std::vector<PackedCall>> PackedCalls(int64_t micro_batches, int64_t tokens,
                                                    int64_t max_cp, int64_t seed,
                                                    const wlb::KernelModel& model) {
  std::vector<PackedCall> calls;
  std::set<std::string> seen;
  for (int64_t i = 0; i < micro_batches; ++i) {
    const wlb::MicroBatch mb = WlbLikeMicroBatch(tokens, uint64_t(seed + i));
    for (int64_t cp = 2; cp <= max_cp; cp *= 2) {
      // adaptive's candidates, so that the fit has seen the calls of every plan it ranks: on the
      // H100 flash table adaptive picks balanced-chunks for 15 of cp_bench's 12 micro-batches x
      // C = 2, 4, 8. Registry order: a call two plans share is labelled by the first.
      for (wlb::ShardStrategy st : wlb::ShardStrategy::All()) {
        if (std::find(std::begin(wlb::kAdaptiveCandidates), std::end(wlb::kAdaptiveCandidates),
                      st) == std::end(wlb::kAdaptiveCandidates)) {
          continue;
        }
        absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, int(cp), st, model);
        if (!plan.ok()) return plan.status();
        for (const wlb::RankShard& r : plan->ranks) {
          PackedCall c{.mb = i,
                       .cp = cp,
                       .rank = r.rank,
                       .strategy = std::string(wlb::ShardStrategyName(st))};
          for (const wlb::Segment& s : r.segments) {
            c.segments.push_back({s.q_len(), s.q_end});
            c.segments_cell +=
                absl::StrFormat("%s%d:%d", c.segments_cell.empty() ? "" : " ", s.q_len(), s.q_end);
          }
          if (!c.segments.empty() && seen.insert(c.segments_cell).second) {
            calls.push_back(std::move(c));
          }
        }
      }
    }
  }
  return calls;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Flags flags(argc, argv);
  std::string out, profile;
  AttentionKernel kernel = AttentionKernel::kFlash;
  int64_t heads = 32, kv_heads = 32, dim = 128, max_q = 32768, max_kv = 131072, warmup = 3,
          iters = 10, packed_mbs = 0, tokens = 131072, max_cp = 8, seed = 101;
  bool ok = flags.Str("out", &out) && flags.Kernel("kernel", &kernel) &&
            flags.Int("heads", &heads) && flags.Int("kv_heads", &kv_heads) &&
            flags.Int("head_dim", &dim) && flags.Int("max_q", &max_q) &&
            flags.Int("max_kv", &max_kv) && flags.Int("warmup", &warmup) &&
            flags.Int("iters", &iters) && flags.Int("packed_micro_batches", &packed_mbs) &&
            flags.Int("tokens", &tokens) && flags.Int("max_cp", &max_cp) &&
            flags.Int("seed", &seed) && flags.Str("profile", &profile) && flags.AllUsed();
  if (!ok || out.empty() || max_q < 1 || max_kv < max_q || iters < 1 || packed_mbs < 0 ||
      tokens < 1 || tokens > wlb::kMaxContext || max_cp < 2 || max_cp > wlb::kMaxCpSize) {
    std::fprintf(stderr,
                 "usage: %s --out=PATH [--kernel=flash|cudnn|reference] [--heads=32] "
                 "[--kv_heads=32] [--head_dim=128] "
                 "[--max_q=32768] [--max_kv=131072] [--warmup=3] [--iters=10] (max_kv >= max_q)\n"
                 "  packed calls: --packed_micro_batches=N [--tokens=131072] [--max_cp=8] "
                 "[--seed=101] [--profile=PATH] (see the comment at the top of "
                 "kernel_profiler.cc)\n",
                 argv[0]);
    return 2;
  }
  wlb::KernelShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  std::vector<PackedCall> calls;
  if (packed_mbs > 0) {
    absl::StatusOr<wlb::KernelModel> plan_model = profile.empty()
                                                      ? wlb::KernelModel::Analytic({.shape = shape})
                                                      : wlb::ReadKernelProfileCsv(profile, shape);
    if (!plan_model.ok()) {
      std::fprintf(stderr, "%s\n", plan_model.status().ToString().c_str());
      return 2;
    }
    absl::StatusOr<std::vector<PackedCall>> c =
        PackedCalls(packed_mbs, tokens, max_cp, seed, *plan_model);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 2;
    }
    calls = *std::move(c);
    // Buffers for the largest call; the calls each strategy adds first (the fit must see them).
    max_q = max_kv = 1;
    std::map<std::string, int> per_strategy;
    for (const PackedCall& call : calls) {
      ++per_strategy[call.strategy];
      int64_t q = 0, kv = 0;
      for (const wlb::CallSegment& s : call.segments) {
        q += s.q_len;
        kv += s.kv_len;
      }
      max_q = std::max(max_q, q);
      max_kv = std::max(max_kv, kv);
    }
    std::string counts;
    for (const auto& [strategy, n] : per_strategy) {
      counts += absl::StrFormat("%s%s %d", counts.empty() ? "" : ", ", strategy, n);
    }
    std::printf(
        "%zu distinct rank calls of %ld micro-batches (%s), C = 2..%ld; largest %ld query and "
        "%ld key rows\n",
        calls.size(), long(packed_mbs), counts.c_str(), long(max_cp), long(max_q), long(max_kv));
  } else if (!profile.empty()) {
    std::fprintf(stderr, "--profile is for the packed mode (--packed_micro_batches > 0)\n");
    return 2;
  }
  if (!bench::RequireDevice(argv[0])) return 3;
  const size_t nq = size_t(max_q) * heads * dim, nk = size_t(max_kv) * kv_heads * dim;
  std::vector<bench::DeviceBf16> in;
  for (size_t i = 0; i < 8; ++i) {
    const size_t n = (i == 1 || i == 2 || i == 6 || i == 7) ? nk : nq;
    in.push_back(i < 4 ? bench::RandomDevice(n, 100 + i, i < 2 ? 2.0f : 1.0f)
                       : bench::EmptyDevice(n));
  }
  in.push_back(bench::EmptyDevice(size_t(heads) * max_q * 2));  // fp32 lse
  for (const auto& b : in) {
    if (!b) return 1;
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string note = absl::StrReplaceAll(
      absl::StrFormat("%s kernel measured %s on %s: %s", AttentionKernelName(kernel), date,
                      bench::DeviceName(), flags.command()),
      {{",", ";"}});
  std::ofstream csv(out);
  csv << (packed_mbs > 0 ? "mb,cp,strategy,rank,segments,ms,bwd_ms," : "q_len,kv_len,ms,bwd_ms,")
      << note << "\n"
      << std::flush;
  if (!csv.good()) {
    std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
    return 1;
  }
  std::vector<Point> points;
  const auto measure = [&](const std::vector<wlb::CallSegment>& segments) -> bool {
    absl::StatusOr<Point> p = Measure(kernel, segments, int(heads), int(kv_heads), int(dim),
                                      int(warmup), int(iters), in.data());
    if (!p.ok()) {
      std::fprintf(stderr, "call of %zu segments (first q_len %ld): %s\n", segments.size(),
                   long(segments.front().q_len), p.status().ToString().c_str());
      return false;
    }
    points.push_back(*p);
    return true;
  };
  if (packed_mbs > 0) {
    for (const PackedCall& c : calls) {
      if (!measure(c.segments)) return 1;
      const Point& p = points.back();
      std::printf(
          "mb %ld C %ld %-15s rank %ld: %3zu segments, %6ld q / %7ld kv rows  fwd %8.4f "
          "ms  bwd %8.4f ms\n",
          long(c.mb), long(c.cp), c.strategy.c_str(), long(c.rank), c.segments.size(), long(p.q),
          long(p.kv), p.fwd_ms, p.bwd_ms);
      csv << absl::StrFormat("%d,%d,%s,%d,%s,%.6f,%.6f,\n", c.mb, c.cp, c.strategy, c.rank,
                             c.segments_cell, p.fwd_ms, p.bwd_ms)
          << std::flush;
      if (!csv.good()) {
        std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
        return 1;
      }
    }
  } else {
    // Query lengths around the tile (the kernel model's flat region and jump), then doubling;
    // key lengths from q_len doubling to max_kv, plus max_kv itself.
    std::vector<int64_t> qs = {16, 64, 128, 192, 256, 384, 512};
    for (int64_t q = 1024; q <= max_q; q *= 2) qs.push_back(q);
    for (int64_t q : qs) {
      if (q > max_q) continue;
      std::vector<int64_t> kvs;
      for (int64_t kv = q; kv < max_kv; kv *= 2) kvs.push_back(kv);
      kvs.push_back(max_kv);
      for (int64_t kv : kvs) {
        if (!measure({{q, kv}})) return 1;
        const Point& p = points.back();
        // Useful FLOPs: query i of the segment sees kv - q + i + 1 keys.
        const double pairs = double(q) * double(kv - q) + double(q) * double(q + 1) / 2;
        const double tflops = 4.0 * double(dim) * double(heads) * pairs / (p.fwd_ms * 1e9);
        std::printf("q_len %6ld kv_len %6ld  fwd %9.4f ms  bwd %9.4f ms  fwd %6.1f TFLOP/s\n",
                    long(q), long(kv), p.fwd_ms, p.bwd_ms, tflops);
        csv << absl::StrFormat("%d,%d,%.6f,%.6f,\n", p.q, p.kv, p.fwd_ms, p.bwd_ms) << std::flush;
        if (!csv.good()) {
          std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
          return 1;
        }
      }
    }
  }
  csv.close();
  if (!csv) {
    std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
    return 1;
  }
  if (packed_mbs > 0) {
    absl::StatusOr<wlb::KernelModel> model =
        wlb::WithPackedCallProfile(*wlb::KernelModel::Analytic({.shape = shape}), out);
    if (!model.ok()) {
      std::fprintf(stderr, "written profile does not fit: %s\n", model.status().ToString().c_str());
      return 1;
    }
    const wlb::PackedCallFit& f = model->packed_calls();
    std::printf("packed-call fit: rms relative error fwd %.1f%%, bwd %.1f%% over %d calls\n",
                100 * f.fwd_rms_relative, 100 * f.bwd_rms_relative, f.points);
  } else {
    absl::StatusOr<wlb::KernelModel> model = wlb::ReadKernelProfileCsv(out, shape);
    if (!model.ok()) {
      std::fprintf(stderr, "written profile does not parse: %s\n",
                   model.status().ToString().c_str());
      return 1;
    }
  }
  std::printf("wrote %zu points to %s (%s)\n", points.size(), out.c_str(), note.c_str());
  if (kernel == AttentionKernel::kCudnn) std::printf("%s\n", bench::CudnnGraphLine().c_str());
  return 0;
}
