// Device correctness of the flash, cudnn and reference kernels, forward and backward.
//
// Small shapes are checked against the float64 CPU reference; a 16K-token WLB-like mix against
// the reference kernel and cudnn against flash; one 128K document (too long for the reference
// kernel's one thread per row, and for the whole CPU reference) against the float64 CPU
// reference on sampled rows. The flash kernels run in both block orders; the cudnn engine runs
// wherever it is compiled in (CudnnEngineAvailable skips with the reason otherwise). Inputs are
// fresh random values each run (the seed is printed on failure), outputs are poisoned with NaN
// before each run so unwritten elements show, and NaN never passes. Skips with a reason when no
// CUDA device is present. WLB_TEST_KERNELS=flash,reference (or cudnn) limits the engines of the
// float64-reference cases (what gpu_check.sh's sanitizer passes use).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_split.h"
#include "test/test_util.h"
#include "wlb/cuda/cpu_reference.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/cudnn_layout.h"
#include "wlb/cuda/varlen_attention.h"

namespace wlb::cuda {
namespace {

using testing::DocumentsProblem;
using testing::Inputs;
using testing::RandomInputs;
using testing::RandomBf16Values;
using testing::RelativeError;
using testing::SegmentsProblem;

// Relative L2 error bounds. Outputs are bf16 (rounding alone is ~2e-3 relative); gradients also
// go through bf16 P and dS operands.
constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 1e-4;
constexpr double kGradTol = 2e-2;
// A reference tensor whose RMS is below this counts as zero, and the bound becomes absolute
// (error RMS <= tol x floor): a one-token document's dQ and dK are exactly zero in float64 (its
// only key is itself, so dS = P (dP - D) = 0), and a relative error would divide by zero. Inputs
// are O(1), so every nonzero reference here is far above it.
constexpr double kRmsFloor = 1e-3;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  bool ok() const { return n_ == 0 || p_ != nullptr; }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}

std::vector<float> ToFloat(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}

size_t CountNaN(const std::vector<float>& x) {
  size_t n = 0;
  for (float v : x) n += std::isnan(v) ? 1 : 0;
  return n;
}


struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

// Runs forward (and backward on its own out/lse) with `kernel`; every output poisoned first.
void RunOnDevice(const AttentionProblem& p, AttentionKernel kernel, const Inputs& in, bool backward,
                 Results* r, BlockOrder order = BlockOrder::kHeaviestFirst,
                 FlashBackwardConfig flash_backward = FlashBackwardConfig::kQ64) {
  const size_t nq = in.q.size(), nk = in.k.size();
  const size_t nl = size_t(p.total_q()) * p.num_heads;
  DeviceBuffer<__nv_bfloat16> q(nq), k(nk), v(nk), out(nq), dout(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(nl);
  for (bool ok : {q.ok(), k.ok(), v.ok(), out.ok(), dout.ok(), dq.ok(), dk.ok(), dv.ok(),
                  lse.ok()}) {
    ASSERT_TRUE(ok) << "cudaMalloc failed";
  }
  // Segments may all be empty (no query): no copy or poisoning of an empty (null) buffer then.
  auto upload = [](void* dst, const std::vector<float>& x) {
    return x.empty() ? cudaSuccess
                     : cudaMemcpy(dst, ToBf16(x).data(), x.size() * 2, cudaMemcpyHostToDevice);
  };
  auto poison = [](void* dst, size_t bytes) {  // 0xff bytes are NaN both as bf16 and as fp32
    return bytes == 0 ? cudaSuccess : cudaMemset(dst, 0xff, bytes);
  };
  ASSERT_CUDA(upload(q.get(), in.q));
  ASSERT_CUDA(upload(k.get(), in.k));
  ASSERT_CUDA(upload(v.get(), in.v));
  ASSERT_CUDA(upload(dout.get(), in.dout));
  ASSERT_CUDA(poison(out.get(), nq * 2));
  ASSERT_CUDA(poison(lse.get(), nl * 4));
  ASSERT_CUDA(poison(dq.get(), nq * 2));
  ASSERT_CUDA(poison(dk.get(), nk * 2));
  ASSERT_CUDA(poison(dv.get(), nk * 2));

  AttentionOptions options;
  options.kernel = kernel;
  options.backward = backward;
  options.block_order = order;
  options.flash_backward = flash_backward;
  absl::StatusOr<VarlenAttention> attn = VarlenAttention::Create(p, options);
  ASSERT_TRUE(attn.ok()) << attn.status();
  const int64_t tq = p.total_q(), tk = p.total_k(), h = p.num_heads, hk = p.num_kv_heads,
                d = p.head_dim;
  ForwardTensors f;
  f.q = {q.get(), tq, h, d};
  f.k = {k.get(), tk, hk, d};
  f.v = {v.get(), tk, hk, d};
  f.out = {out.get(), tq, h, d};
  f.lse = {lse.get(), h, tq};
  absl::Status s = attn->Forward(f, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_CUDA(cudaDeviceSynchronize());
  auto download = [](std::vector<float>* dst, const void* src, size_t n) {
    std::vector<__nv_bfloat16> host(n);
    const cudaError_t e =
        n == 0 ? cudaSuccess : cudaMemcpy(host.data(), src, n * 2, cudaMemcpyDeviceToHost);
    *dst = ToFloat(host);
    return e;
  };
  ASSERT_CUDA(download(&r->out, out.get(), nq));
  r->lse.resize(nl);
  if (nl > 0) {
    ASSERT_CUDA(cudaMemcpy(r->lse.data(), lse.get(), nl * 4, cudaMemcpyDeviceToHost));
  }
  if (!backward) return;

  BackwardTensors b;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.out = {out.get(), tq, h, d};
  b.dout = {dout.get(), tq, h, d};
  b.lse = {lse.get(), h, tq};
  b.dq = {dq.get(), tq, h, d};
  b.dk = {dk.get(), tk, hk, d};
  b.dv = {dv.get(), tk, hk, d};
  s = attn->Backward(b, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(download(&r->dq, dq.get(), nq));
  ASSERT_CUDA(download(&r->dk, dk.get(), nk));
  ASSERT_CUDA(download(&r->dv, dv.get(), nk));
}

class AttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = CudaDeviceAvailable();
    if (!s.ok()) GTEST_SKIP() << "no usable CUDA device: " << s;
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(CountNaN(got), 0u) << what << ": NaN (unwritten or overflowed) elements";
  const double err = RelativeError(got, want, kRmsFloor);
  EXPECT_LE(err, tol) << what << ": relative error " << err;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(CountNaN(got), 0u) << what << ": NaN (unwritten or overflowed) elements";
  EXPECT_EQ(CountNaN(want), 0u) << what << " (reference kernel): NaN elements";
  const double err = RelativeError(got, want, kRmsFloor);
  EXPECT_LE(err, tol) << what << ": relative error " << err;
}

struct KernelVariant {
  AttentionKernel kernel;
  BlockOrder order;
  const char* name;
  FlashBackwardConfig flash_backward = FlashBackwardConfig::kQ64;
};
constexpr KernelVariant kVariants[] = {
    {AttentionKernel::kFlash, BlockOrder::kHeaviestFirst, "flash kernel, heaviest-first blocks"},
    {AttentionKernel::kFlash, BlockOrder::kHeadMajor, "flash kernel, head-major blocks"},
    {AttentionKernel::kFlash, BlockOrder::kHeadMajor,
     "flash kernel, head-major, backward q64_pass32", FlashBackwardConfig::kQ64Pass32},
    {AttentionKernel::kFlash, BlockOrder::kHeaviestFirst,
     "flash kernel, heaviest-first, backward q32", FlashBackwardConfig::kQ32},
    {AttentionKernel::kFlash, BlockOrder::kHeadMajor, "flash kernel, head-major, backward q64_w8",
     FlashBackwardConfig::kQ64Warps8},
    {AttentionKernel::kReference, BlockOrder::kHeaviestFirst, "reference kernel"},
    {AttentionKernel::kCudnn, BlockOrder::kHeaviestFirst, "cudnn engine"},
};
// The flash backward configurations besides the default kQ64.
constexpr FlashBackwardConfig kOtherBackwardConfigs[] = {
    FlashBackwardConfig::kQ64Pass32, FlashBackwardConfig::kQ32, FlashBackwardConfig::kQ64Warps8};

// Whether `kernel` is part of this build (the cudnn engine may be compiled out).
bool Built(AttentionKernel kernel) {
  return kernel != AttentionKernel::kCudnn || CudnnEngineCompiledIn();
}

// Whether the comma-separated engine list in WLB_TEST_KERNELS (unset or empty: all) names
// `kernel`. gpu_check.sh's racecheck runs wlb's own kernels only (cuDNN's kernels are not ours,
// and racecheck reports their asynchronous-copy pipelines as hazards) and one memcheck pass the
// cudnn engine alone. An unknown name is an error, not an empty selection.
absl::StatusOr<bool> Selected(AttentionKernel kernel) {
  const char* env = std::getenv("WLB_TEST_KERNELS");
  if (env == nullptr || *env == '\0') return true;
  bool selected = false;
  for (absl::string_view name : absl::StrSplit(env, ',')) {
    absl::StatusOr<AttentionKernel> k =
        ParseAttentionKernel(std::string_view(name.data(), name.size()));
    if (!k.ok()) return k.status();
    selected = selected || *k == kernel;
  }
  return selected;
}

// Every kernel variant (or only those of `only`, when given) against the float64 CPU reference.
void CheckAgainstCpu(const AttentionProblem& p, std::mt19937_64& rng,
                     std::initializer_list<AttentionKernel> only = {}) {
  const Inputs in = RandomInputs(p, rng);
  absl::StatusOr<CpuForward> f = CpuAttentionForward(p, in.q, in.k, in.v);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<CpuGradients> g = CpuAttentionBackward(p, in.q, in.k, in.v, in.dout);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const KernelVariant& variant : kVariants) {
    absl::StatusOr<bool> selected = Selected(variant.kernel);
    ASSERT_TRUE(selected.ok()) << "WLB_TEST_KERNELS: " << selected.status();
    if (!Built(variant.kernel) || !*selected) continue;
    if (only.size() > 0 && std::find(only.begin(), only.end(), variant.kernel) == only.end()) {
      continue;
    }
    SCOPED_TRACE(variant.name);
    Results r;
    RunOnDevice(p, variant.kernel, in, /*backward=*/true, &r, variant.order,
                variant.flash_backward);
    if (::testing::Test::HasFatalFailure()) return;
    ExpectClose(r.out, f->out, kOutTol, "out");
    ExpectClose(r.lse, f->lse, kLseTol, "lse");
    ExpectClose(r.dq, g->dq, kGradTol, "dq");
    ExpectClose(r.dk, g->dk, kGradTol, "dk");
    ExpectClose(r.dv, g->dv, kGradTol, "dv");
  }
}

std::string Describe(const AttentionProblem& p) {
  std::string s = "segments (q,k):";
  for (int b = 0; b < p.batch() && b < 12; ++b) {
    s += " (" + std::to_string(p.seqlen_q(b)) + "," + std::to_string(p.seqlen_k(b)) + ")";
  }
  if (p.batch() > 12) s += " ... " + std::to_string(p.batch()) + " segments";
  return s + " heads " + std::to_string(p.num_heads) + "/" + std::to_string(p.num_kv_heads) +
         " dim " + std::to_string(p.head_dim) + (p.causal ? " causal" : " full");
}

TEST_F(AttentionGpu, SmallShapesMatchCpuFloat64Reference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<int32_t> tiny;
  for (int i = 0; i < 300; ++i) tiny.push_back(std::uniform_int_distribution<int>(1, 9)(rng_));
  for (int d : {64, 128}) {
    const std::vector<AttentionProblem> cases = {
        DocumentsProblem({1}, 4, 2, d),
        DocumentsProblem({127}, 4, 2, d),
        DocumentsProblem({128}, 4, 2, d),
        DocumentsProblem({129}, 4, 4, d),
        DocumentsProblem({1, 3, 17, 255, 333, 65}, 4, 1, d),
        DocumentsProblem(tiny, 2, 1, d),
        // CP segments: keys longer than queries; an empty query segment; a long key range.
        SegmentsProblem({{64, 300}, {1, 129}, {0, 50}, {129, 1000}, {200, 200}, {31, 33}}, 4, 2,
                        d),
        SegmentsProblem({{100, 37}, {5, 300}, {129, 129}}, 4, 2, d, /*causal=*/false),
    };
    for (const AttentionProblem& p : cases) {
      SCOPED_TRACE(Describe(p));
      CheckAgainstCpu(p, rng_);
      if (HasFatalFailure()) return;
    }
  }
}

// head_dim 96 (wlb-550m): the cudnn engine and the reference kernel take it, flash does not.
TEST_F(AttentionGpu, HeadDim96MatchesCpuFloat64Reference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<AttentionProblem> cases = {
      DocumentsProblem({1, 3, 17, 255, 333, 65}, 4, 1, 96),
      SegmentsProblem({{64, 300}, {1, 129}, {0, 50}, {129, 1000}, {31, 33}}, 4, 2, 96),
  };
  for (const AttentionProblem& p : cases) {
    SCOPED_TRACE(Describe(p));
    CheckAgainstCpu(p, rng_, {AttentionKernel::kCudnn, AttentionKernel::kReference});
    if (HasFatalFailure()) return;
  }
}

TEST_F(AttentionGpu, RandomSegmentsMatchCpuFloat64Reference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<std::pair<int32_t, int32_t>> segs;
    for (int i = std::uniform_int_distribution<int>(1, 8)(rng_); i > 0; --i) {
      const int32_t lk = std::uniform_int_distribution<int32_t>(1, 400)(rng_);
      segs.push_back({std::uniform_int_distribution<int32_t>(0, lk)(rng_), lk});
    }
    const AttentionProblem p = SegmentsProblem(segs, 4, 2, trial % 2 ? 128 : 64);
    SCOPED_TRACE(Describe(p));
    CheckAgainstCpu(p, rng_);
    if (HasFatalFailure()) return;
  }
}

// `kernel` against `baseline` where the CPU reference would be too slow.
void CheckAgainstKernel(const AttentionProblem& p, std::mt19937_64& rng, AttentionKernel kernel,
                        AttentionKernel baseline) {
  const Inputs in = RandomInputs(p, rng);
  Results got, ref;
  RunOnDevice(p, kernel, in, true, &got);
  if (::testing::Test::HasFatalFailure()) return;
  RunOnDevice(p, baseline, in, true, &ref);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectClose(got.out, ref.out, kOutTol, "out");
  ExpectClose(got.lse, ref.lse, kLseTol, "lse");
  ExpectClose(got.dq, ref.dq, kGradTol, "dq");
  ExpectClose(got.dk, ref.dk, kGradTol, "dk");
  ExpectClose(got.dv, ref.dv, kGradTol, "dv");
}

// `rows` rows of `x`, a (rows, row_size) array laid out row-major.
template <typename T>
std::vector<T> Rows(const std::vector<T>& x, const std::vector<int64_t>& rows, size_t row_size) {
  std::vector<T> y;
  for (int64_t r : rows) {
    y.insert(y.end(), x.begin() + r * row_size, x.begin() + (r + 1) * row_size);
  }
  return y;
}

// Tile edges, both ends and random rows of [0, total).
std::vector<int64_t> SampleRows(int64_t total, std::initializer_list<int64_t> edges, int random,
                                std::mt19937_64& rng) {
  std::vector<int64_t> rows;
  for (int64_t r : edges) {
    if (r >= 0 && r < total) rows.push_back(r);
  }
  rows.push_back(total - 1);
  for (int i = 0; i < random; ++i) {
    rows.push_back(std::uniform_int_distribution<int64_t>(0, total - 1)(rng));
  }
  return rows;
}

// `r` (a kernel's results on `in`) against the float64 CPU reference on sampled rows. Forward
// rows are exact float64; backward rows take the kernel's out and LSE as given, as the backward
// kernels do (the forward rows check those).
void CheckSampledRows(const AttentionProblem& p, const Inputs& in, const Results& r,
                      std::mt19937_64& rng) {
  const int64_t n = p.total_q();
  const std::vector<int64_t> qrows =
      SampleRows(n, {0, 1, 127, 128, 129, 4095, 65535, 65536}, 24, rng);
  const std::vector<int64_t> krows =
      SampleRows(n, {0, 1, 31, 32, 63, 64, 65, 65536, n - 64, n - 63}, 24, rng);
  absl::StatusOr<CpuRows> fr = CpuAttentionForwardRows(p, in.q, in.k, in.v, qrows);
  ASSERT_TRUE(fr.ok()) << fr.status();
  absl::StatusOr<CpuRows> br =
      CpuAttentionBackwardRows(p, in.q, in.k, in.v, r.out, in.dout, r.lse, qrows, krows);
  ASSERT_TRUE(br.ok()) << br.status();
  const size_t hd = size_t(p.num_heads) * p.head_dim, kvd = size_t(p.num_kv_heads) * p.head_dim;
  std::vector<float> lse_rows;  // (rows, heads), as CpuRows lays it out
  for (int64_t row : qrows) {
    for (int h = 0; h < p.num_heads; ++h) lse_rows.push_back(r.lse[h * n + row]);
  }
  ExpectClose(Rows(r.out, qrows, hd), fr->out, kOutTol, "out (sampled rows)");
  ExpectClose(lse_rows, fr->lse, kLseTol, "lse (sampled rows)");
  ExpectClose(Rows(r.dq, qrows, hd), br->dq, kGradTol, "dq (sampled rows)");
  ExpectClose(Rows(r.dk, krows, kvd), br->dk, kGradTol, "dk (sampled rows)");
  ExpectClose(Rows(r.dv, krows, kvd), br->dv, kGradTol, "dv (sampled rows)");
}

// One 128K document, flash in both block orders, against the float64 CPU reference on sampled
// rows (the whole reference is ~10^12 multiply-adds, and the reference kernel's thread per row
// keeps its accumulators in local memory: hours at this length). The two orders run the same
// blocks, so out, LSE, dK and dV agree bit for bit (dQ sums with atomics).
TEST_F(AttentionGpu, OneDocumentOf128KMatchesCpuReferenceOnSampledRows) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const AttentionProblem p = DocumentsProblem({131072}, 2, 1, 128);
  SCOPED_TRACE(Describe(p));
  const Inputs in = RandomInputs(p, rng_);
  Results heaviest, head_major;
  RunOnDevice(p, AttentionKernel::kFlash, in, true, &heaviest, BlockOrder::kHeaviestFirst);
  if (HasFatalFailure()) return;
  RunOnDevice(p, AttentionKernel::kFlash, in, true, &head_major, BlockOrder::kHeadMajor);
  if (HasFatalFailure()) return;
  EXPECT_EQ(std::memcmp(heaviest.out.data(), head_major.out.data(), heaviest.out.size() * 4), 0);
  EXPECT_EQ(std::memcmp(heaviest.lse.data(), head_major.lse.data(), heaviest.lse.size() * 4), 0);
  EXPECT_EQ(std::memcmp(heaviest.dk.data(), head_major.dk.data(), heaviest.dk.size() * 4), 0);
  EXPECT_EQ(std::memcmp(heaviest.dv.data(), head_major.dv.data(), heaviest.dv.size() * 4), 0);
  EXPECT_LE(RelativeError(heaviest.dq, head_major.dq), 1e-3);

