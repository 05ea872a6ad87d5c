// Per-element definitions of the unary elementwise ops, shared by the CPU kernels and (later) the CUDA
// kernels so both compute the same function. Each functor's operator() takes the compute type: float or
// double for floating ops (half types are widened to float by the caller, as PyTorch does), the integer
// type itself for the ops that keep integers. Complex variants live with the CPU kernels (std::complex).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/scalar_types.h"
#include "ops/math.h"

namespace kiln::unary {

// Integer arithmetic wraps (two's complement) as in PyTorch; going through the unsigned type avoids the
// undefined behaviour of signed overflow (-INT64_MIN, 100 * 100 in int8 after promotion is fine, but
// INT64_MAX * INT64_MAX is not).
template <class T>
KILN_HD T wrap_neg(T x) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(U(0) - static_cast<U>(x)));
  } else {
    return -x;
  }
}

struct Neg {
  template <class T>
  KILN_HD T operator()(T x) const { return wrap_neg(x); }
};

struct Abs {
  template <class T>
  KILN_HD T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::fabs(x);
    else if constexpr (std::is_unsigned_v<T>) return x;
    else return x < 0 ? wrap_neg(x) : x;  // abs(INT_MIN) stays INT_MIN, as in PyTorch
  }
};

struct Square {
  template <class T>
  KILN_HD T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<uint64_t>(x) * static_cast<uint64_t>(x));
    else return x * x;
  }
};

// (0 < x) - (x < 0): NaN and -0.0 give +0, as PyTorch's sign.
struct Sign {
  template <class T>
  KILN_HD T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) return x;
    else return static_cast<T>(static_cast<int>(T(0) < x) - static_cast<int>(x < T(0)));
  }
};

// NaN and -0.0 pass through (PyTorch's clamp_min(x, 0) does the same).
struct Relu {
  template <class T>
  KILN_HD T operator()(T x) const { return x < T(0) ? T(0) : x; }
};

struct Exp { template <class T> KILN_HD T operator()(T x) const { return math::exp(x); } };
struct Exp2 { template <class T> KILN_HD T operator()(T x) const { return math::exp2(x); } };
struct Expm1 { template <class T> KILN_HD T operator()(T x) const { return math::expm1(x); } };
struct Log { template <class T> KILN_HD T operator()(T x) const { return math::log(x); } };
struct Log2 { template <class T> KILN_HD T operator()(T x) const { return math::log2(x); } };
struct Log10 { template <class T> KILN_HD T operator()(T x) const { return math::log10(x); } };
struct Log1p { template <class T> KILN_HD T operator()(T x) const { return math::log1p(x); } };
struct Sqrt { template <class T> KILN_HD T operator()(T x) const { return math::sqrt(x); } };
// rsqrt(+0) = inf, rsqrt(-0) = -inf (1 / sqrt(-0) = 1 / -0), as PyTorch.
struct Rsqrt { template <class T> KILN_HD T operator()(T x) const { return math::rsqrt(x); } };
struct Reciprocal { template <class T> KILN_HD T operator()(T x) const { return T(1) / x; } };
struct Sin { template <class T> KILN_HD T operator()(T x) const { return math::sin(x); } };
struct Cos { template <class T> KILN_HD T operator()(T x) const { return math::cos(x); } };
struct Tan { template <class T> KILN_HD T operator()(T x) const { return math::tan(x); } };
struct Asin { template <class T> KILN_HD T operator()(T x) const { return math::asin(x); } };
struct Acos { template <class T> KILN_HD T operator()(T x) const { return math::acos(x); } };
struct Atan { template <class T> KILN_HD T operator()(T x) const { return math::atan(x); } };
struct Sinh { template <class T> KILN_HD T operator()(T x) const { return math::sinh(x); } };
struct Cosh { template <class T> KILN_HD T operator()(T x) const { return math::cosh(x); } };
struct Tanh { template <class T> KILN_HD T operator()(T x) const { return math::tanh(x); } };
struct Erf { template <class T> KILN_HD T operator()(T x) const { return math::erf(x); } };

