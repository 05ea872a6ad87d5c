// kiln.Tensor: properties, views, conversions, indexing, Python operators; kiln.tensor / from_numpy.
#include <nanobind/stl/complex.h>

#include <complex>
#include <functional>

#include "kiln/runtime.h"
#include "kiln_py.h"

namespace kiln::py {

namespace {

nb::handle g_tensor_type;

Shape shape_from_args(const nb::args& args) { return shape_args(args, "shape"); }

int64_t checked_index(nb::handle h, int64_t size, int64_t dim) {
  const int64_t i = int_arg(h, "index");
  if (i < -size || i >= size)
    throw nb::index_error(str("index ", i, " is out of bounds for dimension ", dim, " with size ", size).c_str());
  return i < 0 ? i + size : i;
}

bool is_int_like(nb::handle h) {
  return (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) ||
         (!nb::isinstance<Tensor>(h) && PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr()));
}

// Basic indexing as views (ints, slices with positive steps, None, Ellipsis); a 1-d integer tensor along
// one dim selects those entries (a copy, index_select). `allow_copy` is false for assignment.
Tensor index_tensor(const Tensor& t, nb::handle key, bool allow_copy) {
  std::vector<nb::handle> items;
  if (nb::isinstance<nb::tuple>(key)) {
    for (nb::handle h : nb::borrow<nb::tuple>(key)) items.push_back(h);
  } else {
    items.push_back(key);
  }
  int64_t consuming = 0;
  bool ellipsis = false;
  for (nb::handle h : items) {
    if (h.is_none()) continue;
    if (h.ptr() == Py_Ellipsis) {
      if (ellipsis) throw nb::index_error("an index can only have a single ellipsis ('...')");
      ellipsis = true;
      continue;
    }
    ++consuming;
  }
  if (consuming > t.dim())
    throw nb::index_error(str("too many indices for a tensor of dimension ", t.dim(), " (", consuming, " given)").c_str());
  Tensor r = t;
  int64_t dim = 0;
  for (nb::handle h : items) {
    if (h.is_none()) {
      r = r.unsqueeze(dim++);
    } else if (h.ptr() == Py_Ellipsis) {
      dim += t.dim() - consuming;
      consuming = t.dim();  // only one ellipsis
    } else if (PyBool_Check(h.ptr())) {
      throw nb::type_error("indexing with True/False is not supported");
    } else if (is_int_like(h)) {
      r = r.select(dim, checked_index(h, r.size(dim), dim));
    } else if (PySlice_Check(h.ptr())) {
      Py_ssize_t start = 0, stop = 0, step = 0;
      if (PySlice_Unpack(h.ptr(), &start, &stop, &step) != 0) throw nb::python_error();
      if (step <= 0) throw nb::value_error("slice steps must be positive");
      const Py_ssize_t n = PySlice_AdjustIndices(static_cast<Py_ssize_t>(r.size(dim)), &start, &stop, step);
      r = r.slice(dim, start, start + std::max<Py_ssize_t>(n - 1, 0) * step + (n > 0 ? 1 : 0), step);
      ++dim;
    } else if (nb::isinstance<Tensor>(h)) {
      const Tensor& idx = nb::cast<const Tensor&>(h);
      if (!allow_copy)
        throw nb::type_error("assignment through a tensor index is not supported (index_select makes a copy)");
      if (idx.dim() != 1 || idx.dtype() == DType::Bool)
        throw nb::type_error("a tensor index must be a 1-d integer tensor (boolean masks are not supported)");
      r = index_select(r, dim, idx);
      ++dim;
    } else {
      throw nb::type_error(str("unsupported index of type ", nb::type_name(h.type()).c_str(),
                               " (ints, slices, None, ..., and 1-d integer tensors)").c_str());
    }
  }
  return r;
}

// Nested Python sequences and numbers -> values, shape and the dtype torch.tensor would infer.
struct Nested {
  Shape shape;
  std::vector<Scalar> values;
  bool any_float = false, any_complex = false, any_int = false;
};

void walk(nb::handle h, size_t depth, Nested& n) {
  if (PySequence_Check(h.ptr()) && !PyUnicode_Check(h.ptr()) && !PyBytes_Check(h.ptr()) && !nb::isinstance<Tensor>(h)) {
    const Py_ssize_t len = PySequence_Size(h.ptr());
    if (len < 0) throw nb::python_error();
    if (depth == n.shape.size()) n.shape.push_back(len);
    else if (depth > n.shape.size() || n.shape[depth] != len)
      throw nb::value_error(str("tensor(): expected a sequence of length ", depth < n.shape.size() ? n.shape[depth] : 0,
                                " at dim ", depth, ", got ", len, " (ragged nested sequences)").c_str());
    for (Py_ssize_t i = 0; i < len; ++i) {
      nb::object e = nb::steal(PySequence_GetItem(h.ptr(), i));
      if (!e.is_valid()) throw nb::python_error();
      walk(e, depth + 1, n);
    }
    return;
  }
  if (depth != n.shape.size()) throw nb::value_error("tensor(): ragged nested sequences");
  auto s = scalar_from_object(h);
  if (!s) throw nb::type_error(str("tensor(): cannot make a number of ", nb::type_name(h.type()).c_str()).c_str());
  n.any_int |= s->kind() == Scalar::Kind::Int || s->kind() == Scalar::Kind::UInt;
  n.any_float |= s->kind() == Scalar::Kind::Float;
  n.any_complex |= s->kind() == Scalar::Kind::Complex;
  n.values.push_back(*s);
}

Tensor tensor_from_nested(nb::handle data, std::optional<DType> dtype) {
  Nested n;
  walk(data, 0, n);
  // torch.tensor's inference: complex > float (the default float dtype) > int64 > bool.
  const DType natural = n.any_complex ? DType::C64 : n.any_float ? kDefaultFloat : n.any_int ? DType::I64 : DType::Bool;
  const DType out = dtype.value_or(natural);
  Tensor t;
  if (n.any_complex) {
    std::vector<Complex64> v;
    for (const Scalar& x : n.values) v.push_back(x.to_complex());
    t = from_vector(v, n.shape);
  } else if (n.any_float) {
    std::vector<double> v;
    for (const Scalar& x : n.values) v.push_back(x.to_double());
    t = from_vector(v, n.shape);
  } else if (n.any_int) {
    // Integers keep all 64 bits (through a double they would round above 2^53).
    std::vector<int64_t> v;
    for (const Scalar& x : n.values) v.push_back(x.to_int64());
    t = from_vector(v, n.shape);
  } else {
    std::vector<uint8_t> v;
    for (const Scalar& x : n.values) v.push_back(x.to_int64() != 0);
    t = from_vector(v, n.shape).to(DType::Bool);
  }
  return t.to(out);
}

// Python values of every element, nested as the tensor's shape.
nb::object tolist(const Tensor& t) {
  Tensor c = t.cpu();
  const DType dt = c.dtype();
  Tensor v;
  if (dt == DType::Bool) v = c.contiguous();
  else if (is_complex(dt)) v = c.to(DType::C64).contiguous();
  else if (is_floating(dt)) v = c.to(DType::F64).contiguous();
  else if (dt == DType::U64) v = c.contiguous();
  else v = c.to(DType::I64).contiguous();
  const Shape& sizes = v.sizes();
  const void* base = v.numel() ? v.data_ptr() : nullptr;
  auto element = [&](int64_t i) -> nb::object {
    switch (v.dtype()) {
      case DType::Bool: return nb::bool_(static_cast<const bool*>(base)[i]);
      case DType::C64: {
        const Complex64 z = static_cast<const Complex64*>(base)[i];
        return nb::cast(std::complex<double>(z.re, z.im));
      }
      case DType::F64: return nb::float_(static_cast<const double*>(base)[i]);
      case DType::U64: return nb::steal(PyLong_FromUnsignedLongLong(static_cast<const uint64_t*>(base)[i]));
      default: return nb::int_(static_cast<const int64_t*>(base)[i]);
    }
  };
  if (sizes.empty()) return element(0);
  std::function<nb::object(size_t, int64_t)> build = [&](size_t d, int64_t offset) -> nb::object {
    nb::list out;
    int64_t inner = 1;
    for (size_t k = d + 1; k < sizes.size(); ++k) inner *= sizes[k];
    for (int64_t i = 0; i < sizes[d]; ++i)
      out.append(d + 1 == sizes.size() ? element(offset + i) : build(d + 1, offset + i * inner));
    return out;
  };
  return build(0, 0);
}

// to(dtype), to(device), to(device, dtype), to(other), with device= / dtype= keywords.
Tensor convert(const Tensor& t, const nb::args& args, std::optional<Device> device, std::optional<DType> dtype,
               bool copy) {
  for (nb::handle a : args) {
    if (nb::isinstance<Tensor>(a)) {
      const Tensor& o = nb::cast<const Tensor&>(a);
      device = o.device();
      dtype = o.dtype();
    } else if (auto dt = dtype_from_object(a); dt && !nb::isinstance<nb::str>(a)) {
      dtype = *dt;
    } else if (auto dev = device_from_object(a)) {
      device = *dev;
    } else if (auto dt2 = dtype_from_object(a)) {
      dtype = *dt2;
    } else {
      throw nb::type_error("to(): expected a device, a dtype or a tensor");
    }
  }
  nb::gil_scoped_release release;
  Tensor r = t.to(device.value_or(t.device()), dtype.value_or(t.dtype()));
  if (copy && r.is_alias_of(t)) r = r.clone();
  return r;
}

nb::object item(const Tensor& t) {
  if (t.numel() != 1)
    throw nb::value_error(str("item(): a tensor with ", t.numel(), " elements cannot be converted to a Python number").c_str());
  Scalar s(0);
  {
    nb::gil_scoped_release release;
    s = t.item();
  }
  return scalar_to_object(s);
}

}  // namespace

