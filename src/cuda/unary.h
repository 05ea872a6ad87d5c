// CUDA kernels of the unary elementwise ops (src/cuda/unary*.cu), the counterparts of src/cpu/unary.h with
// the same op enum and contract: the op layer (src/ops/unary.cpp) has checked dtypes, converted the input
// to the op's compute dtype and allocated `out` on the input's device. Asynchronous on the current stream.
#pragma once

#include "cpu/unary.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

using cpu::UnaryOp;

// out = op(in) elementwise; out may be in itself (in-place). complex64 covers the ops the CPU supports
// for it. `decimals` is used by RoundDecimals only.
void unary(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals = 0);

// mantissa (in's dtype) and exponent (int32) of a floating tensor.
void frexp(const Tensor& mantissa, const Tensor& exponent, const Tensor& in);

}  // namespace kiln::cuda