  CheckSampledRows(p, in, heaviest, rng_);
}

// The cudnn engine on the same 128K document, against the float64 rows and against flash.
TEST_F(AttentionGpu, CudnnOneDocumentOf128KMatchesCpuReferenceAndFlash) {
  if (!CudnnEngineCompiledIn()) GTEST_SKIP() << CudnnRuntimeVersion().status();
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const AttentionProblem p = DocumentsProblem({131072}, 2, 1, 128);
  const Inputs in = RandomInputs(p, rng_);
  Results cudnn, flash;
  RunOnDevice(p, AttentionKernel::kCudnn, in, true, &cudnn);
  if (HasFatalFailure()) return;
  CheckSampledRows(p, in, cudnn, rng_);
  RunOnDevice(p, AttentionKernel::kFlash, in, true, &flash);
  if (HasFatalFailure()) return;
  ExpectClose(cudnn.out, flash.out, kOutTol, "out vs flash");
  ExpectClose(cudnn.lse, flash.lse, kLseTol, "lse vs flash");
  ExpectClose(cudnn.dq, flash.dq, kGradTol, "dq vs flash");
  ExpectClose(cudnn.dk, flash.dk, kGradTol, "dk vs flash");
  ExpectClose(cudnn.dv, flash.dv, kGradTol, "dv vs flash");
}

