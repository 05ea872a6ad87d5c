// kiln.dtype and kiln.device objects, and the argument conversions of kiln_py.h.
#include <nanobind/stl/complex.h>

#include <array>
#include <cmath>
#include <complex>
#include <limits>

#include "kiln_py.h"

namespace kiln::py {

namespace {

// A dtype as Python sees it: one immutable object per kiln::DType.
struct PyDType {
  DType t;
};
// A device as Python sees it ("cpu", "cuda:0").
struct PyDevice {
  Device d;
};

// Borrowed: the module's attributes (kiln.float32, ...) own the objects, so nothing outlives the interpreter.
std::array<nb::handle, kNumDTypes> g_dtypes;

// Python names, as torch spells them (kiln's dtype_name), plus the aliases torch defines.
struct Alias {
  const char* name;
  DType t;
};
constexpr Alias kAliases[] = {{"float", DType::F32},   {"double", DType::F64}, {"half", DType::F16},
                              {"long", DType::I64},    {"int", DType::I32},    {"short", DType::I16},
                              {"cfloat", DType::C64}};

}  // namespace

nb::handle dtype_object(DType t) { return g_dtypes[static_cast<int>(t)]; }

std::optional<DType> dtype_from_object(nb::handle h) {
  if (nb::isinstance<PyDType>(h)) return nb::cast<const PyDType&>(h).t;
  std::string name;
  if (nb::isinstance<nb::str>(h)) {
    name = nb::cast<std::string>(h);
  } else {
    // torch.float16 prints as "torch.float16"; numpy's dtypes print their names ("float32").
    PyObject* s = PyObject_Str(h.ptr());
    if (!s) {
      PyErr_Clear();
      return std::nullopt;
    }
    Py_ssize_t n = 0;
    const char* c = PyUnicode_AsUTF8AndSize(s, &n);
    if (c) name.assign(c, static_cast<size_t>(n));
    Py_DECREF(s);
    if (!c) {
      PyErr_Clear();
      return std::nullopt;
    }
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    else if (!nb::hasattr(h, "itemsize")) return std::nullopt;  // not a dtype-like object
  }
  for (const Alias& a : kAliases)
    if (name == a.name) return a.t;
  try {
    return parse_dtype(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<Device> device_from_object(nb::handle h) {
  if (nb::isinstance<PyDevice>(h)) return nb::cast<const PyDevice&>(h).d;
  std::string name;
  if (nb::isinstance<nb::str>(h)) {
    name = nb::cast<std::string>(h);
  } else if (nb::hasattr(h, "type") && nb::hasattr(h, "index")) {  // torch.device
    PyObject* s = PyObject_Str(h.ptr());
    if (!s) {
      PyErr_Clear();
      return std::nullopt;
    }
    const char* c = PyUnicode_AsUTF8(s);
    if (c) name = c;
    Py_DECREF(s);
    if (!c) {
      PyErr_Clear();
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  try {
    return Device::parse(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<Scalar> scalar_from_object(nb::handle h) {
  PyObject* o = h.ptr();
  if (PyBool_Check(o)) return Scalar(o == Py_True);
  if (PyLong_Check(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) return Scalar(static_cast<int64_t>(v));
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(o);
      if (!PyErr_Occurred()) return Scalar(static_cast<uint64_t>(u));
      PyErr_Clear();
    }
    return std::nullopt;  // outside [-2^63, 2^64)
  }
  if (PyFloat_Check(o)) return Scalar(PyFloat_AS_DOUBLE(o));
  if (PyComplex_Check(o)) {
    const Py_complex c = PyComplex_AsCComplex(o);
    return Scalar(Complex64{static_cast<float>(c.real), static_cast<float>(c.imag)});
  }
  // NumPy scalars (np.float32(1), np.int64(3), np.bool_): by their kind.
  if (nb::hasattr(h, "dtype") && nb::hasattr(h, "item") && !nb::isinstance(h, tensor_type())) {
    nb::object shape = nb::getattr(h, "shape", nb::none());
    if (!shape.is_none() && nb::len(shape) != 0) return std::nullopt;
    try {
      nb::object v = h.attr("item")();
      if (PyBool_Check(v.ptr()) || PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr()) || PyComplex_Check(v.ptr()))
        return scalar_from_object(v);
    } catch (const nb::python_error&) {
    }
  }
  return std::nullopt;
}

int64_t int_arg(nb::handle h, const char* what) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw nb::type_error(str(what, ": expected an int, got ", nb::type_name(h.type()).c_str()).c_str());
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) {
    PyErr_SetString(PyExc_OverflowError, str(what, ": ", nb::cast<std::string>(nb::str(i)), " does not fit in 64 bits").c_str());
    throw nb::python_error();
  }
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

Shape shape_args(const nb::tuple& args, const char* what) {
  Shape s;
  if (args.size() == 1 && !PyIndex_Check(args[0].ptr())) {
    if (!PySequence_Check(args[0].ptr()) || PyUnicode_Check(args[0].ptr()))
      throw nb::type_error(str(what, ": expected a shape (ints, or one sequence of ints)").c_str());
    for (nb::handle e : nb::borrow<nb::sequence>(args[0])) s.push_back(int_arg(e, what));
    return s;
  }
  for (nb::handle a : args) s.push_back(int_arg(a, what));
  return s;
}

nb::object scalar_to_object(const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return nb::bool_(s.to_int64() != 0);
    case Scalar::Kind::Int: return nb::int_(s.to_int64());
    case Scalar::Kind::UInt: return nb::steal(PyLong_FromUnsignedLongLong(s.to_uint64()));
    case Scalar::Kind::Float: return nb::float_(s.to_double());
    default: {
      const Complex64 c = s.to_complex();
      return nb::cast(std::complex<double>(c.re, c.im));
    }
  }
}

void bind_dtypes(nb::module_& m) {
  nb::class_<PyDType>(m, "dtype", "An element type: kiln.float32, kiln.bfloat16, kiln.float8_e4m3fn, ...")
      .def_prop_ro("itemsize", [](const PyDType& d) { return itemsize(d.t); }, "Bytes per element.")
      .def_prop_ro("is_floating_point", [](const PyDType& d) { return is_floating(d.t); })
      .def_prop_ro("is_complex", [](const PyDType& d) { return is_complex(d.t); })
      .def_prop_ro("is_signed", [](const PyDType& d) { return !is_unsigned(d.t); })
      .def("__repr__", [](const PyDType& d) { return std::string("kiln.") + dtype_name(d.t); })
      .def("__str__", [](const PyDType& d) { return std::string("kiln.") + dtype_name(d.t); })
      .def("__eq__", [](const PyDType& a, nb::handle b) {
        auto t = dtype_from_object(b);
        return t && *t == a.t;
      }, nb::arg("other").none())
      .def("__hash__", [](const PyDType& d) { return static_cast<int>(d.t); });
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    nb::object o = nb::cast(PyDType{t});
    m.attr(dtype_name(t)) = o;
    g_dtypes[i] = o;
  }
  for (const Alias& a : kAliases) m.attr(a.name) = g_dtypes[static_cast<int>(a.t)];

  nb::class_<PyDevice>(m, "device", "Where a tensor lives: kiln.device('cpu'), kiln.device('cuda:0').")
      .def("__init__", [](PyDevice* self, const std::string& name) { new (self) PyDevice{Device::parse(name)}; },
           nb::arg("name"))
      .def("__init__",
           [](PyDevice* self, const std::string& type, int index) {
             new (self) PyDevice{Device::parse(type + ":" + std::to_string(index))};
           },
           nb::arg("type"), nb::arg("index"))
      .def_prop_ro("type", [](const PyDevice& d) { return d.d.is_cuda() ? "cuda" : "cpu"; })
      .def_prop_ro("index", [](const PyDevice& d) -> std::optional<int> {
        if (d.d.is_cpu()) return std::nullopt;
        return d.d.index;
      })
      .def("__repr__", [](const PyDevice& d) { return "device(type='" + std::string(d.d.is_cuda() ? "cuda" : "cpu") +
                                                      (d.d.is_cuda() ? "', index=" + std::to_string(d.d.index) : "'") + ")"; })
      .def("__str__", [](const PyDevice& d) { return d.d.str(); })
      .def("__eq__", [](const PyDevice& a, nb::handle b) {
        auto d = device_from_object(b);
        return d && *d == a.d;
      }, nb::arg("other").none())
      .def("__hash__", [](const PyDevice& d) { return static_cast<int>(d.d.type) * 1024 + d.d.index; });
}

}  // namespace kiln::py

namespace nanobind::detail {

handle type_caster<kiln::Device>::from_cpp(const kiln::Device& v, rv_policy, cleanup_list*) noexcept {
  try {
    return nb::cast(kiln::py::PyDevice{v}).release();
  } catch (...) {
    return handle();
  }
}

bool type_caster<kiln::py::Dims>::from_python(handle src, uint32_t, cleanup_list*) noexcept {
  value = kiln::py::Dims{};
  if (src.is_none()) return true;
  value.all = false;
  if (PyLong_Check(src.ptr()) && !PyBool_Check(src.ptr())) {
    const long long d = PyLong_AsLongLong(src.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    value.dims.push_back(d);
    return true;
  }
  if (!PySequence_Check(src.ptr()) || PyUnicode_Check(src.ptr())) return false;
  const Py_ssize_t n = PySequence_Size(src.ptr());
  if (n < 0) {
    PyErr_Clear();
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* e = PySequence_GetItem(src.ptr(), i);
    if (!e) {
      PyErr_Clear();
      return false;
    }
    const bool ok = PyLong_Check(e) && !PyBool_Check(e);
    const long long d = ok ? PyLong_AsLongLong(e) : 0;
    Py_DECREF(e);
    if (!ok || PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    value.dims.push_back(d);
  }
  return true;
}

}  // namespace nanobind::detail
