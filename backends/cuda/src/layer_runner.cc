#include "wlb/cuda/layer_runner.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "gemm_layout.h"
#include "layer_kernels.h"
#include "wlb/cuda/cuda_status.h"
#include "wlb/cuda/device_fill.h"

#define WLB_CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                     \
    const cublasStatus_t wlb_cublas_status_ = (expr);                                      \
    if (wlb_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
      return absl::InternalError(absl::StrFormat(                                          \
          "%s failed: %s (%s) at %s:%d", #expr, cublasLtGetStatusName(wlb_cublas_status_), \
          cublasLtGetStatusString(wlb_cublas_status_), __FILE__, __LINE__));               \
    }                                                                                      \
  } while (false)

namespace wlb::cuda {
namespace {

using detail::ColumnMajorGemm;
using detail::RowMajorGemm;
using bf16 = __nv_bfloat16;
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// Row-major D (rows, cols) = op(A) (rows, inner) . op(B) (inner, cols) [+ C], bf16 in and out,
// fp32 accumulation, through cuBLASLt's column-major view (gemm_layout.h). Descriptors and the
// algorithm are chosen once (at Plan), so Run only launches.
class Gemm {
 public:
  static absl::StatusOr<Gemm> Create(cublasLtHandle_t handle, int64_t rows, int64_t cols,
                                     int64_t inner, bool trans_a, bool trans_b, bool add_c) {
    Gemm g;
    g.add_c_ = add_c;
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&g.desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const ColumnMajorGemm c = RowMajorGemm(rows, cols, inner, trans_a, trans_b);
    const cublasOperation_t op_first = c.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = c.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(g.desc_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                              &op_first, sizeof(op_first)));
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(g.desc_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                              &op_second, sizeof(op_second)));
    WLB_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&g.lt_a_, CUDA_R_16BF, c.first_rows, c.first_cols, c.first_ld));
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&g.lt_b_, CUDA_R_16BF, c.second_rows,
                                                          c.second_cols, c.second_ld));
    WLB_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&g.lt_d_, CUDA_R_16BF, c.out_rows, c.out_cols, c.out_ld));
    cublasLtMatmulPreference_t pref = nullptr;
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kGemmWorkspaceBytes;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoGetHeuristic(handle, g.desc_, g.lt_a_, g.lt_b_, g.lt_d_, g.lt_d_, pref,
                                          1, &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    WLB_CUBLAS_RETURN_IF_ERROR(st);
    if (found == 0) {
      return absl::NotFoundError(
          absl::StrFormat("cuBLASLt has no bf16 algorithm for a (%d x %d) . (%d x %d) GEMM", rows,
                          inner, inner, cols));
    }
    g.algo_ = result.algo;
    return g;
  }

  Gemm() = default;
  Gemm(Gemm&& o) noexcept { *this = std::move(o); }
  Gemm& operator=(Gemm&& o) noexcept {
    std::swap(desc_, o.desc_);
    std::swap(lt_a_, o.lt_a_);
    std::swap(lt_b_, o.lt_b_);
    std::swap(lt_d_, o.lt_d_);
    std::swap(algo_, o.algo_);
    std::swap(add_c_, o.add_c_);
    return *this;
  }
  ~Gemm() {
    if (lt_a_) cublasLtMatrixLayoutDestroy(lt_a_);
    if (lt_b_) cublasLtMatrixLayoutDestroy(lt_b_);
    if (lt_d_) cublasLtMatrixLayoutDestroy(lt_d_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }

  // D = op(a) op(b) (+ c when created with add_c; c may equal d).
  absl::Status Run(cublasLtHandle_t handle, const bf16* a, const bf16* b, const bf16* c, bf16* d,
                   void* workspace, cudaStream_t stream) const {
    const float alpha = 1.f, beta = add_c_ ? 1.f : 0.f;
    WLB_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle, desc_, &alpha, b, lt_a_, a, lt_b_, &beta,
                                              add_c_ ? c : d, lt_d_, d, lt_d_, &algo_, workspace,
                                              kGemmWorkspaceBytes, stream));
    return absl::OkStatus();
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t lt_a_ = nullptr, lt_b_ = nullptr, lt_d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool add_c_ = false;
};

