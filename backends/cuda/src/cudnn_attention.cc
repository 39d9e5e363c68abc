#include "src/cudnn_attention.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "wlb/cuda/cudnn_layout.h"

#if WLB_CUDA_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "src/kernels.h"
#include "wlb/cuda/cuda_status.h"
#endif

namespace wlb::cuda {

bool CudnnEngineCompiledIn() { return WLB_CUDA_HAVE_CUDNN != 0; }

#if !WLB_CUDA_HAVE_CUDNN

absl::StatusOr<int64_t> CudnnRuntimeVersion() {
  return absl::FailedPreconditionError(
      "wlb::cuda was built without the cudnn attention engine (cuDNN >= 9.6 or the cuDNN "
      "frontend headers were missing at configure time; see backends/cuda/README.md)");
}

namespace detail {

class CudnnAttention {};

absl::StatusOr<std::shared_ptr<const CudnnAttention>> CreateCudnnAttention(const AttentionProblem&,
                                                                           bool, cudaStream_t) {
  return CudnnRuntimeVersion().status();
}

absl::Status CudnnForward(const CudnnAttention&, const ForwardTensors&, cudaStream_t) {
  return CudnnRuntimeVersion().status();
}

absl::Status CudnnBackward(const CudnnAttention&, const BackwardTensors&, cudaStream_t) {
  return CudnnRuntimeVersion().status();
}

}  // namespace detail

CudnnGraphStats CudnnGraphStatistics() { return {}; }

#else  // WLB_CUDA_HAVE_CUDNN

namespace fe = cudnn_frontend;

absl::StatusOr<int64_t> CudnnRuntimeVersion() {
  // cudnnGetVersion reads the loaded library; it needs no device.
  return static_cast<int64_t>(cudnnGetVersion());
}

namespace detail {
namespace {

std::string VersionString(int64_t v) {
  return absl::StrFormat("%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

// Tensor uids of the graphs (the variant pack's keys).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqLenQ,
  kSeqLenK,
  kQOffsets,
  kKvOffsets,
  kStatsOffsets,
};

// One handle and one graph cache per device: a handle is bound to its device, and the plans
// built through it run through it. The mutex also serialises cudnnSetStream + execute.
struct DeviceCache {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<std::string, std::shared_ptr<fe::graph::Graph>> graphs;
};

// CudnnGraphStatistics' counters, over every device's cache (each cache has its own mutex).
struct GraphStats {
  std::mutex mu;
  CudnnGraphStats stats;
};

GraphStats& GraphStatsOf() {
  static auto* stats = new GraphStats();  // never destroyed, like the caches
  return *stats;
}

// Never destroyed: handles must not be destroyed after the CUDA runtime has shut down, which
// static destructors cannot rule out.
DeviceCache& CacheOf(int device) {
  static std::mutex mu;
  static auto* caches = new std::map<int, std::unique_ptr<DeviceCache>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<DeviceCache>& c = (*caches)[device];
  if (!c) c = std::make_unique<DeviceCache>();
  return *c;
}

absl::Status CudnnCall(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s failed: %s", what, cudnnGetErrorString(s)));
}

// cuDNN's refusal as a Status naming what was asked: GRAPH_NOT_SUPPORTED (and the other
// capability codes) become Unimplemented, everything else Internal.
absl::Status FrontendStatus(fe::error_t e, const char* step, const std::string& asked) {
  if (e.is_good()) return absl::OkStatus();
  const std::string msg =
      absl::StrFormat("cuDNN (%s) refused %s at %s: %s", VersionString(cudnnGetVersion()), asked,
                      step, e.get_message());
  if (e.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED ||
      e.get_code() == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED ||
      e.get_code() == fe::error_code_t::HEURISTIC_QUERY_FAILED) {
    return absl::UnimplementedError(msg);
  }
  return absl::InternalError(msg);
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// (b, heads, s, d) over packed (tokens, heads, d) rows: the batch stride is unused (ragged).
TensorPtr Thd(fe::graph::Graph& g, const char* name, Uid uid, int64_t b, int64_t heads, int64_t s,
              int64_t d, const TensorPtr& offsets) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, heads, s, d})
                      .set_stride({s * heads * d, d, heads * d, 1})
                      .set_ragged_offset(offsets));
}

void AsThd(const TensorPtr& t, Uid uid, int64_t b, int64_t heads, int64_t s, int64_t d,
           const TensorPtr& offsets) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({b, heads, s, d})
      .set_stride({s * heads * d, d, heads * d, 1})
      .set_ragged_offset(offsets);
}

