// Per-element math of the reductions, shared by the CPU kernels (src/cpu/reduce*.cpp) and the CUDA kernels
// (src/cuda/kernels/reduce.cuh).
//
// A reduction op is a struct with
//   acc_t                                    the accumulator
//   acc_t identity() const                   the value of an empty reduction
//   acc_t reduce(acc_t a, In x, int64_t i)   folds element x (at position i along the reduced dims) into a
//   acc_t combine(acc_t a, acc_t b) const    merges two partial results
// combine must not depend on the order of its arguments beyond what the op defines (the kernels fold
// interleaved lanes and per-thread partials in any order), so indexed ops break ties by index, not order.
// Turning an accumulator into the output value (projection) is done by the caller's store step.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/scalar_types.h"
#include "ops/math.h"

namespace kiln::reduce {

// Accumulator types. Floating sums accumulate in double: summing 1e7 f32 values keeps ~1e-8 relative
// error without a cascade, and half types are covered too. Integer sums and products wrap modulo 2^64 as
// PyTorch's i64 accumulation does; unsigned arithmetic keeps the wrap defined.
template <class In>
using sum_acc_t = std::conditional_t<std::is_integral_v<In>, uint64_t, double>;
// The CUDA kernels accumulate half types in f32 (their result has 11 or 8 significant bits, and a block
// tree keeps the f32 error at O(log n) ulps) but f32 in f64 like the CPU: summing 1e7 signed f32 values
// in f32 leaves an absolute error near 1e-3, beyond torch.testing's f32 tolerance whenever the sum
// cancels; H100/H200 run f64 adds at full rate, so this costs no bandwidth.
template <class In>
using device_sum_acc_t =
    std::conditional_t<std::is_integral_v<In>, uint64_t, std::conditional_t<is_reduced_float_v<In>, float, double>>;

template <class Acc, class In>
KILN_HD Acc load(In x) {
  if constexpr (std::is_same_v<In, bool>) return static_cast<Acc>(x ? 1 : 0);
  else if constexpr (std::is_integral_v<In> && std::is_integral_v<Acc>) {
    // Sign-extend signed inputs to 64 bits before the (modular) conversion to the accumulator.
    if constexpr (std::is_signed_v<In>) return static_cast<Acc>(static_cast<int64_t>(x));
    else return static_cast<Acc>(static_cast<uint64_t>(x));
  } else if constexpr (is_reduced_float_v<In>) return static_cast<Acc>(static_cast<float>(x));
  else return static_cast<Acc>(x);
}

template <class In, class Acc = sum_acc_t<In>>
struct SumOp {
  using acc_t = Acc;
  KILN_HD acc_t identity() const { return acc_t(0); }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return a + load<acc_t>(x); }
  KILN_HD acc_t combine(acc_t a, acc_t b) const { return a + b; }
};

// Products of floats run in the op math type (not double) so that overflow to inf happens where PyTorch's
// does.
template <class In>
struct ProdOp {
  using acc_t = std::conditional_t<std::is_integral_v<In>, uint64_t, opmath_t<In>>;
  KILN_HD acc_t identity() const { return acc_t(1); }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return a * load<acc_t>(x); }
  KILN_HD acc_t combine(acc_t a, acc_t b) const { return a * b; }
};

template <class T>
KILN_HD bool is_nan_value(T x) {
  if constexpr (std::is_integral_v<T>) return false;
  else return x != x;
}

// amax / amin: NaN propagates (a NaN accumulator stays NaN: both comparisons are false).
template <class In>
struct MaxOp {
  using acc_t = opmath_t<In>;
  KILN_HD acc_t identity() const {
    if constexpr (std::is_floating_point_v<acc_t>) return -std::numeric_limits<acc_t>::infinity();
    else return std::numeric_limits<acc_t>::lowest();
  }
  KILN_HD acc_t combine(acc_t a, acc_t b) const { return (b > a || is_nan_value(b)) ? b : a; }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return combine(a, static_cast<acc_t>(x)); }
};

template <class In>
struct MinOp {
  using acc_t = opmath_t<In>;
  KILN_HD acc_t identity() const {
    if constexpr (std::is_floating_point_v<acc_t>) return std::numeric_limits<acc_t>::infinity();
    else return std::numeric_limits<acc_t>::max();
  }
  KILN_HD acc_t combine(acc_t a, acc_t b) const { return (b < a || is_nan_value(b)) ? b : a; }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return combine(a, static_cast<acc_t>(x)); }
};

// max/min along a dim with the index: NaN wins over numbers, and among equals (or among NaNs) the
// smaller index wins, whatever order partials arrive in.
template <class V>
struct ValueIndex {
  V v;
  int64_t i;
};