// Every GEMM of the layer, in the order they run: forward kQ..kDown, backward kDWd..kDaV.
enum GemmId {
  kQ,
  kK,
  kV,
  kOut,
  kGateUp,
  kDown,
  kDWd,
  kDs,
  kDWgu,
  kDb,
  kDWo,
  kDo,
  kDWq,
  kDWk,
  kDWv,
  kDaQ,
  kDaK,
  kDaV,
  kGemmCount
};

// Checked a * b for sizes (InvalidArgument naming `what` on overflow).
absl::Status MulChecked(int64_t a, int64_t b, const char* what, int64_t& out) {
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer runner: %s = %d x %d overflows 64 bits", what, a, b));
  }
  return absl::OkStatus();
}

}  // namespace

struct LayerRunner::State {
  LayerRunnerOptions options;
  int64_t capacity = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t handle = nullptr;
  std::vector<void*> allocations;
  // Weights and their gradients (bf16; norm gain gradients fp32).
  bf16 *norm1 = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr,
       *norm2 = nullptr, *wgu = nullptr, *wd = nullptr;
  bf16 *dwq = nullptr, *dwk = nullptr, *dwv = nullptr, *dwo = nullptr, *dwgu = nullptr,
       *dwd = nullptr;
  float *dnorm1 = nullptr, *dnorm2 = nullptr;
  // Activations (capacity rows) and gradients.
  bf16 *x = nullptr, *a = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr,
       *h = nullptr, *b = nullptr, *gu = nullptr, *s = nullptr, *y = nullptr;
  bf16 *dy = nullptr, *ds = nullptr, *dgu = nullptr, *db = nullptr, *dh = nullptr, *dout = nullptr,
       *dq = nullptr, *dk = nullptr, *dv = nullptr, *da = nullptr, *dx = nullptr;
  float *rstd1 = nullptr, *rstd2 = nullptr, *lse = nullptr;
  int32_t* positions = nullptr;
  void* workspace = nullptr;
  std::array<cudaEvent_t, 8> events{};  // fwd start, attn start, attn end, fwd end; same for bwd
  // The planned micro-batch.
  int64_t tokens = 0;
  std::optional<VarlenAttention> attention;
  std::vector<Gemm> gemms;
  bool forward_ran = false, backward_ran = false;

  ~State() {
    for (void* p : allocations) cudaFree(p);
    for (cudaEvent_t e : events) {
      if (e) cudaEventDestroy(e);
    }
    if (handle) cublasLtDestroy(handle);
  }

