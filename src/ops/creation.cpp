// Creation ops: empty, zeros, ones, full, *_like, scalar_tensor, from_vector, arange, linspace, logspace, eye.
#include <cstring>

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "cpu/creation.h"
#include "kiln/ops.h"

#if KILN_HAVE_CUDA
#include "cuda/creation.h"
#endif

namespace kiln {

Tensor empty(const Shape& sizes, DType dtype, Device device) {
  const int64_t n = checked_numel(sizes);
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), itemsize(dtype), &nbytes))
    throw Error(str("empty: ", shape_str(sizes), " x ", itemsize(dtype), " bytes overflows"));
  return Tensor(allocate_storage(nbytes, device), sizes, contiguous_strides(sizes), 0, dtype);
}

Tensor zeros(const Shape& sizes, DType dtype, Device device) {
  Tensor t = empty(sizes, dtype, device);
  t.zero_();
  return t;
}

Tensor ones(const Shape& sizes, DType dtype, Device device) {
  Tensor t = empty(sizes, dtype, device);
  t.fill_(1);
  return t;
}

namespace {
DType default_dtype_for(const Scalar& v) {
  switch (v.kind()) {
    case Scalar::Kind::Bool: return DType::Bool;
    case Scalar::Kind::Int: return DType::I64;
    case Scalar::Kind::UInt: return DType::U64;
    case Scalar::Kind::Float: return kDefaultFloat;
    default: return DType::C64;
  }
}
}  // namespace

Tensor full(const Shape& sizes, const Scalar& value, std::optional<DType> dtype, Device device) {
  Tensor t = empty(sizes, dtype.value_or(default_dtype_for(value)), device);
  t.fill_(value);
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, const Scalar& value) { return full(t.sizes(), value, t.dtype(), t.device()); }

Tensor scalar_tensor(const Scalar& value, std::optional<DType> dtype, Device device) {
  return full({}, value, dtype, device);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<Shape> sizes, Device device) {
  Shape s = sizes.value_or(Shape{static_cast<int64_t>(values.size())});
  KILN_CHECK(checked_numel(s) == static_cast<int64_t>(values.size()), "from_vector: ", values.size(),
             " values do not fill shape ", s);
  Tensor host = empty(s, dtype_of<T>(), kCPU);
  if (!values.empty()) {
    if constexpr (std::is_same_v<T, bool>) {
      auto* p = host.data<bool>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    } else {
      std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(T));
    }
  }
  return host.to(device);
}

#define KILN_INSTANTIATE_FROM_VECTOR(T) \
  template Tensor from_vector<T>(const std::vector<T>&, std::optional<Shape>, Device);
KILN_INSTANTIATE_FROM_VECTOR(bool)
KILN_INSTANTIATE_FROM_VECTOR(uint8_t)
KILN_INSTANTIATE_FROM_VECTOR(int8_t)
KILN_INSTANTIATE_FROM_VECTOR(int16_t)
KILN_INSTANTIATE_FROM_VECTOR(uint16_t)
KILN_INSTANTIATE_FROM_VECTOR(int32_t)
KILN_INSTANTIATE_FROM_VECTOR(uint32_t)
KILN_INSTANTIATE_FROM_VECTOR(int64_t)
KILN_INSTANTIATE_FROM_VECTOR(uint64_t)
KILN_INSTANTIATE_FROM_VECTOR(Half)
KILN_INSTANTIATE_FROM_VECTOR(BFloat16)
KILN_INSTANTIATE_FROM_VECTOR(float)
KILN_INSTANTIATE_FROM_VECTOR(double)
KILN_INSTANTIATE_FROM_VECTOR(Complex64)
KILN_INSTANTIATE_FROM_VECTOR(Float8_e4m3fn)
KILN_INSTANTIATE_FROM_VECTOR(Float8_e5m2)
#undef KILN_INSTANTIATE_FROM_VECTOR

}  // namespace kiln

// ---- range factories -----------------------------------------------------------------------------------

namespace kiln {

namespace {
// Only a build without the CUDA backend refuses CUDA devices.
void check_backend(Device device, const char* op) {
#if !KILN_HAVE_CUDA
  KILN_CHECK(!device.is_cuda(), op, ": no CUDA implementation yet (device ", device, ")");
#else
  // Say which op wanted the GPU (the allocator's error would not).
  if (device.is_cuda()) KILN_CHECK(cuda_available(), op, ": CUDA is not available (device ", device, ")");
#endif
}
constexpr DTypeSet kRangeTypes = kFloatTypes | kIntTypes;
void check_range_dtype(DType dtype, const char* op) {
  KILN_CHECK((kRangeTypes & dset(dtype)) != 0, op, ": dtype ", dtype_name(dtype), " is not supported; supported: ",
             dtype_set_str(kRangeTypes));
}
// Refuses lengths whose bytes could not be allocated anyway (PyTorch would try and fail in the allocator).
void check_length(int64_t n, DType dtype, const char* op) {
  constexpr int64_t kMaxBytes = int64_t{1} << 48;
  KILN_CHECK(n <= kMaxBytes / static_cast<int64_t>(itemsize(dtype)), op, ": ", n, " elements of ",
             dtype_name(dtype), " (", static_cast<double>(n) * static_cast<double>(itemsize(dtype)),
             " bytes) is too large to allocate");
}
// PyTorch converts start and end to an integer output type first and refuses values that do not fit.
void check_int_bounds(double start, double end, DType dtype, const char* op) {
  if (!is_integral(dtype, false)) return;
  visit_dtypes<kIntTypes>(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const double lo = static_cast<double>(std::numeric_limits<T>::min());
    const double hi = static_cast<double>(std::numeric_limits<T>::max());
    for (double v : {start, end})
      KILN_CHECK(v >= lo && v <= hi, op, ": value ", v, " cannot be converted to type ", dtype_name(dtype),
                 " without overflow (start=", start, ", end=", end, ")");
  });
}
}  // namespace

