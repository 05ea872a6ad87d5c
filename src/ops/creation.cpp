// Creation ops: empty, zeros, ones, full, *_like, scalar_tensor, from_vector, arange, linspace, logspace, eye.
#include <cstring>

#include "core/dispatch.h"
#include "kiln/ops.h"

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
