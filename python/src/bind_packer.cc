// wlb._wlb bindings: the packers (the registry of make_packer.hpp, built through wlb::PlanSpec).
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "py_common.h"

namespace wlb_py {

namespace {

// A keyword argument of wlb.Packer as its plan setting's text (kPlanSettings: the row's type says
// what Python value it takes); a value of the wrong Python type is a TypeError naming it.
std::string SettingText(const wlb::PlanSetting& row, nb::handle value) {
  const auto wrong = [&](const char* expected) {
    throw nb::type_error(absl::StrFormat("Packer(): %s must be %s, got %s", row.key, expected,
                                         nb::cast<std::string>(nb::repr(value)))
                             .c_str());
  };
  const auto number = [&](nb::handle v) {
    double d = 0.0;
    if (!nb::try_cast(v, d)) wrong("a number");  // the caster refuses bools (py_numbers.h)
    return absl::StrFormat("%.17g", d);
  };
  switch (row.type) {
    case wlb::SettingType::kString: {
      std::string text;
      if (!nb::isinstance<nb::str>(value) || !nb::try_cast(value, text)) wrong("a str");
      return text;
    }
    case wlb::SettingType::kInt: {
      int64_t v = 0;
      // Converts as an int64_t argument does (numpy integers too); py_numbers.h's caster refuses
      // bools (numpy's as well) and integers out of range.
      if (!nb::try_cast(value, v)) wrong("an int");
      return absl::StrCat(v);
    }
    case wlb::SettingType::kNumber:
      return number(value);
    case wlb::SettingType::kBool:
      if (!nb::isinstance<nb::bool_>(value)) wrong("a bool");
      return nb::cast<bool>(value) ? "true" : "false";
    case wlb::SettingType::kIntList: {
      std::vector<int64_t> v;
      if (nb::isinstance<nb::str>(value) || !nb::try_cast(value, v)) wrong("a list of ints");
      return v.empty() ? "none" : absl::StrJoin(v, ",");
    }
    case wlb::SettingType::kRange: {
      if (nb::isinstance<nb::str>(value)) return nb::cast<std::string>(value);
      std::pair<double, double> r;
      if (!nb::try_cast(value, r)) wrong("(low, high) or 'exact'");
      return absl::StrCat(number(nb::cast(r.first)), ",", number(nb::cast(r.second)));
    }
  }
  wrong("a setting");
  return "";
}

// The keyword arguments of wlb.Packer: the plan settings Python offers.
const std::vector<const wlb::PlanSetting*>& PythonSettings() {
  static const std::vector<const wlb::PlanSetting*> rows = [] {
    std::vector<const wlb::PlanSetting*> r;
    for (const wlb::PlanSetting& row : wlb::kPlanSettings) {
      if ((row.fronts & wlb::kPythonKeyword) != 0) r.push_back(&row);
    }
    return r;
  }();
  return rows;
}

const char* PackerDoc() {
  static const std::string doc = [] {
    std::string text =
        "Builds the named packer (see packer_names()). Keyword arguments are wlb-plan's plan "
        "settings (wlb.plan_settings(); None or absent = the default); an option the packer does "
        "not use is an error. cost is also a CostModel (e.g. wlb.fit_micro_batch_cost(...).model); "
        "thresholds is a list of ints ([] = no queues); attention_range is (low, high) or "
        "'exact'.\n";
    for (const wlb::PlanSetting* row : PythonSettings()) {
      const std::string shown = row->show(wlb::PlanSpec{});
      absl::StrAppendFormat(&text, "\n%s (%s, default %s): %s", row->key,
                            wlb::SettingTypeName(row->type), shown.empty() ? "None" : shown,
                            wlb::PlanSettingHelp(*row));
    }
    return text;
  }();
  return doc.c_str();
}

}  // namespace

void BindPacker(nb::module_& m) {
  m.def(
      "plan_settings",
      [] {
        nb::list rows;
        for (const wlb::PlanSetting* row : PythonSettings()) {
          nb::dict d;
          d["key"] = row->key;
          d["type"] = wlb::SettingTypeName(row->type);
          d["default"] = row->show(wlb::PlanSpec{});
          d["help"] = wlb::PlanSettingHelp(*row);
          nb::list readers;
          for (const wlb::PackerInfo& p : wlb::kPackers) {
            if (row->Reads(p)) readers.append(p.name);
          }
          d["readers"] = readers;  // [] : every packer
          d["example"] = row->example;
          rows.append(d);
        }
        return rows;
      },
      "The keyword arguments of Packer, one dict per plan setting (wlb::kPlanSettings): key, type, "
      "default (as text), help, readers (the packers that read it; [] = every packer) and example "
      "(a valid value other than the default, as text).");

  // ---- packers ------------------------------------------------------------------------------
  nb::class_<PyPacker>(m, "Packer",
                       "A stateful packer: push() each step's documents, flush() at the end.")
      .def(
          "__init__",
          [](PyPacker* self, const std::string& name, nb::kwargs kwargs) {
            // The keyword arguments as plan settings, read by ParsePlanSpec and checked by
            // PlanSpec::Validate as wlb-plan reads and checks its flags.
            std::vector<std::pair<std::string, std::string>> pairs = {{"packer", name}};
            std::optional<wlb::CostModel> cost_model;
            for (auto [k, v] : kwargs) {
              const std::string key = nb::cast<std::string>(k);
              const auto& rows = PythonSettings();
              const auto row = std::find_if(rows.begin(), rows.end(),
                                            [&](const auto* r) { return key == r->key; });
              if (row == rows.end()) {
                std::vector<std::string> keys;
                for (const wlb::PlanSetting* r : rows) keys.push_back(r->key);
                throw nb::type_error(
                    absl::StrFormat("Packer() got an unexpected keyword argument %s (its keyword "
                                    "arguments: %s)",
                                    wlb::QuoteForMessage(key), absl::StrJoin(keys, ", "))
                        .c_str());
              }
              if (v.is_none()) continue;  // the default
              if (key == "cost" && nb::try_cast(v, cost_model.emplace())) continue;
              if (key == "cost") cost_model.reset();
              pairs.emplace_back(key, SettingText(**row, v));
            }
            wlb::PlanSpec spec = Unwrap(wlb::ParsePlanSpec(pairs));
            if (cost_model.has_value() && spec.Given("profile_cost")) {
              Raise(absl::InvalidArgumentError(
                  "profile_cost applies to a profile CSV in cost, and cost is a CostModel"));
            }
            const wlb::PlanSettings plan = Unwrap(spec.Validate());
            wlb::DocumentCost doc_cost =
                cost_model.has_value() ? wlb::DocumentCost(*cost_model) : Unwrap(spec.MakeCost());
            std::unique_ptr<wlb::Packer> packer = Unwrap(
                wlb::MakePacker(plan.packer, plan.config, std::move(doc_cost), plan.options));
            // What the packer balances (a dense cost in its per-document form, MakePacker).
            auto balanced = std::make_shared<const wlb::DocumentCost>(packer->cost());
            std::map<std::string, std::string> settings;
            for (const auto& [key, text] : pairs) {
              if (key != "packer") settings[key] = wlb::FindPlanSetting(key)->show(spec);
            }
            new (self) PyPacker{.packer = std::move(packer),
                                .cost = std::move(balanced),
                                .options = plan.options,
                                .settings = std::move(settings)};
          },
          "name"_a = "wlb", "kwargs"_a, PackerDoc())
      .def_prop_ro(
          "settings", [](const PyPacker& p) { return p.settings; },
          "The keyword arguments given (None ones left out), each as its plan setting's text "
          "(wlb.plan_settings()); cost is left out when it is a CostModel.")
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
