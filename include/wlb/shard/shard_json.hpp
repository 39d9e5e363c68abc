// The JSON form of shard plans and CP balance, as wlb-plan --cp C --sharding S writes them.
//
//   nlohmann::json mb_json = wlb::MicroBatchToJson(mb);
//   mb_json.update(wlb::ShardPlanToJson(plan));    // adds "sharding", "shards", ...
//   mb_json["cp_balance"] = wlb::CpBalanceToJson(wlb::MeasureCpBalance(plan, model));
//
// ShardPlanToJson gives
//   {"sharding": "per-doc", "requested_sharding": "adaptive", "cp_size": 2, "rank_capacity": 16,
//    "padding_tokens": 0,
//    "shards": [{"rank": 0,
//                "segments": [{"id", "piece", "q_begin", "q_end", "q_pos", "k_pos"}, ...],
//                "cu_seqlens_q": [0, ...], "cu_seqlens_k": [0, ...],
//                "max_seqlen_q", "max_seqlen_k", "tokens", "causal_pairs"}, ...]}
// q_begin / q_end count from the piece's first token; q_pos / k_pos are packed micro-batch
// indices of the first query and of key 0 (see shard_plan.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "wlb/shard/shard_metrics.hpp"
#include "wlb/shard/shard_plan.hpp"
#include "wlb/shard/shard_strategies.hpp"

namespace wlb {

inline nlohmann::json SegmentToJson(const Segment& s) {
  return {{"id", s.id},       {"piece", s.piece}, {"q_begin", s.q_begin},
          {"q_end", s.q_end}, {"q_pos", s.q_pos}, {"k_pos", s.k_pos}};
}

inline nlohmann::json RankShardToJson(const RankShard& r) {
  nlohmann::json segments = nlohmann::json::array();
  for (const Segment& s : r.segments) segments.push_back(SegmentToJson(s));
  return {{"rank", r.rank},
          {"segments", std::move(segments)},
          {"cu_seqlens_q", r.cu_seqlens_q},
          {"cu_seqlens_k", r.cu_seqlens_k},
          {"max_seqlen_q", r.max_seqlen_q},
          {"max_seqlen_k", r.max_seqlen_k},
          {"tokens", r.tokens},
          {"causal_pairs", r.causal_pairs}};
}

// The plan's keys for a micro-batch object (merge them with nlohmann::json::update).
inline nlohmann::json ShardPlanToJson(const ShardPlan& plan) {
  nlohmann::json shards = nlohmann::json::array();
  for (const RankShard& r : plan.ranks) shards.push_back(RankShardToJson(r));
  return {{"sharding", std::string(ShardStrategyName(plan.strategy))},
          {"requested_sharding", std::string(ShardStrategyName(plan.requested))},
          {"cp_size", plan.cp_size},
          {"rank_capacity", plan.rank_capacity},
          {"padding_tokens", plan.padding_tokens()},
          {"shards", std::move(shards)}};
}

inline nlohmann::json CpBalanceToJson(const CpBalance& b) {
  return {{"pair_imbalance", b.pair_imbalance},
          {"model_imbalance", b.model_imbalance},
          {"max_rank_pairs", b.max_rank_pairs},
          {"max_rank_ms", b.max_rank_ms},
          {"mean_rank_ms", b.mean_rank_ms}};
}

// Every strategy's count under its registry summary key ("per_seq", ...); the keys of strategies
// marked summary_only_when_used ("te_zigzag", "doc_degree") appear only when non-zero, so
// summaries of the older strategies keep their exact form.
inline nlohmann::json CpSummaryToJson(const CpSummary& s) {
  nlohmann::json j = {{"micro_batches", s.micro_batches},
                      {"cp_pair_imbalance_mean", s.pair_imbalance_mean},
                      {"cp_pair_imbalance_max", s.pair_imbalance_max},
                      {"cp_model_imbalance_mean", s.model_imbalance_mean},
                      {"cp_model_imbalance_max", s.model_imbalance_max},
                      {"max_rank_ms_total", s.max_rank_ms_total}};
  for (ShardStrategy strategy : ShardStrategy::All()) {
    const ShardStrategyInfo& info = ShardStrategyRow(strategy);
    if (info.summary_key.empty()) continue;
    const int64_t n = s.count(strategy);
    if (n > 0 || !info.summary_only_when_used) j[std::string(info.summary_key)] = n;
  }
  return j;
}

// Predicted CP time and K/V exchange of a plan (PredictCp), per layer.
inline nlohmann::json CpPredictionToJson(const CpPrediction& p) {
  return {{"max_ms", p.max_ms},
          {"attention_max_ms", p.attention_max_ms},
          {"exchanged_bytes", p.exchanged_bytes},
          {"max_rank_bytes", p.max_rank_bytes},
          {"allgather_bytes", p.allgather_bytes},
          {"allgather_share", p.allgather_share},
          {"exchange",
           [&] {
             std::vector<std::string> kinds;
             for (const ExchangeKind k : p.exchange) kinds.emplace_back(ExchangeKindName(k));
             return kinds;
           }()},
          {"max_rank_pairs", p.rank_pairs.empty()
                                 ? int64_t{0}
                                 : *std::max_element(p.rank_pairs.begin(), p.rank_pairs.end())}};
}

}  // namespace wlb
