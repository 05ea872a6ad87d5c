// CUDA unary ops of floating inputs, part 2: trigonometric, hyperbolic, erf and the activations. The
// functors are the CPU's (src/ops/unary_functors.h); half types compute in float; CUDA's libm may differ
// from glibc by a few ulp.
#include "cuda/unary_impl.h"

namespace kiln::cuda::unary_impl {

namespace {

template <class T>
void trig_op(UnaryOp op, const Tensor& out, const Tensor& in) {
  switch (op) {
    case UnaryOp::Sin: return map<T, T>(op, out, in, unary::Sin{});
    case UnaryOp::Cos: return map<T, T>(op, out, in, unary::Cos{});
    case UnaryOp::Tan: return map<T, T>(op, out, in, unary::Tan{});
    case UnaryOp::Asin: return map<T, T>(op, out, in, unary::Asin{});
    case UnaryOp::Acos: return map<T, T>(op, out, in, unary::Acos{});
    case UnaryOp::Atan: return map<T, T>(op, out, in, unary::Atan{});
    case UnaryOp::Sinh: return map<T, T>(op, out, in, unary::Sinh{});
    case UnaryOp::Cosh: return map<T, T>(op, out, in, unary::Cosh{});
    case UnaryOp::Tanh: return map<T, T>(op, out, in, unary::Tanh{});
    case UnaryOp::Erf: return map<T, T>(op, out, in, unary::Erf{});
    case UnaryOp::Sigmoid: return map<T, T>(op, out, in, unary::Sigmoid{});
    case UnaryOp::Silu: return map<T, T>(op, out, in, unary::Silu{});
    case UnaryOp::GeluErf: return map<T, T>(op, out, in, unary::GeluErf{});
    case UnaryOp::GeluTanh: return map<T, T>(op, out, in, unary::GeluTanh{});
    default: break;
  }
  no_kernel(op, in);
}

}  // namespace

void trig(UnaryOp op, const Tensor& out, const Tensor& in) {
  visit_dtypes<kFloatTypes>(in.dtype(), op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    trig_op<T>(op, out, in);
  });
}

}  // namespace kiln::cuda::unary_impl