template <class In, bool IsMax>
struct ArgExtremeOp {
  using value_t = opmath_t<In>;
  using acc_t = ValueIndex<value_t>;
  KILN_HD acc_t identity() const {
    value_t v;
    if constexpr (std::is_floating_point_v<value_t>)
      v = IsMax ? -std::numeric_limits<value_t>::infinity() : std::numeric_limits<value_t>::infinity();
    else v = IsMax ? std::numeric_limits<value_t>::lowest() : std::numeric_limits<value_t>::max();
    return {v, std::numeric_limits<int64_t>::max()};
  }
  KILN_HD acc_t combine(acc_t a, acc_t b) const {
    const bool an = is_nan_value(a.v), bn = is_nan_value(b.v);
    if (an != bn) return an ? a : b;
    if (an || a.v == b.v) return b.i < a.i ? b : a;
    if constexpr (IsMax) return b.v > a.v ? b : a;
    else return b.v < a.v ? b : a;
  }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t i) const { return combine(a, acc_t{static_cast<value_t>(x), i}); }
};

// all / any: an element counts as true when nonzero (NaN is true, -0.0 is false).
template <class In, bool IsAll>
struct LogicalOp {
  using acc_t = bool;
  KILN_HD acc_t identity() const { return IsAll; }
  KILN_HD acc_t combine(acc_t a, acc_t b) const { return IsAll ? (a && b) : (a || b); }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return combine(a, convert<bool>(x)); }
};

// Welford's running mean and sum of squared deviations (in double), merged with Chan et al.'s formula:
// stays accurate for data far from zero (1e8 + noise), where sum(x^2) - n*mean^2 cancels catastrophically.
struct WelfordAcc {
  double mean, m2, n;
};
template <class In>
struct WelfordOp {
  using acc_t = WelfordAcc;
  KILN_HD acc_t identity() const { return {0.0, 0.0, 0.0}; }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const {
    const double v = load<double>(x);
    a.n += 1.0;
    const double d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
    return a;
  }
  KILN_HD acc_t combine(acc_t a, acc_t b) const {
    if (a.n == 0.0) return b;
    if (b.n == 0.0) return a;
    const double n = a.n + b.n, d = b.mean - a.mean;
    return {a.mean + d * (b.n / n), a.m2 + b.m2 + d * d * (a.n * b.n / n), n};
  }
};
// var = m2 / max(0, n - correction): a non-positive divisor gives inf (m2 > 0) or nan, as in PyTorch.
KILN_HD double welford_var(const WelfordAcc& a, double correction) {
  const double dof = a.n - correction;
  return a.m2 / (dof > 0.0 ? dof : 0.0);
}

// Vector norms. Sums of |x|^p accumulate like sum (Acc: double on the CPU; device_sum_acc_t on CUDA).
enum class NormKind { Zero, One, Two, P, Inf, NegInf };
template <class In, NormKind K, class Acc = double>
struct NormOp {
  using acc_t = Acc;
  double p = 2.0;
  KILN_HD acc_t identity() const { return K == NormKind::NegInf ? std::numeric_limits<Acc>::infinity() : Acc(0); }
  KILN_HD acc_t combine(acc_t a, acc_t b) const {
    if constexpr (K == NormKind::Inf) return (b > a || b != b) ? b : a;
    else if constexpr (K == NormKind::NegInf) return (b < a || b != b) ? b : a;
    else return a + b;
  }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const {
    const Acc v = load<Acc>(x);
    if constexpr (K == NormKind::Zero) return a + (v != Acc(0) ? Acc(1) : Acc(0));
    else if constexpr (K == NormKind::One) return a + math::fabs(v);
    else if constexpr (K == NormKind::Two) return a + v * v;
    else if constexpr (K == NormKind::P) return a + math::pow(math::fabs(v), static_cast<Acc>(p));
    else return combine(a, math::fabs(v));
  }
  KILN_HD acc_t project(acc_t a) const {
    if constexpr (K == NormKind::Two) return math::sqrt(a);
    else if constexpr (K == NormKind::P) return math::pow(a, static_cast<Acc>(1.0 / p));
    else return a;
  }
};

// logsumexp as a running (max, sum of exp(x - max)) pair: one pass, stable, exact for +-inf:
// +inf anywhere gives +inf, all -inf (or nothing) gives -inf, NaN gives NaN.
struct LseAcc {
  double m, s;
};
template <class In>
struct LogSumExpOp {
  using acc_t = LseAcc;
  KILN_HD acc_t identity() const { return {-std::numeric_limits<double>::infinity(), 0.0}; }
  KILN_HD acc_t combine(acc_t a, acc_t b) const {
    if (a.m != a.m || b.m != b.m) return {a.m + b.m, 0.0};  // NaN
    if (b.s == 0.0) return a;
    if (a.s == 0.0) return b;
    if (a.m == b.m) return {a.m, a.s + b.s};
    if (a.m > b.m) return {a.m, a.s + b.s * math::exp(b.m - a.m)};
    return {b.m, b.s + a.s * math::exp(a.m - b.m)};
  }
  KILN_HD acc_t reduce(acc_t a, In x, int64_t) const { return combine(a, acc_t{load<double>(x), 1.0}); }
};
KILN_HD double lse_value(const LseAcc& a) {
  if (a.m != a.m) return a.m;
  if (a.s == 0.0) return -std::numeric_limits<double>::infinity();
  return a.m + math::log(a.s);
}

}  // namespace kiln::reduce
