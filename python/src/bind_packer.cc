// wlb._wlb bindings: the packers (the registry of make_packer.hpp, built through wlb::PlanSpec).
#include <nanobind/stl/pair.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "py_common.h"

namespace wlb_py {

void BindPacker(nb::module_& m) {
  // ---- packers ------------------------------------------------------------------------------
  nb::class_<PyPacker>(m, "Packer",
                       "A stateful packer: push() each step's documents, flush() at the end.")
      .def(
          "__init__",
          [](PyPacker* self, const std::string& name, int64_t context,
             std::optional<int64_t> max_tokens, int32_t micro_batches,
             std::variant<wlb::CostModel, std::string> cost,
             std::optional<std::string> profile_cost,
             std::optional<std::vector<int64_t>> thresholds, std::optional<int> queues,
             std::optional<int> window, std::optional<int> refine_rounds,
             std::optional<int> lookahead, std::optional<double> delay_budget,
             std::optional<bool> bound_delay,
             std::optional<std::variant<std::string, std::pair<double, double>>> attention_range) {
            // The keyword arguments as a wlb::PlanSpec: checked as wlb-plan checks its flags.
            wlb::PlanSpec spec;
            spec.packer = name;
            spec.context = context;
            spec.max_tokens = max_tokens.value_or(0);
            spec.micro_batches = micro_batches;
            const auto* cost_model = std::get_if<wlb::CostModel>(&cost);
            if (cost_model == nullptr) spec.cost = std::get<std::string>(cost);
            if (profile_cost.has_value()) {
              if (cost_model != nullptr) {
                Raise(absl::InvalidArgumentError(
                    "profile_cost applies to a profile CSV in cost, and cost is a CostModel"));
              }
              spec.profile_cost = *profile_cost;
              spec.MarkGiven("profile_cost");
            }
            // An option given to a packer that does not use it is an error, as in wlb-plan,
            // spelled as the keyword argument (`shown`: key -> "key=value").
            std::map<std::string, std::string> shown;
            auto set = [&](const char* key, const auto& value, auto& field) {
              if (!value.has_value()) return;
              field = *value;
              spec.MarkGiven(key);
              shown[key] =
                  absl::StrCat(key, "=", nb::cast<std::string>(nb::repr(nb::cast(*value))));
            };
            set("thresholds", thresholds, spec.thresholds);
            set("queues", queues, spec.queues);
            set("window", window, spec.window);
            set("refine_rounds", refine_rounds, spec.refine_rounds);
            set("lookahead", lookahead, spec.lookahead);
            set("delay_budget", delay_budget, spec.delay_budget);
            set("bound_delay", bound_delay, spec.bound_delay);
            if (attention_range.has_value()) {  // (low, high) or "exact", checked as wlb-plan does
              const auto* pair = std::get_if<std::pair<double, double>>(&*attention_range);
              const std::string text = pair ? absl::StrCat(pair->first, ",", pair->second)
                                            : std::get<std::string>(*attention_range);
              spec.attention_range = Unwrap(wlb::detail::ParseAttentionRange(text));
              spec.MarkGiven("attention_range");
              shown["attention_range"] = absl::StrCat(
                  "attention_range=", nb::cast<std::string>(nb::repr(nb::cast(*attention_range))));
            }
            if (const wlb::PackerInfo* info = wlb::FindPacker(name); info != nullptr) {
              for (const wlb::PackerOptionKey& o : wlb::kPackerOptionKeys) {
                if (shown.count(o.key) && !info->Uses(o.option)) {
                  std::vector<std::string> readers;
                  for (const wlb::PackerInfo& p : wlb::kPackers) {
                    if (p.Uses(o.option)) readers.push_back(p.name);
                  }
                  Raise(absl::InvalidArgumentError(absl::StrFormat(
                      "%s is not used by packer %s: only %s read%s it", shown[o.key],
                      wlb::QuoteForMessage(name), absl::StrJoin(readers, ", "),
                      readers.size() == 1 ? "s" : "")));
                }
              }
            }  // an unknown name: Validate's error lists the packers
            const wlb::PlanSettings plan = Unwrap(spec.Validate());
            wlb::DocumentCost doc_cost =
                cost_model != nullptr ? wlb::DocumentCost(*cost_model) : Unwrap(spec.MakeCost());
            std::unique_ptr<wlb::Packer> packer =
                Unwrap(wlb::MakePacker(plan.packer, plan.config, doc_cost, plan.options));
            new (self)
                PyPacker{.packer = std::move(packer),
                         .cost = std::make_shared<const wlb::DocumentCost>(std::move(doc_cost)),
                         .options = plan.options};
          },
          "name"_a = "wlb", nb::kw_only(), "context"_a = 131072, "max_tokens"_a = nb::none(),
          "micro_batches"_a = 4, "cost"_a = "llama2-7b", "profile_cost"_a = nb::none(),
          "thresholds"_a = nb::none(), "queues"_a = nb::none(), "window"_a = nb::none(),
          "refine_rounds"_a = nb::none(), "lookahead"_a = nb::none(), "delay_budget"_a = nb::none(),
          "bound_delay"_a = nb::none(), "attention_range"_a = nb::none(),
          "Builds the named packer (see packer_names()). max_tokens None = S + S/4; thresholds "
          "None = default thresholds for `queues` queues (None: 2), [] = no queues; an option "
          "the packer does not use (window, thresholds, queues, refine_rounds, lookahead, "
          "delay_budget, bound_delay, attention_range) is an error; cost is a preset name (FLOPs, "
          "or a shipped "
          "calibration such as h100-flash-llama2-7b-tp8: see CostModel.presets()), "
          "a masked preset (llama2-7b-swa4k, ...: mask-aware FLOPs), a CSV path (a "
          "single-document length,ms profile, or micro-batch measurements with a 'lengths' "
          "column: fitted as wlb.fit_micro_batch_cost) or a CostModel (e.g. "
          "wlb.fit_micro_batch_cost(...).model); profile_cost = 'fit' (quadratic, the default) or "
          "'table' (tile-aware "
          "interpolation) for a profile CSV; lookahead = K prefetched steps (wlb-lookahead: "
          "push() returns a step's plan K pushes later, flush() returns the rest); delay_budget = "
          "wlb-lookahead's most mean token delay in steps (None: within wlb's); bound_delay = "
          "False lets the delay price alone steer wlb-lookahead (None: True, each step planned "
          "within wlb-refine's token delay on the same stream); attention_range = (low, high) "
          "with 0 <= low <= 1 <= high, or 'exact': wlb-refine's and wlb-lookahead's refinement "
          "changes must not make a step worse under the cost with attention weighed low..high x "
          "the planning cost's (None: (1, 2.5) for a FLOP cost, exact for a measured one).")
      .def(
          "push",
          [](PyPacker& p, nb::handle arrivals, nb::handle ids) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            std::vector<wlb::Document> docs;
            int64_t next_id = p.next_document_id;
            Documents* given = nullptr;
            if (nb::try_cast(arrivals, given) && given != nullptr) {
              if (!ids.is_none()) {
                throw nb::type_error("push(): ids apply to an array of lengths, not to Documents");
              }
              docs = given->docs;
            } else {
              const std::vector<int64_t> lengths = ToInt64(arrivals, "lengths");
              if (ids.is_none()) {
                docs = PiecesOf(lengths, nullptr, next_id, p.packer->config().context);
              } else {
                const std::vector<int64_t> id = ToInt64(ids, "ids");
                docs = PiecesOf(lengths, &id, 0, p.packer->config().context);
              }
            }
            for (const wlb::Document& d : docs) next_id = std::max(next_id, d.id + 1);
            absl::StatusOr<std::vector<wlb::StepPlan>> ready;
            {
              nb::gil_scoped_release release;
              ready = p.packer->Push(std::move(docs));
            }
            nb::list steps =
                ToSteps(Unwrap(std::move(ready)), p.cost, p.packer->config().max_tokens);
            p.next_document_id = next_id;
            return steps;
          },
          "arrivals"_a, "ids"_a = nb::none(),
          nb::sig("def push(self, arrivals: Documents | numpy.typing.ArrayLike, ids: "
                  "numpy.typing.ArrayLike | None = None) -> list[StepPlan]"),
          "Consumes one step of arrivals: an array of document lengths (split into pieces of <= "
          "S tokens; ids continue from next_document_id unless given) or a Documents object of "
          "pieces. Returns the steps that became ready.")
      .def(
          "flush",
          [](PyPacker& p) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            std::vector<wlb::StepPlan> plans;
            {
              nb::gil_scoped_release release;
              plans = p.packer->Flush();
            }
            return ToSteps(std::move(plans), p.cost, p.packer->config().max_tokens);
          },
          nb::sig("def flush(self) -> list[StepPlan]"),
          "Plans everything still held into final (drain) steps.")
      .def_prop_ro(
          "pending",
          [](const PyPacker& p) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            return Documents{p.packer->Pending()};
          },
          "The pieces held back (queued or carried).", nb::rv_policy::automatic)
      .def(
          "save_state",
          [](const PyPacker& p) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            const std::string blob = p.packer->SaveState();
            return nb::bytes(blob.data(), blob.size());
          },
          "The C++ SaveState() blob, byte for byte.")
      .def(
          "restore_state",
          [](PyPacker& p, nb::bytes blob) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            Check(p.packer->RestoreState(std::string_view(blob.c_str(), blob.size())));
            // The blob does not hold the id counter: never hand out an id the state holds.
            for (const wlb::Document& d : p.packer->Pending()) {
              p.next_document_id = std::max(p.next_document_id, d.id + 1);
            }
          },
          "blob"_a,
          "Restores a SaveState() blob (from Python or C++); on error nothing changes. The blob "
          "holds no id counter: next_document_id becomes at least one above every id the state "
          "holds (state_dict() / load_state_dict() carry the counter exactly).")
      .def(
          "state_dict",
          [](const PyPacker& p) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            const std::string blob = p.packer->SaveState();
            nb::dict d;
            d["packer_state"] = nb::bytes(blob.data(), blob.size());
            d["next_document_id"] = p.next_document_id;
            return d;
          },
          "{'packer_state': the C++ SaveState blob, 'next_document_id': int}.")
      .def(
          "load_state_dict",
          [](PyPacker& p, nb::dict state) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            if (!state.contains("packer_state")) {
              Raise(absl::InvalidArgumentError("state dict has no 'packer_state' entry"));
            }
            nb::handle blob = state["packer_state"];
            if (!nb::isinstance<nb::bytes>(blob)) {
              throw nb::type_error("state dict 'packer_state' must be bytes");
            }
            // Without the counter, push() could hand out ids the restored state already holds.
            if (!state.contains("next_document_id")) {
              Raise(absl::InvalidArgumentError("state dict has no 'next_document_id' entry"));
            }
            // One above the largest id push() accepts.
            constexpr int64_t kMaxNextId = wlb::kMaxStateCounter + 1;
            int64_t next_id = 0;
            nb::handle given = state["next_document_id"];
            if (nb::isinstance<nb::bool_>(given) ||
                !nb::try_cast(given, next_id, /*convert=*/false) || next_id < 0 ||
                next_id > kMaxNextId) {
              const std::string shown = nb::cast<std::string>(nb::repr(given));
              Raise(absl::InvalidArgumentError(absl::StrFormat(
                  "state dict 'next_document_id' must be an integer in [0, %d], got %s", kMaxNextId,
                  wlb::QuoteForMessage(shown))));
            }
            nb::bytes b = nb::borrow<nb::bytes>(blob);
            Check(p.packer->RestoreState(std::string_view(b.c_str(), b.size())));
            p.next_document_id = next_id;
          },
          "state"_a, "Restores a state_dict(); on error nothing changes.")
      .def_prop_ro(
          "name", [](const PyPacker& p) { return std::string(p.packer->name()); },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "context", [](const PyPacker& p) { return p.packer->config().context; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "max_tokens", [](const PyPacker& p) { return p.packer->config().max_tokens; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "micro_batches", [](const PyPacker& p) { return p.packer->config().micro_batches; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "thresholds", [](const PyPacker& p) { return p.options.thresholds; },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "window", [](const PyPacker& p) { return p.options.window; }, nb::rv_policy::automatic)
      .def_prop_ro(
          "cost",
          [](const PyPacker& p) -> std::optional<wlb::CostModel> {
            const wlb::CostModel* polynomial = p.cost->polynomial();
            if (polynomial == nullptr) return std::nullopt;
            return *polynomial;
          },
          nb::rv_policy::automatic)
      .def_prop_ro(
          "next_document_id",
          [](const PyPacker& p) {
            const std::unique_lock<std::mutex> lock = LockPacker(p);
            return p.next_document_id;
          },
          nb::rv_policy::automatic)
      .def("__repr__", [](const PyPacker& p) {
        return absl::StrFormat("Packer('%s', context=%d, max_tokens=%d, micro_batches=%d)",
                               p.packer->name(), p.packer->config().context,
                               p.packer->config().max_tokens, p.packer->config().micro_batches);
      });
}

}  // namespace wlb_py
