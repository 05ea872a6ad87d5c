// Shared by the .cu files of the unary family (include from .cu files only): the op families each file
// instantiates, and the launch helper wrapping a shared functor with the storage <-> compute conversions.
// The split keeps each file's nvcc time short; src/cuda/unary.cu dispatches between them.
#pragma once

#include "core/dispatch.h"
#include "cuda/elementwise.h"
#include "cuda/kernels/unary.cuh"
#include "cuda/unary.h"

namespace kiln::cuda::unary_impl {

// The public op's name ("exp", "isnan", ...), for launch checks and errors.
const char* op_name(UnaryOp op);

// Each takes an input of a dtype the op supports (others throw), out already of the result dtype.
void exact(UnaryOp op, const Tensor& out, const Tensor& in);                      // unary_exact.cu
void exp_log(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals);  // unary_exp_log.cu
void trig(UnaryOp op, const Tensor& out, const Tensor& in);                       // unary_trig.cu
void complex(UnaryOp op, const Tensor& out, const Tensor& in);                    // unary_complex.cu

[[noreturn]] void no_kernel(UnaryOp op, const Tensor& in);

// out = f(in) with In loaded, widened to opmath_t<In>, f applied, converted to Out.
template <class Out, class In, class F>
void map(UnaryOp op, const Tensor& out, const Tensor& in, F f) {
  launch_elementwise<Out, In>(out, {&in}, Widen<Out, In, F>{f}, op_name(op));
}

}  // namespace kiln::cuda::unary_impl