nb::handle tensor_type() { return g_tensor_type; }

void bind_tensor(nb::module_& m) {
  auto cls = nb::class_<Tensor>(m, "Tensor",
                                "A strided n-dimensional array on the CPU or a CUDA device, with PyTorch's semantics.");
  g_tensor_type = cls;
  cls.def_prop_ro("shape", [](const Tensor& t) { return nb::tuple(nb::cast(t.sizes())); })
      .def("size", [](const Tensor& t, std::optional<int64_t> dim) -> nb::object {
        if (dim) return nb::int_(t.size(*dim));
        return nb::tuple(nb::cast(t.sizes()));
      }, nb::arg("dim") = nb::none())
      .def("stride", [](const Tensor& t, std::optional<int64_t> dim) -> nb::object {
        if (dim) return nb::int_(t.stride(*dim));
        return nb::tuple(nb::cast(t.strides()));
      }, nb::arg("dim") = nb::none())
      .def("dim", &Tensor::dim)
      .def_prop_ro("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("device", &Tensor::device)
      .def_prop_ro("is_cuda", &Tensor::is_cuda)
      .def_prop_ro("is_cpu", &Tensor::is_cpu)
      .def_prop_ro("itemsize", [](const Tensor& t) { return t.itemsize(); })
      .def_prop_ro("nbytes", [](const Tensor& t) { return t.nbytes(); })
      .def("element_size", [](const Tensor& t) { return t.itemsize(); })
      .def("storage_offset", &Tensor::storage_offset)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.numel() ? t.data_ptr() : nullptr); })
      .def("__repr__", [](const Tensor& t) {
        nb::gil_scoped_release release;
        return t.str();
      })
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
        return t.size(0);
      })
      .def("__iter__", [](nb::handle self) {
        const Tensor& t = nb::cast<const Tensor&>(self);
        if (t.dim() == 0) throw nb::type_error("iteration over a 0-d tensor");
        nb::list rows;
        for (int64_t i = 0; i < t.size(0); ++i) rows.append(nb::cast(t.select(0, i)));
        return nb::iter(rows);
      })
      .def("__bool__", [](const Tensor& t) {
        if (t.numel() != 1)
          throw nb::value_error("the truth value of a tensor with more than one element is ambiguous");
        return nb::cast<bool>(nb::bool_(item(t)));
      })
      .def("__float__", [](const Tensor& t) { return nb::cast<double>(nb::float_(item(t))); })
      .def("__int__", [](const Tensor& t) { return nb::int_(item(t)); })
      .def("__index__", [](const Tensor& t) {
        if (!is_integral(t.dtype(), false) || t.numel() != 1)
          throw nb::type_error("only one-element integer tensors can be used as an index");
        return nb::int_(item(t));
      })
      .def("item", &item, "The value of a one-element tensor as a Python number.")
      .def("tolist", &tolist, "The elements as (nested) Python lists of numbers.")
      // Views.
      .def("view", [](const Tensor& t, nb::args args) {
        if (args.size() == 1) {
          if (auto dt = dtype_from_object(args[0]); dt && !PyLong_Check(args[0].ptr()) &&
                                                   !PySequence_Check(args[0].ptr()))
            return t.view_as_dtype(*dt);
        }
        return t.view(shape_from_args(args));
      }, "view(*shape) or view(dtype): a view with a new shape, or the same bytes read as another dtype of equal size")
      .def("reshape", [](const Tensor& t, nb::args args) { return t.reshape(shape_from_args(args)); })
      .def("flatten", &Tensor::flatten, nb::arg("start_dim") = 0, nb::arg("end_dim") = -1)
      .def("permute", [](const Tensor& t, nb::args args) { return t.permute(shape_from_args(args)); })
      .def("transpose", &Tensor::transpose, nb::arg("dim0"), nb::arg("dim1"))
      .def("t", &Tensor::t)
      .def_prop_ro("T", [](const Tensor& t) {
        Shape dims;
        for (int64_t d = t.dim() - 1; d >= 0; --d) dims.push_back(d);
        return t.permute(dims);
      })
      .def_prop_ro("mT", [](const Tensor& t) { return t.transpose(-2, -1); })
      .def("narrow", &Tensor::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"))
      .def("select", &Tensor::select, nb::arg("dim"), nb::arg("index"))
      .def("expand", [](const Tensor& t, nb::args args) { return t.expand(shape_from_args(args)); })
      .def("expand_as", &Tensor::expand_as, nb::arg("other"))
      .def("squeeze", [](const Tensor& t, std::optional<int64_t> dim) { return dim ? t.squeeze(*dim) : t.squeeze(); },
           nb::arg("dim") = nb::none())
      .def("unsqueeze", &Tensor::unsqueeze, nb::arg("dim"))
      .def("as_strided", &Tensor::as_strided, nb::arg("size"), nb::arg("stride"), nb::arg("storage_offset") = nb::none())
      // Copies and conversions.
      .def("contiguous", &Tensor::contiguous, release_gil())
      .def("clone", &Tensor::clone, release_gil())
      .def("to", &convert, "to(device=None, dtype=None, copy=False): this tensor on a device and/or in a dtype "
                           "(itself when nothing changes unless copy=True); positional forms to(dtype), to(device), "
                           "to(device, dtype), to(other)",
           nb::arg("args"), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(), nb::arg("copy") = false)
      .def("cpu", [](const Tensor& t) { return t.cpu(); }, release_gil())
      .def("cuda", [](const Tensor& t, std::optional<Device> d) { return t.to(d.value_or(cuda_device(0))); },
           nb::arg("device") = nb::none(), release_gil())
      .def("float", [](const Tensor& t) { return t.to(DType::F32); }, release_gil())
      .def("double", [](const Tensor& t) { return t.to(DType::F64); }, release_gil())
      .def("half", [](const Tensor& t) { return t.to(DType::F16); }, release_gil())
      .def("bfloat16", [](const Tensor& t) { return t.to(DType::BF16); }, release_gil())
      .def("int", [](const Tensor& t) { return t.to(DType::I32); }, release_gil())
      .def("long", [](const Tensor& t) { return t.to(DType::I64); }, release_gil())
      .def("bool", [](const Tensor& t) { return t.to(DType::Bool); }, release_gil())
      .def("copy_", [](Tensor& t, const Tensor& src) -> Tensor& { return t.copy_(src); }, nb::arg("src"),
           nb::rv_policy::none, release_gil())
      .def("fill_", [](Tensor& t, const Scalar& v) -> Tensor& { return t.fill_(v); }, nb::arg("value"),
           nb::rv_policy::none, release_gil())
      .def("zero_", [](Tensor& t) -> Tensor& { return t.zero_(); }, nb::rv_policy::none, release_gil())
      .def("record_stream", [](const Tensor& t, nb::handle s) {
        // kiln.cuda.Stream holds a kiln::Stream (runtime.cpp).
        t.record_stream(nb::cast<const Stream&>(s));
      }, nb::arg("stream"))
      .def("__getitem__", [](const Tensor& t, nb::handle key) { return index_tensor(t, key, true); },
           nb::arg("key").none())
      .def("__setitem__", [](Tensor& t, nb::handle key, nb::handle value) {
        Tensor dst = index_tensor(t, key, false);
        if (nb::isinstance<Tensor>(value)) {
          const Tensor& src = nb::cast<const Tensor&>(value);
          nb::gil_scoped_release release;
          dst.copy_(src);
        } else if (auto s = scalar_from_object(value)) {
          nb::gil_scoped_release release;
          dst.fill_(*s);
        } else {
          Tensor src = nb::hasattr(value, "__dlpack__") ? tensor_from_dlpack(value, std::nullopt)
                                                        : tensor_from_nested(value, dst.dtype());
          nb::gil_scoped_release release;
          dst.copy_(src.to(dst.device()));
        }
      }, nb::arg("key").none(), nb::arg("value").none());
  bind_dlpack(m, cls);

  m.def("tensor", [](nb::handle data, std::optional<DType> dtype, std::optional<Device> device) {
    Tensor t;
    if (nb::isinstance<Tensor>(data)) t = nb::cast<const Tensor&>(data).clone();
    else if (nb::hasattr(data, "__dlpack__")) t = tensor_from_dlpack(data, true);
    else t = tensor_from_nested(data, dtype);
    nb::gil_scoped_release release;
    return t.to(device.value_or(t.device()), dtype.value_or(t.dtype()));
  }, nb::arg("data"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
     "A new tensor holding a copy of `data`: nested sequences of numbers (dtype inferred as torch.tensor does: "
     "bool, int64, float32 or complex64), a NumPy array, another DLPack producer, or a kiln tensor.");
  m.def("from_numpy", [](nb::handle a) { return tensor_from_dlpack(a, std::nullopt); }, nb::arg("ndarray"),
        "A CPU tensor viewing a NumPy array's memory (no copy), as torch.from_numpy.");
  m.def("is_tensor", [](nb::handle h) { return nb::isinstance<Tensor>(h); }, nb::arg("obj"));
}

}  // namespace kiln::py
