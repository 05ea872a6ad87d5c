// Per-element formulas of arange, linspace and logspace (KILN_HD: CPU and CUDA kernels share them).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/scalar_types.h"
#include "kiln/tensor.h"  // Scalar

namespace kiln {

// arange's accumulate type, as PyTorch's CPU acc_type: double for f32/f64, float for f16/bf16, int64 for
// integers.
template <class T>
using arange_acc_t = std::conditional_t<std::is_floating_point_v<T>, double,
                                        std::conditional_t<is_reduced_float_v<T>, float, int64_t>>;

// Element i of arange(start, step) with n elements, reproducing PyTorch 2.11's CPU kernel bit for bit.
// PyTorch computes start + step * i (fused multiply-add) for most elements, but in its vectorised loop
// (blocks of 2 * V elements from the front, V = 8 for f32, 4 for f64, 16 for f16/bf16; the last n % 2V
// elements take the scalar formula) lane k of a vector starting at index j gets T(T(start + step*j) + k*step).
// kiln evaluates that per element, so the result does not depend on threads; it matches PyTorch whenever
// PyTorch runs on one thread or n < 32768 (above that PyTorch's result depends on its thread split).
template <class T>
struct ArangeOp {
  using acc = arange_acc_t<T>;
  acc start, step;
  int64_t n;
  KILN_HD T operator()(int64_t i) const {
    if constexpr (std::is_same_v<acc, int64_t>) {
      // Wraps like PyTorch's int64 arithmetic, then truncates to T.
      return static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(start) +
                                                 static_cast<uint64_t>(step) * static_cast<uint64_t>(i)));
    } else {
      constexpr int64_t V = std::is_same_v<T, double> ? 4 : std::is_same_v<T, float> ? 8 : 16;
      const int64_t blocked = n - n % (2 * V);
      if (i >= blocked) return convert<T>(std::fma(step, static_cast<acc>(i), start));
      const int64_t k = i % V;
      const T base = convert<T>(std::fma(step, static_cast<acc>(i - k), start));
      if constexpr (std::is_same_v<acc, double>) {
        return convert<T>(std::fma(static_cast<double>(k), step, static_cast<double>(base)));
      } else {
        // The reduced-float vector lane is not fused: k * step rounds to float first.
        const float ks = static_cast<float>(k) * step;
        return convert<T>(static_cast<float>(base) + ks);
      }
    }
  }
};

// Arithmetic of linspace's step type: PyTorch's CPU kernel computes in float for f16/bf16/f32, double for
// f64 and integer outputs.
template <class T>
struct LinspaceArith {
  using step_t = std::conditional_t<std::is_integral_v<T>, double, opmath_t<T>>;
  KILN_HD static step_t mul(step_t a, double b) {
    if constexpr (is_reduced_float_v<T>) return T(static_cast<float>(a) * static_cast<float>(T(static_cast<float>(b))));
    else return a * static_cast<step_t>(b);
  }
  KILN_HD static step_t add(step_t a, step_t b) {
    if constexpr (is_reduced_float_v<T>) return T(static_cast<float>(a) + static_cast<float>(b));
    else return a + b;
  }
  KILN_HD static step_t sub(step_t a, step_t b) {
    if constexpr (is_reduced_float_v<T>) return T(static_cast<float>(a) - static_cast<float>(b));
    else return a - b;
  }
};

// Element i of linspace: symmetric, the first half counts up from start and the second half down from end,
// so both endpoints are exact.
template <class T>
struct LinspaceOp {
  using A = LinspaceArith<T>;
  using step_t = typename A::step_t;
  step_t start, end, step;
  int64_t steps;
  KILN_HD step_t value(int64_t i) const {
    const int64_t halfway = steps / 2;
    if constexpr (std::is_floating_point_v<step_t>) {
      // PyTorch's compiled scalar loop fuses the multiply-add (linspace(-1, 1, 7)[3] is -2^-25, not 0).
      if (i < halfway) return std::fma(step, static_cast<step_t>(i), start);
      return std::fma(-step, static_cast<step_t>(steps - i - 1), end);
    } else {
      if (i < halfway) return A::add(start, A::mul(step, static_cast<double>(i)));
      return A::sub(end, A::mul(step, static_cast<double>(steps - i - 1)));
    }
  }
  KILN_HD T operator()(int64_t i) const { return convert<T>(value(i)); }
};

// Element i of logspace: base ^ (linspace element), pow in double for integer and f64 outputs, float
// otherwise.
template <class T>
struct LogspaceOp {
  LinspaceOp<T> lin;
  double base;
  KILN_HD T operator()(int64_t i) const {
    const auto e = lin.value(i);
    if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) {
      return convert<T>(std::pow(base, static_cast<double>(e)));
    } else {
      return convert<T>(std::pow(static_cast<float>(base), static_cast<float>(e)));
    }
  }
};

// ---- host-side construction (both backends build the functors the same way) ----------------------------

// ArangeOp for an output of n elements: integer outputs step in int64, floats in arange_acc_t<T>.
template <class T>
ArangeOp<T> make_arange_op(const Scalar& start, const Scalar& step, int64_t n) {
  using acc = arange_acc_t<T>;
  ArangeOp<T> op;
  if constexpr (std::is_same_v<acc, int64_t>) {
    op.start = start.to_int64();
    op.step = step.to_int64();
  } else {
    op.start = static_cast<acc>(start.to_double());
    op.step = static_cast<acc>(step.to_double());
  }
  op.n = n;
  return op;
}

template <class T>
LinspaceOp<T> make_linspace_op(double start, double end, int64_t steps) {
  using step_t = typename LinspaceOp<T>::step_t;
  LinspaceOp<T> op;
  // PyTorch first converts start and end to the output type, then computes the step in step_t.
  const T s = convert<T>(start), e = convert<T>(end);
  op.start = static_cast<step_t>(s);
  op.end = static_cast<step_t>(e);
  op.step = steps > 1 ? (op.end - op.start) / static_cast<step_t>(steps - 1) : step_t(0);
  op.steps = steps;
  return op;
}

}  // namespace kiln
