// Helpers shared by the CP profiler, benchmark and example: --key=value flags, device buffers
// of seeded bf16 values, the device's name, the cudnn engine's graph-building cost, the planner
// options that rank CP plans by kernel time alone.
#ifndef WLB_CUDA_BENCH_CP_BENCH_UTIL_H_
#define WLB_CUDA_BENCH_CP_BENCH_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wlb/cuda/attention_problem.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/device_fill.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/shard/shard_types.hpp"

namespace wlb::cuda::bench {

// Planner options under which adaptive ranks its candidates by kernel time alone (a link so fast
// that the exchange vanishes): what the CP benches compare against, because they measure each
// rank's kernels in isolation, without the exchange.
inline CpPlanOptions KernelTimeOnly() {
  return {.comm = {.link_gbps = 1e6, .latency_us = 0.0}};
}

// --key=value flags; Get* report a bad or unknown flag and return false.
class Flags {
 public:
  Flags(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      const size_t eq = a.find('=');
      if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
        bad_.push_back(a);
        continue;
      }
      values_[a.substr(2, eq - 2)] = a.substr(eq + 1);
    }
    std::vector<std::string> args(argv, argv + argc);
    command_ = absl::StrJoin(args, " ");
  }
  bool Int(const char* name, int64_t* v) { return Parse(name, [&](const std::string& s) {
    return absl::SimpleAtoi(s, v); }); }
  bool Str(const char* name, std::string* v) {
    return Parse(name, [&](const std::string& s) { *v = s; return true; });
  }
  // An attention engine by name (flash, reference, cudnn); cudnn only when compiled in.
  bool Kernel(const char* name, AttentionKernel* v) {
    return Parse(name, [&](const std::string& s) {
      absl::StatusOr<AttentionKernel> k = ParseAttentionKernel(s);
      if (!k.ok()) {
        std::fprintf(stderr, "%s\n", k.status().ToString().c_str());
        return false;
      }
      if (*k == AttentionKernel::kCudnn && !CudnnEngineCompiledIn()) {
        std::fprintf(stderr, "%s\n", CudnnRuntimeVersion().status().ToString().c_str());
        return false;
      }
      *v = *k;
      return true;
    });
  }
  // True when every flag given was read; prints the strays.
  bool AllUsed() const {
    bool ok = bad_.empty();
    for (const std::string& b : bad_) std::fprintf(stderr, "bad argument '%s'\n", b.c_str());
    for (const auto& [k, v] : values_) {
      if (!used_.count(k)) {
        std::fprintf(stderr, "unknown flag --%s\n", k.c_str());
        ok = false;
      }
    }
    return ok;
  }
  const std::string& command() const { return command_; }

 private:
  template <typename F>
  bool Parse(const char* name, F f) {
    used_[name] = true;
    auto it = values_.find(name);
    if (it == values_.end()) return true;
    if (f(it->second)) return true;
    std::fprintf(stderr, "bad value for --%s: '%s'\n", name, it->second.c_str());
    return false;
  }
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
  std::vector<std::string> bad_;
  std::string command_;
};

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBf16 = std::unique_ptr<__nv_bfloat16, CudaFree>;

// `n` seeded bf16 values in [-scale, scale] on the current device; null on failure (printed).
// Filled on the device (a host fill and upload took seconds per 128K-token buffer), then the
// device is synchronised: callers use the buffer on other streams (the CP ranks') right away.
inline DeviceBf16 RandomDevice(size_t n, uint64_t seed, float scale) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(n, 1) * 2) != cudaSuccess) {
    std::fprintf(stderr, "cannot allocate %zu bf16 values\n", n);
    return nullptr;
  }
  DeviceBf16 d(static_cast<__nv_bfloat16*>(p));
  absl::Status s = FillUniformBf16(d.get(), static_cast<int64_t>(n), seed, scale);
  if (s.ok()) {
    s = CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize()", __FILE__, __LINE__);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "cannot fill %zu bf16 values: %s\n", n, s.ToString().c_str());
    return nullptr;
  }
  return d;
}

inline DeviceBf16 EmptyDevice(size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(n, 1) * 2) != cudaSuccess) return nullptr;
  return DeviceBf16(static_cast<__nv_bfloat16*>(p));
}

// Prints why no GPU can be used and returns false, so mains can `return 3`.
inline bool RequireDevice(const char* program) {
  absl::Status s = CudaDeviceAvailable();
  if (s.ok()) return true;
  std::fprintf(stderr, "%s needs a CUDA device: %s\n", program, s.ToString().c_str());
  return false;
}

// "cudnn graphs built: N in S s": the cudnn engine's one-time graph-building cost in this
// process, which per-call times leave out; mains print it at the end when the engine ran.
inline std::string CudnnGraphLine() {
  const CudnnGraphStats g = CudnnGraphStatistics();
  return absl::StrFormat("cudnn graphs built: %d in %.3f s", g.graphs_built, g.build_seconds);
}

inline std::string DeviceName() {
  cudaDeviceProp p{};
  int d = 0;
  cudaGetDevice(&d);
  return cudaGetDeviceProperties(&p, d) == cudaSuccess ? p.name : "unknown device";
}

}  // namespace wlb::cuda::bench

#endif  // WLB_CUDA_BENCH_CP_BENCH_UTIL_H_
