// Times the varlen attention engines (wlb's flash kernels, cuDNN's fused attention) and prints
// TFLOP/s (useful FLOPs: causal pairs counted per document; backward = 2.5 x forward) as a table
// and as JSON lines.
//
//   wlb_cuda_attention_bench [--tokens=131072] [--heads=16] [--kv_heads=16] [--head_dim=128]
//       [--warmup=3] [--iters=10] [--mix=PATH] [--mix_offset=0] [--dump_mix=PATH]
//       [--json=PATH] [--configs=512,2048,8192,16384,mix]
//       [--kernels=flash,cudnn] [--block_orders=heaviest_first,head_major]
//       [--flash_backward=q64]
//
// --kernels lists the engines to time, one after the other on the same buffers (flash, cudnn,
// reference; default flash,cudnn, or flash alone when the cudnn engine is compiled out).
// Configurations: uniform documents of 512, 2K, 8K and 16K tokens filling --tokens, and "mix": a
// --tokens micro-batch of consecutive documents from the WLB-LLM-like length file (--mix,
// default ../shared/data/doc_lengths_wlbllm_like.json), cut at the end to fit; when the file is
// absent, a seeded sample (97% uniform in 1..6250, 3% log-uniform up to 128K) stands in, and the
// JSON says so. --dump_mix writes the mix lengths used, for the PyTorch side-by-side. Each
// configuration is timed with every --kernels engine, flash in every --block_orders order
// (wlb::cuda::BlockOrder) and every --flash_backward configuration (wlb::cuda::FlashBackwardConfig:
// q64, q64_pass32, q32, q64_w8; the forward is the same kernel in each), one after the other on the
// same buffers, so their ratios come from one run. The first line names the CUDA driver, runtime
// and cuDNN versions (so does every JSON row); the last, when cudnn ran, how many cuDNN graphs were
// built and the seconds that took (a one-time cost the per-call times leave out; cudnn JSON rows
// carry the running totals). Output is line-buffered and every JSON row flushed, so a run killed by
// `timeout` keeps every configuration it finished.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/cp_bench_util.h"
#include "nlohmann/json.hpp"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/device_fill.h"
#include "wlb/cuda/varlen_attention.h"

namespace {

using wlb::cuda::AttentionProblem;

struct Flags {
  int64_t tokens = 131072;
  int heads = 16;
  int kv_heads = 16;
  int head_dim = 128;
  int warmup = 3;
  int iters = 10;
  std::string mix = std::string(WLB_SHARED_DATA_DIR) + "/doc_lengths_wlbllm_like.json";
  int64_t mix_offset = 0;
  std::string dump_mix;
  std::string json;
  std::string configs = "512,2048,8192,16384,mix";
  std::string block_orders = "heaviest_first,head_major";
  std::string flash_backward = "q64";
  std::string kernels = wlb::cuda::CudnnEngineCompiledIn() ? "flash,cudnn" : "flash";
};

// --kernels: engine names (wlb::cuda::ParseAttentionKernel); cudnn only when compiled in.
bool ParseKernels(const std::string& list, std::vector<wlb::cuda::AttentionKernel>* kernels) {
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    absl::StatusOr<wlb::cuda::AttentionKernel> k =
        wlb::cuda::ParseAttentionKernel(std::string_view(name.data(), name.size()));
    if (!k.ok()) {
      std::fprintf(stderr, "--kernels: %s\n", k.status().ToString().c_str());
      return false;
    }
    if (*k == wlb::cuda::AttentionKernel::kCudnn && !wlb::cuda::CudnnEngineCompiledIn()) {
      std::fprintf(stderr, "--kernels=cudnn: %s\n",
                   wlb::cuda::CudnnRuntimeVersion().status().ToString().c_str());
      return false;
    }
    kernels->push_back(*k);
  }
  return !kernels->empty();
}

// --block_orders names, in BlockOrder's order.
constexpr std::pair<const char*, wlb::cuda::BlockOrder> kOrderNames[] = {
    {"heaviest_first", wlb::cuda::BlockOrder::kHeaviestFirst},
    {"head_major", wlb::cuda::BlockOrder::kHeadMajor},
};

bool ParseBlockOrders(const std::string& list,
                      std::vector<std::pair<const char*, wlb::cuda::BlockOrder>>* orders) {
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    const auto* it = std::find_if(std::begin(kOrderNames), std::end(kOrderNames),
                                  [&](const auto& o) { return name == o.first; });
    if (it == std::end(kOrderNames)) {
      std::fprintf(stderr, "bad block order '%s' (allowed: heaviest_first, head_major)\n",
                   std::string(name).c_str());
      return false;
    }
    orders->push_back(*it);
  }
  return !orders->empty();
}

