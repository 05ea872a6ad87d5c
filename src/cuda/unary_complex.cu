// CUDA unary ops of complex64 inputs: the ops the CPU supports for complex64 (src/cpu/unary.cpp
// complex_op), with cuda::std::complex<float> math (src/cuda/kernels/unary.cuh).
#include "cuda/unary_impl.h"

namespace kiln::cuda::unary_impl {

namespace {

template <class F>
void map_c(UnaryOp op, const Tensor& out, const Tensor& in, F f) {
  launch_elementwise<Complex64, Complex64>(out, {&in}, ComplexMap<F>{f}, op_name(op));
}

template <class Out, class F>
void map_c_to(UnaryOp op, const Tensor& out, const Tensor& in, F f) {
  launch_elementwise<Out, Complex64>(out, {&in}, ComplexTo<Out, F>{f}, op_name(op));
}

}  // namespace

void complex(UnaryOp op, const Tensor& out, const Tensor& in) {
  KILN_CHECK(in.dtype() == DType::C64, op_name(op), ": internal error: expected a complex64 input, got ", in.meta());
  switch (op) {
    case UnaryOp::Neg: return map_c(op, out, in, cunary::Neg{});
    case UnaryOp::Abs: return map_c_to<float>(op, out, in, cunary::Abs{});
    case UnaryOp::Square: return map_c(op, out, in, cunary::Square{});
    case UnaryOp::Reciprocal: return map_c(op, out, in, cunary::Reciprocal{});
    case UnaryOp::Rsqrt: return map_c(op, out, in, cunary::Rsqrt{});
    case UnaryOp::Exp: return map_c(op, out, in, cunary::Exp{});
    case UnaryOp::Log: return map_c(op, out, in, cunary::Log{});
    case UnaryOp::Log10: return map_c(op, out, in, cunary::Log10{});
    case UnaryOp::Sqrt: return map_c(op, out, in, cunary::Sqrt{});
    case UnaryOp::Sin: return map_c(op, out, in, cunary::Sin{});
    case UnaryOp::Cos: return map_c(op, out, in, cunary::Cos{});
    case UnaryOp::Tan: return map_c(op, out, in, cunary::Tan{});
    case UnaryOp::Asin: return map_c(op, out, in, cunary::Asin{});
    case UnaryOp::Acos: return map_c(op, out, in, cunary::Acos{});
    case UnaryOp::Atan: return map_c(op, out, in, cunary::Atan{});
    case UnaryOp::Sinh: return map_c(op, out, in, cunary::Sinh{});
    case UnaryOp::Cosh: return map_c(op, out, in, cunary::Cosh{});
    case UnaryOp::Tanh: return map_c(op, out, in, cunary::Tanh{});
    case UnaryOp::Sigmoid: return map_c(op, out, in, cunary::Sigmoid{});
    case UnaryOp::IsNan: return map_c_to<bool>(op, out, in, cunary::IsNan{});
    case UnaryOp::IsInf: return map_c_to<bool>(op, out, in, cunary::IsInf{});
    case UnaryOp::IsFinite: return map_c_to<bool>(op, out, in, cunary::IsFinite{});
    case UnaryOp::LogicalNot: return map_c_to<bool>(op, out, in, cunary::LogicalNot{});
    default: no_kernel(op, in);
  }
}

}  // namespace kiln::cuda::unary_impl
