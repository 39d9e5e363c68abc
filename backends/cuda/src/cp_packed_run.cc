#include "wlb/cuda/cp_packed_run.h"

#include <tuple>

#include "absl/strings/str_format.h"
#include "wlb/cuda/cuda_status.h"

namespace wlb::cuda {

CpPackedRunner::~CpPackedRunner() {
  for (void* p : buffers_) cudaFree(p);
}

absl::StatusOr<std::unique_ptr<CpPackedRunner>> CpPackedRunner::Create(
    const ShardPlan& plan, const CpAttentionConfig& config, Communicator& comm,
    const CpExecutorOptions& options) {
  std::unique_ptr<CpPackedRunner> r(new CpPackedRunner());
  r->comm_ = &comm;
  absl::StatusOr<std::unique_ptr<CpExecutor>> e = CpExecutor::Create(plan, config, comm, options);
  if (!e.ok()) return e.status();
  r->executor_ = *std::move(e);
  const int64_t cap = r->executor_->maps().rank_capacity;
  const int64_t h = config.num_heads, kh = config.num_kv_heads, d = config.head_dim;
  auto alloc = [&](int64_t heads) -> absl::StatusOr<__nv_bfloat16*> {
    void* p = nullptr;
    if (cap > 0) WLB_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, size_t(cap * heads * d) * 2));
    r->buffers_.push_back(p);
    return static_cast<__nv_bfloat16*>(p);
  };
  for (int i = 0; i < comm.num_local_ranks(); ++i) {
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(comm.device(i)));
    __nv_bfloat16* bufs[8];
    const int64_t heads[8] = {h, kh, kh, h, h, h, kh, kh};  // q k v out dout dq dk dv
    for (int b = 0; b < 8; ++b) {
      absl::StatusOr<__nv_bfloat16*> p = alloc(heads[b]);
      if (!p.ok()) return p.status();
      bufs[b] = *p;
    }
    r->forward_.push_back({{bufs[0], cap, h, d}, {bufs[1], cap, kh, d}, {bufs[2], cap, kh, d},
                           {bufs[3], cap, h, d}});
    r->backward_.push_back({{bufs[0], cap, h, d},
                            {bufs[1], cap, kh, d},
                            {bufs[2], cap, kh, d},
                            {bufs[3], cap, h, d},
                            {bufs[4], cap, h, d},
                            {bufs[5], cap, h, d},
                            {bufs[6], cap, kh, d},
                            {bufs[7], cap, kh, d}});
  }
  return r;
}

absl::Status CpPackedRunner::Sync() {
  for (int i = 0; i < comm_->num_local_ranks(); ++i) {
    WLB_CUDA_RETURN_IF_ERROR(cudaSetDevice(comm_->device(i)));
    WLB_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(comm_->stream(i)));
  }
  return absl::OkStatus();
}

absl::Status CpPackedRunner::Rerun(bool backward) {
  if (absl::Status s = executor_->Forward(forward_); !s.ok()) return s;
  if (backward) {
    if (absl::Status s = executor_->Backward(backward_); !s.ok()) return s;
  }
  return Sync();
}

absl::Status CpPackedRunner::Run(const PackedCpTensors& t, bool backward) {
  if (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.out == nullptr ||
      (backward && (t.dout == nullptr || t.dq == nullptr || t.dk == nullptr || t.dv == nullptr))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "packed CP run (backward %v): q, k, v, out%s must be non-null", backward,
        backward ? ", dout, dq, dk, dv" : ""));
  }
  const CpAttentionConfig& c = executor_->config();
  const int64_t q_row = int64_t(c.num_heads) * c.head_dim * 2;
  const int64_t kv_row = int64_t(c.num_kv_heads) * c.head_dim * 2;
  WLB_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // packed inputs are ready
  auto shard = [&](const void* packed, int64_t row, auto member, auto& list) {
    std::vector<void*> local;
    for (auto& x : list) local.push_back(const_cast<void*>(static_cast<const void*>((x.*member).data)));
    return executor_->ShardPacked(packed, row, local);
  };
  auto unshard = [&](void* packed, int64_t row, auto member, auto& list) {
    std::vector<const void*> local;
    for (auto& x : list) local.push_back((x.*member).data);
    return executor_->UnshardToPacked(local, row, packed);
  };
  if (absl::Status s = shard(t.q, q_row, &CpForwardTensors::q, forward_); !s.ok()) return s;
  if (absl::Status s = shard(t.k, kv_row, &CpForwardTensors::k, forward_); !s.ok()) return s;
  if (absl::Status s = shard(t.v, kv_row, &CpForwardTensors::v, forward_); !s.ok()) return s;
  if (backward) {
    if (absl::Status s = shard(t.dout, q_row, &CpBackwardTensors::dout, backward_); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = Rerun(backward); !s.ok()) return s;
  if (absl::Status s = unshard(t.out, q_row, &CpForwardTensors::out, forward_); !s.ok()) return s;
  if (backward) {
    for (auto [packed, row, member] :
         {std::tuple{t.dq, q_row, &CpBackwardTensors::dq}, std::tuple{t.dk, kv_row, &CpBackwardTensors::dk},
          std::tuple{t.dv, kv_row, &CpBackwardTensors::dv}}) {
      if (absl::Status s = unshard(packed, row, member, backward_); !s.ok()) return s;
    }
  }
  return Sync();
}

}  // namespace wlb::cuda