  template <typename T>
  absl::Status Alloc(T*& p, int64_t count) {
    void* raw = nullptr;
    WLB_CUDA_RETURN_IF_ERROR(
        cudaMalloc(&raw, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
    allocations.push_back(raw);
    p = static_cast<T*>(raw);
    return absl::OkStatus();
  }

  // One of the planned GEMMs on this runner's handle, workspace and stream.
  absl::Status RunGemm(GemmId id, const bf16* a, const bf16* b, const bf16* c, bf16* d) const {
    return gemms[id].Run(handle, a, b, c, d, workspace, stream);
  }
};

LayerRunner::LayerRunner(std::unique_ptr<State> state, LayerShape shape)
    : state_(std::move(state)), shape_(std::move(shape)) {}
LayerRunner::~LayerRunner() = default;

absl::StatusOr<int64_t> LayerRunner::DeviceBytes(const LayerShape& s, int64_t capacity,
                                                 bool backward) {
  if (absl::Status st = ValidateLayerShape(s); !st.ok()) return st;
  // Widths (bf16 columns) of the activations, then of the gradients, each `capacity` rows.
  // x a h b y dy, q o, k v, gu s.
  const int64_t fwd_width = 6 * s.hidden + 2 * s.q_width() + 2 * s.kv_width() + 3 * s.ffn;
  // db dh da dx, dout dq, dk dv, ds dgu.
  const int64_t bwd_width = 4 * s.hidden + 2 * s.q_width() + 2 * s.kv_width() + 3 * s.ffn;
  const int64_t weights = 2 * s.hidden + s.hidden * (s.q_width() + 2 * s.kv_width()) +
                          s.q_width() * s.hidden + 3 * s.hidden * s.ffn;
  // bf16 activations, fp32 rstd1/rstd2 and LSE, int32 position.
  int64_t act = 0, per_row = 2 * (fwd_width + (backward ? bwd_width : 0)) + 8 + 4 * s.heads + 4;
  if (absl::Status st = MulChecked(capacity, per_row, "activation bytes", act); !st.ok()) {
    return st;
  }
  const int64_t weight_bytes = 2 * weights * (backward ? 2 : 1) + 8 * s.hidden;
  return act + weight_bytes + static_cast<int64_t>(kGemmWorkspaceBytes);
}

absl::StatusOr<std::unique_ptr<LayerRunner>> LayerRunner::Create(const LayerShape& s,
                                                                 const LayerParams& params,
                                                                 int64_t capacity,
                                                                 const LayerRunnerOptions& options,
                                                                 cudaStream_t stream) {
  if (absl::Status st = ValidateLayerShape(s); !st.ok()) return st;
  if (s.hidden > detail::kMaxNormWidth) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer shape '%s': hidden %d is over the RMSNorm kernels' limit of %d",
                        s.name, s.hidden, detail::kMaxNormWidth));
  }
  if (absl::Status st = ValidateLayerParams(s, params); !st.ok()) return st;
  if (capacity < 1 || capacity > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layer runner capacity must be in [1, 2^31) tokens, got %d", capacity));
  }
  absl::StatusOr<int64_t> bytes = DeviceBytes(s, capacity, options.backward);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status st = CudaDeviceAvailable(); !st.ok()) return st;
  size_t free_bytes = 0, total_bytes = 0;
  WLB_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (*bytes > static_cast<int64_t>(free_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("layer '%s' at %d tokens needs %d bytes of device memory, %d are free",
                        s.name, capacity, *bytes, free_bytes));
  }
  auto st = std::make_unique<State>();
  st->options = options;
  st->options.attention.backward = options.backward;
  st->capacity = capacity;
  st->stream = stream;
  WLB_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&st->handle));
  for (cudaEvent_t& e : st->events) WLB_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  const int64_t c = capacity, hidden = s.hidden;
  // Weights: converted to bf16 on the host (the values are bf16-representable) and uploaded.
  const std::pair<bf16**, const std::vector<double>*> weights[] = {
      {&st->norm1, &params.norm1}, {&st->wq, &params.wq}, {&st->wk, &params.wk},
      {&st->wv, &params.wv},       {&st->wo, &params.wo}, {&st->norm2, &params.norm2},
      {&st->wgu, &params.wgu},     {&st->wd, &params.wd}};
  for (const auto& [ptr, values] : weights) {
    std::vector<bf16> host(values->size());
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = __float2bfloat16(static_cast<float>((*values)[i]));
    if (absl::Status e = st->Alloc(*ptr, static_cast<int64_t>(host.size())); !e.ok()) return e;
    WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(*ptr, host.data(), host.size() * sizeof(bf16),
                                             cudaMemcpyHostToDevice, stream));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `host` dies here
  }
  std::vector<std::pair<bf16**, int64_t>> buffers = {
      {&st->x, c * hidden},       {&st->a, c * hidden},       {&st->q, c * s.q_width()},
      {&st->k, c * s.kv_width()}, {&st->v, c * s.kv_width()}, {&st->o, c * s.q_width()},
      {&st->h, c * hidden},       {&st->b, c * hidden},       {&st->gu, c * 2 * s.ffn},
      {&st->s, c * s.ffn},        {&st->y, c * hidden},       {&st->dy, c * hidden}};
  if (options.backward) {
    const std::vector<std::pair<bf16**, int64_t>> grads = {
        {&st->ds, c * s.ffn},         {&st->dgu, c * 2 * s.ffn},    {&st->db, c * hidden},
        {&st->dh, c * hidden},        {&st->dout, c * s.q_width()}, {&st->dq, c * s.q_width()},
        {&st->dk, c * s.kv_width()},  {&st->dv, c * s.kv_width()},  {&st->da, c * hidden},
        {&st->dx, c * hidden},        {&st->dwq, params.wq.size()}, {&st->dwk, params.wk.size()},
        {&st->dwv, params.wv.size()}, {&st->dwo, params.wo.size()}, {&st->dwgu, params.wgu.size()},
        {&st->dwd, params.wd.size()}};
    buffers.insert(buffers.end(), grads.begin(), grads.end());
    if (absl::Status e = st->Alloc(st->dnorm1, hidden); !e.ok()) return e;
    if (absl::Status e = st->Alloc(st->dnorm2, hidden); !e.ok()) return e;
  }
  for (const auto& [ptr, count] : buffers) {
    if (absl::Status e = st->Alloc(*ptr, count); !e.ok()) return e;
  }
  for (float** p : {&st->rstd1, &st->rstd2}) {
    if (absl::Status e = st->Alloc(*p, c); !e.ok()) return e;
  }
  if (absl::Status e = st->Alloc(st->lse, c * s.heads); !e.ok()) return e;
  if (absl::Status e = st->Alloc(st->positions, c); !e.ok()) return e;
  char* ws = nullptr;
  if (absl::Status e = st->Alloc(ws, static_cast<int64_t>(kGemmWorkspaceBytes)); !e.ok()) return e;
  st->workspace = ws;
  std::unique_ptr<LayerRunner> runner(new LayerRunner(std::move(st), s));
  if (absl::Status e = runner->RandomizeInputs(1); !e.ok()) return e;
  return runner;
}

