// wlb._wlb: the nanobind extension behind `import wlb`. It only converts types between Python
// (numpy arrays, bytes, str) and the header-only library; every packing, sharding and metric
// decision is made by include/wlb. Errors: an absl::Status becomes ValueError (OSError /
// FileNotFoundError for file reads) carrying the library's message; wrong argument types raise
// TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "wlb/wlb.hpp"

namespace nb = nanobind;
using namespace nb::literals;

void BindData(nb::module_& m);  // bind_data.cc

namespace {

// ---- errors -------------------------------------------------------------------------------

enum class ErrorKind { kValue, kFile };

[[noreturn]] void Raise(const absl::Status& status, ErrorKind kind = ErrorKind::kValue) {
  PyObject* type = PyExc_ValueError;
  if (kind == ErrorKind::kFile) {
    type = status.code() == absl::StatusCode::kNotFound ? PyExc_FileNotFoundError : PyExc_OSError;
    // A file that was read but holds bad values is a ValueError, like any other bad value.
    if (status.code() == absl::StatusCode::kInvalidArgument) type = PyExc_ValueError;
  }
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw nb::python_error();
}

void Check(const absl::Status& status, ErrorKind kind = ErrorKind::kValue) {
  if (!status.ok()) Raise(status, kind);
}

template <typename T>
T Unwrap(absl::StatusOr<T> value, ErrorKind kind = ErrorKind::kValue) {
  if (!value.ok()) Raise(value.status(), kind);
  return *std::move(value);
}

// ---- numpy in -----------------------------------------------------------------------------

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;

// Any 1-D integer array-like (numpy array, torch CPU tensor, list of ints) as int64 values.
// Floats and booleans are a TypeError (never truncated); integers outside int64 a ValueError.
// Raw bytes and text are not arrays of lengths, although numpy would read them as such.
void RejectBytesAndText(nb::handle obj, const char* what) {
  if (PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) ||
      PyMemoryView_Check(obj.ptr())) {
    throw nb::type_error(absl::StrFormat("%s must be a 1-D integer array, got %s", what,
                                         nb::inst_name(obj).c_str())
                             .c_str());
  }
}

// A bool among a list's integers (numpy would silently make it 0 or 1).
void RejectBoolItems(nb::handle obj, const char* what) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) return;
  nb::object numpy_bool = nb::module_::import_("numpy").attr("bool_");
  size_t i = 0;
  for (nb::handle item : obj) {
    if (PyBool_Check(item.ptr()) || nb::isinstance(item, numpy_bool)) {
      throw nb::type_error(
          absl::StrFormat("%s[%d] is a bool; lengths and ids must be integers", what, i).c_str());
    }
    ++i;
  }
}