TensorPtr Int32Column(fe::graph::Graph& g, const char* name, Uid uid, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// The causal mask of class `c` on SDPA forward or backward attributes: top-left where every
// segment is square (the same set; cuDNN's backward skips masked tiles only then), else
// bottom-right (CP segments: queries [a, b) of a document see keys [0, b)).
template <typename Attributes>
void SetCausalMask(const CudnnShapeClass& c, Attributes& options) {
  if (!c.causal) return;
  if (c.causal_top_left) {
    options.set_causal_mask(true);
  } else {
    options.set_causal_mask_bottom_right(true);
  }
}

// Builds the forward or backward graph of class `c` through `handle`.
absl::StatusOr<std::shared_ptr<fe::graph::Graph>> BuildGraph(const CudnnShapeClass& c,
                                                             bool backward, cudnnHandle_t handle) {
  const std::string asked = absl::StrFormat("the %s SDPA graph for shape class {%s}",
                                            backward ? "backward" : "forward", c.ToString());
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = c.batch, h = c.num_heads, hk = c.num_kv_heads, d = c.head_dim;
  const int64_t sq = c.max_seqlen_q, sk = c.max_seqlen_k;
  fe::graph::Graph& g = *graph;
  TensorPtr q_offsets = Int32Column(g, "q_offsets", kQOffsets, b + 1);
  TensorPtr kv_offsets = Int32Column(g, "kv_offsets", kKvOffsets, b + 1);
  TensorPtr stats_offsets = Int32Column(g, "stats_offsets", kStatsOffsets, b + 1);
  TensorPtr seq_len_q = Int32Column(g, "seq_len_q", kSeqLenQ, b);
  TensorPtr seq_len_k = Int32Column(g, "seq_len_kv", kSeqLenK, b);
  TensorPtr q = Thd(g, "Q", kQ, b, h, sq, d, q_offsets);
  TensorPtr k = Thd(g, "K", kK, b, hk, sk, d, kv_offsets);
  TensorPtr v = Thd(g, "V", kV, b, hk, sk, d, kv_offsets);
  // Statistics (b, h, s, 1) stored token-major, (total_q, heads), like Q's rows.
  const std::vector<int64_t> stats_dim = {b, h, sq, 1}, stats_stride = {sq * h, 1, h, 1};
  if (!backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("wlb_sdpa_forward")
                       .set_generate_stats(true)
                       .set_attn_scale(c.softmax_scale)
                       .set_padding_mask(true)
                       .set_seq_len_q(seq_len_q)
                       .set_seq_len_kv(seq_len_k);
    SetCausalMask(c, options);
    auto [o, stats] = g.sdpa(q, k, v, options);
    AsThd(o, kO, b, h, sq, d, q_offsets);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride)
        .set_ragged_offset(stats_offsets);
  } else {
    TensorPtr o = Thd(g, "O", kO, b, h, sq, d, q_offsets);
    TensorPtr dout = Thd(g, "dO", kDO, b, h, sq, d, q_offsets);
    TensorPtr stats = g.tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(kStats)
                                   .set_dim(stats_dim)
                                   .set_stride(stats_stride)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_ragged_offset(stats_offsets));
    // max_total_seq_len bounds the fp32 dQ/dK/dV workspaces by the packed token count instead
    // of batch x max length (which a many-document micro-batch would make enormous).
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("wlb_sdpa_backward")
                       .set_attn_scale(c.softmax_scale)
                       .set_padding_mask(true)
                       .set_seq_len_q(seq_len_q)
                       .set_seq_len_kv(seq_len_k)
                       .set_max_total_seq_len_q(c.total_q)
                       .set_max_total_seq_len_kv(c.total_k);
    SetCausalMask(c, options);
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, options);
    AsThd(dq, kDQ, b, h, sq, d, q_offsets);
    AsThd(dk, kDK, b, hk, sk, d, kv_offsets);
    AsThd(dv, kDV, b, hk, sk, d, kv_offsets);
  }
  try {
    if (auto s = FrontendStatus(g.validate(), "validate", asked); !s.ok()) return s;
    if (auto s = FrontendStatus(g.build_operation_graph(handle), "build_operation_graph", asked);
        !s.ok()) {
      return s;
    }
    if (auto s =
            FrontendStatus(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                           "create_execution_plans", asked);
        !s.ok()) {
      return s;
    }
    if (auto s = FrontendStatus(g.check_support(handle), "check_support", asked); !s.ok()) {
      return s;
    }
    if (auto s = FrontendStatus(g.build_plans(handle), "build_plans", asked); !s.ok()) return s;
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrFormat("cuDNN frontend threw building %s: %s", asked, e.what()));
  }
  return graph;
}

