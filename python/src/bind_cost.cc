// wlb._wlb bindings: cost models (CostModel, presets, profile fits) and the kernel model.
#include "py_common.h"

namespace wlb_py {

void BindCost(nb::module_& m) {
  // ---- cost models --------------------------------------------------------------------------
  nb::class_<wlb::CostModel>(m, "CostModel",
                             "W(d) = attn_quadratic*d^2 + attn_linear*d + linear_per_token*d + "
                             "per_document: the work of one document of d tokens; plus "
                             "dense_quadratic*T^2 per micro-batch of T tokens under a dense "
                             "attention (sdpa / eager over a packed mask).")
      .def(
          "__init__",
          [](wlb::CostModel* self, double attn_quadratic, double attn_linear,
             double linear_per_token, double per_document, std::string unit,
             std::string description, double dense_quadratic) {
            wlb::CostModel c{.attn_quadratic = attn_quadratic,
                             .attn_linear = attn_linear,
                             .linear_per_token = linear_per_token,
                             .per_document = per_document,
                             .dense_quadratic = dense_quadratic,
                             .unit = std::move(unit),
                             .description = std::move(description)};
            CheckCostModel(c);
            new (self) wlb::CostModel(std::move(c));
          },
          "attn_quadratic"_a = 0.0, "attn_linear"_a = 0.0, "linear_per_token"_a = 0.0,
          "per_document"_a = 0.0, "unit"_a = "flop", "description"_a = "",
          "dense_quadratic"_a = 0.0)
      .def_static(
          "from_preset",
          [](const std::string& name) { return Unwrap(wlb::CostModelFromPreset(name)); }, "name"_a,
          "The model of a preset (see CostModel.presets()): forward FLOPs, or a calibration's ms.")
      .def_static(
          "presets", [] { return wlb::CostPresetNames(); },
          "Names of the built-in cost presets: FLOP models of the transformer shapes, then the "
          "shipped calibrations (fwd+bwd ms measured on a GPU, e.g. h100-flash-llama2-7b-tp8).")
      .def_static(
          "from_shape",
          [](int64_t hidden, int64_t ffn, int64_t heads, int64_t kv_heads, int64_t layers,
             std::string name, const std::string& attention) {
            return Unwrap(wlb::CostModelFromShape({.name = std::move(name),
                                                   .hidden = hidden,
                                                   .ffn = ffn,
                                                   .heads = heads,
                                                   .kv_heads = kv_heads,
                                                   .layers = layers},
                                                  Unwrap(wlb::FindAttentionFamily(attention))));
          },
          "hidden"_a, "ffn"_a, "heads"_a, "kv_heads"_a, "layers"_a, "name"_a = "custom",
          "attention"_a = "per-document",
          "Forward-FLOP model of a LLaMA-style shape under an attention family "
          "(CostModel.attention_families()): 'per-document' (varlen kernels) or 'dense' (sdpa / "
          "eager over a packed mask).")
      .def_static(
          "attention_families",
          [] {
            std::vector<std::string> names;
            for (const auto& f : wlb::kAttentionFamilies) names.emplace_back(f.name);
            return names;
          },
          "The attention families a cost can follow: 'per-document', 'dense'.")
      .def_static(
          "fit",
          [](nb::handle lengths, nb::handle latencies) {
            const std::vector<int64_t> l = ToInt64(lengths, "lengths");
            const std::vector<double> ms = ToDouble(latencies, "latencies");
            if (l.size() != ms.size()) {
              Raise(absl::InvalidArgumentError(absl::StrFormat(
                  "lengths has %d entries but latencies has %d", l.size(), ms.size())));
            }
            std::vector<wlb::ProfilePoint> points;
            for (size_t i = 0; i < l.size(); ++i) points.push_back({l[i], ms[i]});
            return Unwrap(wlb::FitCostModel(points)).model;
          },
          "lengths"_a, "latencies"_a,
          nb::sig("def fit(lengths: numpy.typing.ArrayLike, latencies: numpy.typing.ArrayLike) -> "
                  "CostModel"),
          "Fits a*d^2 + b*d + c (ms, all >= 0) to measured latencies; the fit errors are in "
          "`description`.")
      .def_static(
          "from_profile",
          [](const std::string& path) {
            return Unwrap(wlb::FitCostModel(Unwrap(wlb::ReadProfileCsv(path), ErrorKind::kFile)))
                .model;
          },
          "path"_a, "Reads a length -> latency CSV (as wlb-plan --cost) and fits it.")
      .def_ro("attn_quadratic", &wlb::CostModel::attn_quadratic)
      .def_ro("attn_linear", &wlb::CostModel::attn_linear)
      .def_ro("linear_per_token", &wlb::CostModel::linear_per_token)
      .def_ro("per_document", &wlb::CostModel::per_document)
      .def_ro("dense_quadratic", &wlb::CostModel::dense_quadratic)
      .def_prop_ro(
          "attention_family",
          [](const wlb::CostModel& c) { return std::string(wlb::AttentionFamilyName(c.family())); },
          "The attention family: 'dense' when dense_quadratic > 0, else 'per-document'.")
      .def(
          "micro_batch",
          [](const wlb::CostModel& c, nb::handle lengths) {
            return c.MicroBatch(ToInt64(lengths, "lengths"));
          },
          "lengths"_a,
          "The cost of one micro-batch of these document lengths (dense term included).")
      .def_ro("unit", &wlb::CostModel::unit)
      .def_ro("description", &wlb::CostModel::description)
      .def(
          "__call__", [](const wlb::CostModel& c, int64_t d) { return c(d); }, "length"_a,
          "W(d) of one document.")
      .def(
          "__call__",
          [](const wlb::CostModel& c, nb::handle lengths) {
            std::vector<double> out;
            for (int64_t d : ToInt64(lengths, "lengths")) out.push_back(c(d));
            return ToNumpy(std::move(out));
          },
          "lengths"_a, "W(d) of every length (float64 array).")
      .def(
          "attention", [](const wlb::CostModel& c, int64_t d) { return c.Attention(d); },
          "length"_a, "The attention part W_a(d).")
      .def(
          "linear", [](const wlb::CostModel& c, int64_t d) { return c.Linear(d); }, "length"_a,
          "The linear part W_l(d), per-document constant included.")
      .def("__repr__", [](const wlb::CostModel& c) {
        return absl::StrFormat("CostModel(%s)", c.description.empty() ? c.unit : c.description);
      });

  // ---- micro-batch measurements as a cost ---------------------------------------------------
  nb::class_<wlb::PredictionError>(m, "PredictionError",
                                   "Relative errors |scale * predicted - measured| / measured "
                                   "of a model over measured micro-batches.")
      .def_ro("scale", &wlb::PredictionError::scale)
      .def_ro("mean_relative", &wlb::PredictionError::mean_relative)
      .def_ro("max_relative", &wlb::PredictionError::max_relative)
      .def_ro("points", &wlb::PredictionError::points)
      .def("__repr__", [](const wlb::PredictionError& e) {
        return absl::StrFormat("PredictionError(mean_relative=%.4g, max_relative=%.4g, points=%d)",
                               e.mean_relative, e.max_relative, e.points);
      });
  nb::class_<wlb::MicroBatchFit>(
      m, "MicroBatchFit",
      "ms = a*sum(d^2) + b*sum(d) + c*documents + per_call fitted to measured micro-batches "
      "(wlb.fit_micro_batch_cost); model is W(d) = a d^2 + b d + c in ms.")
      .def_ro("model", &wlb::MicroBatchFit::model)
      .def_ro("per_call_ms", &wlb::MicroBatchFit::per_call_ms)
      .def_ro("in_sample", &wlb::MicroBatchFit::in_sample)
      .def_ro("held_out", &wlb::MicroBatchFit::held_out)
      .def_ro("held_out_rule", &wlb::MicroBatchFit::held_out_rule)
      .def_ro("samples", &wlb::MicroBatchFit::samples)
      .def(
          "predict",
          [](const wlb::MicroBatchFit& fit, nb::handle lengths) {
            return wlb::PredictMicroBatchMs(fit, ToInt64(lengths, "lengths"));
          },
          "lengths"_a, "Predicted ms of one micro-batch of these document lengths.")
      .def("__repr__", [](const wlb::MicroBatchFit& fit) {
        return absl::StrFormat("MicroBatchFit(%s)", fit.model.description);
      });
  m.def(
      "fit_micro_batch_cost",
      [](nb::handle lengths, nb::handle ms, nb::handle step, const std::string& attention) {
        RejectBytesAndText(lengths, "lengths");
        std::vector<wlb::MicroBatchSample> samples;
        for (nb::handle row : lengths) {
          const std::string what = absl::StrFormat("lengths[%d]", samples.size());
          samples.push_back({.lengths = ToInt64(row, what.c_str()),
                             .where = absl::StrFormat("row %d", samples.size())});
        }
        const std::vector<double> times = ToDouble(ms, "ms");
        if (times.size() != samples.size()) {
          Raise(absl::InvalidArgumentError(absl::StrFormat(
              "lengths has %d micro-batches but ms has %d times", samples.size(), times.size())));
        }
        for (size_t i = 0; i < times.size(); ++i) samples[i].ms = times[i];
        if (!step.is_none()) {
          const std::vector<int64_t> steps = ToInt64(step, "step");
          if (steps.size() != samples.size()) {
            Raise(absl::InvalidArgumentError(
                absl::StrFormat("lengths has %d micro-batches but step has %d steps",
                                samples.size(), steps.size())));
          }
          for (size_t i = 0; i < steps.size(); ++i) samples[i].step = steps[i];
        }
        return Unwrap(wlb::FitMicroBatchCost(samples, Unwrap(wlb::FindAttentionFamily(attention))));
      },
      "lengths"_a, "ms"_a, nb::kw_only(), "step"_a = nb::none(), "attention"_a = "per-document",
      nb::sig("def fit_micro_batch_cost(lengths: typing.Sequence[numpy.typing.ArrayLike], ms: "
              "numpy.typing.ArrayLike, *, step: numpy.typing.ArrayLike | None = None, "
              "attention: str = 'per-document') -> MicroBatchFit"),
      "Fits ms = a*sum(d^2) + b*sum(d) + c*documents + per_call (all >= 0, relative error) to "
      "measured micro-batches: lengths[i] is micro-batch i's document lengths, ms[i] its "
      "measured time (e.g. forward + backward). Held-out error: fits on half the rows predict "
      "the other half and back, halves by step parity when step is given, else by row parity. "
      "attention='dense' fits a*T^2 (T = sum(d), the micro-batch's tokens: dense_quadratic) "
      "instead of a*sum(d^2). "
      "ValueError naming the row and value for bad input.");
  m.def(
      "read_micro_batch_measurements",
      [](const std::string& path) {
        const std::vector<wlb::MicroBatchSample> rows =
            Unwrap(wlb::ReadMicroBatchCsv(path), ErrorKind::kFile);
        nb::list lengths;
        std::vector<double> ms;
        std::vector<int64_t> steps;
        for (const wlb::MicroBatchSample& s : rows) {
          lengths.append(ToNumpy(std::vector<int64_t>(s.lengths)));
          ms.push_back(s.ms);
          if (s.step) steps.push_back(*s.step);
        }
        nb::dict out;
        out["lengths"] = lengths;
        out["ms"] = ToNumpy(std::move(ms));
        out["step"] = rows.front().step ? nb::cast(ToNumpy(std::move(steps))) : nb::none();
        return out;
      },
      "path"_a,
      "Reads a micro-batch measurement CSV (a 'lengths' column of ';'-separated lengths, 'ms' or "
      "'forward_ms' + 'backward_ms', optional 'step'; as wlb-plan --cost reads it) into "
      "{'lengths': [int64 arrays], 'ms': float64 array, 'step': int64 array or None}, so "
      "wlb.fit_micro_batch_cost(**wlb.read_micro_batch_measurements(path)) fits it.");

  nb::class_<wlb::KernelModel>(m, "KernelModel",
                               "Predicted latency of causal varlen attention segments (the "
                               "kernel model of adaptive and hybrid sharding).")
      .def(
          "__init__",
          [](wlb::KernelModel* self) { new (self) wlb::KernelModel(wlb::KernelModel::Default()); },
          "The default: wlb's flash kernel forward measured on an H100 (an embedded table, tile "
          "128, 32 heads x 128); KernelModel.analytic() is the analytic curve.")
      .def_static(
          "analytic",
          [](int64_t heads, int64_t head_dim, int64_t tile_q, int64_t tile_k, double peak_tflops,
             double q_half, double kv_half, double segment_overhead_ms) {
            return Unwrap(wlb::KernelModel::Analytic(
                {.shape = MakeKernelShape(heads, head_dim, tile_q, tile_k),
                 .peak_tflops = peak_tflops,
                 .q_half = q_half,
                 .kv_half = kv_half,
                 .segment_overhead_ms = segment_overhead_ms}));
          },
          "heads"_a = 32, "head_dim"_a = 128, "tile_q"_a = 128, "tile_k"_a = 128,
          "peak_tflops"_a = 345.0, "q_half"_a = 160.0, "kv_half"_a = 0.0,
          "segment_overhead_ms"_a = 1e-3, "The analytic model with custom constants.")
      .def_static(
          "from_profile",
          [](const std::string& path, int64_t heads, int64_t head_dim, int64_t tile_q,
             int64_t tile_k, double segment_overhead_ms) {
            return Unwrap(
                wlb::ReadKernelProfileCsv(path, MakeKernelShape(heads, head_dim, tile_q, tile_k),
                                          segment_overhead_ms),
                ErrorKind::kFile);
          },
          "path"_a, "heads"_a = 32, "head_dim"_a = 128, "tile_q"_a = 128, "tile_k"_a = 128,
          "segment_overhead_ms"_a = 0.0,
          "Reads a q_len,kv_len,ms profile table (as wlb-plan --kernel-profile).")
      .def_static(
          "from_points",
          [](nb::handle q_len, nb::handle kv_len, nb::handle ms, int64_t heads, int64_t head_dim,
             int64_t tile_q, int64_t tile_k, double segment_overhead_ms) {
            const std::vector<int64_t> q = ToInt64(q_len, "q_len");
            const std::vector<int64_t> kv = ToInt64(kv_len, "kv_len");
            const std::vector<double> t = ToDouble(ms, "ms");
            if (q.size() != kv.size() || q.size() != t.size()) {
              Raise(absl::InvalidArgumentError(
                  absl::StrFormat("q_len, kv_len and ms must have the same size, got %d, %d, %d",
                                  q.size(), kv.size(), t.size())));
            }
            std::vector<wlb::KernelProfilePoint> points;
            for (size_t i = 0; i < q.size(); ++i) points.push_back({q[i], kv[i], t[i]});
            return Unwrap(wlb::KernelModel::FromProfile(
                points, MakeKernelShape(heads, head_dim, tile_q, tile_k), segment_overhead_ms));
          },
          "q_len"_a, "kv_len"_a, "ms"_a, "heads"_a = 32, "head_dim"_a = 128, "tile_q"_a = 128,
          "tile_k"_a = 128, "segment_overhead_ms"_a = 0.0, "A table model from measured points.")
      .def(
          "segment_ms",
          [](const wlb::KernelModel& k, int64_t q_len, int64_t kv_len) {
            if (q_len < 0 || kv_len < q_len) {
              Raise(absl::InvalidArgumentError(
                  absl::StrFormat("segment_ms: need 0 <= q_len <= kv_len, got q_len %d, kv_len %d",
                                  q_len, kv_len)));
            }
            return k.SegmentMs(q_len, kv_len);
          },
          "q_len"_a, "kv_len"_a, "Predicted latency (ms) of q_len queries over kv_len keys.")
      .def_prop_ro("tile_q", &wlb::KernelModel::tile_q, nb::rv_policy::automatic)
      .def_prop_ro("tile_k", &wlb::KernelModel::tile_k, nb::rv_policy::automatic)
      .def_prop_ro("analytic_model", &wlb::KernelModel::analytic, nb::rv_policy::automatic);
}

}  // namespace wlb_py
