// CUDA unary ops that are exact in every dtype (no rounding beyond the dtype's own): neg, abs, square,
// sign, relu, bitwise_not and the predicates, for bool, integer and floating inputs. Same functors and
// conversions as the CPU (src/cpu/unary.cpp real_op), so the results are bit-identical.
// Sign and Relu compare unsigned integers with zero: intended (one definition for every type).
#pragma nv_diag_suppress 186

#include "cuda/unary_impl.h"

namespace kiln::cuda::unary_impl {

namespace {

template <class T>
void exact_op(UnaryOp op, const Tensor& out, const Tensor& in) {
  using C = opmath_t<T>;
  constexpr bool fp = std::is_floating_point_v<C>;
  constexpr bool integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;
  constexpr bool boolean = std::is_same_v<T, bool>;
  switch (op) {
    case UnaryOp::Neg: if constexpr (fp || integer) return map<T, T>(op, out, in, unary::Neg{}); break;
    case UnaryOp::Abs: if constexpr (fp || integer) return map<T, T>(op, out, in, unary::Abs{}); break;
    case UnaryOp::Square: if constexpr (fp || integer) return map<T, T>(op, out, in, unary::Square{}); break;
    case UnaryOp::Sign: return map<T, T>(op, out, in, unary::Sign{});
    case UnaryOp::Relu: if constexpr (fp || integer) return map<T, T>(op, out, in, unary::Relu{}); break;
    case UnaryOp::BitwiseNot:
      if constexpr (integer || boolean) return map<T, T>(op, out, in, unary::BitwiseNot{});
      break;
    case UnaryOp::Signbit: return map<bool, T>(op, out, in, unary::Signbit{});
    case UnaryOp::LogicalNot: return map<bool, T>(op, out, in, unary::LogicalNot{});
    // For bool and integer inputs these are constants (the functors say so too): a fill, not a kernel
    // per integer dtype.
    case UnaryOp::IsNan:
      if constexpr (fp) return map<bool, T>(op, out, in, unary::IsNan{});
      else return void(Tensor(out).fill_(false));
    case UnaryOp::IsInf:
      if constexpr (fp) return map<bool, T>(op, out, in, unary::IsInf{});
      else return void(Tensor(out).fill_(false));
    case UnaryOp::IsFinite:
      if constexpr (fp) return map<bool, T>(op, out, in, unary::IsFinite{});
      else return void(Tensor(out).fill_(true));
    default: break;
  }
  no_kernel(op, in);
}

}  // namespace

void exact(UnaryOp op, const Tensor& out, const Tensor& in) {
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(in.dtype(), op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    exact_op<T>(op, out, in);
  });
}

}  // namespace kiln::cuda::unary_impl
