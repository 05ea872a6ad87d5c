// CPU kernels of the unary elementwise ops: one dispatch on the input dtype, then a switch on the op
// that instantiates each functor of src/ops/unary_functors.h only for the dtypes it supports.
#include "cpu/unary.h"

#include <cmath>
#include <complex>
#include <type_traits>

#include "core/dispatch.h"
#include "cpu/loops.h"
#include "ops/unary_functors.h"

namespace kiln::cpu {
namespace {

// Loads In, computes f in In's opmath type (float for half types), stores as Out.
template <class Out, class In, class F>
void map(const Tensor& out, const Tensor& in, F f) {
  using C = opmath_t<In>;
  unary_kernel<Out, In>(out, in, [f](In v) { return convert<Out>(f(static_cast<C>(v))); });
}

using cfloat = std::complex<float>;

template <class F>
void map_complex(const Tensor& out, const Tensor& in, F f) {
  unary_kernel<Complex64, Complex64>(out, in, [f](Complex64 v) {
    const cfloat r = f(cfloat(v.re, v.im));
    return Complex64(r.real(), r.imag());
  });
}

template <class Out, class F>
void map_complex_to(const Tensor& out, const Tensor& in, F f) {
  unary_kernel<Out, Complex64>(out, in, [f](Complex64 v) { return static_cast<Out>(f(cfloat(v.re, v.im))); });
}

[[noreturn]] void not_instantiated(UnaryOp op, const Tensor& in) {
  throw Error(str("cpu::unary: internal error: op #", static_cast<int>(op), " has no kernel for ",
                  dtype_name(in.dtype())));
}

void complex_op(UnaryOp op, const Tensor& out, const Tensor& in) {
  switch (op) {
    case UnaryOp::Neg: return map_complex(out, in, [](cfloat z) { return -z; });
    case UnaryOp::Abs: return map_complex_to<float>(out, in, [](cfloat z) { return std::abs(z); });
    case UnaryOp::Square: return map_complex(out, in, [](cfloat z) { return z * z; });
    case UnaryOp::Reciprocal: return map_complex(out, in, [](cfloat z) { return cfloat(1.f) / z; });
    case UnaryOp::Rsqrt: return map_complex(out, in, [](cfloat z) { return cfloat(1.f) / std::sqrt(z); });
    case UnaryOp::Exp: return map_complex(out, in, [](cfloat z) { return std::exp(z); });
    case UnaryOp::Log: return map_complex(out, in, [](cfloat z) { return std::log(z); });
    case UnaryOp::Log10: return map_complex(out, in, [](cfloat z) { return std::log10(z); });
    case UnaryOp::Sqrt: return map_complex(out, in, [](cfloat z) { return std::sqrt(z); });
    case UnaryOp::Sin: return map_complex(out, in, [](cfloat z) { return std::sin(z); });
    case UnaryOp::Cos: return map_complex(out, in, [](cfloat z) { return std::cos(z); });
    case UnaryOp::Tan: return map_complex(out, in, [](cfloat z) { return std::tan(z); });
    case UnaryOp::Asin: return map_complex(out, in, [](cfloat z) { return std::asin(z); });
    case UnaryOp::Acos: return map_complex(out, in, [](cfloat z) { return std::acos(z); });
    case UnaryOp::Atan: return map_complex(out, in, [](cfloat z) { return std::atan(z); });
    case UnaryOp::Sinh: return map_complex(out, in, [](cfloat z) { return std::sinh(z); });
    case UnaryOp::Cosh: return map_complex(out, in, [](cfloat z) { return std::cosh(z); });
    case UnaryOp::Tanh: return map_complex(out, in, [](cfloat z) { return std::tanh(z); });
    case UnaryOp::Sigmoid: return map_complex(out, in, [](cfloat z) { return cfloat(1.f) / (cfloat(1.f) + std::exp(-z)); });
    case UnaryOp::IsNan:
      return map_complex_to<bool>(out, in, [](cfloat z) { return std::isnan(z.real()) || std::isnan(z.imag()); });
    case UnaryOp::IsInf:
      return map_complex_to<bool>(out, in, [](cfloat z) { return std::isinf(z.real()) || std::isinf(z.imag()); });
    case UnaryOp::IsFinite:
      return map_complex_to<bool>(out, in,
                                  [](cfloat z) { return std::isfinite(z.real()) && std::isfinite(z.imag()); });
    case UnaryOp::LogicalNot:
      return map_complex_to<bool>(out, in, [](cfloat z) { return z.real() == 0.f && z.imag() == 0.f; });
    default: not_instantiated(op, in);
  }
}

// T is a real storage type: bool, an integer, or a floating type (half types compute in float).
template <class T>
void real_op(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals) {
  using C = opmath_t<T>;
  constexpr bool fp = std::is_floating_point_v<C>;
  constexpr bool integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;
  constexpr bool boolean = std::is_same_v<T, bool>;
  switch (op) {
    // Ops that keep integers.
    case UnaryOp::Neg: if constexpr (fp || integer) return map<T, T>(out, in, unary::Neg{}); break;
    case UnaryOp::Abs: if constexpr (fp || integer) return map<T, T>(out, in, unary::Abs{}); break;
    case UnaryOp::Square: if constexpr (fp || integer) return map<T, T>(out, in, unary::Square{}); break;
    case UnaryOp::Sign: return map<T, T>(out, in, unary::Sign{});
    case UnaryOp::Relu: if constexpr (fp || integer) return map<T, T>(out, in, unary::Relu{}); break;
    // Predicates, any real input.
    case UnaryOp::Signbit: return map<bool, T>(out, in, unary::Signbit{});
    case UnaryOp::IsNan: return map<bool, T>(out, in, unary::IsNan{});
    case UnaryOp::IsInf: return map<bool, T>(out, in, unary::IsInf{});
    case UnaryOp::IsFinite: return map<bool, T>(out, in, unary::IsFinite{});
    case UnaryOp::LogicalNot: return map<bool, T>(out, in, unary::LogicalNot{});
    case UnaryOp::BitwiseNot: if constexpr (integer || boolean) return map<T, T>(out, in, unary::BitwiseNot{}); break;
    default: break;
  }
  if constexpr (fp) {
    switch (op) {
      case UnaryOp::Exp: return map<T, T>(out, in, unary::Exp{});
      case UnaryOp::Exp2: return map<T, T>(out, in, unary::Exp2{});
      case UnaryOp::Expm1: return map<T, T>(out, in, unary::Expm1{});
      case UnaryOp::Log: return map<T, T>(out, in, unary::Log{});
      case UnaryOp::Log2: return map<T, T>(out, in, unary::Log2{});
      case UnaryOp::Log10: return map<T, T>(out, in, unary::Log10{});
      case UnaryOp::Log1p: return map<T, T>(out, in, unary::Log1p{});
      case UnaryOp::Sqrt: return map<T, T>(out, in, unary::Sqrt{});
      case UnaryOp::Rsqrt: return map<T, T>(out, in, unary::Rsqrt{});
      case UnaryOp::Reciprocal: return map<T, T>(out, in, unary::Reciprocal{});
      case UnaryOp::Sin: return map<T, T>(out, in, unary::Sin{});
      case UnaryOp::Cos: return map<T, T>(out, in, unary::Cos{});
      case UnaryOp::Tan: return map<T, T>(out, in, unary::Tan{});
      case UnaryOp::Asin: return map<T, T>(out, in, unary::Asin{});
      case UnaryOp::Acos: return map<T, T>(out, in, unary::Acos{});
      case UnaryOp::Atan: return map<T, T>(out, in, unary::Atan{});
      case UnaryOp::Sinh: return map<T, T>(out, in, unary::Sinh{});
      case UnaryOp::Cosh: return map<T, T>(out, in, unary::Cosh{});
      case UnaryOp::Tanh: return map<T, T>(out, in, unary::Tanh{});
      case UnaryOp::Erf: return map<T, T>(out, in, unary::Erf{});
      case UnaryOp::Sigmoid: return map<T, T>(out, in, unary::Sigmoid{});
      case UnaryOp::Silu: return map<T, T>(out, in, unary::Silu{});
      case UnaryOp::GeluErf: return map<T, T>(out, in, unary::GeluErf{});
      case UnaryOp::GeluTanh: return map<T, T>(out, in, unary::GeluTanh{});
      case UnaryOp::Floor: return map<T, T>(out, in, unary::Floor{});
      case UnaryOp::Ceil: return map<T, T>(out, in, unary::Ceil{});
      case UnaryOp::Trunc: return map<T, T>(out, in, unary::Trunc{});
      case UnaryOp::Round: return map<T, T>(out, in, unary::Round{});
      case UnaryOp::RoundDecimals: {
        const bool negative = decimals < 0;
        const double p = std::pow(10.0, static_cast<double>(negative ? -decimals : decimals));
        return map<T, T>(out, in, unary::RoundDecimals<C>{static_cast<C>(p), negative});
      }
      default: break;
    }
  }
  not_instantiated(op, in);
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals) {
  if (in.dtype() == DType::C64) return complex_op(op, out, in);
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(in.dtype(), "cpu::unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    real_op<T>(op, out, in, decimals);
  });
}

void frexp(const Tensor& mantissa, const Tensor& exponent, const Tensor& in) {
  visit_dtypes<kFloatTypes>(in.dtype(), "frexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = opmath_t<T>;
    StridedLoop<3> loop(in.sizes(), {&mantissa, &exponent, &in});
    loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i) {
        int32_t e = 0;
        const C m = unary::Frexp{}(static_cast<C>(*reinterpret_cast<const T*>(p[2] + i * s[2])), &e);
        *reinterpret_cast<T*>(p[0] + i * s[0]) = convert<T>(m);
        *reinterpret_cast<int32_t*>(p[1] + i * s[1]) = e;
      }
    });
  });
}

}  // namespace kiln::cpu
