// Per-element math of the binary ops, one functor per op, callable from host and device (KILN_HD) so the
// CPU and CUDA backends share one definition. T is the compute type (opmath_t of the storage type: float
// for f16/bf16). Integer functors are free of undefined behaviour: overflow wraps (done in unsigned
// arithmetic), division by zero returns 0 (the op layer raises ZeroDivisionError before any kernel runs;
// the guard only keeps the kernel defined), and shifts by negative or too-large counts give PyTorch's values.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/tensor.h"
#include "ops/math.h"

namespace kiln::fn {

// A Scalar argument (add's alpha) in the compute type M, the same way on both backends (host code).
template <class M>
M scalar_as(const Scalar& s) {
  if constexpr (std::is_same_v<M, bool>) return s.to_double() != 0.0 || s.to_int64() != 0;
  else if constexpr (std::is_same_v<M, Complex64>) return s.to_complex();
  else if constexpr (std::is_unsigned_v<M>) return static_cast<M>(s.to_uint64());
  else if constexpr (std::is_integral_v<M>) return static_cast<M>(s.to_int64());
  else return static_cast<M>(s.to_double());
}

template <class T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Unsigned type at least as wide as unsigned int, so that small types do not promote to (signed) int and
// overflow there (uint16 * uint16 would).
template <class T>
using wide_unsigned_t = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T>
KILN_HD T wrap_add(T a, T b) {
  using U = wide_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
KILN_HD T wrap_sub(T a, T b) {
  using U = wide_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <class T>
KILN_HD T wrap_mul(T a, T b) {
  using U = wide_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

// a + alpha * b (sub passes -alpha; for unsigned types the wrapped negation is the same modular value).
template <class T>
struct AddFn {
  T alpha;
  KILN_HD T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || (b && alpha);
    else if constexpr (is_int_v<T>) return wrap_add(a, wrap_mul(alpha, b));
    else return a + alpha * b;
  }
};

template <class T>
struct MulFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else if constexpr (is_int_v<T>) return wrap_mul(a, b);
    else return a * b;
  }
};

// True division (floating types only: integer inputs are converted to float by the op).
template <class T>
struct DivFn {
  KILN_HD T operator()(T a, T b) const { return a / b; }
};

// Integer quotient rounded toward zero; the one overflowing case (MIN / -1) wraps to MIN.
template <class T>
KILN_HD T int_div_trunc(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return wrap_sub(T(0), a);
  }
  return static_cast<T>(a / b);
}

template <class T>
struct DivTruncFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return int_div_trunc(a, b);
    else return math::trunc(a / b);
  }
};

template <class T>
struct DivFloorFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      if constexpr (std::is_signed_v<T>) {
        if (b != 0 && b != -1 && ((a < 0) != (b < 0))) {
          const T q = static_cast<T>(a / b);
          return static_cast<T>(a % b) != 0 ? static_cast<T>(q - 1) : q;
        }
      }
      return int_div_trunc(a, b);
    } else {
      // PyTorch's div_floor_floating: exact for a/b near integers where floor(a / b) would round wrongly
      // (1.0 // 0.1 is 9, not 10).
      if (b == 0) return a / b;
      const T mod = math::fmod(a, b);
      T div = (a - mod) / b;
      if (mod != 0 && (b < 0) != (mod < 0)) div -= 1;
      if (div != 0) {
        T fl = math::floor(div);
        if (div - fl > T(0.5)) fl += 1;
        return fl;
      }
      return math::copysign(T(0), a / b);
    }
  }
};

template <class T>
struct FmodFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return 0;
      }
      return static_cast<T>(a % b);
    } else {
      return math::fmod(a, b);
    }
  }
};

// Python's %: the result has the sign of b.
template <class T>
struct RemainderFn {
  KILN_HD T operator()(T a, T b) const {
    T r = FmodFn<T>{}(a, b);
    if constexpr (std::is_unsigned_v<T>) {
      return r;
    } else {
      if (r != 0 && ((r < 0) != (b < 0))) {
        if constexpr (is_int_v<T>) r = wrap_add(r, b);
        else r += b;
      }
      return r;
    }
  }
};

// Integer power by squaring (wrapping); negative exponents give 1/a truncated, as PyTorch's powi does.
template <class T>
struct PowFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) {
      if constexpr (std::is_signed_v<T>) {
        if (b < 0) {
          if (a == 1) return 1;
          if (a == -1) return (b & 1) ? T(-1) : T(1);
          return 0;
        }
      }
      T result = 1;
      while (b) {
        if (b & 1) result = wrap_mul(result, a);
        b = static_cast<T>(b / 2);
        a = wrap_mul(a, a);
      }
      return result;
    } else {
      return math::pow(a, b);
    }
  }
};

