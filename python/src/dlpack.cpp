// DLPack, both ways and without copies: Tensor.__dlpack__ / __dlpack_device__ for consumers
// (torch.from_dlpack, np.from_dlpack, ...) and kiln.from_dlpack for producers (NumPy arrays, PyTorch and
// CuPy tensors, anything with __dlpack__). The structures below are the DLPack 1.1 ABI (dlpack.h).
//
// Lifetimes: an exported capsule holds a Tensor (and so its storage) until the consumer calls the deleter;
// an imported tensor's storage holds the producer's DLManagedTensor and calls its deleter, with the GIL
// held, when the last kiln tensor viewing it dies.
//
// Streams (CUDA): the consumer names the stream it will use (the protocol's `stream` argument); the
// producer makes that stream wait, on the device, for the work already enqueued on the tensor (an event,
// not a host synchronisation).
#include <cstring>
#include <memory>

#include "kiln/runtime.h"
#include "kiln_py.h"

namespace kiln::py {

namespace {

// ---- The DLPack ABI -----------------------------------------------------------------------------------
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;
constexpr uint32_t kDLPackMajor = 1, kDLPackMinor = 1;

DLDataType to_dl(DType t) {
  const uint8_t bits = static_cast<uint8_t>(itemsize(t) * 8);
  switch (t) {
    case DType::Bool: return {kDLBool, 8, 1};
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return {kDLUInt, bits, 1};
    case DType::I8: case DType::I16: case DType::I32: case DType::I64: return {kDLInt, bits, 1};
    case DType::F16: case DType::F32: case DType::F64: return {kDLFloat, bits, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::C64: return {kDLComplex, 64, 1};
    case DType::F8E4M3: return {kDLFloat8_e4m3fn, 8, 1};
    case DType::F8E5M2: return {kDLFloat8_e5m2, 8, 1};
  }
  throw Error("DLPack: unknown dtype");
}

DType from_dl(DLDataType d) {
  KILN_CHECK(d.lanes == 1, "from_dlpack: vector types (lanes = ", d.lanes, ") are not supported");
  switch (d.code) {
    case kDLBool:
      if (d.bits == 8) return DType::Bool;
      break;
    case kDLUInt:
      if (d.bits == 8) return DType::U8;
      if (d.bits == 16) return DType::U16;
      if (d.bits == 32) return DType::U32;
      if (d.bits == 64) return DType::U64;
      break;
    case kDLInt:
      if (d.bits == 8) return DType::I8;
      if (d.bits == 16) return DType::I16;
      if (d.bits == 32) return DType::I32;
      if (d.bits == 64) return DType::I64;
      break;
    case kDLFloat:
      if (d.bits == 16) return DType::F16;
      if (d.bits == 32) return DType::F32;
      if (d.bits == 64) return DType::F64;
      break;
    case kDLBfloat:
      if (d.bits == 16) return DType::BF16;
      break;
    case kDLComplex:
      if (d.bits == 64) return DType::C64;
      break;
    case kDLFloat8_e4m3fn:
      if (d.bits == 8) return DType::F8E4M3;
      break;
    case kDLFloat8_e5m2:
      if (d.bits == 8) return DType::F8E5M2;
      break;
    default: break;
  }
  throw Error(str("from_dlpack: DLPack dtype (code ", int(d.code), ", ", int(d.bits),
                  " bits) has no kiln dtype (kiln has bool, u8-u64, i8-i64, float16, bfloat16, float32, float64, "
                  "complex64, float8_e4m3fn, float8_e5m2)"));
}

// ---- Export ---------------------------------------------------------------------------------------------
// One allocation holds the managed tensor, the kiln tensor it keeps alive, and the shape and strides.
template <class Managed>
struct Export {
  Managed managed{};
  Tensor tensor;
  std::vector<int64_t> shape, strides;
};

template <class Managed>
Managed* make_export(const Tensor& t) {
  auto* e = new Export<Managed>();
  e->tensor = t;
  e->shape = t.sizes();
  e->strides = t.strides();
  DLTensor& d = e->managed.dl_tensor;
  // data points at the first element: byte_offset 0 (CUDA consumers may not accept another offset).
  d.data = t.numel() > 0 ? t.data_ptr() : t.storage()->data();
  d.device = t.is_cuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = to_dl(t.dtype());
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](Managed* self) { delete static_cast<Export<Managed>*>(self->manager_ctx); };
  return &e->managed;
}

// A capsule nobody consumed frees its tensor; a consumed one was renamed "used_..." and is the consumer's.
void legacy_capsule_destructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}
void versioned_capsule_destructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    if (m && m->deleter) m->deleter(m);
  }
}

