// wlb._wlb: the nanobind extension behind `import wlb`. It only converts types between Python
// (numpy arrays, bytes, str) and the header-only library; every packing, sharding and metric
// decision is made by include/wlb. Errors: an absl::Status becomes ValueError (OSError /
// FileNotFoundError for file reads) carrying the library's message; wrong argument types raise
// TypeError. One file per area binds it (py_common.h lists them).
#include "py_common.h"

NB_MODULE(_wlb, m) {
  m.doc() = "wlb: workload-balanced packing and CP sharding (bindings of the C++ library).";
  m.attr("__version__") = WLB_VERSION;
  wlb_py::BindCost(m);
  wlb_py::BindSteps(m);
  wlb_py::BindPacker(m);
  wlb_py::BindShards(m);
  BindData(m);
}
