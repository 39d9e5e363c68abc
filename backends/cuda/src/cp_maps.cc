#include "wlb/cuda/cp_maps.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "wlb/shard/row_exchange.hpp"
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

// The CSR transpose of `rows` (each in [0, n)): sources of row g are the positions j with
// rows[j] == g, ascending (a stable counting sort, so sums over them are deterministic).
void Transpose(const std::vector<int32_t>& rows, int64_t n, std::vector<int32_t>& offsets,
               std::vector<int32_t>& sources) {
  offsets.assign(static_cast<size_t>(n) + 1, 0);
  for (int32_t g : rows) ++offsets[static_cast<size_t>(g) + 1];
  for (size_t g = 0; g < static_cast<size_t>(n); ++g) offsets[g + 1] += offsets[g];
  sources.resize(rows.size());
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (size_t j = 0; j < rows.size(); ++j) {
    sources[static_cast<size_t>(next[static_cast<size_t>(rows[j])]++)] = static_cast<int32_t>(j);
  }
}

// Turns `m` (whole-schedule maps of a rank holding `segments`, own rows at source rows
// own_first + i) into the split schedule's (cp_maps.h, CpSchedule::kSplit).
absl::Status SplitSegments(const std::vector<Segment>& segments, const CpAttentionConfig& config,
                           int64_t own_first, CpRankMaps& m) {
  const std::vector<int32_t> keys = std::move(m.key_rows);  // every segment's keys [0, q_end)
  m.key_rows.clear();
  m.problem = EmptyProblem(config);
  m.problem.causal = false;
  m.diagonal = EmptyProblem(config);
  std::vector<int32_t> diagonal_sources;  // the diagonal keys' source rows
  int64_t first_key = 0, first_query = 0;
  for (const Segment& s : segments) {
    const int32_t q_len = static_cast<int32_t>(s.q_len());
    m.diagonal.cu_seqlens_q.push_back(static_cast<int32_t>(first_query + q_len));
    m.diagonal.cu_seqlens_k.push_back(static_cast<int32_t>(first_query + q_len));
    m.diagonal.max_seqlen_q = m.diagonal.max_seqlen_k = std::max(m.diagonal.max_seqlen_q, q_len);
    for (int64_t j = s.q_begin; j < s.q_end; ++j) {
      diagonal_sources.push_back(keys[static_cast<size_t>(first_key + j)]);
    }
    if (s.q_begin > 0) {
      const int32_t prefix = static_cast<int32_t>(s.q_begin);
      m.problem.cu_seqlens_q.push_back(m.problem.total_q() + q_len);
      m.problem.cu_seqlens_k.push_back(m.problem.total_k() + prefix);
      m.problem.max_seqlen_q = std::max(m.problem.max_seqlen_q, q_len);
      m.problem.max_seqlen_k = std::max(m.problem.max_seqlen_k, prefix);
      for (int64_t i = 0; i < q_len; ++i) {
        m.query_rows.push_back(static_cast<int32_t>(first_query + i));
      }
      m.key_rows.insert(m.key_rows.end(), keys.begin() + first_key,
                        keys.begin() + first_key + prefix);
    }
    first_key += s.q_end;
    first_query += q_len;
  }
  // The diagonal is read in place from the rank's own rows: its keys must be them, in order.
  for (size_t i = 0; i < diagonal_sources.size(); ++i) {
    if (diagonal_sources[i] != own_first + static_cast<int64_t>(i)) {
      return absl::InternalError(absl::StrFormat(
          "rank %d: diagonal key %d reads source row %d, not its own row %d", m.rank, i,
          diagonal_sources[i], own_first + static_cast<int64_t>(i)));
    }
  }
  std::vector<int32_t> contributions = m.key_rows;
  contributions.insert(contributions.end(), diagonal_sources.begin(), diagonal_sources.end());
  Transpose(contributions, m.source_rows, m.key_offsets, m.key_sources);
  return absl::OkStatus();
}

}  // namespace

const char* CpScheduleName(CpSchedule schedule) {
  return schedule == CpSchedule::kSplit ? "split" : "whole";
}

int64_t CpKvRowBytes(const CpAttentionConfig& config) {
  return 4 * int64_t{config.num_kv_heads} * config.head_dim;
}

ExchangeKind ChooseCpExchange(const ShardPlan& plan, const CpAttentionConfig& config,
                              const CommModel& comm) {
  return ChooseExchange(ExchangedKvRows(plan, config.mask), plan.rank_capacity,
                        CpKvRowBytes(config), comm)
      .kind;
}

float EffectiveSoftmaxScale(const CpAttentionConfig& config) {
  if (config.softmax_scale != 0.0f || config.head_dim <= 0) return config.softmax_scale;
  return 1.0f / std::sqrt(static_cast<float>(config.head_dim));
}

absl::StatusOr<CpMaps> BuildCpMaps(const ShardPlan& plan, const CpAttentionConfig& config,
                                   ExchangeKind exchange, CpSchedule schedule) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  // Local rows, gathered rows and key rows come from the planning library (wlb/shard/
  // shard_maps.hpp, which also checks the plan, and row_exchange.hpp); this adds the kernel's
  // problem and the dK/dV maps.
  absl::StatusOr<ShardMaps> rows = BuildShardMaps(plan);
  if (!rows.ok()) return rows.status();
  RowExchange row_exact;
  if (exchange == ExchangeKind::kRowExact) row_exact = BuildRowExchange(*rows, plan.rank_capacity);
  CpMaps maps;
  maps.cp_size = plan.cp_size;
  maps.tokens = plan.tokens;
  maps.rank_capacity = plan.rank_capacity;
  maps.exchange = exchange;
  maps.schedule = schedule;
  maps.packed_to_gathered = std::move(rows->packed_to_gathered);
  maps.ranks.resize(plan.ranks.size());
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
    if (exchange == ExchangeKind::kRowExact) {
      RankRowExchange& x = row_exact.ranks[r];
      m.source_rows = x.buffer_rows();
      m.key_rows = std::move(x.key_rows);
      m.send_rows = std::move(x.send_rows);
      m.send_counts = std::move(x.send_counts);
      m.recv_counts = std::move(x.recv_counts);
      Transpose(m.send_rows, m.tokens, m.return_offsets, m.return_sources);
    } else {
      m.source_rows = maps.gathered_rows();
      m.key_rows = std::move(rows->ranks[r].key_rows);
    }
    if (schedule == CpSchedule::kSplit) {
      const int64_t own_first = exchange == ExchangeKind::kRowExact ? 0 : r * plan.rank_capacity;
      if (absl::Status s = SplitSegments(plan.ranks[r].segments, config, own_first, m); !s.ok()) {
        return s;
      }
    } else {
      Transpose(m.key_rows, m.source_rows, m.key_offsets, m.key_sources);
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