// The consumer's stream as the protocol passes it: None (the legacy default stream), 1 (legacy default),
// 2 (per-thread default), -1 (no synchronisation wanted), or a cudaStream_t as an integer. Read with the GIL held.
intptr_t consumer_stream(const Tensor& t, nb::handle stream) {
  if (!t.is_cuda()) {
    if (!stream.is_none() && !(PyLong_Check(stream.ptr()) && PyLong_AsLongLong(stream.ptr()) == -1))
      throw nb::buffer_error("__dlpack__: a CPU tensor takes no stream (stream must be None)");
    return -1;
  }
  intptr_t s = 1;
  if (!stream.is_none()) {
    if (!PyLong_Check(stream.ptr())) throw nb::type_error("__dlpack__: stream must be an int or None");
    s = static_cast<intptr_t>(PyLong_AsLongLong(stream.ptr()));
    if (PyErr_Occurred()) throw nb::python_error();
  }
  if (s == 0) throw nb::buffer_error("__dlpack__: stream 0 is ambiguous for CUDA (use 1 or 2 for a default stream)");
  return s;
}

// Makes the consumer's stream wait for the work enqueued so far on the tensor's stream (an event; no host
// sync). No Python API here: it runs with the GIL released.
void sync_for_consumer(const Tensor& t, intptr_t s) {
  if (s == -1) return;
  const Stream producer = current_stream(t.device());
  // 1 and 2 are the legacy and per-thread default streams' handles in CUDA (cudaStreamLegacy, cudaStreamPerThread).
  const Stream consumer = Stream::from_handle(t.device(), reinterpret_cast<void*>(s));
  if (consumer == producer || (s == 1 && producer.is_default())) return;
  Event e;
  e.record(producer);
  e.wait(consumer);
}

nb::object export_dlpack(const Tensor& t, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                         nb::handle copy) {
  Tensor src = t;
  if (!dl_device.is_none()) {
    auto dev = nb::cast<std::pair<int, int>>(dl_device);
    const bool same = (t.is_cpu() && dev.first == kDLCPU) || (t.is_cuda() && dev.first == kDLCUDA && dev.second == t.device().index);
    if (!same) throw nb::buffer_error("__dlpack__: kiln exports a tensor on its own device only (dl_device differs)");
  }
  if (!copy.is_none() && nb::cast<bool>(copy)) src = t.clone();
  const intptr_t consumer = consumer_stream(src, stream);
  {
    nb::gil_scoped_release release;
    sync_for_consumer(src, consumer);
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    auto v = nb::cast<std::pair<int, int>>(max_version);
    versioned = v.first >= 1;
  }
  if (versioned) {
    DLManagedTensorVersioned* m = make_export<DLManagedTensorVersioned>(src);
    m->version = {kDLPackMajor, kDLPackMinor};
    m->flags = 0;
    PyObject* cap = PyCapsule_New(m, "dltensor_versioned", versioned_capsule_destructor);
    if (!cap) {
      m->deleter(m);
      throw nb::python_error();
    }
    return nb::steal(cap);
  }
  DLManagedTensor* m = make_export<DLManagedTensor>(src);
  PyObject* cap = PyCapsule_New(m, "dltensor", legacy_capsule_destructor);
  if (!cap) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

// ---- Import ---------------------------------------------------------------------------------------------
bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Calls the producer's deleter once the last kiln view dies, with the GIL held (NumPy's deleter releases a
// Python reference). At interpreter shutdown the memory is left to the process's exit.
template <class Managed>
std::shared_ptr<void> own(Managed* m, void* base) {
  return std::shared_ptr<void>(base, [m](void*) {
    if (!m->deleter) return;
    if (!Py_IsInitialized() || interpreter_finalizing()) return;
    nb::gil_scoped_acquire gil;
    m->deleter(m);
  });
}

Tensor import_dltensor(const DLTensor& d, std::shared_ptr<void> keep, const char* what) {
  Device dev;
  switch (d.device.device_type) {
    case kDLCPU: case kDLCUDAHost: dev = kCPU; break;
    case kDLCUDA: case kDLCUDAManaged: dev = cuda_device(d.device.device_id); break;
    default:
      throw Error(str("from_dlpack: the producer's device type ", d.device.device_type,
                      " is neither the CPU nor CUDA"));
  }
  KILN_CHECK(d.ndim >= 0 && d.ndim <= 64, "from_dlpack: ", d.ndim, " dims");
  const DType dtype = from_dl(d.dtype);
  Shape sizes(d.shape, d.shape + d.ndim);
  Shape strides = d.strides ? Shape(d.strides, d.strides + d.ndim) : contiguous_strides(sizes);
  // The bytes the view reaches, for the storage's size; negative strides have no kiln form.
  int64_t numel = 1, last = 0;
  for (int i = 0; i < d.ndim; ++i) {
    KILN_CHECK(sizes[i] >= 0, "from_dlpack: negative size ", sizes[i], " in dim ", i);
    numel *= sizes[i];
  }
  for (int i = 0; i < d.ndim; ++i) {
    if (sizes[i] <= 1) {
      strides[i] = std::max<int64_t>(strides[i], 0);  // a stride of a size-1 dim is meaningless
      continue;
    }
    KILN_CHECK(strides[i] >= 0, "from_dlpack: ", what, " has a negative stride (", strides[i], " in dim ", i,
               "); kiln tensors have none: pass a copy (e.g. numpy.ascontiguousarray)");
    last += (sizes[i] - 1) * strides[i];
  }
  const size_t nbytes = numel == 0 ? 0 : static_cast<size_t>(last + 1) * itemsize(dtype);
  auto* base = static_cast<uint8_t*>(d.data) + d.byte_offset;
  std::shared_ptr<void> data(keep, base);  // aliasing: `keep` owns, `base` is the pointer
  auto storage = std::make_shared<Storage>(std::move(data), nbytes, dev);
  return Tensor(std::move(storage), std::move(sizes), std::move(strides), 0, dtype);
}

// kiln's current stream on `dev`, as the protocol's stream argument for the producer.
nb::object consumer_stream_arg(Device dev) {
  if (!dev.is_cuda()) return nb::none();
  const Stream s = current_stream(dev);
  if (s.is_default()) return nb::int_(1);
  return nb::int_(reinterpret_cast<intptr_t>(s.handle()));
}

}  // namespace

