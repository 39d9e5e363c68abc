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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/cp_bench_util.h"
#include "wlb/cost/kernel_model.hpp"
#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/io/kernel_profile.hpp"

namespace {

using namespace wlb::cuda;  // NOLINT: a small program

struct Point {
  int64_t q, kv;
  double fwd_ms, bwd_ms;
};

absl::StatusOr<Point> Measure(AttentionKernel kernel, int64_t q, int64_t kv, int heads,
                              int kv_heads, int dim, int warmup, int iters,
                              const bench::DeviceBf16* in) {
  AttentionProblem p;
  p.cu_seqlens_q = {0, static_cast<int32_t>(q)};
  p.cu_seqlens_k = {0, static_cast<int32_t>(kv)};
  p.max_seqlen_q = static_cast<int32_t>(q);
  p.max_seqlen_k = static_cast<int32_t>(kv);
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

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Flags flags(argc, argv);
  std::string out;
  AttentionKernel kernel = AttentionKernel::kFlash;
  int64_t heads = 32, kv_heads = 32, dim = 128, max_q = 32768, max_kv = 131072, warmup = 3,
          iters = 10;
  bool ok = flags.Str("out", &out) && flags.Kernel("kernel", &kernel) &&
            flags.Int("heads", &heads) && flags.Int("kv_heads", &kv_heads) &&
            flags.Int("head_dim", &dim) && flags.Int("max_q", &max_q) &&
            flags.Int("max_kv", &max_kv) && flags.Int("warmup", &warmup) &&
            flags.Int("iters", &iters) && flags.AllUsed();
  if (!ok || out.empty() || max_q < 1 || max_kv < max_q || iters < 1) {
    std::fprintf(stderr,
                 "usage: %s --out=PATH [--kernel=flash|cudnn|reference] [--heads=32] "
                 "[--kv_heads=32] [--head_dim=128] "
                 "[--max_q=32768] [--max_kv=131072] [--warmup=3] [--iters=10] (max_kv >= max_q)\n",
                 argv[0]);
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
  csv << "q_len,kv_len,ms,bwd_ms," << note << "\n" << std::flush;
  if (!csv.good()) {
    std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
    return 1;
  }
  // Query lengths around the tile (the kernel model's flat region and jump), then doubling;
  // key lengths from q_len doubling to max_kv, plus max_kv itself.
  std::vector<int64_t> qs = {16, 64, 128, 192, 256, 384, 512};
  for (int64_t q = 1024; q <= max_q; q *= 2) qs.push_back(q);
  std::vector<Point> points;
  for (int64_t q : qs) {
    if (q > max_q) continue;
    std::vector<int64_t> kvs;
    for (int64_t kv = q; kv < max_kv; kv *= 2) kvs.push_back(kv);
    kvs.push_back(max_kv);
    for (int64_t kv : kvs) {
      absl::StatusOr<Point> p = Measure(kernel, q, kv, int(heads), int(kv_heads), int(dim),
                                        int(warmup), int(iters), in.data());
      if (!p.ok()) {
        std::fprintf(stderr, "q_len %ld kv_len %ld: %s\n", long(q), long(kv),
                     p.status().ToString().c_str());
        return 1;
      }
      // Useful FLOPs: query i of the segment sees kv - q + i + 1 keys.
      const double pairs = double(q) * double(kv - q) + double(q) * double(q + 1) / 2;
      const double tflops = 4.0 * double(dim) * double(heads) * pairs / (p->fwd_ms * 1e9);
      std::printf("q_len %6ld kv_len %6ld  fwd %9.4f ms  bwd %9.4f ms  fwd %6.1f TFLOP/s\n",
                  long(q), long(kv), p->fwd_ms, p->bwd_ms, tflops);
      csv << absl::StrFormat("%d,%d,%.6f,%.6f,\n", p->q, p->kv, p->fwd_ms, p->bwd_ms) << std::flush;
      if (!csv.good()) {
        std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
        return 1;
      }
      points.push_back(*p);
    }
  }
  csv.close();
  if (!csv) {
    std::fprintf(stderr, "cannot write '%s'\n", out.c_str());
    return 1;
  }
  wlb::KernelShape shape;
  shape.heads = heads;
  shape.head_dim = dim;
  absl::StatusOr<wlb::KernelModel> model = wlb::ReadKernelProfileCsv(out, shape);
  if (!model.ok()) {
    std::fprintf(stderr, "written profile does not parse: %s\n", model.status().ToString().c_str());
    return 1;
  }
  std::printf("wrote %zu points to %s (%s)\n", points.size(), out.c_str(), note.c_str());
  if (kernel == AttentionKernel::kCudnn) std::printf("%s\n", bench::CudnnGraphLine().c_str());
  return 0;
}