Tensor arange(const Scalar& end, std::optional<DType> dtype, Device device) {
  return arange(0, end, 1, dtype, device);
}

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, std::optional<DType> dtype,
              Device device) {
  const bool all_int = start.is_integral() && end.is_integral() && step.is_integral();
  KILN_CHECK(start.kind() != Scalar::Kind::Complex && end.kind() != Scalar::Kind::Complex &&
                 step.kind() != Scalar::Kind::Complex,
             "arange: complex start/end/step are not supported (got ", start.str(), ", ", end.str(), ", ",
             step.str(), ")");
  const DType dt = dtype.value_or(all_int ? DType::I64 : kDefaultFloat);
  check_range_dtype(dt, "arange");
  check_backend(device, "arange");
  // Length as PyTorch computes it: in int64 for an int64 output (values truncated to integers first), in
  // double otherwise.
  double size_d;
  bool step_nonzero, finite, consistent;
  if (dt == DType::I64) {
    const int64_t s = start.to_int64(), e = end.to_int64(), st = step.to_int64();
    step_nonzero = st != 0;
    finite = std::isfinite(start.to_double()) && std::isfinite(end.to_double());
    consistent = (st > 0 && e >= s) || (st < 0 && e <= s);
    const int64_t sgn = (st > 0) - (st < 0);
    // In 128 bits: PyTorch's int64 expression would overflow (and wrap) for ranges near the int64 limits.
    size_d = step_nonzero ? static_cast<double>((static_cast<__int128>(e) - s + st - sgn) / st) : 0.0;
  } else {
    const double s = start.to_double(), e = end.to_double(), st = step.to_double();
    const bool int_acc = is_integral(dt, false);
    // An integer output steps by the step truncated to an integer.
    step_nonzero = int_acc ? step.to_int64() != 0 : st != 0.0;
    finite = std::isfinite(s) && std::isfinite(e);
    consistent = (st > 0 && e >= s) || (st < 0 && e <= s);
    size_d = std::ceil((e - s) / st);
  }
  KILN_CHECK(step_nonzero, "arange: step must be nonzero (start=", start.str(), ", end=", end.str(),
             ", step=", step.str(), ", dtype ", dtype_name(dt), ")");
  KILN_CHECK(finite, "arange: unsupported range: ", start.str(), " -> ", end.str(), " (start and end must be finite)");
  KILN_CHECK(consistent, "arange: upper bound and lower bound inconsistent with step sign (start=", start.str(),
             ", end=", end.str(), ", step=", step.str(), ")");
  KILN_CHECK(size_d >= 0 && size_d <= 9.2233720368547748e18, "arange: invalid size ", size_d,
             ", possible overflow? (start=", start.str(), ", end=", end.str(), ", step=", step.str(), ")");
  const auto n = static_cast<int64_t>(size_d);
  check_length(n, dt, "arange");
  Tensor out = empty({n}, dt, device);
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::arange_fill(out, start, step);
    return out;
  }
#endif
  cpu::arange_fill(out, start, step);
  return out;
}

Tensor linspace(double start, double end, int64_t steps, DType dtype, Device device) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  check_range_dtype(dtype, "linspace");
  check_backend(device, "linspace");
  check_length(steps, dtype, "linspace");
  check_int_bounds(start, end, dtype, "linspace");
  Tensor out = empty({steps}, dtype, device);
  if (steps == 1) return out.fill_(start);  // PyTorch gives start (the symmetric formula would give end)
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::linspace_fill(out, start, end);
    return out;
  }
#endif
  cpu::linspace_fill(out, start, end);
  return out;
}

Tensor logspace(double start, double end, int64_t steps, double base, DType dtype, Device device) {
  KILN_CHECK(steps >= 0, "logspace: number of steps must be non-negative, got ", steps);
  check_range_dtype(dtype, "logspace");
  check_backend(device, "logspace");
  check_length(steps, dtype, "logspace");
  check_int_bounds(start, end, dtype, "logspace");
  Tensor out = empty({steps}, dtype, device);
  if (steps == 1) return out.fill_(std::pow(base, start));  // as linspace: the start
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::logspace_fill(out, start, end, base);
    return out;
  }
#endif
  cpu::logspace_fill(out, start, end, base);
  return out;
}

Tensor eye(int64_t n, std::optional<int64_t> m, DType dtype, Device device) {
  const int64_t cols = m.value_or(n);
  KILN_CHECK(n >= 0, "eye: n must be greater or equal to 0, got ", n);
  KILN_CHECK(cols >= 0, "eye: m must be greater or equal to 0, got ", cols);
  check_backend(device, "eye");
  Tensor out = zeros({n, cols}, dtype, device);
  if (out.numel() == 0) return out;
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::eye_fill(out);
    return out;
  }
#endif
  cpu::eye_fill(out);
  return out;
}

}  // namespace kiln