// NaN propagates; on equal values (0 and -0) the first operand wins, as in PyTorch.
template <class T>
struct MaximumFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else if constexpr (std::is_floating_point_v<T>) {
      if (math::isnan(a)) return a;
      if (math::isnan(b)) return b;
    }
    return a < b ? b : a;
  }
};
template <class T>
struct MinimumFn {
  KILN_HD T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else if constexpr (std::is_floating_point_v<T>) {
      if (math::isnan(a)) return a;
      if (math::isnan(b)) return b;
    }
    return b < a ? b : a;
  }
};

template <class T>
struct Atan2Fn {
  KILN_HD T operator()(T a, T b) const { return math::atan2(a, b); }
};

// values where x == 0, else (x > 0); NaN gives 0 as in PyTorch.
template <class T>
struct HeavisideFn {
  KILN_HD T operator()(T x, T v) const { return x == T(0) ? v : static_cast<T>(x > T(0)); }
};

template <class T>
struct BitAndFn {
  KILN_HD T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
template <class T>
struct BitOrFn {
  KILN_HD T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
template <class T>
struct BitXorFn {
  KILN_HD T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};

// Counts outside [0, bits) give 0 (PyTorch's values; in C++ they would be undefined).
template <class T>
struct ShiftLeftFn {
  KILN_HD T operator()(T a, T b) const {
    constexpr T bits = static_cast<T>(sizeof(T) * 8);
    if constexpr (std::is_signed_v<T>) {
      if (b < 0) return 0;
    }
    if (b >= bits) return 0;
    return static_cast<T>(static_cast<wide_unsigned_t<T>>(static_cast<std::make_unsigned_t<T>>(a)) << b);
  }
};
// Counts outside [0, bits) shift everything out: 0, or -1 for a negative signed value (sign fill).
template <class T>
struct ShiftRightFn {
  KILN_HD T operator()(T a, T b) const {
    constexpr T bits = static_cast<T>(sizeof(T) * 8);
    if constexpr (std::is_signed_v<T>) {
      if (b < 0 || b >= bits) return a < 0 ? T(-1) : T(0);
    } else {
      if (b >= bits) return 0;
    }
    return static_cast<T>(a >> b);  // arithmetic shift for negative signed values (defined in C++20)
  }
};

struct LogicalAndFn {
  KILN_HD bool operator()(bool a, bool b) const { return a && b; }
};
struct LogicalOrFn {
  KILN_HD bool operator()(bool a, bool b) const { return a || b; }
};
struct LogicalXorFn {
  KILN_HD bool operator()(bool a, bool b) const { return a != b; }
};

// Exact comparison of a signed and an unsigned 64-bit value.
KILN_HD bool less_iu(int64_t a, uint64_t b) { return a < 0 || static_cast<uint64_t>(a) < b; }
KILN_HD bool less_ui(uint64_t a, int64_t b) { return b >= 0 && a < static_cast<uint64_t>(b); }
KILN_HD bool equal_iu(int64_t a, uint64_t b) { return a >= 0 && static_cast<uint64_t>(a) == b; }

enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };

// Comparison of two values of one type, or of int64 with uint64 (exactly).
template <CmpOp Op>
struct CompareFn {
  template <class A, class B>
  KILN_HD bool operator()(A a, B b) const {
    if constexpr (std::is_same_v<A, int64_t> && std::is_same_v<B, uint64_t>) {
      if constexpr (Op == CmpOp::Eq) return equal_iu(a, b);
      if constexpr (Op == CmpOp::Ne) return !equal_iu(a, b);
      if constexpr (Op == CmpOp::Lt) return less_iu(a, b);
      if constexpr (Op == CmpOp::Le) return !less_ui(b, a);
      if constexpr (Op == CmpOp::Gt) return less_ui(b, a);
      if constexpr (Op == CmpOp::Ge) return !less_iu(a, b);
    } else if constexpr (std::is_same_v<A, uint64_t> && std::is_same_v<B, int64_t>) {
      if constexpr (Op == CmpOp::Eq) return equal_iu(b, a);
      if constexpr (Op == CmpOp::Ne) return !equal_iu(b, a);
      if constexpr (Op == CmpOp::Lt) return less_ui(a, b);
      if constexpr (Op == CmpOp::Le) return !less_iu(b, a);
      if constexpr (Op == CmpOp::Gt) return less_iu(b, a);
      if constexpr (Op == CmpOp::Ge) return !less_ui(a, b);
    } else {
      if constexpr (Op == CmpOp::Eq) return a == b;
      if constexpr (Op == CmpOp::Ne) return a != b;
      if constexpr (Op == CmpOp::Lt) return a < b;
      if constexpr (Op == CmpOp::Le) return a <= b;
      if constexpr (Op == CmpOp::Gt) return a > b;
      if constexpr (Op == CmpOp::Ge) return a >= b;
    }
  }
};

}  // namespace kiln::fn