std::vector<int64_t> ToInt64(nb::handle obj, const char* what) {
  RejectBytesAndText(obj, what);
  RejectBoolItems(obj, what);
  AnyArray a;
  if (!nb::try_cast(obj, a)) {
    nb::object asarray = nb::module_::import_("numpy").attr("asarray");
    nb::object converted;
    try {
      converted = asarray(obj);
    } catch (const nb::python_error&) {
      throw nb::type_error(absl::StrFormat("%s must be a 1-D integer array, got %s", what,
                                           nb::inst_name(obj).c_str())
                               .c_str());
    }
    if (!nb::try_cast(converted, a)) {
      throw nb::type_error(absl::StrFormat("%s must be a 1-D integer array", what).c_str());
    }
  }
  if (a.ndim() != 1) {
    throw nb::type_error(
        absl::StrFormat("%s must be a 1-D integer array, got %d dimensions", what, a.ndim())
            .c_str());
  }
  const size_t n = a.shape(0);
  std::vector<int64_t> out(n);
  if (n == 0) return out;  // an empty list is float64 to numpy; there is nothing to convert
  const nb::dlpack::dtype dt = a.dtype();
  const int64_t stride = a.stride(0);
  const auto* base = static_cast<const char*>(a.data());
  const size_t bytes = dt.bits / 8;
  auto at = [&](size_t i) { return base + static_cast<int64_t>(i) * stride * bytes; };
  const bool is_int = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
  const bool is_uint = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
  if ((!is_int && !is_uint) || dt.lanes != 1 ||
      !(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) {
    const char* kind = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) ? "float"
                       : dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bool)
                           ? "bool"
                           : "non-integer";
    throw nb::type_error(
        absl::StrFormat("%s must be an integer array, got a %s%d array", what, kind, dt.bits)
            .c_str());
  }
  for (size_t i = 0; i < n; ++i) {
    const char* p = at(i);
    if (is_int) {
      switch (bytes) {
        case 1:
          out[i] = *reinterpret_cast<const int8_t*>(p);
          break;
        case 2:
          out[i] = *reinterpret_cast<const int16_t*>(p);
          break;
        case 4:
          out[i] = *reinterpret_cast<const int32_t*>(p);
          break;
        default:
          out[i] = *reinterpret_cast<const int64_t*>(p);
          break;
      }
    } else {
      uint64_t v = 0;
      switch (bytes) {
        case 1:
          v = *reinterpret_cast<const uint8_t*>(p);
          break;
        case 2:
          v = *reinterpret_cast<const uint16_t*>(p);
          break;
        case 4:
          v = *reinterpret_cast<const uint32_t*>(p);
          break;
        default:
          v = *reinterpret_cast<const uint64_t*>(p);
          break;
      }
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        PyErr_SetString(PyExc_ValueError,
                        absl::StrFormat("%s[%d] = %d does not fit int64", what, i, v).c_str());
        throw nb::python_error();
      }
      out[i] = static_cast<int64_t>(v);
    }
  }
  return out;
}

// A 1-D array-like of finite floats (latencies): accepts any real dtype.
std::vector<double> ToDouble(nb::handle obj, const char* what) {
  RejectBytesAndText(obj, what);
  RejectBoolItems(obj, what);
  nb::object a;
  try {
    a = nb::module_::import_("numpy").attr("asarray")(obj, "dtype"_a = "float64");
  } catch (const nb::python_error&) {  // ragged nesting, strings, objects
    throw nb::type_error(absl::StrFormat("%s must be a 1-D array of numbers, got %s", what,
                                         nb::inst_name(obj).c_str())
                             .c_str());
  }
  nb::ndarray<const double, nb::ndim<1>, nb::device::cpu> arr;
  if (!nb::try_cast(a, arr)) {
    throw nb::type_error(
        absl::StrFormat("%s must be a 1-D array of numbers, got %d dimensions", what,
                        nb::cast<int>(a.attr("ndim")))
            .c_str());
  }
  std::vector<double> out(arr.shape(0));
  for (size_t i = 0; i < out.size(); ++i) out[i] = arr(i);
  return out;
}

// ---- numpy out ----------------------------------------------------------------------------

template <typename T>
using Array1 = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// Hands a vector to numpy without copying it again (the array owns it).
template <typename T>
Array1<T> ToNumpy(std::vector<T> values) {
  auto* heap = new std::vector<T>(std::move(values));
  if (heap->empty()) heap->reserve(1);  // a valid data pointer even for an empty array
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Array1<T>(heap->data(), {heap->size()}, owner);
}

template <typename T, typename Fn>
Array1<T> Column(const std::vector<wlb::Document>& docs, Fn field) {
  std::vector<T> out;
  out.reserve(docs.size());
  for (const wlb::Document& d : docs) out.push_back(static_cast<T>(field(d)));
  return ToNumpy(std::move(out));
}

nb::dict JsonToDict(const nlohmann::json& j) {
  return nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(j.dump()));
}

// ---- wrapped types ------------------------------------------------------------------------

// A list of documents (or pieces), one row per piece.
struct Documents {
  std::vector<wlb::Document> docs;
};

