// wlb._wlb bindings: CP shard plans and their per-rank index maps.
#include "py_common.h"

namespace wlb_py {

// The CP options of plan_shards' and predict_cp_of_placement's keyword arguments (checked where
// the library plans or prices).
wlb::CpPlanOptions CpOptions(double cp_link_gbps, const std::string& layer_mix,
                             double cp_latency_us, double cp_gather_gbps) {
  wlb::CpPlanOptions options{.comm = {.link_gbps = cp_link_gbps,
                                      .latency_us = cp_latency_us,
                                      .gather_gbps = cp_gather_gbps}};
  options.mix = Unwrap(wlb::LayerMix::Parse(layer_mix));
  return options;
}

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
            const wlb::AttentionMask& mask = r.plan->Mask();
            std::vector<int64_t> keys;
            for (const wlb::Segment& s : r.shard().segments) {
              wlb::ForEachKernelSegment(mask, s.q_begin, s.q_end,
                                        [&](int64_t, int64_t q1, int64_t k0) {
                                          for (int64_t j = k0; j < q1; ++j) {
                                            keys.push_back(s.k_pos + j);
                                          }
                                        });
            }
            return ToNumpy(std::move(keys));
          },
          "Packed rows of this rank's keys under plan.mask, in its cu_seqlens_k layout (int64).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "key_rows", [](const RankRef& r) { return Widen(r.masked_maps().key_rows); },
          "Rows of the all-gathered K/V (cp_size x rank_capacity, rank-major) holding this "
          "rank's keys under plan.mask, in its cu_seqlens_k layout (int64).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "row_exchange",
          [](const RankRef& r) {
            const wlb::RankRowExchange& x =
                r.plan->RowExchange().ranks[static_cast<size_t>(r.rank)];
            nb::dict d;
            d["send_rows"] = Widen(x.send_rows);
            d["send_counts"] = ToNumpy(std::vector<int64_t>(x.send_counts));
            d["recv_counts"] = ToNumpy(std::vector<int64_t>(x.recv_counts));
            d["key_rows"] = Widen(x.key_rows);
            return d;
          },
          "This rank's part of the row-exact K/V exchange under plan.mask "
          "(wlb::BuildRowExchange): send_rows, its local rows the other ranks need, grouped by "
          "destination rank; send_counts / recv_counts, rows sent to / received from each rank "
          "(all_to_all_single's splits; 0 for itself); key_rows, its keys' rows in its own rows "
          "followed by the received ones (in cu_seqlens_k order). All int64.")
      .def_prop_ro(
          "cu_seqlens_q",
          [](const RankRef& r) {
            return ToNumpy(r.causal() ? r.shard().cu_seqlens_q : r.masked_maps().cu_seqlens_q);
          },
          "Query prefix sums of the kernel segments under plan.mask (int32): the plan's "
          "segments, except that a chunked mask cuts them at chunk boundaries.",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "cu_seqlens_k",
          [](const RankRef& r) {
            return ToNumpy(r.causal() ? r.shard().cu_seqlens_k : r.masked_maps().cu_seqlens_k);
          },
          "Key prefix sums of the kernel segments under plan.mask (int32): segment i has the "
          "piece keys [key_begin[i], its last query], bottom-right aligned.",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "max_seqlen_q",
          [](const RankRef& r) {
            return r.causal() ? r.shard().max_seqlen_q : r.masked_maps().max_seqlen_q;
          },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "max_seqlen_k",
          [](const RankRef& r) {
            return r.causal() ? r.shard().max_seqlen_k : r.masked_maps().max_seqlen_k;
          },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "key_begin",
          [](const RankRef& r) {
            if (r.causal()) return ToNumpy(std::vector<int64_t>(r.shard().segments.size(), 0));
            return ToNumpy(r.masked_maps().key_begin);
          },
          "Per kernel segment: the position in its piece of its first key (int64; 0 under "
          "causal masks).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "kernel_segment",
          [](const RankRef& r) {
            if (r.causal()) {
              std::vector<int64_t> all(r.shard().segments.size());
              for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
              return ToNumpy(std::move(all));
            }
            return Widen(r.masked_maps().segment);
          },
          "Per kernel segment: its plan segment (an index into segment_ids, q_begin, ...).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "pairs",
          [](const RankRef& r) {
            const wlb::AttentionMask& mask = r.plan->Mask();
            int64_t pairs = 0;
            for (const wlb::Segment& s : r.shard().segments)
              pairs += mask.Pairs(s.q_begin, s.q_end);
            return pairs;
          },
          "(query, key) pairs its queries attend under plan.mask.", nb::rv_policy::automatic)
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
          "The strategy used (adaptive resolves to the fastest predicted plan within the memory "
          "cap: per-seq-ordered, per-doc, hybrid, doc-degree, per-seq, balanced-chunks or "
          "contiguous; "
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
          "layer_mix", [](const PyShardPlan& p) { return p.mix.Name(); },
          "The layer mix plan_shards planned for ('window:4096x27,causalx5').",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "mask",
          [](const PyShardPlan& p) -> std::optional<std::string> {
            if (!p.mask) return std::nullopt;
            return p.mask->Name();
          },
          "The attention mask the plan's key rows and kernel segments are for, and that "
          "wlb.torch.cp_attention applies: the layer mix's mask when it has one, else None until "
          "for_mask picks one.",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "kernel_window", [](const PyShardPlan& p) { return wlb::KernelWindow(p.Mask()); },
          "Keys per query row an executor keeps, the last ones up to its own, in every kernel "
          "segment: the window w of a sliding-window mask, 0 for no limit.",
          nb::rv_policy::automatic)
      .def(
          "for_mask",
          [](const PyShardPlan& p, const std::string& text) {
            const wlb::AttentionMask mask = Unwrap(wlb::AttentionMask::Parse(text));
            bool in_mix = false;
            for (const auto& [m, count] : p.mix.layers) in_mix |= m == mask;
            if (!in_mix) {
              throw nb::value_error(("mask " + mask.Name() + " is not in the plan's layer mix " +
                                     p.mix.Name() + "; plan with layer_mix naming it")
                                        .c_str());
            }
            auto out = std::make_shared<PyShardPlan>(p);
            out->mask = mask;
            out->maps.reset();  // under the new mask on first use
            out->row_exchange.reset();
            return out;
          },
          "mask"_a,
          "The same plan for one layer's mask of its layer mix ('causal', 'window:W', "
          "'chunk:C'): key rows, kernel segments and cp_attention follow it.")
      .def(
          "exchange",
          [](const PyShardPlan& p, int64_t kv_row_bytes) {
            if (kv_row_bytes < 1 || kv_row_bytes > (int64_t{1} << 30)) {
              throw nb::value_error(
                  absl::StrFormat("kv_row_bytes must be in [1, 2^30], got %d", kv_row_bytes)
                      .c_str());
            }
            const std::vector<wlb::RankExchange> x = wlb::ExchangedKvRows(p.plan, p.Mask());
            const wlb::ExchangeChoice c =
                wlb::ChooseExchange(x, p.plan.rank_capacity, kv_row_bytes, p.comm);
            std::vector<int64_t> recv, send;
            for (const wlb::RankExchange& r : x) {
              recv.push_back(r.recv_rows);
              send.push_back(r.send_rows);
            }
            nb::dict d;
            d["kind"] = std::string(wlb::ExchangeKindName(c.kind));
            d["row_exact_rows"] = c.row_exact_rows;
            d["allgather_rows"] = c.allgather_rows;
            d["row_exact_ms"] = c.row_exact_ms;
            d["allgather_ms"] = c.allgather_ms;
            d["recv_rows"] = ToNumpy(std::move(recv));
            d["send_rows"] = ToNumpy(std::move(send));
            return d;
          },
          "kv_row_bytes"_a,
          "The K/V exchange wlb.torch.cp_attention runs for this plan under plan.mask, with rows "
          "of kv_row_bytes (K and V of one token): wlb::ChooseExchange over the link plan_shards "
          "was given (cp_link_gbps, cp_latency_us). A dict: kind ('row-exact' or 'all-gather'), "
          "row_exact_rows / allgather_rows (the slowest rank's rows of each), row_exact_ms / "
          "allgather_ms (their predicted times), recv_rows / send_rows (per rank, the other "
          "ranks' rows its keys need and its rows the others need; int64).")
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
          "mix plan_shards was given, each layer kind with the exchange ShardPlan.exchange "
          "picks): max_ms, attention_max_ms, exchanged_bytes, max_rank_bytes, allgather_bytes, "
          "allgather_share, exchange (per layer kind), max_rank_pairs.",
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
      " (see shard_strategy_names()). cp_link_gbps (K/V link GB/s per direction), cp_latency_us "
      "(per exchange collective) and layer_mix "
      "('window:4096x27,causalx5': the layers' attention masks) steer " +
      wlb::ShardStrategyNameList(
          " and ",
          [](const wlb::ShardStrategyInfo& i) { return i.uses.cp_link || i.uses.layer_mix; }) +
      " and cp_prediction. The plan carries the mix (layer_mix); its key rows, kernel segments "
      "and wlb.torch.cp_attention follow plan.mask, the mix's mask (for a mix of several, "
      "plan.for_mask(mask) picks the layer's). cp_gather_gbps (GB/s at which a rank copies its "
      "segments' key rows into the contiguous layout of one varlen call, read and written once, "
      "as cp_attention's index_select does; 0, the default, prices no copy) enters the ranking "
      "of " +
      wlb::ShardStrategyNameList(" and ",
                                 [](const wlb::ShardStrategyInfo& i) { return i.uses.key_copy; }) +
      " and cp_prediction. cp_memory_cap_percent (the most tokens one rank may hold, in percent of "
      "T / C, in [100, " +
      std::to_string(wlb::kMaxCpMemoryCapPercent) + "]; " +
      std::to_string(wlb::kDefaultCpMemoryCapPercent) +
      ", the default, is 1.01 x T / C; larger lets adaptive trade memory for time) caps every "
      "rank of " +
      wlb::ShardStrategyNameList(
          " and ", [](const wlb::ShardStrategyInfo& i) { return i.uses.memory_cap; }) +
      ".";
  m.def(
      "shard_strategy_names",
      [] {
        std::vector<std::string> names;
        for (const wlb::ShardStrategyInfo& info : wlb::ShardStrategies()) {
          names.emplace_back(info.name);
        }
        return names;
      },
      "Names plan_shards accepts (the CP strategy registry, wlb/shard/strategy_table.hpp).");
  m.def(
      "plan_shards",
      [](nb::handle micro_batch, int cp, const std::string& strategy,
         std::optional<wlb::KernelModel> kernel_model, double cp_link_gbps,
         const std::string& layer_mix, double cp_latency_us, double cp_gather_gbps,
         int64_t cp_memory_cap_percent) {
        const wlb::MicroBatch mb = AsMicroBatch(micro_batch);
        const wlb::ShardStrategy s = Unwrap(wlb::ParseShardStrategy(strategy));
        const wlb::KernelModel& model = kernel_model ? *kernel_model : wlb::KernelModel::Default();
        wlb::CpPlanOptions options =
            CpOptions(cp_link_gbps, layer_mix, cp_latency_us, cp_gather_gbps);
        options.memory_cap_percent = cp_memory_cap_percent;
        auto out = std::make_shared<PyShardPlan>();
        out->mix = options.mix;
        out->comm = options.comm;
        // The executor's mask is the mix's when it has only one.
        out->mask = options.mix.layers.front().first;
        for (const auto& [mask, count] : options.mix.layers) {
          if (mask != *out->mask) out->mask.reset();
        }
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
      "cp_latency_us"_a = wlb::kDefaultCpLatencyUs, "cp_gather_gbps"_a = 0.0,
      "cp_memory_cap_percent"_a = wlb::kDefaultCpMemoryCapPercent,
      nb::sig("def plan_shards(micro_batch: MicroBatch | Documents | numpy.typing.ArrayLike, cp: "
              "int, strategy: str = 'adaptive', kernel_model: KernelModel | None = None, "
              "cp_link_gbps: float = 450.0, layer_mix: str = 'causal', "
              "cp_latency_us: float = 10.0, cp_gather_gbps: float = 0.0, "
              "cp_memory_cap_percent: int = 101) -> ShardPlan"),
      plan_shards_doc.c_str());
  m.def(
      "predict_cp_of_placement",
      [](nb::handle micro_batch, int cp, nb::handle owner,
         std::optional<wlb::KernelModel> kernel_model, double cp_link_gbps,
         const std::string& layer_mix, double cp_latency_us, double cp_gather_gbps) {
        const wlb::MicroBatch mb = AsMicroBatch(micro_batch);
        const std::vector<int64_t> ranks = ToInt64(owner, "owner");
        const wlb::KernelModel& model = kernel_model ? *kernel_model : wlb::KernelModel::Default();
        const wlb::CpPlanOptions options =
            CpOptions(cp_link_gbps, layer_mix, cp_latency_us, cp_gather_gbps);
        absl::StatusOr<wlb::CpPrediction> p;
        {
          nb::gil_scoped_release release;
          p = wlb::PredictCpOfPlacement(mb, cp, ranks, model, options);
        }
        return JsonToDict(wlb::CpPredictionToJson(Unwrap(std::move(p))));
      },
      "micro_batch"_a, "cp"_a, "owner"_a, "kernel_model"_a = nb::none(),
      "cp_link_gbps"_a = wlb::kDefaultCpLinkGbps, "layer_mix"_a = "causal",
      "cp_latency_us"_a = wlb::kDefaultCpLatencyUs, "cp_gather_gbps"_a = 0.0,
      nb::sig("def predict_cp_of_placement(micro_batch: MicroBatch | Documents | "
              "numpy.typing.ArrayLike, cp: int, owner: numpy.typing.ArrayLike, kernel_model: "
              "KernelModel | None = None, cp_link_gbps: float = 450.0, layer_mix: str = "
              "'causal', cp_latency_us: float = 10.0, cp_gather_gbps: float = 0.0) -> dict"),
      "Another balancer's placement priced as plan_shards prices its plans "
      "(wlb::PredictCpOfPlacement): owner[t] is the rank holding packed token t (an integer "
      "array of micro_batch's tokens, every value in [0, cp)); a rank's consecutive tokens of one "
      "document are one varlen segment and its buffer holds the largest rank's tokens. Returns "
      "ShardPlan.cp_prediction's dict (max_ms: the slowest rank's attention + K/V exchange, what "
      "adaptive ranks plans by) under the same kernel model, link and layer mix arguments as "
      "plan_shards. A bad owner array raises ValueError naming the token and its rank.");
}

}  // namespace wlb_py
