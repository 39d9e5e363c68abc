// CP execution on the GPU (label gpu): for WLB-LLM-like micro-batches of 16K..128K tokens,
// C in {2, 4, 8} and every sharding strategy, CP attention (LocalCommunicator, flash kernel)
// equals single-device flash attention over the whole packed micro-batch, forward and backward;
// the same on the cudnn engine (16K and 128K, where it is compiled in), whose single-device
// result also matches flash's;
// plus the collectives against host sums and the NCCL communicator over every visible GPU.
// Skips with the reason when no CUDA device is present.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "test/test_util.h"
#include "wlb/cuda/communicator.h"
#include "wlb/cuda/cp_maps.h"
#include "wlb/cuda/cp_packed_run.h"
#include "wlb/cuda/cp_workload.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/varlen_attention.h"
#include "wlb/shard/shard_plan.hpp"

namespace wlb::cuda {
namespace {

// CP vs single-device, both bf16 flash. Relative L2 over the tensor and the largest element
// error over the largest reference magnitude. The public artifact allowed rtol 1.6e-2 (out) and
// 0.1 (gradients); CP only reorders sums and rounds per-segment dK/dV partials to bf16 once more.
constexpr double kOutRelL2 = 4e-3, kOutMax = 8e-3;
constexpr double kGradRelL2 = 1e-2, kGradMax = 2e-2;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct Dev {
  explicit Dev(size_t n) : n(n) { ok = cudaMalloc(&p, std::max<size_t>(n, 1) * 2) == cudaSuccess; }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  __nv_bfloat16* get() const { return static_cast<__nv_bfloat16*>(p); }
  void* p = nullptr;
  size_t n;
  bool ok;
};

std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}

std::vector<float> Download(const Dev& d) {
  std::vector<__nv_bfloat16> h(d.n);
  cudaMemcpy(h.data(), d.p, d.n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> f(d.n);
  for (size_t i = 0; i < d.n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

struct Errors {
  double rel_l2 = 0, max_rel = 0;
  size_t nan = 0;
};

Errors Compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Errors e;
  double num = 0, den = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) ++e.nan;
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
    max_err = std::max(max_err, std::abs(d));
    max_ref = std::max(max_ref, std::abs(double(ref[i])));
  }
  e.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  e.max_rel = max_err / std::max(max_ref, 1e-300);
  return e;
}

class CpGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << "no CUDA device: " << s;
  }
};

// Packed inputs, the single-device result, and a checker for a CP run over the same tensors.
struct Fixture {
  MicroBatch mb;
  CpAttentionConfig config;
  size_t nq = 0, nk = 0;
  std::unique_ptr<Dev> q, k, v, dout, out, dq, dk, dv;
  std::vector<float> ref_out, ref_dq, ref_dk, ref_dv;
};

