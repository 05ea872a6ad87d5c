#include <cstdio>

#include "kiln/tensor.h"

namespace kiln {

double Scalar::to_double() const {
  switch (kind_) {
    case Kind::Bool:
    case Kind::Int: return static_cast<double>(i_);
    case Kind::UInt: return static_cast<double>(u_);
    default: return d_;
  }
}
int64_t Scalar::to_int64() const {
  switch (kind_) {
    case Kind::Bool:
    case Kind::Int: return i_;
    case Kind::UInt: return static_cast<int64_t>(u_);
    default: return float_to_i64_x86(d_);
  }
}
uint64_t Scalar::to_uint64() const {
  switch (kind_) {
    case Kind::Bool:
    case Kind::Int: return static_cast<uint64_t>(i_);
    case Kind::UInt: return u_;
    default: return float_to_u64_x86(d_);
  }
}
Complex64 Scalar::to_complex() const {
  if (kind_ == Kind::Complex) return Complex64(static_cast<float>(d_), im_);
  return Complex64(static_cast<float>(to_double()), 0.f);
}
DType Scalar::natural_dtype() const {
  switch (kind_) {
    case Kind::Bool: return DType::Bool;
    case Kind::Int: return DType::I64;
    case Kind::UInt: return DType::U64;
    case Kind::Float: return DType::F64;
    default: return DType::C64;
  }
}
std::string Scalar::str() const {
  switch (kind_) {
    case Kind::Bool: return i_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::UInt: return std::to_string(u_);
    case Kind::Float: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", d_);
      return buf;
    }
    default: {
      char buf[80];
      std::snprintf(buf, sizeof buf, "(%.9g%+.9gj)", d_, static_cast<double>(im_));
      return buf;
    }
  }
}

}  // namespace kiln