struct DeviceFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;

// `what` and `shape` name the buffer in the error: a workspace is sized by the shape class, so an
// out-of-memory names both the bytes and the class that asked for them.
absl::StatusOr<DevicePtr> DeviceAlloc(size_t bytes, const char* what, const std::string& shape) {
  if (bytes == 0) return DevicePtr();
  void* raw = nullptr;
  if (absl::Status s =
          CudaStatus(cudaMalloc(&raw, bytes), "cudaMalloc(&raw, bytes)", __FILE__, __LINE__);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("cudnn engine: allocating %d bytes for the %s "
                                                  "of graph class %s: %s",
                                                  bytes, what, shape, s.message()));
  }
  return DevicePtr(raw);
}

absl::StatusOr<DevicePtr> Upload(const std::vector<int32_t>& host, cudaStream_t stream,
                                 const std::string& shape) {
  auto d = DeviceAlloc(host.size() * sizeof(int32_t), "ragged offsets", shape);
  if (!d.ok()) return d.status();
  WLB_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d->get(), host.data(), host.size() * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, stream));
  return d;
}

}  // namespace

class CudnnAttention {
 public:
  AttentionProblem problem;
  CudnnShapeClass shape;
  CudnnRaggedLayout layout;
  DeviceCache* cache = nullptr;
  std::shared_ptr<fe::graph::Graph> forward, backward;
  DevicePtr seq_len_q, seq_len_k, q_offsets, kv_offsets, stats_offsets;
  // Token-major statistics (forward output, backward input) and the graphs' workspaces; forward
  // and backward own theirs, so a forward may overlap the previous step's backward.
  DevicePtr forward_stats, backward_stats, forward_workspace, backward_workspace;

  // The variant pack entries every graph reads.
  std::unordered_map<int64_t, void*> CommonPack() const {
    return {{kSeqLenQ, seq_len_q.get()},
            {kSeqLenK, seq_len_k.get()},
            {kQOffsets, q_offsets.get()},
            {kKvOffsets, kv_offsets.get()},
            {kStatsOffsets, stats_offsets.get()}};
  }

  absl::Status Execute(const fe::graph::Graph& graph, std::unordered_map<int64_t, void*>& pack,
                       void* workspace, cudaStream_t stream, const char* what) const {
    std::lock_guard<std::mutex> lock(cache->mu);
    if (auto s = CudnnCall(cudnnSetStream(cache->handle, stream), "cudnnSetStream"); !s.ok()) {
      return s;
    }
    try {
      return FrontendStatus(graph.execute(cache->handle, pack, workspace), what,
                            absl::StrFormat("shape class {%s}", shape.ToString()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrFormat("cuDNN frontend threw at %s: %s", what, e.what()));
    }
  }
};

absl::StatusOr<std::shared_ptr<const CudnnAttention>> CreateCudnnAttention(
    const AttentionProblem& problem, bool backward, cudaStream_t stream) {
  const int64_t version = cudnnGetVersion();
  if (version < kMinCudnnVersion) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cuDNN %s is loaded (cudnnGetVersion() = %d); the cudnn attention engine needs >= %s "
        "(ragged GQA backward, bottom-right causal masks)",
        VersionString(version), version, VersionString(kMinCudnnVersion)));
  }
  int device = 0;
  WLB_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  auto engine = std::make_shared<CudnnAttention>();
  engine->problem = problem;
  engine->shape = CudnnShapeClassOf(problem);
  auto layout = BuildCudnnRaggedLayout(problem, engine->shape);
  if (!layout.ok()) return layout.status();
  engine->layout = *std::move(layout);
  engine->cache = &CacheOf(device);
  {
    DeviceCache& cache = *engine->cache;
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.handle == nullptr) {
      if (auto s = CudnnCall(cudnnCreate(&cache.handle), "cudnnCreate"); !s.ok()) return s;
    }
    for (bool phase : {false, true}) {
      if (phase && !backward) continue;
      const std::string key = (phase ? "bwd " : "fwd ") + engine->shape.ToString();
      std::shared_ptr<fe::graph::Graph>& graph = cache.graphs[key];
      if (!graph) {
        const auto start = std::chrono::steady_clock::now();
        auto built = BuildGraph(engine->shape, phase, cache.handle);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        {
          GraphStats& g = GraphStatsOf();
          std::lock_guard<std::mutex> stats_lock(g.mu);
          g.stats.build_seconds += took.count();
          if (built.ok()) ++g.stats.graphs_built;
        }
        if (!built.ok()) {
          cache.graphs.erase(key);
          return built.status();
        }
        graph = *std::move(built);
      }
      (phase ? engine->backward : engine->forward) = graph;
    }
  }
  const CudnnRaggedLayout& l = engine->layout;
  const std::string shape_name = engine->shape.ToString();  // for allocation errors
  for (auto [dst, src] :
       {std::pair{&engine->seq_len_q, &l.seq_len_q}, std::pair{&engine->seq_len_k, &l.seq_len_k},
        std::pair{&engine->q_offsets, &l.q_offsets}, std::pair{&engine->kv_offsets, &l.kv_offsets},
        std::pair{&engine->stats_offsets, &l.stats_offsets}}) {
    auto d = Upload(*src, stream, shape_name);
    if (!d.ok()) return d.status();
    *dst = *std::move(d);
  }
  const size_t stats_bytes = size_t(problem.total_q()) * problem.num_heads * sizeof(float);
  for (bool phase : {false, true}) {
    if (phase && !backward) continue;
    const fe::graph::Graph& graph = phase ? *engine->backward : *engine->forward;
    int64_t workspace = 0;
    if (auto s = FrontendStatus(graph.get_workspace_size(workspace), "get_workspace_size",
                                shape_name);
        !s.ok()) {
      return s;
    }
    auto ws = DeviceAlloc(static_cast<size_t>(workspace),
                          phase ? "backward workspace" : "forward workspace", shape_name);
    if (!ws.ok()) return ws.status();
    auto stats = DeviceAlloc(stats_bytes, "softmax statistics", shape_name);
    if (!stats.ok()) return stats.status();
    (phase ? engine->backward_workspace : engine->forward_workspace) = *std::move(ws);
    (phase ? engine->backward_stats : engine->forward_stats) = *std::move(stats);
  }
  // The host vectors die with `layout` only when the engine does; still, make the uploads
  // visible to every stream before the first run.
  WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return std::shared_ptr<const CudnnAttention>(std::move(engine));
}

