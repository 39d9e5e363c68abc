// wlb._wlb bindings: CP shard plans and their per-rank index maps.
#include "py_common.h"

namespace wlb_py {

void BindShards(nb::module_& m) {
  // ---- shard plans --------------------------------------------------------------------------
  nb::class_<RankRef>(m, "RankShard",
                      "One CP rank's share of a micro-batch, as index arrays for PyTorch.")
      .def_prop_ro(
          "rank", [](const RankRef& r) { return r.rank; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "token_indices", [](const RankRef& r) { return Widen(r.maps().local_to_packed); },
          "Packed micro-batch rows this rank holds, in its local order (int64).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "key_indices",
          [](const RankRef& r) {
            std::vector<int64_t> keys;
            for (const wlb::Segment& s : r.shard().segments) {
              for (int64_t j = 0; j < s.q_end; ++j) keys.push_back(s.k_pos + j);
            }
            return ToNumpy(std::move(keys));
          },
          "Packed rows of this rank's keys, in its cu_seqlens_k layout (int64).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "key_rows", [](const RankRef& r) { return Widen(r.maps().key_rows); },
          "Rows of the all-gathered K/V (cp_size x rank_capacity, rank-major) holding this "
          "rank's keys, in its cu_seqlens_k layout (int64).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "cu_seqlens_q", [](const RankRef& r) { return ToNumpy(r.shard().cu_seqlens_q); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "cu_seqlens_k", [](const RankRef& r) { return ToNumpy(r.shard().cu_seqlens_k); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "max_seqlen_q", [](const RankRef& r) { return r.shard().max_seqlen_q; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "max_seqlen_k", [](const RankRef& r) { return r.shard().max_seqlen_k; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "tokens", [](const RankRef& r) { return r.shard().tokens; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "causal_pairs", [](const RankRef& r) { return r.shard().causal_pairs; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "predicted_ms",
          [](const RankRef& r) { return r.plan->predicted_ms[static_cast<size_t>(r.rank)]; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "segment_ids",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.id; }); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "segment_pieces",
          [](const RankRef& r) {
            return SegmentColumn(r, [](auto& s) { return int64_t{s.piece}; });
          },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "q_begin",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.q_begin; }); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "q_end",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.q_end; }); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "q_pos",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.q_pos; }); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "k_pos",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.k_pos; }); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "doc_index",
          [](const RankRef& r) { return SegmentColumn(r, [](auto& s) { return s.doc_index; }); },
          nb::rv_policy::automatic);

  nb::class_<PyShardPlan>(m, "ShardPlan", "The CP shard plan of one micro-batch.")
      .def_prop_ro(
          "strategy",
          [](const PyShardPlan& p) { return std::string(wlb::ShardStrategyName(p.plan.strategy)); },
          "The strategy used (adaptive resolves to per-seq-ordered, per-doc or hybrid; "
          "doc-degree to doc-degree or the per-doc, hybrid or per-seq-ordered plan it predicted "
          "faster).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "requested",
          [](const PyShardPlan& p) {
            return std::string(wlb::ShardStrategyName(p.plan.requested));
          },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "cp_size", [](const PyShardPlan& p) { return p.plan.cp_size; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "tokens", [](const PyShardPlan& p) { return p.plan.tokens; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "rank_capacity", [](const PyShardPlan& p) { return p.plan.rank_capacity; },
          "Rows of every rank's local buffer, padding included.", nb::rv_policy::automatic)
      .def_prop_ro(
          "padding_tokens", [](const PyShardPlan& p) { return p.plan.padding_tokens(); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "packed_to_gathered",
          [](const PyShardPlan& p) { return Widen(p.Maps().packed_to_gathered); },
          "All-gathered row of every packed token (int64).", nb::rv_policy::automatic)
      .def_prop_ro(
          "ranks",
          [](const std::shared_ptr<PyShardPlan>& p) {
            std::vector<RankRef> out;
            for (int r = 0; r < p->plan.cp_size; ++r) out.push_back(RankRef{p, r});
            return out;
          },
          nb::rv_policy::automatic)
      .def("__len__", [](const PyShardPlan& p) { return p.plan.ranks.size(); })
      .def("__getitem__",
           [](const std::shared_ptr<PyShardPlan>& p, int r) {
             if (r < 0) r += p->plan.cp_size;
             if (r < 0 || r >= p->plan.cp_size) throw nb::index_error("rank out of range");
             return RankRef{p, r};
           })
      .def_prop_ro(
          "predicted_ms", [](const PyShardPlan& p) { return ToNumpy(p.predicted_ms); },
          "Predicted attention latency of every rank (float64, ms).", nb::rv_policy::automatic)
      .def_prop_ro(
          "cp_prediction",
          [](const PyShardPlan& p) { return JsonToDict(wlb::CpPredictionToJson(p.cp_prediction)); },
          "Predicted per-layer CP time with K/V exchange (wlb::PredictCp under the link and layer "
          "mix plan_shards was given): max_ms, attention_max_ms, exchanged_bytes, "
          "max_rank_bytes, allgather_bytes.",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "balance",
          [](const PyShardPlan& p) { return JsonToDict(wlb::CpBalanceToJson(p.balance)); },
          "CP imbalance in causal pairs and under the kernel model.", nb::rv_policy::automatic)
      .def(
          "to_json", [](const PyShardPlan& p) { return wlb::ShardPlanToJson(p.plan).dump(); },
          "The plan's keys as wlb-plan --cp writes them on a micro-batch.");

  // The strategy list comes from the registry; nanobind keeps the pointer, hence static.
  static const std::string plan_shards_doc =
      "Cuts a micro-batch (a MicroBatch, Documents or array of lengths) over `cp` CP ranks: " +
      wlb::ShardStrategyNameList(" or ") +
      " (see shard_strategy_names()). cp_link_gbps (K/V link GB/s per direction) and layer_mix "
      "('window:4096x27,causalx5': the layers' attention masks) steer " +
      wlb::ShardStrategyNameList(
          " and ",
          [](const wlb::ShardStrategyInfo& i) { return i.uses.cp_link || i.uses.layer_mix; }) +
      " and cp_prediction.";
  m.def(
      "shard_strategy_names",
      [] {
        std::vector<std::string> names;
        for (const wlb::ShardStrategyInfo& info : wlb::ShardStrategies()) {
          names.emplace_back(info.name);
        }
        return names;
      },
      "Names plan_shards accepts (the CP strategy registry, wlb/shard/shard_strategies.hpp).");
  m.def(
      "plan_shards",
      [](nb::handle micro_batch, int cp, const std::string& strategy,
         std::optional<wlb::KernelModel> kernel_model, double cp_link_gbps,
         const std::string& layer_mix) {
        const wlb::MicroBatch mb = AsMicroBatch(micro_batch);
        const wlb::ShardStrategy s = Unwrap(wlb::ParseShardStrategy(strategy));
        const wlb::KernelModel model = kernel_model.value_or(wlb::KernelModel::Default());
        wlb::CpPlanOptions options{.comm = {.link_gbps = cp_link_gbps}};
        options.mix = Unwrap(wlb::LayerMix::Parse(layer_mix));
        auto out = std::make_shared<PyShardPlan>();
        absl::Status status;
        {
          nb::gil_scoped_release release;
          absl::StatusOr<wlb::ShardPlan> plan = wlb::PlanShards(mb, cp, s, model, options);
          if (plan.ok()) {
            out->plan = *std::move(plan);
            out->predicted_ms = wlb::PredictRankMs(out->plan, model);
            out->balance = wlb::MeasureCpBalance(out->plan, model);
            out->cp_prediction = wlb::PredictCp(out->plan, model, options);
          } else {
            status = plan.status();
          }
        }
        Check(status);
        return out;
      },
      "micro_batch"_a, "cp"_a, "strategy"_a = "adaptive", "kernel_model"_a = nb::none(),
      "cp_link_gbps"_a = wlb::kDefaultCpLinkGbps, "layer_mix"_a = "causal",
      nb::sig("def plan_shards(micro_batch: MicroBatch | Documents | numpy.typing.ArrayLike, cp: "
              "int, strategy: str = 'adaptive', kernel_model: KernelModel | None = None, "
              "cp_link_gbps: float = 450.0, layer_mix: str = 'causal') -> ShardPlan"),
      plan_shards_doc.c_str());
}

}  // namespace wlb_py
