// CPU kernels of the arithmetic, bitwise and logical binary ops: a dtype dispatch around the shared
// functors of ops/binary_functors.h. Reduced-precision floats load as float, compute, and round once.
#include "cpu/binary.h"

#include "core/dispatch.h"
#include "cpu/clones.h"
#include "cpu/loops.h"

#include <algorithm>

namespace kiln::cpu {

namespace {

constexpr DTypeSet kArith = kFloatTypes | kIntTypes | kBoolType;
constexpr DTypeSet kNumeric = kFloatTypes | kIntTypes;
constexpr DTypeSet kBitwise = kIntTypes | kBoolType;

template <class S, class F>
void run(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  using M = opmath_t<S>;
  if constexpr (std::is_same_v<S, Half>) {
    // f16 rows with unit strides widen and narrow 256 values at a time (F16C where the CPU has it; element by
    // element the conversions cost more than the arithmetic); the same float arithmetic and the same rounding
    // (to nearest even) as the loop below.
    StridedLoop<3> loop(out.sizes(), {&out, &a, &b});
    loop.for_each_row([&](char* const* p, int64_t n, const int64_t* st) {
      auto* o = reinterpret_cast<Half*>(p[0]);
      const auto* x = reinterpret_cast<const Half*>(p[1]);
      const auto* y = reinterpret_cast<const Half*>(p[2]);
      if (st[0] == 2 && st[1] == 2 && st[2] == 2) {
        float xb[256], yb[256];
        for (int64_t i = 0; i < n; i += 256) {
          const int64_t len = std::min<int64_t>(256, n - i);
          simd_widen(x + i, len, xb);
          simd_widen(y + i, len, yb);
          for (int64_t k = 0; k < len; ++k) xb[k] = f(xb[k], yb[k]);
          simd_narrow(xb, len, o + i);
        }
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const Half xv = *reinterpret_cast<const Half*>(p[1] + i * st[1]);
        const Half yv = *reinterpret_cast<const Half*>(p[2] + i * st[2]);
        *reinterpret_cast<Half*>(p[0] + i * st[0]) = static_cast<Half>(f(static_cast<M>(xv), static_cast<M>(yv)));
      }
    });
    return;
  }
  binary_kernel<S, S, S>(out, a, b,
                         [f](S x, S y) { return static_cast<S>(f(static_cast<M>(x), static_cast<M>(y))); });
}

// Runs Fn<opmath_t<T>> for the dtype of out, instantiated only for the dtypes in Allowed.
template <DTypeSet Allowed, template <class> class Fn>
void dispatch(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtypes<Allowed>(out.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    run<S>(out, a, b, Fn<opmath_t<S>>{});
  });
}


}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::Add:
      visit_dtypes<kArith | kComplexTypes>(out.dtype(), "add", [&](auto tag) {
        using S = typename decltype(tag)::type;
        using M = opmath_t<S>;
        run<S>(out, a, b, fn::AddFn<M>{fn::scalar_as<M>(alpha)});
      });
      return;
    case BinaryOp::Mul: return dispatch<kArith | kComplexTypes, fn::MulFn>("mul", out, a, b);
    case BinaryOp::Div: return dispatch<kFloatTypes | kComplexTypes, fn::DivFn>("div", out, a, b);
    case BinaryOp::DivTrunc: return dispatch<kNumeric, fn::DivTruncFn>("div", out, a, b);
    case BinaryOp::DivFloor: return dispatch<kNumeric, fn::DivFloorFn>("div", out, a, b);
    case BinaryOp::Pow: return dispatch<kNumeric, fn::PowFn>("pow", out, a, b);
    case BinaryOp::Maximum: return dispatch<kArith, fn::MaximumFn>("maximum", out, a, b);
    case BinaryOp::Minimum: return dispatch<kArith, fn::MinimumFn>("minimum", out, a, b);
    case BinaryOp::Fmod: return dispatch<kNumeric, fn::FmodFn>("fmod", out, a, b);
    case BinaryOp::Remainder: return dispatch<kNumeric, fn::RemainderFn>("remainder", out, a, b);
    case BinaryOp::Atan2: return dispatch<kFloatTypes, fn::Atan2Fn>("atan2", out, a, b);
    case BinaryOp::Heaviside: return dispatch<kArith, fn::HeavisideFn>("heaviside", out, a, b);
    case BinaryOp::BitAnd: return dispatch<kBitwise, fn::BitAndFn>("bitwise_and", out, a, b);
    case BinaryOp::BitOr: return dispatch<kBitwise, fn::BitOrFn>("bitwise_or", out, a, b);
    case BinaryOp::BitXor: return dispatch<kBitwise, fn::BitXorFn>("bitwise_xor", out, a, b);
    case BinaryOp::ShiftLeft: return dispatch<kIntTypes, fn::ShiftLeftFn>("bitwise_left_shift", out, a, b);
    case BinaryOp::ShiftRight: return dispatch<kIntTypes, fn::ShiftRightFn>("bitwise_right_shift", out, a, b);
    case BinaryOp::LogicalAnd: return binary_kernel<bool, bool, bool>(out, a, b, fn::LogicalAndFn{});
    case BinaryOp::LogicalOr: return binary_kernel<bool, bool, bool>(out, a, b, fn::LogicalOrFn{});
    case BinaryOp::LogicalXor: return binary_kernel<bool, bool, bool>(out, a, b, fn::LogicalXorFn{});
  }
}

bool any_zero(const Tensor& t) {
  bool found = false;
  visit_dtypes<kIntTypes | kBoolType>(t.dtype(), "any_zero", [&](auto tag) {
    using T = typename decltype(tag)::type;
    StridedLoop<1> loop(t.sizes(), {&t});
    // Serial: a flag written from several threads would race; this is one cheap pass over the divisor.
    loop.for_each_row(
        [&](char* const* p, int64_t n, const int64_t* s) {
          for (int64_t i = 0; i < n && !found; ++i)
            if (*reinterpret_cast<const T*>(p[0] + i * s[0]) == T(0)) found = true;
        },
        /*parallel=*/false);
  });
  return found;
}

}  // namespace kiln::cpu
