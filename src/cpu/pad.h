// pad's one-pass CPU kernel (src/ops/pad_index.h gives the map): y contiguous [outer, o0, o1, o2]; x read
// through its strides from `x_base`; `value` the constant's bytes in the dtype (itemsize bytes).
#pragma once

#include "kiln/tensor.h"
#include "ops/pad_index.h"

namespace kiln::cpu {
void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value);
}  // namespace kiln::cpu
