// Shared helpers of the elementwise ops: device and shape checks, casting rules, scalar operands.
#pragma once

#include <initializer_list>

#include "kiln/ops.h"

namespace kiln {

// PyTorch's canCast: no complex into a non-complex type, no floating into an integral type, nothing but
// bool into bool.
bool can_cast(DType from, DType to);

// All operands on one device; names every operand's meta on failure.
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);

// Broadcast shape of two shapes, with the op's name in the error.
Shape broadcast_for(const char* op, const Shape& a, const Shape& b);

// Throws "<op>: no CUDA implementation yet" for a tensor off the CPU.
void check_cpu_only(const char* op, const Tensor& t);

// A 0-d tensor holding a Scalar converted to `dtype` (PyTorch's wrapped number after promotion).
Tensor scalar_operand(const Scalar& s, DType dtype, Device device);

}  // namespace kiln
