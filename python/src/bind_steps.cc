// wlb._wlb bindings: documents, micro-batches, planned steps, lengths input and the metrics over
// them.
#include "py_common.h"

namespace wlb_py {

void BindSteps(nb::module_& m) {
  // ---- documents and steps ------------------------------------------------------------------
  auto documents = nb::class_<Documents>(
      m, "Documents", "Documents or pieces of documents as columns (no per-document objects).");
  documents.def(
      "__init__",
      [](Documents* self, nb::handle ids, nb::handle lengths, nb::handle pieces,
         nb::handle offsets) {
        Documents d = MakeDocumentColumns(ids, lengths, pieces, offsets);
        new (self) Documents(std::move(d));
      },
      "ids"_a, "lengths"_a, "pieces"_a = nb::none(), "offsets"_a = nb::none());
  DefColumns(documents,
             [](const Documents& d) -> const std::vector<wlb::Document>& { return d.docs; });
  documents.def_prop_ro(
      "tokens", [](const Documents& d) { return wlb::TotalTokens(d.docs); },
      nb::rv_policy::automatic);

  auto micro_batch = nb::class_<wlb::MicroBatch>(
      m, "MicroBatch", "One packed micro-batch: its pieces in order, tokens and cost.");
  micro_batch.def(
      "__init__",
      [](wlb::MicroBatch* self, nb::handle documents) {
        wlb::MicroBatch mb = AsMicroBatch(documents);
        new (self) wlb::MicroBatch(std::move(mb));
      },
      "documents"_a, "From a Documents object or an array of lengths (ids 0, 1, ...; cost 0).");
  DefColumns(micro_batch, [](const wlb::MicroBatch& mb) -> const std::vector<wlb::Document>& {
    return mb.documents;
  });
  micro_batch.def_ro("tokens", &wlb::MicroBatch::tokens)
      .def_ro("cost", &wlb::MicroBatch::cost)
      .def_prop_ro(
          "cu_seqlens",
          [](const wlb::MicroBatch& mb) { return ToNumpy(Unwrap(wlb::CuSeqlens(mb))); },
          "int32 prefix sums of the piece lengths, from 0 (FlashAttention varlen layout).",
          nb::rv_policy::automatic)
      .def_prop_ro(
          "position_ids", [](const wlb::MicroBatch& mb) { return ToNumpy(wlb::PositionIds(mb)); },
          "int64 position of every packed token inside its piece.", nb::rv_policy::automatic)
      .def_prop_ro(
          "max_seqlen",
          [](const wlb::MicroBatch& mb) {
            int64_t longest = 0;
            for (const wlb::Document& d : mb.documents) longest = std::max(longest, d.length);
            return longest;
          },
          "Longest piece (max_seqlen of varlen attention).", nb::rv_policy::automatic)
      .def_prop_ro(
          "documents", [](const wlb::MicroBatch& mb) { return Documents{mb.documents}; },
          "The pieces as a Documents object (a copy).", nb::rv_policy::automatic);

  nb::class_<Step>(m, "StepPlan", "One planned step: N micro-batches and their balance.")
      .def_prop_ro(
          "step", [](const Step& s) { return s.plan.step; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "drain", [](const Step& s) { return s.plan.drain; },
          "Produced by flush() at the end of input.", nb::rv_policy::automatic)
      .def_prop_ro(
          "micro_batches",
          [](nb::handle self) {
            Step& s = nb::cast<Step&>(self);
            nb::list out;
            for (wlb::MicroBatch& mb : s.plan.micro_batches) {
              out.append(nb::cast(&mb, nb::rv_policy::reference_internal, self));
            }
            return out;
          },
          "The micro-batches (views that keep this step alive).", nb::rv_policy::automatic)
      .def("__len__", [](const Step& s) { return s.plan.micro_batches.size(); })
      .def_prop_ro(
          "tokens",
          [](const Step& s) {
            std::vector<int64_t> t;
            for (const wlb::MicroBatch& mb : s.plan.micro_batches) t.push_back(mb.tokens);
            return ToNumpy(std::move(t));
          },
          "Tokens per micro-batch (int64).", nb::rv_policy::automatic)
      .def_prop_ro(
          "costs",
          [](const Step& s) {
            std::vector<double> c;
            for (const wlb::MicroBatch& mb : s.plan.micro_batches) c.push_back(mb.cost);
            return ToNumpy(std::move(c));
          },
          "Cost per micro-batch (float64, in the cost model's unit).", nb::rv_policy::automatic)
      .def_ro("imbalance", &Step::imbalance, "Max / mean micro-batch cost.")
      .def_ro("lower_bound", &Step::lower_bound,
              "max(heaviest document, mean) / mean: no packing of these documents does better.")
      .def_prop_ro(
          "held_back_documents", [](const Step& s) { return s.plan.held_back_documents; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "held_back_tokens", [](const Step& s) { return s.plan.held_back_tokens; },
          nb::rv_policy::automatic)
      .def(
          "to_json",
          [](const Step& s) { return wlb::StepToJson(s.plan, *s.cost, s.max_tokens).dump(); },
          "The step as wlb-plan --format json writes it.");

  m.def(
      "make_documents",
      [](nb::handle lengths, int64_t context, int64_t first_id) {
        return Documents{PiecesOf(ToInt64(lengths, "lengths"), nullptr, first_id, context)};
      },
      "lengths"_a, "context"_a, "first_id"_a = 0,
      nb::sig(
          "def make_documents(lengths: numpy.typing.ArrayLike, context: int, first_id: int = 0) "
          "-> Documents"),
      "Splits documents into pieces of at most `context` tokens; ids first_id, first_id+1, ...");
  m.def(
      "split_into_steps",
      [](const Documents& pieces, int64_t tokens_per_step) {
        std::vector<Documents> out;
        for (auto& step : Unwrap(wlb::SplitIntoSteps(pieces.docs, tokens_per_step))) {
          out.push_back(Documents{std::move(step)});
        }
        return out;
      },
      "pieces"_a, "tokens_per_step"_a,
      "Groups pieces into steps of N x S tokens by the step of their first token.");
  m.def(
      "sample_default_lengths",
      [](int64_t min_total_tokens, uint64_t seed) {
        if (min_total_tokens < 0 || min_total_tokens > kMaxSampleTokens) {
          Raise(absl::InvalidArgumentError(absl::StrFormat(
              "min_total_tokens must be in [0, %d], got %d", kMaxSampleTokens, min_total_tokens)));
        }
        return ToNumpy(wlb::SampleDefaultLengths(min_total_tokens, seed));
      },
      "min_total_tokens"_a, "seed"_a = 1,
      "Samples the embedded default distribution until the lengths sum to min_total_tokens.");
  m.def(
      "read_lengths",
      [](const std::string& path) {
        return ToNumpy(Unwrap(wlb::ReadLengthsFile(path), ErrorKind::kFile));
      },
      "path"_a,
      "Reads document lengths: a lengths file (one integer per line, or a JSON array) or a "
      "Megatron-LM .idx index (its sequence lengths); \"-\" reads standard input.");
  m.def(
      "parse_lengths",
      [](const std::string& text, const std::string& source) {
        return ToNumpy(Unwrap(wlb::ParseLengths(text, source)));
      },
      "text"_a, "source"_a = "<string>", "Parses lengths-file text.");
  m.def("default_thresholds", &wlb::DefaultThresholds, "context"_a, "levels"_a,
        "Default outlier thresholds for `levels` queues.");
  m.def("default_max_tokens", &wlb::DefaultMaxTokens, "context"_a,
        "The default variable-length cap S + S/4.");
  m.def(
      "packer_names",
      [] {
        std::vector<std::string> names;
        for (const wlb::PackerInfo& p : wlb::kPackers) names.push_back(p.name);
        return names;
      },
      "Names MakePacker accepts (the packer registry, wlb/pack/make_packer.hpp).");

  // ---- metrics ------------------------------------------------------------------------------
  m.def(
      "imbalance_degree",
      [](nb::handle values) {
        const std::vector<double> v = ToDouble(values, "values");
        double total = 0.0;  // finite values whose sum overflows would give a mean of inf
        for (size_t i = 0; i < v.size(); ++i) {
          const double x = v[i];
          if (!(x >= 0.0) || !std::isfinite(x)) {
            Raise(absl::InvalidArgumentError(
                absl::StrFormat("imbalance_degree: values must be >= 0 and finite, got %g", x)));
          }
          if (x > std::numeric_limits<double>::max() - total) {
            Raise(absl::InvalidArgumentError(absl::StrFormat(
                "imbalance_degree: values[%d] = %g brings the sum of the values past the largest "
                "double; scale them down",
                i, x)));
          }
          total += x;
        }
        return wlb::MaxOverMean(v);
      },
      "values"_a, "Max / mean of non-negative costs (1.0 for none or all zero).");
  m.def(
      "summarize",
      [](const std::vector<const Step*>& steps) {
        if (steps.empty()) return JsonToDict(wlb::SummaryToJson(wlb::StreamSummary{}));
        return JsonToDict(wlb::SummaryToJson(wlb::Summarize(PlansOf(steps), *steps[0]->cost)));
      },
      "steps"_a,
      "Imbalance over steady steps and token delay over all, as in wlb-plan's JSON summary.");
}

}  // namespace wlb_py
