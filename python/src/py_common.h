// What the binding files of wlb._wlb share (wlb_ext.cc has the module; bind_cost.cc,
// bind_steps.cc, bind_packer.cc, bind_shard.cc and bind_data.cc one area each): errors, numpy
// conversions, and the wrapped types (in a named namespace: nanobind identifies a bound type by
// its C++ type, which must be the same in every file).
#pragma once
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
#include <map>
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
#include "absl/strings/str_join.h"
#include "py_numbers.h"
#include "wlb/wlb.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlb_py {

// ---- errors -------------------------------------------------------------------------------

enum class ErrorKind { kValue, kFile };

[[noreturn]] inline void Raise(const absl::Status& status, ErrorKind kind = ErrorKind::kValue) {
  PyObject* type = PyExc_ValueError;
  if (kind == ErrorKind::kFile) {
    type = status.code() == absl::StatusCode::kNotFound ? PyExc_FileNotFoundError : PyExc_OSError;
    // A file that was read but holds bad values is a ValueError, like any other bad value.
    if (status.code() == absl::StatusCode::kInvalidArgument) type = PyExc_ValueError;
  }
  PyErr_SetString(type, std::string(status.message()).c_str());
  throw nb::python_error();
}

inline void Check(const absl::Status& status, ErrorKind kind = ErrorKind::kValue) {
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
inline void RejectBytesAndText(nb::handle obj, const char* what) {
  if (PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) ||
      PyMemoryView_Check(obj.ptr())) {
    throw nb::type_error(
        absl::StrFormat("%s must be a 1-D integer array, got %s", what, nb::inst_name(obj).c_str())
            .c_str());
  }
}