absl::Status CudnnForward(const CudnnAttention& e, const ForwardTensors& t, cudaStream_t stream) {
  auto pack = e.CommonPack();
  pack[kQ] = const_cast<__nv_bfloat16*>(t.q.data);
  pack[kK] = const_cast<__nv_bfloat16*>(t.k.data);
  pack[kV] = const_cast<__nv_bfloat16*>(t.v.data);
  pack[kO] = t.out.data;
  pack[kStats] = e.forward_stats.get();
  if (auto s = e.Execute(*e.forward, pack, e.forward_workspace.get(), stream, "forward execute");
      !s.ok()) {
    return s;
  }
  WLB_CUDA_RETURN_IF_ERROR(LaunchStatsToLse(static_cast<const float*>(e.forward_stats.get()),
                                            t.lse.data, e.problem.num_heads, e.problem.total_q(),
                                            stream));
  return absl::OkStatus();
}

absl::Status CudnnBackward(const CudnnAttention& e, const BackwardTensors& t, cudaStream_t stream) {
  if (!e.backward) {
    return absl::FailedPreconditionError("the cudnn engine was planned without backward");
  }
  if (e.layout.has_unvisited_keys) {
    const size_t kv_bytes = size_t(t.dk.numel()) * sizeof(__nv_bfloat16);
    WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dk.data, 0, kv_bytes, stream));
    WLB_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.dv.data, 0, kv_bytes, stream));
  }
  WLB_CUDA_RETURN_IF_ERROR(LaunchLseToStats(t.lse.data, static_cast<float*>(e.backward_stats.get()),
                                            e.problem.num_heads, e.problem.total_q(), stream));
  auto pack = e.CommonPack();
  pack[kQ] = const_cast<__nv_bfloat16*>(t.q.data);
  pack[kK] = const_cast<__nv_bfloat16*>(t.k.data);
  pack[kV] = const_cast<__nv_bfloat16*>(t.v.data);
  pack[kO] = const_cast<__nv_bfloat16*>(t.out.data);
  pack[kDO] = const_cast<__nv_bfloat16*>(t.dout.data);
  pack[kStats] = e.backward_stats.get();
  pack[kDQ] = t.dq.data;
  pack[kDK] = t.dk.data;
  pack[kDV] = t.dv.data;
  return e.Execute(*e.backward, pack, e.backward_workspace.get(), stream, "backward execute");
}

}  // namespace detail

CudnnGraphStats CudnnGraphStatistics() {
  detail::GraphStats& g = detail::GraphStatsOf();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.stats;
}

#endif  // WLB_CUDA_HAVE_CUDNN

}  // namespace wlb::cuda