absl::Status LayerRunner::RandomizeInputs(uint64_t seed) {
  State& st = *state_;
  const int64_t n = st.capacity * shape_.hidden;
  if (absl::Status s = FillUniformBf16(st.x, n, 2 * seed, 1.f, st.stream); !s.ok()) return s;
  return FillUniformBf16(st.dy, n, 2 * seed + 1, 1.f, st.stream);
}

absl::Status LayerRunner::SetInputs(absl::Span<const double> x, absl::Span<const double> dy) {
  State& st = *state_;
  if (x.size() != dy.size() || x.size() % static_cast<size_t>(shape_.hidden) != 0 ||
      static_cast<int64_t>(x.size()) > st.capacity * shape_.hidden) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SetInputs: x has %d and dy %d values; both must be the same multiple of hidden = %d, "
        "at most capacity %d rows",
        x.size(), dy.size(), shape_.hidden, st.capacity));
  }
  for (const auto& [dst, src] : {std::pair{st.x, x}, std::pair{st.dy, dy}}) {
    std::vector<bf16> host(src.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(static_cast<float>(src[i]));
    WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host.data(), host.size() * sizeof(bf16),
                                             cudaMemcpyHostToDevice, st.stream));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st.stream));
  }
  return absl::OkStatus();
}

absl::Status LayerRunner::Plan(const PackedDocuments& batch) {
  State& st = *state_;
  const LayerShape& s = shape_;
  if (batch.cu_seqlens.size() < 2 ||
      batch.positions.size() != static_cast<size_t>(batch.tokens())) {
    return absl::InvalidArgumentError("Plan: the micro-batch is not packed (use PackDocuments)");
  }
  const int64_t t = batch.tokens();
  if (t > st.capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Plan: micro-batch of %d tokens is over the runner's capacity of %d", t, st.capacity));
  }
  st.attention.reset();
  st.gemms.clear();
  st.forward_ran = st.backward_ran = false;
  AttentionProblem p;
  p.cu_seqlens_q = batch.cu_seqlens;
  p.cu_seqlens_k = batch.cu_seqlens;
  p.max_seqlen_q = p.max_seqlen_k = batch.max_length;
  p.num_heads = static_cast<int>(s.heads);
  p.num_kv_heads = static_cast<int>(s.kv_heads);
  p.head_dim = static_cast<int>(s.head_dim);
  p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  absl::StatusOr<VarlenAttention> attn =
      VarlenAttention::Create(p, st.options.attention, st.stream);
  if (!attn.ok()) return attn.status();
  WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(st.positions, batch.positions.data(),
                                           batch.positions.size() * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, st.stream));
  const int64_t hidden = s.hidden, qw = s.q_width(), kw = s.kv_width(), f = s.ffn;
  // (rows, cols, inner, trans_a, trans_b, add_c) per GemmId.
  const std::array<std::tuple<int64_t, int64_t, int64_t, bool, bool, bool>, kGemmCount> shapes = {{
      {t, qw, hidden, false, false, false},     // q = a Wq
      {t, kw, hidden, false, false, false},     // k = a Wk
      {t, kw, hidden, false, false, false},     // v = a Wv
      {t, hidden, qw, false, false, true},      // h = x + o Wo
      {t, 2 * f, hidden, false, false, false},  // gu = b Wgu
      {t, hidden, f, false, false, true},       // y = h + s Wd
      {f, hidden, t, true, false, false},       // dWd = s^T dy
      {t, f, hidden, false, true, false},       // ds = dy Wd^T
      {hidden, 2 * f, t, true, false, false},   // dWgu = b^T dgu
      {t, hidden, 2 * f, false, true, false},   // db = dgu Wgu^T
      {qw, hidden, t, true, false, false},      // dWo = o^T dh
      {t, qw, hidden, false, true, false},      // dout = dh Wo^T
      {hidden, qw, t, true, false, false},      // dWq = a^T dq
      {hidden, kw, t, true, false, false},      // dWk = a^T dk
      {hidden, kw, t, true, false, false},      // dWv = a^T dv
      {t, hidden, qw, false, true, false},      // da = dq Wq^T
      {t, hidden, kw, false, true, true},       // da += dk Wk^T
      {t, hidden, kw, false, true, true},       // da += dv Wv^T
  }};
  const int count = st.options.backward ? kGemmCount : kDWd;
  for (int i = 0; i < count; ++i) {
    const auto& [rows, cols, inner, ta, tb, add] = shapes[i];
    absl::StatusOr<Gemm> g = Gemm::Create(st.handle, rows, cols, inner, ta, tb, add);
    if (!g.ok()) return g.status();
    st.gemms.push_back(*std::move(g));
  }
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st.stream));  // `batch.positions` may die
  st.attention.emplace(*std::move(attn));
  st.tokens = t;
  return absl::OkStatus();
}

