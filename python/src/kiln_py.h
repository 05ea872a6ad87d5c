// What the binding files share: conversions between Python objects and kiln's argument types. The
// bindings only convert arguments and call kiln's C++ API; no op is computed here.
//
//   DType     kiln.float32 ... (the objects of kiln.dtype), or a name: "float32", "bf16", "torch.float16"
//   Device    kiln.device objects, "cpu", "cuda", "cuda:1", or anything whose str() is such a name
//             (torch.device)
//   Scalar    Python bool, int, float, complex, and NumPy scalars of those kinds
//   Dims      None (all dims), an int, or a sequence of ints (torch's dim= argument)
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace nb = nanobind;

namespace kiln::py {

// The Python object of each dtype (kiln.float32, ...), created once by bind_dtypes().
nb::handle dtype_object(DType t);
// The dtype of a Python object, if it names one.
std::optional<DType> dtype_from_object(nb::handle h);
std::optional<Device> device_from_object(nb::handle h);
std::optional<Scalar> scalar_from_object(nb::handle h);
nb::object scalar_to_object(const Scalar& s);

// A dim= argument: none given (all dims), or a list.
struct Dims {
  std::vector<int64_t> dims;
  bool all = true;
};

// Module parts, each in its own file.
void bind_dtypes(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_dlpack(nb::module_& m, nb::class_<Tensor>& cls);
void bind_ops(nb::module_& m);
void bind_nn(nb::module_& m, nb::module_& functional);
void bind_runtime(nb::module_& m, nb::module_& cuda);
void bind_llm(nb::module_& m);
void bind_linalg(nb::module_& m, nb::module_& linalg);
void bind_functional(nb::module_& m, nb::module_& functional);

// A Python int (or an object with __index__) as int64: TypeError for other types, OverflowError outside
// the range. `what` names the argument.
int64_t int_arg(nb::handle h, const char* what);
// A shape given as varargs (f(2, 3)) or as one sequence (f((2, 3))).
Shape shape_args(const nb::tuple& args, const char* what);

// A tensor viewing a DLPack producer's memory (kiln.from_dlpack); copy=True copies it.
Tensor tensor_from_dlpack(nb::handle obj, std::optional<bool> copy);

// The Tensor class object (for isinstance checks outside tensor.cpp).
nb::handle tensor_type();

// The GIL is released around every call that computes: CPU kernels can take long, and a CUDA call may
// block on the allocator or a synchronisation.
using release_gil = nb::call_guard<nb::gil_scoped_release>;

}  // namespace kiln::py

namespace nanobind::detail {

template <>
struct type_caster<kiln::DType> {
  NB_TYPE_CASTER(kiln::DType, const_name("kiln.dtype | str"))
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    auto d = kiln::py::dtype_from_object(src);
    if (!d) return false;
    value = *d;
    return true;
  }
  static handle from_cpp(kiln::DType v, rv_policy, cleanup_list*) noexcept {
    return kiln::py::dtype_object(v).inc_ref();
  }
};

template <>
struct type_caster<kiln::Device> {
  NB_TYPE_CASTER(kiln::Device, const_name("kiln.device | str"))
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    auto d = kiln::py::device_from_object(src);
    if (!d) return false;
    value = *d;
    return true;
  }
  static handle from_cpp(const kiln::Device& v, rv_policy, cleanup_list*) noexcept;
};

template <>
struct type_caster<kiln::Scalar> {
  NB_TYPE_CASTER(kiln::Scalar, const_name("bool | int | float | complex"))
  type_caster() : value(0) {}
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    auto s = kiln::py::scalar_from_object(src);
    if (!s) return false;
    value = *s;
    return true;
  }
  static handle from_cpp(const kiln::Scalar& v, rv_policy, cleanup_list*) noexcept {
    return kiln::py::scalar_to_object(v).release();
  }
};

template <>
struct type_caster<kiln::py::Dims> {
  NB_TYPE_CASTER(kiln::py::Dims, const_name("int | Sequence[int] | None"))
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept;
  static handle from_cpp(const kiln::py::Dims&, rv_policy, cleanup_list*) noexcept { return none().release(); }
};

}  // namespace nanobind::detail