// Binds the per-document columns shared by Documents and MicroBatch: one numpy array per field.
template <typename Class, typename Get>
void DefColumns(Class& cls, Get get) {
  using T = typename Class::Type;
  auto column = [&](const char* name, auto field, const char* doc) {
    using V = decltype(field(std::declval<const wlb::Document&>()));
    cls.def_prop_ro(
        name, [get, field](const T& self) { return Column<V>(get(self), field); }, doc,
        nb::rv_policy::automatic);
  };
  column(
      "ids", [](const wlb::Document& d) { return d.id; }, "Document ids (int64), one per piece.");
  column(
      "lengths", [](const wlb::Document& d) { return d.length; }, "Piece lengths (int64).");
  column(
      "pieces", [](const wlb::Document& d) { return d.piece; },
      "Piece index within its document (int32).");
  column(
      "offsets", [](const wlb::Document& d) { return d.offset; },
      "First token of each piece within its document (int64).");
  column(
      "arrival_steps", [](const wlb::Document& d) { return d.arrival_step; },
      "Step each piece arrived with (int64).");
  cls.def("__len__", [get](const T& self) { return get(self).size(); });
}

// A planned step plus what its metrics need.
struct Step {
  wlb::StepPlan plan;
  std::shared_ptr<const wlb::CostModel> cost;
  int64_t max_tokens = 0;  // the packer's S_max, for the cap-aware bound in to_json
  double imbalance = 1.0;
  double lower_bound = 1.0;
};

nb::list ToSteps(std::vector<wlb::StepPlan> plans,
                 const std::shared_ptr<const wlb::CostModel>& cost, int64_t max_tokens) {
  nb::list out;
  for (wlb::StepPlan& p : plans) {
    Step s{.plan = std::move(p), .cost = cost, .max_tokens = max_tokens};
    s.imbalance = wlb::ImbalanceDegree(s.plan.micro_batches);
    s.lower_bound = wlb::LowerBound(s.plan.micro_batches, *cost);
    out.append(nb::cast(std::move(s)));
  }
  return out;
}

std::vector<wlb::StepPlan> PlansOf(const std::vector<const Step*>& steps) {
  std::vector<wlb::StepPlan> plans;
  plans.reserve(steps.size());
  for (const Step* s : steps) plans.push_back(s->plan);
  return plans;
}

// A packer and the id the next pushed document gets.
struct PyPacker {
  std::unique_ptr<wlb::Packer> packer;
  std::shared_ptr<const wlb::CostModel> cost;
  wlb::PackerOptions options;
  int64_t next_document_id = 0;
  // Serialises every call that reads or changes the packer or next_document_id: planning runs
  // without the GIL, so Python threads sharing one Packer would otherwise interleave inside it.
  std::unique_ptr<std::mutex> mutex = std::make_unique<std::mutex>();
};

// Locks a Packer for one call. The mutex is taken with the GIL released: a thread that holds the
// mutex may wait for the GIL, so waiting for the mutex while holding the GIL could deadlock.
std::unique_lock<std::mutex> LockPacker(const PyPacker& p) {
  nb::gil_scoped_release release;
  return std::unique_lock<std::mutex>(*p.mutex);
}

// A shard plan with its predicted per-rank latencies, and its index maps built on first use: the
// maps hold every rank's key rows (about C x tokens for per-document sharding), so plan_shards of
// one long document at a large C stays O(C + documents) until a map is read (BuildShardMaps
// refuses maps over kMaxShardMapRows rows). Built with the GIL held, so only once.
struct PyShardPlan {
  wlb::ShardPlan plan;
  std::vector<double> predicted_ms;
  wlb::CpBalance balance;
  wlb::CpPrediction cp_prediction;  // attention + K/V exchange under the plan's options
  mutable std::optional<wlb::ShardMaps> maps;

  const wlb::ShardMaps& Maps() const {
    if (!maps) maps = Unwrap(wlb::BuildShardMaps(plan));
    return *maps;
  }
};

struct RankRef {
  std::shared_ptr<const PyShardPlan> plan;
  int rank = 0;
  const wlb::RankShard& shard() const { return plan->plan.ranks[static_cast<size_t>(rank)]; }
  const wlb::RankMaps& maps() const { return plan->Maps().ranks[static_cast<size_t>(rank)]; }
};