// 1 / (1 + e^-x): for x -> -inf, e^-x overflows to inf and the result is 0, never NaN.
struct Sigmoid {
  template <class T>
  KILN_HD T operator()(T x) const { return T(1) / (T(1) + math::exp(-x)); }
};

// x / (1 + e^-x) rather than x * sigmoid(x): for x -> -inf this gives -0 (x / inf) where the product would
// be -inf * 0 = NaN. x = -inf itself gives NaN, as in PyTorch.
struct Silu {
  template <class T>
  KILN_HD T operator()(T x) const { return x / (T(1) + math::exp(-x)); }
};

// x * Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2.
struct GeluErf {
  template <class T>
  KILN_HD T operator()(T x) const {
    const T k_alpha = T(0.70710678118654752440);  // 1 / sqrt(2)
    return x * T(0.5) * (T(1) + math::erf(x * k_alpha));
  }
};

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's "tanh" approximation.
struct GeluTanh {
  template <class T>
  KILN_HD T operator()(T x) const {
    const T k_beta = T(0.79788456080286535588);  // sqrt(2 / pi)
    const T k_kappa = T(0.044715);
    const T inner = k_beta * (x + k_kappa * x * x * x);
    return T(0.5) * x * (T(1) + math::tanh(inner));
  }
};

struct Floor { template <class T> KILN_HD T operator()(T x) const { return math::floor(x); } };
struct Ceil { template <class T> KILN_HD T operator()(T x) const { return math::ceil(x); } };
struct Trunc { template <class T> KILN_HD T operator()(T x) const { return math::trunc(x); } };
// Half to even: nearbyint under the default rounding mode.
struct Round { template <class T> KILN_HD T operator()(T x) const { return math::nearbyint(x); } };

// round(x, decimals) as PyTorch computes it: scale by 10^|decimals| in the compute type, round half to
// even, scale back (so a large `decimals` overflows the scale to inf and gives NaN, as in PyTorch).
template <class T>
struct RoundDecimals {
  T ten_pow;
  bool negative;
  KILN_HD T operator()(T x) const {
    return negative ? math::nearbyint(x / ten_pow) * ten_pow : math::nearbyint(x * ten_pow) / ten_pow;
  }
};

struct Signbit {
  template <class T>
  KILN_HD bool operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::signbit(x);
    else if constexpr (std::is_unsigned_v<T>) return false;
    else return x < 0;
  }
};

struct IsNan {
  template <class T>
  KILN_HD bool operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::isnan(x);
    else return false;
  }
};

struct IsInf {
  template <class T>
  KILN_HD bool operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::isinf(x);
    else return false;
  }
};

struct IsFinite {
  template <class T>
  KILN_HD bool operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::isfinite(x);
    else return true;
  }
};

// NaN is nonzero, so logical_not(NaN) is false.
struct LogicalNot {
  template <class T>
  KILN_HD bool operator()(T x) const { return x == T(0); }
};

struct BitwiseNot {
  template <class T>
  KILN_HD T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) return !x;
    else return static_cast<T>(~x);
  }
};

// x = mantissa * 2^exponent, |mantissa| in [0.5, 1); 0 -> (0, 0) keeping the sign; inf and NaN ->
// (x, 0). Subnormal inputs are exact (frexp scales them up; a half subnormal is normal in float).
struct Frexp {
  template <class T>
  KILN_HD T operator()(T x, int32_t* exponent) const {
    if (!math::isfinite(x) || x == T(0)) {
      *exponent = 0;
      return x;
    }
    int e = 0;
#if defined(__CUDA_ARCH__)
    const T m = ::frexp(x, &e);
#else
    const T m = std::frexp(x, &e);
#endif
    *exponent = static_cast<int32_t>(e);
    return m;
  }
};

}  // namespace kiln::unary
