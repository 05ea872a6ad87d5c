// CUDA launchers of the binary elementwise family (src/cuda/binary*.cu, src/cuda/compare.cu): the same
// contract as the CPU kernels of src/cpu/binary.h (operands converted to the compute dtype and expanded to
// the output's shape by the op layer, all on the output's device). Asynchronous on the current stream.
#pragma once

#include "cpu/binary.h"

namespace kiln::cuda {

// out, a, b all of one dtype (bool for the logical ops). alpha is used by Add only. Integer division and
// remainder by zero give 0 and raise "ZeroDivisionError" at the next synchronisation (device_error.h).
void binary(cpu::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha);
// out bool; a and b of one dtype, or one int64 and one uint64 (compared exactly).
void compare(fn::CmpOp op, const Tensor& out, const Tensor& a, const Tensor& b);
// out[i] = cond[i] ? a[i] : b[i]; out, a, b of one dtype, cond bool.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// self[i] = value where mask[i]; value points to one element of self's dtype in host memory (passed to the
// kernel by value).
void masked_fill(const Tensor& self, const Tensor& mask, const void* value);

namespace detail {
// The parts of binary() that live in their own translation units (compile time).
void binary_division(cpu::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_bitwise(cpu::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
}  // namespace detail

}  // namespace kiln::cuda
