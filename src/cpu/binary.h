// CPU kernels of the binary elementwise ops (src/cpu/binary.cpp, src/cpu/compare.cpp). Operands arrive
// already converted to the compute dtype and expanded to the output's shape; the op layer (src/ops/) has
// done every check.
#pragma once

#include "kiln/tensor.h"
#include "ops/binary_functors.h"

namespace kiln::cpu {

enum class BinaryOp : uint8_t {
  Add,  // a + alpha * b (sub passes -alpha)
  Mul,
  Div,
  DivTrunc,
  DivFloor,
  Pow,
  Maximum,
  Minimum,
  Fmod,
  Remainder,
  Atan2,
  Heaviside,
  BitAnd,
  BitOr,
  BitXor,
  ShiftLeft,
  ShiftRight,
  LogicalAnd,  // operands bool
  LogicalOr,
  LogicalXor,
};

// out, a, b all of one dtype (bool for the logical ops). alpha is used by Add only.
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha);
// out bool; a and b of one dtype, or one int64 and one uint64 (compared exactly).
void compare(fn::CmpOp op, const Tensor& out, const Tensor& a, const Tensor& b);
// out[i] = cond[i] ? a[i] : b[i]; out, a, b of one dtype, cond bool.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// self[i] = value where mask[i]; value is a 0-d tensor of self's dtype.
void masked_fill(const Tensor& self, const Tensor& mask, const Tensor& value);
// Whether any element of an integer tensor is zero (division by zero is an error for integers).
bool any_zero(const Tensor& t);

}  // namespace kiln::cpu