TEST_F(AttentionGpu, WlbLikeMixOf16KMatchesReferenceKernel) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Mostly short documents with one long one, as in the WLB-LLM length distribution.
  std::vector<int32_t> lengths = {9000};
  int32_t total = 9000;
  while (total < 16384) {
    const int32_t l = std::min(16384 - total, std::uniform_int_distribution<int32_t>(1, 2000)(rng_));
    lengths.push_back(l);
    total += l;
  }
  std::shuffle(lengths.begin(), lengths.end(), rng_);
  for (int d : {64, 128}) {
    const AttentionProblem p = DocumentsProblem(lengths, 4, 2, d);
    SCOPED_TRACE(Describe(p));
    CheckAgainstKernel(p, rng_, AttentionKernel::kFlash, AttentionKernel::kReference);
    if (HasFatalFailure()) return;
    if (CudnnEngineCompiledIn()) {
      SCOPED_TRACE("cudnn vs flash");
      CheckAgainstKernel(p, rng_, AttentionKernel::kCudnn, AttentionKernel::kFlash);
      if (HasFatalFailure()) return;
    }
  }
}

// The engine is compiled in, the loaded cuDNN is new enough, and a plan builds on this device.
TEST_F(AttentionGpu, CudnnEngineAvailable) {
  if (!CudnnEngineCompiledIn()) GTEST_SKIP() << CudnnRuntimeVersion().status();
  absl::StatusOr<int64_t> version = CudnnRuntimeVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  std::printf("cuDNN runtime version %lld\n", static_cast<long long>(*version));
  EXPECT_GE(*version, kMinCudnnVersion);
  absl::StatusOr<VarlenAttention> attn = VarlenAttention::Create(
      DocumentsProblem({300, 17}, 8, 2, 128), {.kernel = AttentionKernel::kCudnn});
  EXPECT_TRUE(attn.ok()) << attn.status();
}