template <typename Fn>
Array1<int64_t> SegmentColumn(const RankRef& r, Fn field) {
  std::vector<int64_t> out;
  out.reserve(r.shard().segments.size());
  for (const wlb::Segment& s : r.shard().segments) out.push_back(field(s));
  return ToNumpy(std::move(out));
}

Array1<int64_t> Widen(const std::vector<int32_t>& v) {
  return ToNumpy(std::vector<int64_t>(v.begin(), v.end()));
}

wlb::MicroBatch MicroBatchFromDocuments(std::vector<wlb::Document> docs,
                                        const wlb::CostModel* cost) {
  wlb::MicroBatch mb;
  mb.documents = std::move(docs);
  for (const wlb::Document& d : mb.documents) {
    if (d.length <= 0) Check(wlb::ValidateLength(d.length, absl::StrFormat("document %d", d.id)));
    if (mb.tokens > std::numeric_limits<int64_t>::max() - d.length) {
      Raise(absl::OutOfRangeError(absl::StrFormat(
          "document %d: length %d overflows the micro-batch token count", d.id, d.length)));
    }
    mb.tokens += d.length;
    if (cost != nullptr) mb.cost += (*cost)(d.length);
  }
  return mb;
}

// Documents from explicit columns; missing pieces / offsets default to 0 (whole documents).
Documents MakeDocumentColumns(nb::handle ids, nb::handle lengths, nb::handle pieces,
                              nb::handle offsets) {
  const std::vector<int64_t> id = ToInt64(ids, "ids");
  const std::vector<int64_t> len = ToInt64(lengths, "lengths");
  std::vector<int64_t> piece(len.size(), 0), offset(len.size(), 0);
  if (!pieces.is_none()) piece = ToInt64(pieces, "pieces");
  if (!offsets.is_none()) offset = ToInt64(offsets, "offsets");
  if (id.size() != len.size() || piece.size() != len.size() || offset.size() != len.size()) {
    Raise(absl::InvalidArgumentError(absl::StrFormat(
        "ids, lengths, pieces and offsets must have the same size, got %d, %d, %d, %d", id.size(),
        len.size(), piece.size(), offset.size())));
  }
  Documents out;
  out.docs.reserve(len.size());
  for (size_t i = 0; i < len.size(); ++i) {
    if (id[i] < 0 || piece[i] < 0 || piece[i] > std::numeric_limits<int32_t>::max() ||
        offset[i] < 0) {
      Raise(absl::InvalidArgumentError(absl::StrFormat(
          "document row %d: need id >= 0, 0 <= piece <= 2^31-1, offset >= 0; got id %d, piece "
          "%d, offset %d",
          i, id[i], piece[i], offset[i])));
    }
    if (len[i] <= 0) Check(wlb::ValidateLength(len[i], absl::StrFormat("document %d", id[i])));
    out.docs.push_back(wlb::Document{.id = id[i],
                                     .length = len[i],
                                     .piece = static_cast<int32_t>(piece[i]),
                                     .offset = offset[i]});
  }
  return out;
}

// Lengths -> pieces of <= context tokens with ids first_id, first_id + 1, ... (the library's
// AppendPieces, as MakeDocuments does for ids from 0).
std::vector<wlb::Document> PiecesOf(const std::vector<int64_t>& lengths,
                                    const std::vector<int64_t>* ids, int64_t first_id,
                                    int64_t context) {
  if (ids != nullptr && ids->size() != lengths.size()) {
    Raise(absl::InvalidArgumentError(
        absl::StrFormat("ids has %d entries but lengths has %d", ids->size(), lengths.size())));
  }
  std::vector<wlb::Document> docs;
  docs.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t id = ids != nullptr ? (*ids)[i] : first_id + static_cast<int64_t>(i);
    if (id < 0) {
      Raise(absl::InvalidArgumentError(
          absl::StrFormat("document ids must be >= 0, got %d at position %d", id, i)));
    }
    Check(wlb::AppendPieces(id, lengths[i], context, docs));
  }
  return docs;
}

