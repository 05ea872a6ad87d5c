// CUDA unary ops of floating inputs, part 1: exponentials, logarithms, roots, reciprocal and rounding.
// The functors are the CPU's (src/ops/unary_functors.h); half types compute in float. The math calls map
// to CUDA's libm (src/ops/math.h): exp/log may differ from glibc by a few ulp; sqrt, reciprocal and the
// rounding ops are correctly rounded on both, so identical.
#include <cmath>

#include "cuda/unary_impl.h"

namespace kiln::cuda::unary_impl {

namespace {

template <class T>
void exp_log_op(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals) {
  using C = opmath_t<T>;
  switch (op) {
    case UnaryOp::Exp: return map<T, T>(op, out, in, unary::Exp{});
    case UnaryOp::Exp2: return map<T, T>(op, out, in, unary::Exp2{});
    case UnaryOp::Expm1: return map<T, T>(op, out, in, unary::Expm1{});
    case UnaryOp::Log: return map<T, T>(op, out, in, unary::Log{});
    case UnaryOp::Log2: return map<T, T>(op, out, in, unary::Log2{});
    case UnaryOp::Log10: return map<T, T>(op, out, in, unary::Log10{});
    case UnaryOp::Log1p: return map<T, T>(op, out, in, unary::Log1p{});
    case UnaryOp::Sqrt: return map<T, T>(op, out, in, unary::Sqrt{});
    case UnaryOp::Rsqrt: return map<T, T>(op, out, in, unary::Rsqrt{});
    case UnaryOp::Reciprocal: return map<T, T>(op, out, in, unary::Reciprocal{});
    case UnaryOp::Floor: return map<T, T>(op, out, in, unary::Floor{});
    case UnaryOp::Ceil: return map<T, T>(op, out, in, unary::Ceil{});
    case UnaryOp::Trunc: return map<T, T>(op, out, in, unary::Trunc{});
    case UnaryOp::Round: return map<T, T>(op, out, in, unary::Round{});
    case UnaryOp::RoundDecimals: {
      // The scale is computed on the host exactly as the CPU does, so both round the same products.
      const bool negative = decimals < 0;
      const double p = std::pow(10.0, static_cast<double>(negative ? -decimals : decimals));
      return map<T, T>(op, out, in, unary::RoundDecimals<C>{static_cast<C>(p), negative});
    }
    default: break;
  }
  no_kernel(op, in);
}

}  // namespace

void exp_log(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals) {
  visit_dtypes<kFloatTypes>(in.dtype(), op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    exp_log_op<T>(op, out, in, decimals);
  });
}

}  // namespace kiln::cuda::unary_impl