TEST_F(AttentionGpu, FlashIsDeterministic) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const AttentionProblem p = SegmentsProblem({{700, 1500}, {3000, 3000}, {5, 9}}, 8, 2, 128);
  const Inputs in = RandomInputs(p, rng_);
  for (FlashBackwardConfig config : {FlashBackwardConfig::kQ64, FlashBackwardConfig::kQ64Pass32,
                                     FlashBackwardConfig::kQ32, FlashBackwardConfig::kQ64Warps8}) {
    SCOPED_TRACE(FlashBackwardConfigName(config));
    Results a, b;
    RunOnDevice(p, AttentionKernel::kFlash, in, true, &a, BlockOrder::kHeadMajor, config);
    RunOnDevice(p, AttentionKernel::kFlash, in, true, &b, BlockOrder::kHeadMajor, config);
    if (HasFatalFailure()) return;
    // Forward, dK and dV have a fixed summation order; dQ sums with atomics.
    EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0);
    EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0);
    EXPECT_EQ(std::memcmp(a.dk.data(), b.dk.data(), a.dk.size() * 4), 0);
    EXPECT_EQ(std::memcmp(a.dv.data(), b.dv.data(), a.dv.size() * 4), 0);
    EXPECT_LE(RelativeError(a.dq, b.dq), 1e-3);
  }
}

