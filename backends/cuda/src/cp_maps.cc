#include "wlb/cuda/cp_maps.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

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
  if (plan.cp_size < 1 || plan.ranks.size() != static_cast<size_t>(plan.cp_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard plan has cp_size %d and %d ranks; need cp_size >= 1 ranks", plan.cp_size,
        plan.ranks.size()));
  }
  if (plan.tokens < 0 || plan.rank_capacity < 0 || plan.tokens > kInt32Max ||
      plan.rank_capacity > kInt32Max / plan.cp_size) {
    return absl::OutOfRangeError(absl::StrFormat(
        "shard plan: %d tokens, %d ranks x rank_capacity %d; gathered rows must fit int32 (%d)",
        plan.tokens, plan.cp_size, plan.rank_capacity, kInt32Max));
  }
  CpMaps maps;
  maps.cp_size = plan.cp_size;
  maps.tokens = plan.tokens;
  maps.rank_capacity = plan.rank_capacity;
  maps.packed_to_gathered.assign(static_cast<size_t>(plan.tokens), -1);
  maps.ranks.resize(plan.ranks.size());

  // Pass 1: local rows and where every packed token lives after the all-gather.
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankShard& shard = plan.ranks[r];
    CpRankMaps& m = maps.ranks[r];
    m.rank = static_cast<int>(r);
    m.problem = EmptyProblem(config);
    for (const Segment& s : shard.segments) {
      if (s.q_begin < 0 || s.q_begin >= s.q_end || s.k_pos < 0 || s.q_pos != s.k_pos + s.q_begin ||
          s.k_pos + s.q_end > plan.tokens) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d segment of document %d: queries [%d, %d) at packed %d, keys at packed %d "
            "do not lie in the %d-token micro-batch",
            r, s.doc_index, s.q_begin, s.q_end, s.q_pos, s.k_pos, plan.tokens));
      }
      if (m.tokens + s.q_len() > plan.rank_capacity) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rank %d: segments hold more than rank_capacity %d tokens", r, plan.rank_capacity));
      }
      const int64_t total_k = m.problem.total_k() + s.q_end;
      if (total_k > kInt32Max) {
        return absl::OutOfRangeError(
            absl::StrFormat("rank %d: %d gathered keys exceed int32", r, total_k));
      }
      for (int64_t i = 0; i < s.q_len(); ++i) {
        int32_t& slot = maps.packed_to_gathered[static_cast<size_t>(s.q_pos + i)];
        if (slot >= 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "packed token %d is held by rank %d and by gathered row %d", s.q_pos + i, r, slot));
        }
        slot = static_cast<int32_t>(r * plan.rank_capacity + m.tokens + i);
        m.local_to_packed.push_back(static_cast<int32_t>(s.q_pos + i));
      }
      m.tokens += s.q_len();
      m.problem.cu_seqlens_q.push_back(static_cast<int32_t>(m.tokens));
      m.problem.cu_seqlens_k.push_back(static_cast<int32_t>(total_k));
      m.problem.max_seqlen_q = std::max<int32_t>(m.problem.max_seqlen_q, s.q_len());
      m.problem.max_seqlen_k = std::max<int32_t>(m.problem.max_seqlen_k, s.q_end);
    }
  }
  for (size_t p = 0; p < maps.packed_to_gathered.size(); ++p) {
    if (maps.packed_to_gathered[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("packed token %d of %d is held by no rank", p, plan.tokens));
    }
  }

  // Pass 2: key rows (now that every token's gathered row is known) and their transpose.
  const int64_t gathered = maps.gathered_rows();
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    CpRankMaps& m = maps.ranks[r];
    m.key_rows.reserve(static_cast<size_t>(m.problem.total_k()));
    for (const Segment& s : plan.ranks[r].segments) {
      for (int64_t j = 0; j < s.q_end; ++j) {
        m.key_rows.push_back(maps.packed_to_gathered[static_cast<size_t>(s.k_pos + j)]);
      }
    }
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