// A bool among a list's integers (numpy would silently make it 0 or 1).
inline void RejectBoolItems(nb::handle obj, const char* what) {
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

inline std::vector<int64_t> ToInt64(nb::handle obj, const char* what) {
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

// A 1-D array-like of finite floats (latencies): accepts any integer or float dtype; a bool
// array is a TypeError (numpy would make it 0.0 and 1.0).
inline std::vector<double> ToDouble(nb::handle obj, const char* what) {
  RejectBytesAndText(obj, what);
  RejectBoolItems(obj, what);
  nb::object a;
  try {
    nb::object numpy = nb::module_::import_("numpy");
    nb::object given = numpy.attr("asarray")(obj);
    if (nb::cast<std::string>(given.attr("dtype").attr("kind")) == "b") {
      throw nb::type_error(
          absl::StrFormat("%s must be an array of numbers, got a bool array", what).c_str());
    }
    a = numpy.attr("asarray")(given, "dtype"_a = "float64");
  } catch (const nb::python_error&) {  // ragged nesting, strings, objects
    throw nb::type_error(absl::StrFormat("%s must be a 1-D array of numbers, got %s", what,
                                         nb::inst_name(obj).c_str())
                             .c_str());
  }
  nb::ndarray<const double, nb::ndim<1>, nb::device::cpu> arr;
  if (!nb::try_cast(a, arr)) {
    throw nb::type_error(absl::StrFormat("%s must be a 1-D array of numbers, got %d dimensions",
                                         what, nb::cast<int>(a.attr("ndim")))
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

inline nb::dict JsonToDict(const nlohmann::json& j) {
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
  std::shared_ptr<const wlb::DocumentCost> cost;
  int64_t max_tokens = 0;  // the packer's S_max, for the cap-aware bound in to_json
  double imbalance = 1.0;
  double lower_bound = 1.0;
};

inline nb::list ToSteps(std::vector<wlb::StepPlan> plans,
                        const std::shared_ptr<const wlb::DocumentCost>& cost, int64_t max_tokens) {
  nb::list out;
  for (wlb::StepPlan& p : plans) {
    Step s{.plan = std::move(p), .cost = cost, .max_tokens = max_tokens};
    s.imbalance = wlb::ImbalanceDegree(s.plan.micro_batches);
    s.lower_bound = wlb::LowerBound(s.plan.micro_batches, *cost);
    out.append(nb::cast(std::move(s)));
  }
  return out;
}

inline std::vector<wlb::StepPlan> PlansOf(const std::vector<const Step*>& steps) {
  std::vector<wlb::StepPlan> plans;
  plans.reserve(steps.size());
  for (const Step* s : steps) plans.push_back(s->plan);
  return plans;
}

// A packer and the id the next pushed document gets.
struct PyPacker {
  std::unique_ptr<wlb::Packer> packer;
  std::shared_ptr<const wlb::DocumentCost> cost;
  wlb::PackerOptions options;
  std::map<std::string, std::string> settings;  // the plan settings given, as text
  int64_t next_document_id = 0;
  // Serialises every call that reads or changes the packer or next_document_id: planning runs
  // without the GIL, so Python threads sharing one Packer would otherwise interleave inside it.
  std::unique_ptr<std::mutex> mutex = std::make_unique<std::mutex>();
};

// Locks a Packer for one call. The mutex is taken with the GIL released: a thread that holds the
// mutex may wait for the GIL, so waiting for the mutex while holding the GIL could deadlock.
inline std::unique_lock<std::mutex> LockPacker(const PyPacker& p) {
  nb::gil_scoped_release release;
  return std::unique_lock<std::mutex>(*p.mutex);
}

// A shard plan with its predicted per-rank latencies, the layer mix it was planned for, the mask
// its executor runs (one of the mix's; unset while a mix of several masks has not been narrowed
// to one with ShardPlan.for_mask), and its index maps under that mask built on first use: the
// maps hold every rank's key rows (about C x tokens for per-document sharding under causal
// masks), so plan_shards of one long document at a large C stays O(C + documents) until a map is
// read (BuildShardMaps refuses maps over kMaxShardMapRows rows). Built with the GIL held, so only
// once.
struct PyShardPlan {
  wlb::ShardPlan plan;
  std::vector<double> predicted_ms;
  wlb::CpBalance balance;
  wlb::CpPrediction cp_prediction;  // attention + K/V exchange under the plan's options
  wlb::LayerMix mix = wlb::LayerMix::Causal();
  wlb::CommModel comm;  // the link plan_shards planned for (cp_link_gbps, cp_latency_us)
  std::optional<wlb::AttentionMask> mask;
  mutable std::optional<wlb::ShardMaps> maps;
  mutable std::optional<wlb::RowExchange> row_exchange;  // under the executor's mask

  // The maps' mask-free rows (local_to_packed, packed_to_gathered) are the same under every
  // mask; without a chosen mask they come from the maps of the mix's first.
  const wlb::ShardMaps& Maps() const {
    if (!maps) maps = Unwrap(wlb::BuildShardMaps(plan, mask.value_or(mix.layers.front().first)));
    return *maps;
  }
  // The executor's mask; ValueError naming the mix while none is chosen.
  const wlb::AttentionMask& Mask() const {
    if (!mask) {
      std::vector<std::string> names;
      for (const auto& [m, count] : mix.layers) names.push_back(m.Name());
      throw nb::value_error(absl::StrFormat("the plan's layer mix %s has several masks; pick the "
                                            "layer's with plan.for_mask(mask), mask one of %s",
                                            mix.Name(), absl::StrJoin(names, ", "))
                                .c_str());
    }
    return *mask;
  }
  // The maps under the executor's mask (key rows, kernel segments).
  const wlb::ShardMaps& MaskedMaps() const {
    Mask();
    return Maps();
  }
  // The row-exact exchange under the executor's mask (wlb/shard/row_exchange.hpp).
  const wlb::RowExchange& RowExchange() const {
    if (!row_exchange) row_exchange = wlb::BuildRowExchange(MaskedMaps(), plan.rank_capacity);
    return *row_exchange;
  }
};

struct RankRef {
  std::shared_ptr<const PyShardPlan> plan;
  int rank = 0;
  const wlb::RankShard& shard() const { return plan->plan.ranks[static_cast<size_t>(rank)]; }
  const wlb::RankMaps& maps() const { return plan->Maps().ranks[static_cast<size_t>(rank)]; }
  const wlb::RankMaps& masked_maps() const {
    return plan->MaskedMaps().ranks[static_cast<size_t>(rank)];
  }
  // Causal plans read the plan's segments (no maps built); other masks their kernel segments.
  bool causal() const { return plan->Mask().causal(); }
};

template <typename Fn>
Array1<int64_t> SegmentColumn(const RankRef& r, Fn field) {
  std::vector<int64_t> out;
  out.reserve(r.shard().segments.size());
  for (const wlb::Segment& s : r.shard().segments) out.push_back(field(s));
  return ToNumpy(std::move(out));
}

inline Array1<int64_t> Widen(const std::vector<int32_t>& v) {
  return ToNumpy(std::vector<int64_t>(v.begin(), v.end()));
}

inline wlb::MicroBatch MicroBatchFromDocuments(std::vector<wlb::Document> docs,
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
inline Documents MakeDocumentColumns(nb::handle ids, nb::handle lengths, nb::handle pieces,
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
inline std::vector<wlb::Document> PiecesOf(const std::vector<int64_t>& lengths,
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

inline wlb::MicroBatch AsMicroBatch(nb::handle obj) {
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

inline void CheckCostModel(const wlb::CostModel& m) {
  for (auto [name, v] :
       {std::pair{"attn_quadratic", m.attn_quadratic}, std::pair{"attn_linear", m.attn_linear},
        std::pair{"linear_per_token", m.linear_per_token},
        std::pair{"per_document", m.per_document},
        std::pair{"dense_quadratic", m.dense_quadratic}}) {
    if (!(v >= 0.0) || !std::isfinite(v)) {
      Raise(absl::InvalidArgumentError(
          absl::StrFormat("cost model: %s must be >= 0 and finite, got %g", name, v)));
    }
  }
  Check(wlb::ValidateCost(m));
}

inline wlb::KernelShape MakeKernelShape(int64_t heads, int64_t head_dim, int64_t tile_q,
                                        int64_t tile_k) {
  return {.heads = heads, .head_dim = head_dim, .tile_q = tile_q, .tile_k = tile_k};
}

// Sampling stops at one input stream's limit (wlb/core/limits.hpp).
inline constexpr int64_t kMaxSampleTokens = wlb::kMaxStreamTokens;

// One area of the module each.
void BindCost(nb::module_& m);    // bind_cost.cc: cost and kernel models
void BindSteps(nb::module_& m);   // bind_steps.cc: documents, micro-batches, steps, metrics
void BindPacker(nb::module_& m);  // bind_packer.cc: packers
void BindShards(nb::module_& m);  // bind_shard.cc: CP shard plans

}  // namespace wlb_py

void BindData(nb::module_& m);  // bind_data.cc
