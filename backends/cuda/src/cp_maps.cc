#include "wlb/cuda/cp_maps.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "wlb/shard/shard_maps.hpp"

namespace wlb::cuda {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

AttentionProblem EmptyProblem(const CpAttentionConfig& config) {
  AttentionProblem p;
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  p.num_heads = config.num_heads;
  p.num_kv_heads = config.num_kv_heads;
  p.head_dim = config.head_dim;
  p.softmax_scale = EffectiveSoftmaxScale(config);
  p.causal = true;
  return p;
}

// Validates the shape with a one-token problem, so that a rank without work still reports a
// bad config.
absl::Status ValidateConfig(const CpAttentionConfig& config) {
  if (!config.mask.causal()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the CUDA CP executor applies causal masks only, got attention mask %s (run window and "
        "chunk masks with wlb.torch.cp_attention)",
        config.mask.Name()));
  }
  AttentionProblem p = EmptyProblem(config);
  p.cu_seqlens_q.push_back(1);
  p.cu_seqlens_k.push_back(1);
  p.max_seqlen_q = p.max_seqlen_k = 1;
  return ValidateProblem(p, config.kernel);
}

}  // namespace

float EffectiveSoftmaxScale(const CpAttentionConfig& config) {
  if (config.softmax_scale != 0.0f || config.head_dim <= 0) return config.softmax_scale;
  return 1.0f / std::sqrt(static_cast<float>(config.head_dim));
}

absl::StatusOr<CpMaps> BuildCpMaps(const ShardPlan& plan, const CpAttentionConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  // Local rows, gathered rows and key rows come from the planning library (wlb/shard/
  // shard_maps.hpp, which also checks the plan); this adds the kernel's problem and dK/dV map.
  absl::StatusOr<ShardMaps> rows = BuildShardMaps(plan);
  if (!rows.ok()) return rows.status();
  CpMaps maps;
  maps.cp_size = plan.cp_size;
  maps.tokens = plan.tokens;
  maps.rank_capacity = plan.rank_capacity;
  maps.packed_to_gathered = std::move(rows->packed_to_gathered);
  maps.ranks.resize(plan.ranks.size());
  const int64_t gathered = maps.gathered_rows();
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    CpRankMaps& m = maps.ranks[r];
    m.rank = static_cast<int>(r);
    m.problem = EmptyProblem(config);
    for (const Segment& s : plan.ranks[r].segments) {
      m.tokens += s.q_len();
      m.problem.cu_seqlens_q.push_back(static_cast<int32_t>(m.tokens));
      m.problem.cu_seqlens_k.push_back(static_cast<int32_t>(m.problem.total_k() + s.q_end));
      m.problem.max_seqlen_q = std::max<int32_t>(m.problem.max_seqlen_q, s.q_len());
      m.problem.max_seqlen_k = std::max<int32_t>(m.problem.max_seqlen_k, s.q_end);
    }
    m.local_to_packed = std::move(rows->ranks[r].local_to_packed);
    m.key_rows = std::move(rows->ranks[r].key_rows);
    // Counting sort of key rows by gathered row: stable, so sources stay ascending.
    m.key_offsets.assign(static_cast<size_t>(gathered) + 1, 0);
    for (int32_t g : m.key_rows) ++m.key_offsets[static_cast<size_t>(g) + 1];
    for (size_t g = 0; g < static_cast<size_t>(gathered); ++g) {
      m.key_offsets[g + 1] += m.key_offsets[g];
    }
    m.key_sources.resize(m.key_rows.size());
    std::vector<int32_t> next(m.key_offsets.begin(), m.key_offsets.end() - 1);
    for (size_t j = 0; j < m.key_rows.size(); ++j) {
      m.key_sources[static_cast<size_t>(next[static_cast<size_t>(m.key_rows[j])]++)] =
          static_cast<int32_t>(j);
    }
  }
  return maps;
}

absl::StatusOr<AttentionProblem> WholeBatchProblem(const MicroBatch& mb,
                                                   const CpAttentionConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (mb.documents.empty()) {
    return absl::InvalidArgumentError("micro-batch has no documents; nothing to attend");
  }
  AttentionProblem p = EmptyProblem(config);
  int64_t total = 0;
  for (const Document& d : mb.documents) {
    total += d.length;
    if (d.length <= 0 || total > kInt32Max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "document %d has length %d (need > 0, packed total within int32)", d.id, d.length));
    }
    p.cu_seqlens_q.push_back(static_cast<int32_t>(total));
    p.cu_seqlens_k.push_back(static_cast<int32_t>(total));
    p.max_seqlen_q = p.max_seqlen_k = std::max<int32_t>(p.max_seqlen_q, d.length);
  }
  return p;
}

}  // namespace wlb::cuda