// Every backward configuration adds the same dK and dV products in the same order (16-query
// k-steps, tiles in order; the tiles one configuration skips are fully masked, adding zeros), so
// dK and dV equal the default's value for value (== : a zero's sign may differ); dQ up to its
// atomics' order. A WLB-like mix (long and short documents, GQA) and CP segments, both head dims.
TEST_F(AttentionGpu, FlashBackwardConfigsAgreeWithDefault) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<int32_t> lengths = {3000};
  for (int32_t total = 3000; total < 8192;) {
    const int32_t l = std::min(8192 - total, std::uniform_int_distribution<int32_t>(1, 700)(rng_));
    lengths.push_back(l);
    total += l;
  }
  std::shuffle(lengths.begin(), lengths.end(), rng_);
  for (int d : {64, 128}) {
    for (const AttentionProblem& p :
         {DocumentsProblem(lengths, 4, 2, d),
          SegmentsProblem({{64, 300}, {33, 129}, {0, 50}, {129, 1000}, {97, 97}}, 4, 1, d)}) {
      SCOPED_TRACE(Describe(p));
      const Inputs in = RandomInputs(p, rng_);
      Results base;
      RunOnDevice(p, AttentionKernel::kFlash, in, true, &base, BlockOrder::kHeadMajor);
      if (HasFatalFailure()) return;
      for (FlashBackwardConfig config : kOtherBackwardConfigs) {
        SCOPED_TRACE(FlashBackwardConfigName(config));
        Results r;
        RunOnDevice(p, AttentionKernel::kFlash, in, true, &r, BlockOrder::kHeadMajor, config);
        if (HasFatalFailure()) return;
        EXPECT_EQ(std::memcmp(r.out.data(), base.out.data(), r.out.size() * 4), 0) << "forward";
        EXPECT_EQ(CountNaN(r.dk) + CountNaN(r.dv) + CountNaN(r.dq), 0u);
        EXPECT_TRUE(r.dk == base.dk) << "dk differs from q64's";
        EXPECT_TRUE(r.dv == base.dv) << "dv differs from q64's";
        ExpectClose(r.dq, base.dq, 1e-3, "dq vs q64");
      }
    }
  }
}