absl::Status LayerRunner::Forward() {
  State& st = *state_;
  const LayerShape& s = shape_;
  if (!st.attention) return absl::FailedPreconditionError("LayerRunner::Forward before Plan");
  const int64_t t = st.tokens;
  const float eps = static_cast<float>(s.norm_eps);
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[0], st.stream));
  WLB_CUDA_RETURN_IF_ERROR(
      detail::LaunchRmsNormForward(st.x, st.norm1, st.a, st.rstd1, t, s.hidden, eps, st.stream));
  if (absl::Status e = st.RunGemm(kQ, st.a, st.wq, nullptr, st.q); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kK, st.a, st.wk, nullptr, st.k); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kV, st.a, st.wv, nullptr, st.v); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRope(st.q, st.positions, t, s.heads, s.head_dim,
                                              s.rope_theta, false, st.stream));
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRope(st.k, st.positions, t, s.kv_heads, s.head_dim,
                                              s.rope_theta, false, st.stream));
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[1], st.stream));
  ForwardTensors ft;
  ft.q = {st.q, t, s.heads, s.head_dim};
  ft.k = {st.k, t, s.kv_heads, s.head_dim};
  ft.v = {st.v, t, s.kv_heads, s.head_dim};
  ft.out = {st.o, t, s.heads, s.head_dim};
  ft.lse = {st.lse, s.heads, t};
  if (absl::Status e = st.attention->Forward(ft, st.stream); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[2], st.stream));
  if (absl::Status e = st.RunGemm(kOut, st.o, st.wo, st.x, st.h); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(
      detail::LaunchRmsNormForward(st.h, st.norm2, st.b, st.rstd2, t, s.hidden, eps, st.stream));
  if (absl::Status e = st.RunGemm(kGateUp, st.b, st.wgu, nullptr, st.gu); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchSwiGluForward(st.gu, st.s, t, s.ffn, st.stream));
  if (absl::Status e = st.RunGemm(kDown, st.s, st.wd, st.h, st.y); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[3], st.stream));
  st.forward_ran = true;
  st.backward_ran = false;
  return absl::OkStatus();
}