wlb::MicroBatch AsMicroBatch(nb::handle obj) {
  wlb::MicroBatch* mb = nullptr;
  if (nb::try_cast(obj, mb) && mb != nullptr) return *mb;
  Documents* docs = nullptr;
  if (nb::try_cast(obj, docs) && docs != nullptr)
    return MicroBatchFromDocuments(docs->docs, nullptr);
  // Lengths of whole documents: one piece each, so none may be longer than a context window can be.
  const std::vector<int64_t> lengths = ToInt64(obj, "micro_batch lengths");
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] > wlb::kMaxContext) {
      Raise(absl::InvalidArgumentError(
          absl::StrFormat("micro_batch lengths: document %d has %d tokens, above the limit of %d "
                          "(the largest context window)",
                          i, lengths[i], wlb::kMaxContext)));
    }
  }
  return MicroBatchFromDocuments(PiecesOf(lengths, nullptr, 0, wlb::kMaxContext), nullptr);
}

void CheckCostModel(const wlb::CostModel& m) {
  for (auto [name, v] :
       {std::pair{"attn_quadratic", m.attn_quadratic}, std::pair{"attn_linear", m.attn_linear},
        std::pair{"linear_per_token", m.linear_per_token},
        std::pair{"per_document", m.per_document}}) {
    if (!(v >= 0.0) || !std::isfinite(v)) {
      Raise(absl::InvalidArgumentError(
          absl::StrFormat("cost model: %s must be >= 0 and finite, got %g", name, v)));
    }
  }
  Check(wlb::ValidateCost(m));
}

wlb::KernelShape MakeKernelShape(int64_t heads, int64_t head_dim, int64_t tile_q, int64_t tile_k) {
  return {.heads = heads, .head_dim = head_dim, .tile_q = tile_q, .tile_k = tile_k};
}

// Sampling stops at one input stream's limit (wlb/core/limits.hpp).
constexpr int64_t kMaxSampleTokens = wlb::kMaxStreamTokens;

}  // namespace