// --flash_backward names (wlb::cuda::ParseFlashBackwardConfig).
bool ParseBackwardConfigs(const std::string& list,
                          std::vector<wlb::cuda::FlashBackwardConfig>* configs) {
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    absl::StatusOr<wlb::cuda::FlashBackwardConfig> c =
        wlb::cuda::ParseFlashBackwardConfig(std::string_view(name.data(), name.size()));
    if (!c.ok()) {
      std::fprintf(stderr, "--flash_backward: %s\n", c.status().ToString().c_str());
      return false;
    }
    configs->push_back(*c);
  }
  return !configs->empty();
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument '%s' (expected --name=value)\n", arg.c_str());
      return false;
    }
    const std::string name = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    bool ok = true;
    if (name == "tokens") ok = absl::SimpleAtoi(value, &f->tokens);
    else if (name == "heads") ok = absl::SimpleAtoi(value, &f->heads);
    else if (name == "kv_heads") ok = absl::SimpleAtoi(value, &f->kv_heads);
    else if (name == "head_dim") ok = absl::SimpleAtoi(value, &f->head_dim);
    else if (name == "warmup") ok = absl::SimpleAtoi(value, &f->warmup);
    else if (name == "iters") ok = absl::SimpleAtoi(value, &f->iters) && f->iters > 0;
    else if (name == "mix") f->mix = value;
    else if (name == "mix_offset") ok = absl::SimpleAtoi(value, &f->mix_offset);
    else if (name == "dump_mix") f->dump_mix = value;
    else if (name == "json") f->json = value;
    else if (name == "configs") f->configs = value;
    else if (name == "block_orders") f->block_orders = value;
    else if (name == "flash_backward")
      f->flash_backward = value;
    else if (name == "kernels")
      f->kernels = value;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag '%s'\n", arg.c_str());
      return false;
    }
  }
  return true;
}

// The mix micro-batch: consecutive documents from `lengths`, the last one cut to fill `tokens`.
std::vector<int32_t> CutMicroBatch(const std::vector<int64_t>& lengths, int64_t offset,
                                   int64_t tokens) {
  std::vector<int32_t> out;
  int64_t total = 0;
  for (size_t i = offset; i < lengths.size() && total < tokens; ++i) {
    const int64_t l = std::min(lengths[i], tokens - total);
    out.push_back(static_cast<int32_t>(l));
    total += l;
  }
  return out;
}

std::vector<int64_t> GeneratedLengths(size_t n) {
  std::mt19937_64 rng(20250701);
  std::vector<int64_t> v(n);
  for (int64_t& l : v) {
    if (std::bernoulli_distribution(0.97)(rng)) {
      l = std::uniform_int_distribution<int64_t>(1, 6250)(rng);
    } else {
      l = static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(
          std::log(6250.0), std::log(124913.0))(rng)));
    }
  }
  return v;
}

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    const cudaError_t e_ = (expr);                                                    \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s\n",                                                    \
                   wlb::cuda::CudaStatus(e_, #expr, __FILE__, __LINE__).ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (false)