absl::Status LayerRunner::Backward() {
  State& st = *state_;
  const LayerShape& s = shape_;
  if (!st.options.backward) {
    return absl::FailedPreconditionError("LayerRunner::Backward: created with backward = false");
  }
  if (!st.forward_ran) {
    return absl::FailedPreconditionError("LayerRunner::Backward needs a Forward since the Plan");
  }
  const int64_t t = st.tokens, hidden = s.hidden;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[4], st.stream));
  if (absl::Status e = st.RunGemm(kDWd, st.s, st.dy, nullptr, st.dwd); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDs, st.dy, st.wd, nullptr, st.ds); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchSwiGluBackward(st.gu, st.ds, st.dgu, t, s.ffn, st.stream));
  if (absl::Status e = st.RunGemm(kDWgu, st.b, st.dgu, nullptr, st.dwgu); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDb, st.dgu, st.wgu, nullptr, st.db); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(st.dnorm2, 0, hidden * sizeof(float), st.stream));
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRmsNormBackward(st.h, st.norm2, st.rstd2, st.db, st.dy,
                                                         st.dh, st.dnorm2, t, hidden, st.stream));
  if (absl::Status e = st.RunGemm(kDWo, st.o, st.dh, nullptr, st.dwo); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDo, st.dh, st.wo, nullptr, st.dout); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[5], st.stream));
  BackwardTensors bt;
  bt.q = {st.q, t, s.heads, s.head_dim};
  bt.k = {st.k, t, s.kv_heads, s.head_dim};
  bt.v = {st.v, t, s.kv_heads, s.head_dim};
  bt.out = {st.o, t, s.heads, s.head_dim};
  bt.dout = {st.dout, t, s.heads, s.head_dim};
  bt.lse = {st.lse, s.heads, t};
  bt.dq = {st.dq, t, s.heads, s.head_dim};
  bt.dk = {st.dk, t, s.kv_heads, s.head_dim};
  bt.dv = {st.dv, t, s.kv_heads, s.head_dim};
  if (absl::Status e = st.attention->Backward(bt, st.stream); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[6], st.stream));
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRope(st.dq, st.positions, t, s.heads, s.head_dim,
                                              s.rope_theta, true, st.stream));
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRope(st.dk, st.positions, t, s.kv_heads, s.head_dim,
                                              s.rope_theta, true, st.stream));
  if (absl::Status e = st.RunGemm(kDWq, st.a, st.dq, nullptr, st.dwq); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDWk, st.a, st.dk, nullptr, st.dwk); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDWv, st.a, st.dv, nullptr, st.dwv); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDaQ, st.dq, st.wq, nullptr, st.da); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDaK, st.dk, st.wk, st.da, st.da); !e.ok()) return e;
  if (absl::Status e = st.RunGemm(kDaV, st.dv, st.wv, st.da, st.da); !e.ok()) return e;
  WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(st.dnorm1, 0, hidden * sizeof(float), st.stream));
  WLB_CUDA_RETURN_IF_ERROR(detail::LaunchRmsNormBackward(st.x, st.norm1, st.rstd1, st.da, st.dh,
                                                         st.dx, st.dnorm1, t, hidden, st.stream));
  WLB_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.events[7], st.stream));
  st.backward_ran = true;
  return absl::OkStatus();
}