NB_MODULE(_wlb, m) {
  m.doc() = "wlb: workload-balanced packing and CP sharding (bindings of the C++ library).";
  m.attr("__version__") = WLB_VERSION;

  // ---- cost models --------------------------------------------------------------------------
  nb::class_<wlb::CostModel>(m, "CostModel",
                             "W(d) = attn_quadratic*d^2 + attn_linear*d + linear_per_token*d + "
                             "per_document: the work of one document of d tokens.")
      .def(
          "__init__",
          [](wlb::CostModel* self, double attn_quadratic, double attn_linear,
             double linear_per_token, double per_document, std::string unit,
             std::string description) {
            wlb::CostModel c{.attn_quadratic = attn_quadratic,
                             .attn_linear = attn_linear,
                             .linear_per_token = linear_per_token,
                             .per_document = per_document,
                             .unit = std::move(unit),
                             .description = std::move(description)};
            CheckCostModel(c);
            new (self) wlb::CostModel(std::move(c));
          },
          "attn_quadratic"_a = 0.0, "attn_linear"_a = 0.0, "linear_per_token"_a = 0.0,
          "per_document"_a = 0.0, "unit"_a = "flop", "description"_a = "")
      .def_static(
          "from_preset",
          [](const std::string& name) { return Unwrap(wlb::CostModelFromPreset(name)); }, "name"_a,
          "Forward-FLOP model of a preset (see CostModel.presets()).")
      .def_static(
          "presets",
          [] {
            std::vector<std::string> names;
            for (const wlb::TransformerShape& s : wlb::TransformerPresets())
              names.push_back(s.name);
            return names;
          },
          "Names of the built-in transformer shapes.")
      .def_static(
          "from_shape",
          [](int64_t hidden, int64_t ffn, int64_t heads, int64_t kv_heads, int64_t layers,
             std::string name) {
            return Unwrap(wlb::CostModelFromShape({.name = std::move(name),
                                                   .hidden = hidden,
                                                   .ffn = ffn,
                                                   .heads = heads,
                                                   .kv_heads = kv_heads,
                                                   .layers = layers}));
          },
          "hidden"_a, "ffn"_a, "heads"_a, "kv_heads"_a, "layers"_a, "name"_a = "custom",
          "Forward-FLOP model of a LLaMA-style shape.")
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

  nb::class_<wlb::KernelModel>(m, "KernelModel",
                               "Predicted latency of causal varlen attention segments (the "
                               "kernel model of adaptive and hybrid sharding).")
      .def(
          "__init__",
          [](wlb::KernelModel* self) { new (self) wlb::KernelModel(wlb::KernelModel::Default()); },
          "The analytic default (tile 128, 32 heads x 128, FlashAttention-2 H100 fit).")
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
        for (const char* n : wlb::kPackerNames) names.push_back(n);
        return names;
      },
      "Names MakePacker accepts.");
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

  // ---- packers ------------------------------------------------------------------------------
  nb::class_<PyPacker>(m, "Packer",
                       "A stateful packer: push() each step's documents, flush() at the end.")
      .def(
          "__init__",
          [](PyPacker* self, const std::string& name, int64_t context,
             std::optional<int64_t> max_tokens, int32_t micro_batches,
             std::variant<wlb::CostModel, std::string> cost,
             std::optional<std::vector<int64_t>> thresholds, int queues, int window,
             int refine_rounds, int lookahead, std::optional<double> delay_budget) {
            wlb::PackerConfig config{.context = context,
                                     .max_tokens = max_tokens.value_or(
                                         context > 0 ? wlb::DefaultMaxTokens(context) : context),
                                     .micro_batches = micro_batches};
            wlb::CostModel model;
            if (auto* c = std::get_if<wlb::CostModel>(&cost)) {
              model = *c;
            } else {
              model = Unwrap(wlb::ResolveCostModel(std::get<std::string>(cost))).model;
            }
            if (!thresholds.has_value() && (queues < 0 || queues > 16)) {
              Raise(absl::InvalidArgumentError(
                  absl::StrFormat("queues must be in [0, 16], got %d", queues)));
            }
            wlb::PackerOptions options{
                .window = window,
                .thresholds = thresholds.has_value()
                                  ? *thresholds
                                  : wlb::DefaultThresholds(std::max<int64_t>(context, 1), queues),
                .refine_rounds = refine_rounds,
                .lookahead = lookahead,
                .delay_budget = delay_budget.value_or(std::numeric_limits<double>::infinity())};
            std::unique_ptr<wlb::Packer> packer =
                Unwrap(wlb::MakePacker(name, config, model, options));
            new (self) PyPacker{.packer = std::move(packer),
                                .cost = std::make_shared<const wlb::CostModel>(std::move(model)),
                                .options = std::move(options)};
          },
          "name"_a = "wlb", nb::kw_only(), "context"_a = 131072, "max_tokens"_a = nb::none(),
          "micro_batches"_a = 4, "cost"_a = "llama2-7b", "thresholds"_a = nb::none(),
          "queues"_a = 2, "window"_a = 1, "refine_rounds"_a = 0, "lookahead"_a = 1,
          "delay_budget"_a = nb::none(),
          "Builds the named packer (see packer_names()). max_tokens None = S + S/4; thresholds "
          "None = default thresholds for `queues` queues, [] = no queues; cost is a preset name, "
          "a profile CSV path or a CostModel; lookahead = K prefetched steps (wlb-lookahead: "
          "push() returns a step's plan K pushes later, flush() returns the rest); delay_budget = "
          "wlb-lookahead's most mean token delay in steps (None: within wlb's).")
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
                  "state dict 'next_document_id' must be an integer in [0, %d], got %s",
                  kMaxNextId, wlb::QuoteForMessage(shown))));
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
          "cost", [](const PyPacker& p) { return *p.cost; }, nb::rv_policy::automatic)
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

  // ---- metrics ------------------------------------------------------------------------------
  m.def(
      "imbalance_degree",
      [](nb::handle values) {
        const std::vector<double> v = ToDouble(values, "values");
        for (double x : v) {
          if (!(x >= 0.0) || !std::isfinite(x)) {
            Raise(absl::InvalidArgumentError(
                absl::StrFormat("imbalance_degree: values must be >= 0 and finite, got %g", x)));
          }
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

  BindData(m);
}
