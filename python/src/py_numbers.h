// The number casters of wlb._wlb. Every binding file includes this header (through py_common.h,
// or directly: bind_data.cc) before it binds anything, so every file sees the same casters.
#pragma once
#include <nanobind/nanobind.h>

#include <cstring>
#include <limits>
#include <type_traits>

// ---- numbers: a bool is not a number ------------------------------------------------------
// nanobind converts True / False (and numpy.bool_) to 1 / 0 wherever an int or a float is
// expected; every such argument of wlb is a size, rank, count, seed, bandwidth or time, where a
// bool is a mistake. These casters (for every int, int64_t, uint64_t and double argument of the
// module, also inside lists and optionals) refuse bools, so the call is a TypeError naming the
// argument types as for any other wrong type; anything else converts as nanobind's own casters
// (of a same-width type, which they call) convert it, and integers out of the C++ type's range
// are refused, not wrapped.
NAMESPACE_BEGIN(NB_NAMESPACE)
NAMESPACE_BEGIN(detail)

inline bool WlbIsBool(handle src) noexcept {
  if (PyBool_Check(src.ptr())) return true;
  const char* name = Py_TYPE(src.ptr())->tp_name;  // numpy.bool_ is not a Python bool
  return std::strcmp(name, "numpy.bool") == 0 || std::strcmp(name, "numpy.bool_") == 0;
}

template <typename T, typename Via>
struct WlbNumberCaster {
  NB_TYPE_CASTER(T, const_name<std::is_integral_v<T>>("int", "float"))
  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    if (WlbIsBool(src)) return false;
    type_caster<Via> via;
    if (!via.from_python(src, flags, cleanup)) return false;
    if constexpr (std::is_integral_v<T>) {
      if (via.value < static_cast<Via>(std::numeric_limits<T>::min()) ||
          via.value > static_cast<Via>(std::numeric_limits<T>::max())) {
        return false;
      }
    }
    value = static_cast<T>(via.value);
    return true;
  }
  static handle from_cpp(T src, rv_policy policy, cleanup_list* cleanup) noexcept {
    return type_caster<Via>::from_cpp(static_cast<Via>(src), policy, cleanup);
  }
};

static_assert(sizeof(long) == sizeof(long long), "int64_t is long on the supported platforms");
template <>
struct type_caster<long> : WlbNumberCaster<long, long long> {};
template <>
struct type_caster<unsigned long> : WlbNumberCaster<unsigned long, unsigned long long> {};
template <>
struct type_caster<int> : WlbNumberCaster<int, long long> {};
template <>
struct type_caster<double> : WlbNumberCaster<double, long double> {};

NAMESPACE_END(detail)
NAMESPACE_END(NB_NAMESPACE)