absl::StatusOr<LayerTimes> LayerRunner::Times() {
  State& st = *state_;
  if (!st.forward_ran) return absl::FailedPreconditionError("LayerRunner::Times before Forward");
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st.stream));
  auto ms = [&](int from, int to) -> absl::StatusOr<double> {
    float v = 0.f;
    WLB_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&v, st.events[from], st.events[to]));
    return static_cast<double>(v);
  };
  LayerTimes times;
  const std::pair<double*, std::pair<int, int>> spans[] = {{&times.forward_ms, {0, 3}},
                                                           {&times.attention_forward_ms, {1, 2}},
                                                           {&times.backward_ms, {4, 7}},
                                                           {&times.attention_backward_ms, {5, 6}}};
  for (const auto& [out, span] : spans) {
    if (span.first >= 4 && !st.backward_ran) break;
    absl::StatusOr<double> v = ms(span.first, span.second);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  return times;
}

namespace {

template <typename T>
absl::StatusOr<std::vector<double>> Download(const T* device, int64_t count, cudaStream_t stream) {
  std::vector<T> host(static_cast<size_t>(count));
  WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T),
                                           cudaMemcpyDeviceToHost, stream));
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<double> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      out[i] = __bfloat162float(host[i]);
    } else {
      out[i] = host[i];
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<LayerForwardResult> LayerRunner::DownloadOutput() {
  State& st = *state_;
  if (!st.forward_ran) return absl::FailedPreconditionError("DownloadOutput before Forward");
  absl::StatusOr<std::vector<double>> y = Download(st.y, st.tokens * shape_.hidden, st.stream);
  if (!y.ok()) return y.status();
  return LayerForwardResult{*std::move(y)};
}

absl::StatusOr<LayerGradients> LayerRunner::DownloadGradients() {
  State& st = *state_;
  if (!st.backward_ran) return absl::FailedPreconditionError("DownloadGradients before Backward");
  const LayerShape& s = shape_;
  LayerGradients g;
  LayerParams& w = g.dparams;
  const std::pair<std::vector<double>*, std::pair<const bf16*, int64_t>> tensors[] = {
      {&g.dx, {st.dx, st.tokens * s.hidden}},     {&w.wq, {st.dwq, s.hidden * s.q_width()}},
      {&w.wk, {st.dwk, s.hidden * s.kv_width()}}, {&w.wv, {st.dwv, s.hidden * s.kv_width()}},
      {&w.wo, {st.dwo, s.q_width() * s.hidden}},  {&w.wgu, {st.dwgu, s.hidden * 2 * s.ffn}},
      {&w.wd, {st.dwd, s.ffn * s.hidden}}};
  for (const auto& [out, src] : tensors) {
    absl::StatusOr<std::vector<double>> v = Download(src.first, src.second, st.stream);
    if (!v.ok()) return v.status();
    *out = *std::move(v);
  }
  for (const auto& [out, src] : {std::pair{&w.norm1, st.dnorm1}, std::pair{&w.norm2, st.dnorm2}}) {
    absl::StatusOr<std::vector<double>> v = Download(src, s.hidden, st.stream);
    if (!v.ok()) return v.status();
    *out = *std::move(v);
  }
  return g;
}

}  // namespace wlb::cuda
