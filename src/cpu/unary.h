// CPU kernels of the unary elementwise ops (src/cpu/unary.cpp). The op layer (src/ops/unary.cpp) has
// already checked dtypes and allocated `out`; these only loop.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

enum class UnaryOp {
  Neg, Abs, Square, Sign, Relu,
  Exp, Exp2, Expm1, Log, Log2, Log10, Log1p, Sqrt, Rsqrt, Reciprocal,
  Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Tanh, Erf, Sigmoid, Silu, GeluErf, GeluTanh,
  Floor, Ceil, Trunc, Round, RoundDecimals,
  Signbit, IsNan, IsInf, IsFinite, LogicalNot, BitwiseNot,
};

// out = op(in), elementwise over out's shape (in has the same shape). `in` has the op's compute dtype
// (integers already converted for float ops); out has the result dtype: in's dtype, bool for predicates,
// f32 for abs of c64. `decimals` is used by RoundDecimals only. out may be in itself (in-place).
void unary(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals = 0);

// mantissa (in's dtype) and exponent (i32) of a floating tensor.
void frexp(const Tensor& mantissa, const Tensor& exponent, const Tensor& in);

}  // namespace kiln::cpu
