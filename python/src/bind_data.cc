// Bindings for data loading in training jobs: DP-rank assignment of a step's micro-batches under
// the 1F1B step-time model (wlb/sim/dp_assign.hpp) and Megatron-LM index files
// (wlb/io/megatron_index.hpp). Called from wlb_ext.cc's module definition.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "py_numbers.h"
#include "wlb/io/megatron_index.hpp"
#include "wlb/sim/dp_assign.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Any bad value is ValueError; reading a file (`file`), a missing one is FileNotFoundError and
// an unreadable one OSError.
template <typename T>
T OrRaise(absl::StatusOr<T> value, bool file = false) {
  if (value.ok()) return *std::move(value);
  const absl::StatusCode code = value.status().code();
  PyObject* type = PyExc_ValueError;
  if (file && code == absl::StatusCode::kNotFound) type = PyExc_FileNotFoundError;
  if (file && code != absl::StatusCode::kNotFound && code != absl::StatusCode::kInvalidArgument) {
    type = PyExc_OSError;
  }
  PyErr_SetString(type, std::string(value.status().message()).c_str());
  throw nb::python_error();
}

nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> Int64Array(std::vector<int64_t> values) {
  auto* owned = new std::vector<int64_t>(std::move(values));
  nb::capsule free(owned, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(owned->data(), {owned->size()}, free);
}

}  // namespace

void BindData(nb::module_& m) {
  m.def(
      "assign_dp_ranks",
      [](const std::vector<double>& forward, const std::vector<double>& backward, int pp, int dp) {
        if (forward.size() != backward.size()) {
          OrRaise<int>(absl::InvalidArgumentError(
              absl::StrFormat("forward has %d micro-batches but backward has %d", forward.size(),
                              backward.size())));
        }
        std::vector<wlb::StageTimes> times(forward.size());
        for (size_t k = 0; k < times.size(); ++k) times[k] = {forward[k], backward[k]};
        absl::StatusOr<wlb::DpAssignment> a;
        {
          nb::gil_scoped_release release;
          a = wlb::AssignDpRanks(times, pp, dp);
        }
        wlb::DpAssignment out = OrRaise(std::move(a));
        nb::dict d;
        d["ranks"] = nb::cast(out.ranks);
        d["step_seconds"] = out.step_seconds;
        d["round_robin_seconds"] = out.round_robin_seconds;
        return d;
      },
      "forward"_a, "backward"_a, "pp"_a, "dp"_a,
      "Places a step's micro-batches (per-stage forward / backward seconds) on `dp` ranks of a "
      "`pp`-stage 1F1B pipeline, len / dp each, minimising the slowest rank's makespan: "
      "{'ranks': each rank's micro-batch indices in run order, 'step_seconds', "
      "'round_robin_seconds' (micro-batch k on rank k % dp)}.");
  m.def(
      "micro_batch_stage_times",
      [](const std::vector<std::vector<int64_t>>& micro_batches, const std::string& model, int tp,
         int cp, int pp, int dp, double gemm_tflops, const std::string& sharding) {
        const wlb::TransformerShape shape = OrRaise(wlb::FindTransformerShape(model));
        wlb::PipelineJob job = OrRaise(
            wlb::MakePipelineJob(shape, {.tp = tp, .cp = cp, .pp = pp, .dp = dp}, gemm_tflops));
        const wlb::StepTimeModel step_model = OrRaise(wlb::StepTimeModel::Create(std::move(job)));
        const wlb::ShardStrategy strategy = OrRaise(wlb::ParseShardStrategy(sharding));
        std::vector<double> forward, backward;
        for (size_t k = 0; k < micro_batches.size(); ++k) {
          wlb::MicroBatch mb;
          for (int64_t length : micro_batches[k]) {
            if (length < 1 || length > wlb::kMaxMaxTokens) {
              OrRaise<int>(absl::InvalidArgumentError(
                  absl::StrFormat("micro-batch %d: document length %d is outside [1, %d]", k,
                                  length, wlb::kMaxMaxTokens)));
            }
            mb.documents.push_back(
                {.id = static_cast<int64_t>(mb.documents.size()), .length = length});
            mb.tokens += length;
          }
          const wlb::StageTimes t =
              OrRaise(step_model.MicroBatchTimes(mb, {.candidates = {strategy}}));
          forward.push_back(t.forward);
          backward.push_back(t.backward);
        }
        return std::make_pair(forward, backward);
      },
      "micro_batches"_a, nb::kw_only(), "model"_a = "llama2-7b", "tp"_a = 1, "cp"_a = 1, "pp"_a = 1,
      "dp"_a = 1, "gemm_tflops"_a = 500.0, "sharding"_a = "adaptive",
      "Per-stage (forward, backward) seconds of each micro-batch (a list of document lengths) "
      "under the 1F1B step-time model of a (TP, CP, PP, DP) job of a preset shape.");
  m.def(
      "read_megatron_index",
      [](const std::string& path) {
        wlb::MegatronIndex index = OrRaise(wlb::ReadMegatronIndex(path), /*file=*/true);
        nb::dict d;
        d["dtype_code"] = index.dtype_code;
        d["item_size"] = index.item_size;
        d["sequence_lengths"] = Int64Array(std::move(index.sequence_lengths));
        d["sequence_pointers"] = Int64Array(std::move(index.sequence_pointers));
        d["document_indices"] = Int64Array(std::move(index.document_indices));
        d["empty_sequences"] = index.empty_sequences;
        return d;
      },
      "path"_a,
      "Reads a Megatron-LM .idx file: {'dtype_code', 'item_size', 'sequence_lengths', "
      "'sequence_pointers' (byte offsets into the .bin), 'document_indices'} (int64 arrays), "
      "'empty_sequences' (how many have length 0).");
  m.def(
      "scan_megatron_index",
      [](const std::string& path) {
        absl::StatusOr<wlb::MegatronLengthReader> opened;
        wlb::MegatronHeader header;
        int64_t empty = 0, bin_bytes = 0;
        {
          nb::gil_scoped_release release;
          opened = wlb::MegatronLengthReader::Open(path);
          if (opened.ok()) {
            header = opened->header();
            std::vector<int64_t> chunk;
            absl::Status s;
            do {
              s = opened->Next(size_t{1} << 20, chunk);
            } while (s.ok() && !chunk.empty());
            if (!s.ok()) opened = s;
          }
          if (opened.ok()) {
            empty = opened->empty_sequences();
            bin_bytes = opened->bin_bytes();
          }
        }
        OrRaise(std::move(opened), /*file=*/true);
        nb::dict d;
        d["dtype_code"] = header.dtype_code;
        d["item_size"] = header.item_size;
        d["sequences"] = header.sequences;
        d["documents"] = header.documents;
        d["empty_sequences"] = empty;
        d["bin_bytes"] = bin_bytes;
        d["lengths_offset"] = wlb::kMegatronHeaderBytes;
        d["pointers_offset"] = wlb::kMegatronHeaderBytes + 4 * header.sequences;
        d["document_indices_offset"] = wlb::kMegatronHeaderBytes + 12 * header.sequences;
        return d;
      },
      "path"_a,
      "Checks a Megatron-LM .idx file (a regular file) chunk by chunk, as read_megatron_index "
      "does, in constant memory whatever its size: {'dtype_code', 'item_size', 'sequences', "
      "'documents', 'empty_sequences', 'bin_bytes' (the .bin's size it describes), and the byte "
      "offsets of its arrays: 'lengths_offset' (int32 x sequences), 'pointers_offset' (int64 x "
      "sequences), 'document_indices_offset' (int64 x documents)}, for numpy.memmap.");
}