void MakeFixture(int64_t tokens, int head_dim, uint64_t seed, Fixture& f,
                 AttentionKernel kernel = AttentionKernel::kFlash) {
  f.mb = WlbLikeMicroBatch(tokens, seed);
  // GQA groups of 2.
  f.config = {.num_heads = 4, .num_kv_heads = 2, .head_dim = head_dim, .kernel = kernel};
  f.nq = size_t(tokens) * 4 * head_dim;
  f.nk = size_t(tokens) * 2 * head_dim;
  std::mt19937_64 rng(seed);
  for (auto [dev, n, scale] : {std::tuple{&f.q, f.nq, 2.0f}, std::tuple{&f.k, f.nk, 2.0f},
                               std::tuple{&f.v, f.nk, 1.0f}, std::tuple{&f.dout, f.nq, 1.0f}}) {
    *dev = std::make_unique<Dev>(n);
    ASSERT_TRUE((*dev)->ok);
    const std::vector<__nv_bfloat16> h = ToBf16(testing::RandomBf16Values(n, rng, scale));
    ASSERT_CUDA(cudaMemcpy((*dev)->p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  for (auto [dev, n] : {std::pair{&f.out, f.nq}, std::pair{&f.dq, f.nq}, std::pair{&f.dk, f.nk},
                        std::pair{&f.dv, f.nk}}) {
    *dev = std::make_unique<Dev>(n);
    ASSERT_TRUE((*dev)->ok);
  }
  absl::StatusOr<AttentionProblem> whole = WholeBatchProblem(f.mb, f.config);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<VarlenAttention> attn = VarlenAttention::Create(*whole, {.kernel = kernel});
  ASSERT_TRUE(attn.ok()) << attn.status();
  Dev lse_raw(size_t(4) * tokens * 2);  // fp32 (heads, tokens): 2 bf16-sized slots per float
  const int64_t h = 4, kh = 2, d = head_dim;
  ForwardTensors ft{{f.q->get(), tokens, h, d}, {f.k->get(), tokens, kh, d},
                    {f.v->get(), tokens, kh, d}, {f.out->get(), tokens, h, d},
                    {static_cast<float*>(lse_raw.p), h, tokens}};
  ASSERT_TRUE(attn->Forward(ft, nullptr).ok());
  BackwardTensors bt{{f.q->get(), tokens, h, d},     {f.k->get(), tokens, kh, d},
                     {f.v->get(), tokens, kh, d},    {f.out->get(), tokens, h, d},
                     {f.dout->get(), tokens, h, d},  {static_cast<float*>(lse_raw.p), h, tokens},
                     {f.dq->get(), tokens, h, d},    {f.dk->get(), tokens, kh, d},
                     {f.dv->get(), tokens, kh, d}};
  ASSERT_TRUE(attn->Backward(bt, nullptr).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  f.ref_out = Download(*f.out);
  f.ref_dq = Download(*f.dq);
  f.ref_dk = Download(*f.dk);
  f.ref_dv = Download(*f.dv);
}

// Runs `plan` through CP on `comm` (by `exchange`, or the rule's choice, `schedule`, and K and V
// in one collective or one each) and checks it against the fixture's single-device result, and
// the bytes the communicator moved against the planner's rows: forward K and V (bf16) one way,
// backward dK and dV (fp32) the other. The defaults are the paths awaiting their first GPU run,
// not the executor's defaults (CpExecutorOptions: what ran), which the whole-schedule cases run.
void CheckCp(Fixture& f, const ShardPlan& plan, Communicator& comm,
             std::optional<ExchangeKind> exchange = std::nullopt,
             CpSchedule schedule = CpSchedule::kSplit, bool kv_one_collective = true) {
  for (Dev* d : {f.out.get(), f.dq.get(), f.dk.get(), f.dv.get()}) {
    ASSERT_CUDA(cudaMemset(d->p, 0xff, d->n * 2));  // NaN: unwritten rows show
  }
  absl::StatusOr<std::unique_ptr<CpPackedRunner>> run = CpPackedRunner::Create(
      plan, f.config, comm,
      {.exchange = exchange, .schedule = schedule, .kv_one_collective = kv_one_collective});
  ASSERT_TRUE(run.ok()) << run.status();
  const ExchangeKind ran = (*run)->executor().maps().exchange;
  comm.ResetTraffic();
  PackedCpTensors t{f.q->get(), f.k->get(), f.v->get(), f.dout->get(),
                    f.out->get(), f.dq->get(), f.dk->get(), f.dv->get()};
  ASSERT_TRUE((*run)->Run(t, /*backward=*/true).ok());
  const std::string where = absl::StrFormat(
      "%d tokens, %d documents, C %d, %s, %s, %s, K/V %s", plan.tokens, f.mb.documents.size(),
      plan.cp_size, ShardStrategyName(plan.strategy), ExchangeKindName(ran),
      CpScheduleName(schedule), kv_one_collective ? "in one collective" : "one collective each");
  for (auto [dev, ref, rel, mx, name] :
       {std::tuple{f.out.get(), &f.ref_out, kOutRelL2, kOutMax, "out"},
        std::tuple{f.dq.get(), &f.ref_dq, kGradRelL2, kGradMax, "dq"},
        std::tuple{f.dk.get(), &f.ref_dk, kGradRelL2, kGradMax, "dk"},
        std::tuple{f.dv.get(), &f.ref_dv, kGradRelL2, kGradMax, "dv"}}) {
    const Errors e = Compare(Download(*dev), *ref);
    EXPECT_EQ(e.nan, 0u) << name << ", " << where;
    EXPECT_LE(e.rel_l2, rel) << name << ", " << where;
    EXPECT_LE(e.max_rel, mx) << name << ", " << where;
    std::printf("  %-4s rel L2 %.2e, max %.2e  (%s)\n", name, e.rel_l2, e.max_rel, where.c_str());
  }
  const std::vector<RankExchange> rows = ExchangedKvRows(plan);
  const int64_t row_bytes = CpKvRowBytes(f.config);  // K and V, bf16
  for (int r = 0; r < plan.cp_size; ++r) {
    const bool exact = ran == ExchangeKind::kRowExact;
    const int64_t all = int64_t{plan.cp_size - 1} * plan.rank_capacity;
    const int64_t out = exact ? rows[r].send_rows : all, in = exact ? rows[r].recv_rows : all;
    const CommTraffic got = comm.traffic(r);
    EXPECT_EQ(got.sent_bytes, out * row_bytes + in * 2 * row_bytes)
        << "rank " << r << ", " << where;
    EXPECT_EQ(got.received_bytes, in * row_bytes + out * 2 * row_bytes)
        << "rank " << r << ", " << where;
    // K/V forward and dK/dV backward: one collective each way, or one per tensor.
    EXPECT_EQ(got.collectives, kv_one_collective ? 2 : 4) << "rank " << r << ", " << where;
  }
}

// Every strategy at C = 2, 4, 8 on `f`'s micro-batch against its single-device result, split
// schedule: by both exchanges when `both_exchanges` (and then, with `whole_too`, the whole
// schedule by both as well), else by the exchange the rule picks.
void CheckEveryStrategy(Fixture& f, bool both_exchanges, bool whole_too = false) {
  for (int cp : {2, 4, 8}) {
    absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(cp);
    ASSERT_TRUE(comm.ok()) << comm.status();
    for (ShardStrategy s : ShardStrategy::All()) {
      absl::StatusOr<ShardPlan> plan = PlanShards(f.mb, cp, s, KernelModel::Default());
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (!both_exchanges) {
        CheckCp(f, *plan, **comm);
        continue;
      }
      for (ExchangeKind x : {ExchangeKind::kRowExact, ExchangeKind::kAllGather}) {
        CheckCp(f, *plan, **comm, x);
        if (whole_too) CheckCp(f, *plan, **comm, x, CpSchedule::kWhole, false);
      }
    }
  }
}

TEST_F(CpGpuTest, EveryStrategyMatchesSingleDevice) {
  uint64_t seed = 11;
  for (int64_t tokens : {16384, 32768, 65536, 131072}) {
    Fixture f;
    MakeFixture(tokens, 128, seed++, f);
    if (HasFatalFailure()) return;
    CheckEveryStrategy(f, /*both_exchanges=*/tokens <= 32768, /*whole_too=*/tokens <= 16384);
  }
}

// The cudnn engine: CP on cudnn vs single-device cudnn, and single-device cudnn vs flash.
TEST_F(CpGpuTest, CudnnEveryStrategyMatchesSingleDevice) {
  if (!CudnnEngineCompiledIn()) GTEST_SKIP() << CudnnRuntimeVersion().status();
  uint64_t seed = 21;
  for (int64_t tokens : {16384, 131072}) {
    Fixture flash, f;
    MakeFixture(tokens, 128, seed, flash);
    if (HasFatalFailure()) return;
    MakeFixture(tokens, 128, seed++, f, AttentionKernel::kCudnn);
    if (HasFatalFailure()) return;
    for (auto [got, ref, rel, name] : {std::tuple{&f.ref_out, &flash.ref_out, kOutRelL2, "out"},
                                       std::tuple{&f.ref_dq, &flash.ref_dq, kGradRelL2, "dq"},
                                       std::tuple{&f.ref_dk, &flash.ref_dk, kGradRelL2, "dk"},
                                       std::tuple{&f.ref_dv, &flash.ref_dv, kGradRelL2, "dv"}}) {
      const Errors e = Compare(*got, *ref);
      EXPECT_EQ(e.nan, 0u) << name << " cudnn vs flash, " << tokens << " tokens";
      EXPECT_LE(e.rel_l2, rel) << name << " cudnn vs flash, " << tokens << " tokens";
    }
    CheckEveryStrategy(f, /*both_exchanges=*/tokens <= 16384);
  }
}

TEST_F(CpGpuTest, HeadDim64AndOddTokenCount) {
  Fixture f;
  MakeFixture(16383, 64, 5, f);  // per-sequence pads, per-document shards differ by one
  if (HasFatalFailure()) return;
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(4);
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (ShardStrategy s : {ShardStrategy("per-seq"), ShardStrategy("per-doc")}) {
    CheckCp(f, *PlanShards(f.mb, 4, s, KernelModel::Default()), **comm);
  }
}

// Rows whose byte size is not a multiple of 16 (reference kernel, head_dim 18: K/V rows of 72
// bytes) under both schedules and both exchanges: no buffer the kernels read may start inside a
// row block that breaks their 16-byte alignment.
TEST_F(CpGpuTest, ReferenceKernelUnalignedRows) {
  Fixture f;
  MakeFixture(2048, 18, 9, f, AttentionKernel::kReference);
  if (HasFatalFailure()) return;
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(4);
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (ShardStrategy s : {ShardStrategy("per-seq"), ShardStrategy("per-doc")}) {
    const ShardPlan plan = *PlanShards(f.mb, 4, s, KernelModel::Default());
    for (ExchangeKind x : {ExchangeKind::kRowExact, ExchangeKind::kAllGather}) {
      for (CpSchedule schedule : {CpSchedule::kSplit, CpSchedule::kWhole}) {
        CheckCp(f, plan, **comm, x, schedule, schedule == CpSchedule::kSplit);
      }
    }
  }
}

TEST_F(CpGpuTest, NcclOverEveryVisibleGpu) {
#if WLB_CUDA_HAVE_NCCL
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  std::vector<int> devices(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) devices[i] = i;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::CreateAll(devices);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Fixture f;
  MakeFixture(16384, 128, 3, f);
  if (HasFatalFailure()) return;
  // Packed tensors live on device 0; with several GPUs the runner needs peer access.
  for (int i = 1; i < count; ++i) {
    cudaSetDevice(i);
    cudaDeviceEnablePeerAccess(0, 0);
  }
  cudaSetDevice(0);
  CheckCp(f, *PlanShards(f.mb, count, ShardStrategy("adaptive"), KernelModel::Default()), **comm);
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

TEST_F(CpGpuTest, LocalCollectivesMatchHostSums) {
  const int ranks = 3;
  const size_t count = 1000;
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(ranks);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::mt19937_64 rng(1);
  std::vector<std::vector<float>> host(ranks);
  std::vector<std::unique_ptr<Dev>> send, recv;  // fp32 stored in 2x bf16-sized slots
  std::vector<const void*> sp;
  std::vector<void*> rp;
  for (int r = 0; r < ranks; ++r) {
    host[r] = testing::RandomBf16Values(count * ranks, rng);
    send.push_back(std::make_unique<Dev>(count * ranks * 2));
    recv.push_back(std::make_unique<Dev>(count * ranks * 2));
    ASSERT_CUDA(cudaMemcpy(send[r]->p, host[r].data(), count * ranks * 4, cudaMemcpyHostToDevice));
    sp.push_back(send[r]->p);
    rp.push_back(recv[r]->p);
  }
  // A pageable cudaMemcpy may return before its DMA lands, and the legacy stream does not order
  // the communicator's non-blocking streams: wait for the uploads before any collective.
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE((*comm)->ReduceScatterSum(sp, rp, count, CommDataType::kFloat32).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> got(count);
    ASSERT_CUDA(cudaMemcpy(got.data(), recv[r]->p, count * 4, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < count; ++e) {
      const float want = (host[0][r * count + e] + host[1][r * count + e]) + host[2][r * count + e];
      ASSERT_EQ(got[e], want) << "rank " << r << " element " << e;
    }
  }
  ASSERT_TRUE((*comm)->AllGather(sp, rp, count, CommDataType::kFloat32).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> got(count * ranks);
    ASSERT_CUDA(cudaMemcpy(got.data(), recv[r]->p, got.size() * 4, cudaMemcpyDeviceToHost));
    for (int src = 0; src < ranks; ++src) {
      ASSERT_TRUE(std::equal(got.begin() + src * count, got.begin() + (src + 1) * count,
                             host[src].begin()))
          << "rank " << r << " block " << src;
    }
  }
}

TEST_F(CpGpuTest, LocalAllToAllVMovesEveryBlock) {
  const int ranks = 4;
  absl::StatusOr<std::unique_ptr<LocalCommunicator>> comm = LocalCommunicator::Create(ranks);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::mt19937_64 rng(2);
  // counts[s][d]: elements s sends to d, zeros included (and s == d, a copy to itself).
  std::vector<std::vector<int64_t>> send_counts(ranks, std::vector<int64_t>(ranks));
  std::vector<std::vector<int64_t>> recv_counts(ranks, std::vector<int64_t>(ranks));
  for (int s = 0; s < ranks; ++s) {
    for (int d = 0; d < ranks; ++d) {
      send_counts[s][d] = recv_counts[d][s] = (s + d) % 3 == 0 ? 0 : int64_t(rng() % 700);
    }
  }
  std::vector<std::vector<float>> host(ranks);
  std::vector<std::unique_ptr<Dev>> send, recv;
  std::vector<const void*> sp;
  std::vector<void*> rp;
  for (int r = 0; r < ranks; ++r) {
    int64_t out = 0, in = 0;
    for (int p = 0; p < ranks; ++p) out += send_counts[r][p], in += recv_counts[r][p];
    host[r] = testing::RandomBf16Values(size_t(out), rng);
    send.push_back(std::make_unique<Dev>(size_t(out) * 2 + 2));  // fp32 in bf16-sized slots
    recv.push_back(std::make_unique<Dev>(size_t(in) * 2 + 2));
    ASSERT_CUDA(cudaMemcpy(send[r]->p, host[r].data(), size_t(out) * 4, cudaMemcpyHostToDevice));
    sp.push_back(send[r]->p);
    rp.push_back(recv[r]->p);
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  (*comm)->ResetTraffic();
  ASSERT_TRUE((*comm)->AllToAllV(sp, send_counts, rp, recv_counts, CommDataType::kFloat32).ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  for (int d = 0; d < ranks; ++d) {
    int64_t at = 0, in_others = 0;
    std::vector<float> got(
        size_t(std::accumulate(recv_counts[d].begin(), recv_counts[d].end(), int64_t{0})));
    ASSERT_CUDA(cudaMemcpy(got.data(), recv[d]->p, got.size() * 4, cudaMemcpyDeviceToHost));
    for (int s = 0; s < ranks; ++s) {
      int64_t from = 0;
      for (int t = 0; t < d; ++t) from += send_counts[s][t];
      for (int64_t e = 0; e < recv_counts[d][s]; ++e) {
        ASSERT_EQ(got[size_t(at + e)], host[s][size_t(from + e)]) << "rank " << d << " from " << s;
      }
      at += recv_counts[d][s];
      if (s != d) in_others += recv_counts[d][s];
    }
    EXPECT_EQ((*comm)->traffic(d).received_bytes, in_others * 4);
  }
}

}  // namespace
}  // namespace wlb::cuda