Tensor tensor_from_dlpack(nb::handle obj, std::optional<bool> copy) {
  if (nb::isinstance<Tensor>(obj)) {
    const Tensor& t = nb::cast<const Tensor&>(obj);
    return copy.value_or(false) ? t.clone() : t;
  }
  if (!nb::hasattr(obj, "__dlpack__"))
    throw nb::type_error("from_dlpack: the object has no __dlpack__ method (a NumPy array, a torch tensor, ...)");
  Device dev = kCPU;
  if (nb::hasattr(obj, "__dlpack_device__")) {
    auto d = nb::cast<std::pair<int, int>>(obj.attr("__dlpack_device__")());
    if (d.first == kDLCUDA || d.first == kDLCUDAManaged) dev = cuda_device(d.second);
  }
  nb::object stream = consumer_stream_arg(dev);
  nb::object cap;
  try {
    nb::dict kw;
    kw["max_version"] = nb::make_tuple(kDLPackMajor, kDLPackMinor);
    if (dev.is_cuda()) kw["stream"] = stream;
    cap = obj.attr("__dlpack__")(**kw);
  } catch (const nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    // A producer that predates DLPack 1.0 (no max_version).
    cap = dev.is_cuda() ? obj.attr("__dlpack__")(nb::arg("stream") = stream) : obj.attr("__dlpack__")();
  }
  Tensor t;
  bool read_only = false;
  if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), "dltensor_versioned"));
    KILN_CHECK(m->version.major == 1, "from_dlpack: DLPack version ", m->version.major, ".", m->version.minor,
               " (kiln reads 1.x)");
    if (PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned") != 0) throw nb::python_error();
    auto keep = own(m, m->dl_tensor.data);
    read_only = (m->flags & kDLFlagReadOnly) != 0;
    t = import_dltensor(m->dl_tensor, std::move(keep), "the array");
  } else if (PyCapsule_IsValid(cap.ptr(), "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
    if (PyCapsule_SetName(cap.ptr(), "used_dltensor") != 0) throw nb::python_error();
    auto keep = own(m, m->dl_tensor.data);
    t = import_dltensor(m->dl_tensor, std::move(keep), "the array");
  } else {
    throw nb::type_error("from_dlpack: __dlpack__ returned no DLPack capsule");
  }
  // kiln has no read-only tensors: a read-only producer (a NumPy view of bytes, a memory map) is copied, so
  // that no kiln op can write memory that must not change.
  if (read_only) {
    if (copy.has_value() && !*copy)
      throw nb::buffer_error("from_dlpack: the array is read-only and copy=False; kiln tensors are writable");
    return t.clone();
  }
  return copy.value_or(false) ? t.clone() : t;
}

void bind_dlpack(nb::module_& m, nb::class_<Tensor>& cls) {
  cls.def("__dlpack__", &export_dlpack, nb::kw_only(), nb::arg("stream") = nb::none(),
          nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none(),
          "A DLPack capsule viewing this tensor (no copy). `stream` is the consumer's CUDA stream: it waits on "
          "the device for the work enqueued so far on this tensor's stream.");
  cls.def("__dlpack_device__", [](const Tensor& t) {
    return t.is_cuda() ? std::make_pair(int(kDLCUDA), t.device().index) : std::make_pair(int(kDLCPU), 0);
  });
  m.def("from_dlpack", [](nb::handle obj, std::optional<bool> copy) { return tensor_from_dlpack(obj, copy); },
        nb::arg("ext_tensor"), nb::kw_only(), nb::arg("copy") = nb::none(),
        "A kiln tensor viewing the memory of any DLPack producer (NumPy, PyTorch, CuPy, ...) without a copy, "
        "on the producer's device; the producer's memory lives as long as the tensor. kiln's current stream "
        "waits for the producer's pending work. A read-only array is copied.");
}

}  // namespace kiln::py