TEST_F(AttentionGpu, BadTensorsAreRejectedBeforeLaunch) {
  const AttentionProblem p = DocumentsProblem({100}, 4, 2, 64);
  DeviceBuffer<__nv_bfloat16> q(100 * 4 * 64), kv(100 * 2 * 64), out(100 * 4 * 64);
  DeviceBuffer<float> lse(4 * 100);
  ASSERT_TRUE(q.ok() && kv.ok() && out.ok() && lse.ok());
  ASSERT_CUDA(cudaMemset(out.get(), 0xff, out.size() * 2));
  absl::StatusOr<VarlenAttention> attn = VarlenAttention::Create(p);
  ASSERT_TRUE(attn.ok()) << attn.status();
  ForwardTensors f;
  f.q = {q.get(), 100, 4, 64};
  f.k = {kv.get(), 100, 2, 64};
  f.v = {kv.get(), 100, 2, 64};
  f.out = {out.get(), 100, 4, 64};
  f.lse = {lse.get(), 4, 99};  // wrong
  const absl::Status s = attn->Forward(f, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> host(out.size());
  ASSERT_CUDA(cudaMemcpy(host.data(), out.get(), host.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(CountNaN(ToFloat(host)), host.size()) << "out was written despite the error";
}

}  // namespace
}  // namespace wlb::cuda