#define CHECK_OK(expr)                                                     \
  do {                                                                     \
    const absl::Status s_ = (expr);                                        \
    if (!s_.ok()) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #expr, s_.ToString().c_str()); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (false)

// The library versions the numbers were measured with: every number must name them.
struct Versions {
  int driver = 0, runtime = 0;  // 1000 * major + 10 * minor; driver 0: no driver
  int64_t cudnn = 0;            // cudnnGetVersion(); 0: the cudnn engine is compiled out
};

// Read before the device check and never fatal: a machine without a driver still says so (0).
Versions LibraryVersions() {
  Versions v;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  if (absl::StatusOr<int64_t> c = wlb::cuda::CudnnRuntimeVersion(); c.ok()) v.cudnn = *c;
  return v;
}

template <typename F>
double MedianMs(F&& run, int warmup, int iters) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) run();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    run();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file: a run killed by `timeout` keeps what it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  std::vector<std::pair<const char*, wlb::cuda::BlockOrder>> orders;
  if (!ParseBlockOrders(flags.block_orders, &orders)) return 2;
  std::vector<wlb::cuda::AttentionKernel> kernels;
  if (!ParseKernels(flags.kernels, &kernels)) return 2;
  std::vector<wlb::cuda::FlashBackwardConfig> backward_configs;
  if (!ParseBackwardConfigs(flags.flash_backward, &backward_configs)) return 2;
  const Versions versions = LibraryVersions();
  const std::string cudnn_version =
      versions.cudnn > 0
          ? absl::StrFormat("cuDNN %d.%d.%d (%d)", versions.cudnn / 10000,
                            versions.cudnn / 100 % 100, versions.cudnn % 100, versions.cudnn)
          : "cudnn engine compiled out";
  std::printf("versions: CUDA driver %d.%d (%d), CUDA runtime %d.%d (%d), %s\n",
              versions.driver / 1000, versions.driver % 1000 / 10, versions.driver,
              versions.runtime / 1000, versions.runtime % 1000 / 10, versions.runtime,
              cudnn_version.c_str());
  if (absl::Status s = wlb::cuda::CudaDeviceAvailable(); !s.ok()) {
    std::fprintf(stderr, "no usable CUDA device, nothing measured: %s\n", s.ToString().c_str());
    return 3;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);

  std::vector<int64_t> all_lengths;
  std::string mix_source;
  if (std::ifstream in(flags.mix); in) {
    all_lengths = nlohmann::json::parse(in).get<std::vector<int64_t>>();
    mix_source = flags.mix;
  } else {
    all_lengths = GeneratedLengths(4096);
    mix_source = "generated (seed 20250701; file not found: " + flags.mix + ")";
  }
  const std::vector<int32_t> mix = CutMicroBatch(all_lengths, flags.mix_offset, flags.tokens);
  if (!flags.dump_mix.empty()) {
    std::ofstream(flags.dump_mix) << nlohmann::json(mix).dump() << "\n";
  }

  std::ofstream json_out;
  if (!flags.json.empty()) json_out.open(flags.json);
  std::printf("%-8s %-9s %-14s %-10s %6s %9s %10s %10s %10s %10s\n", "config", "kernel",
              "block_order", "flash_bwd", "docs", "tokens", "fwd_ms", "fwd_TFLOPs", "bwd_ms",
              "bwd_TFLOPs");
  for (const std::string& config :
       std::vector<std::string>(absl::StrSplit(flags.configs, ','))) {
    std::vector<int32_t> lengths;
    if (config == "mix") {
      lengths = mix;
    } else {
      int64_t len = 0;
      if (!absl::SimpleAtoi(config, &len) || len <= 0) {
        std::fprintf(stderr, "bad config '%s'\n", config.c_str());
        return 2;
      }
      lengths.assign(std::max<int64_t>(1, flags.tokens / len), static_cast<int32_t>(len));
    }
    AttentionProblem p;
    p.cu_seqlens_q = {0};
    for (int32_t l : lengths) p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + l);
    p.cu_seqlens_k = p.cu_seqlens_q;
    p.max_seqlen_q = p.max_seqlen_k = *std::max_element(lengths.begin(), lengths.end());
    p.num_heads = flags.heads;
    p.num_kv_heads = flags.kv_heads;
    p.head_dim = flags.head_dim;
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(flags.head_dim));
    p.causal = true;

    const int64_t tq = p.total_q(), h = p.num_heads, hk = p.num_kv_heads, d = p.head_dim;
    const size_t nq = size_t(tq) * h * d, nk = size_t(tq) * hk * d;
    __nv_bfloat16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float* lse;
    for (auto [ptr, n] : {std::pair{&q, nq}, {&k, nk}, {&v, nk}, {&out, nq}, {&dout, nq},
                          {&dq, nq}, {&dk, nk}, {&dv, nk}}) {
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(ptr), n * sizeof(__nv_bfloat16)));
    }
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&lse), size_t(tq) * h * sizeof(float)));
    // Filled on the device: a host fill took seconds per buffer at 128K x 16 heads x 128.
    CHECK_OK(wlb::cuda::FillUniformBf16(q, int64_t(nq), 1, 1.f));
    CHECK_OK(wlb::cuda::FillUniformBf16(k, int64_t(nk), 2, 1.f));
    CHECK_OK(wlb::cuda::FillUniformBf16(v, int64_t(nk), 3, 1.f));
    CHECK_OK(wlb::cuda::FillUniformBf16(dout, int64_t(nq), 4, 1.f));
    CHECK_CUDA(cudaDeviceSynchronize());

    wlb::cuda::ForwardTensors f;
    f.q = {q, tq, h, d};
    f.k = {k, tq, hk, d};
    f.v = {v, tq, hk, d};
    f.out = {out, tq, h, d};
    f.lse = {lse, h, tq};
    wlb::cuda::BackwardTensors b;
    b.q = f.q;
    b.k = f.k;
    b.v = f.v;
    b.out = {out, tq, h, d};
    b.dout = {dout, tq, h, d};
    b.lse = {lse, h, tq};
    b.dq = {dq, tq, h, d};
    b.dk = {dk, tq, hk, d};
    b.dv = {dv, tq, hk, d};

    // Every engine; flash in every block order and backward configuration (the others have
    // neither: "-").
    struct Run {
      wlb::cuda::AttentionKernel kernel;
      const char* order_name;
      wlb::cuda::BlockOrder order;
      wlb::cuda::FlashBackwardConfig backward;
    };
    std::vector<Run> runs;
    for (wlb::cuda::AttentionKernel kernel : kernels) {
      if (kernel != wlb::cuda::AttentionKernel::kFlash) {
        runs.push_back({kernel, "-", wlb::cuda::BlockOrder::kHeaviestFirst,
                        wlb::cuda::FlashBackwardConfig::kQ64});
        continue;
      }
      for (const auto& [order_name, order] : orders) {
        for (wlb::cuda::FlashBackwardConfig c : backward_configs) {
          runs.push_back({kernel, order_name, order, c});
        }
      }
    }
    for (const auto& [kernel, order_name, order, backward] : runs) {
      wlb::cuda::AttentionOptions options;
      options.kernel = kernel;
      options.block_order = order;
      options.flash_backward = backward;
      const char* kernel_name = wlb::cuda::AttentionKernelName(kernel);
      const char* backward_name = kernel == wlb::cuda::AttentionKernel::kFlash
                                      ? wlb::cuda::FlashBackwardConfigName(backward)
                                      : "-";
      absl::StatusOr<wlb::cuda::VarlenAttention> attn =
          wlb::cuda::VarlenAttention::Create(p, options);
      CHECK_OK(attn.status());
      const double fwd_ms =
          MedianMs([&] { CHECK_OK(attn->Forward(f, nullptr)); }, flags.warmup, flags.iters);
      const double bwd_ms =
          MedianMs([&] { CHECK_OK(attn->Backward(b, nullptr)); }, flags.warmup, flags.iters);
      CHECK_CUDA(cudaDeviceSynchronize());
      const double flops = wlb::cuda::ForwardFlops(p);
      const double fwd_tflops = flops / (fwd_ms * 1e-3) / 1e12;
      const double bwd_tflops = 2.5 * flops / (bwd_ms * 1e-3) / 1e12;
      std::printf("%-8s %-9s %-14s %-10s %6zu %9lld %10.3f %10.1f %10.3f %10.1f\n", config.c_str(),
                  kernel_name, order_name, backward_name, lengths.size(),
                  static_cast<long long>(tq), fwd_ms, fwd_tflops, bwd_ms, bwd_tflops);
      nlohmann::json row = {{"impl", std::string("wlb_") + kernel_name},
                            {"kernel", kernel_name},
                            {"config", config},
                            {"block_order", order_name},
                            {"flash_backward", backward_name},
                            {"docs", lengths.size()},
                            {"tokens", tq},
                            {"heads", h},
                            {"kv_heads", hk},
                            {"head_dim", d},
                            {"fwd_ms", fwd_ms},
                            {"bwd_ms", bwd_ms},
                            {"fwd_tflops", fwd_tflops},
                            {"bwd_tflops", bwd_tflops},
                            {"useful_fwd_flops", flops},
                            {"device", prop.name},
                            {"cuda_driver_version", versions.driver},
                            {"cuda_runtime_version", versions.runtime},
                            {"cudnn_version", versions.cudnn}};
      if (config == "mix") row["mix_source"] = mix_source;
      if (kernel == wlb::cuda::AttentionKernel::kCudnn) {
        // Running totals of this process: the graphs this row's Create built are included.
        const wlb::cuda::CudnnGraphStats g = wlb::cuda::CudnnGraphStatistics();
        row["cudnn_graphs_built"] = g.graphs_built;
        row["cudnn_graph_build_s"] = g.build_seconds;
      }
      if (json_out) json_out << row.dump() << "\n" << std::flush;
    }
    for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                      static_cast<void*>(out), static_cast<void*>(dout), static_cast<void*>(dq),
                      static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(lse)}) {
      CHECK_CUDA(cudaFree(ptr));
    }
  }
  if (std::find(kernels.begin(), kernels.end(), wlb::cuda::AttentionKernel::kCudnn) !=
      kernels.end()) {
    std::printf("%s\n", wlb::cuda::bench::CudnnGraphLine().c_str());
  }
  return 0;
}
