// Element copies between tensors of one shape, any dtypes and devices.
#pragma once

#include "kiln/tensor.h"

namespace kiln {

// dst and src have the same shape; dtypes and devices may differ. Safe when they overlap in memory.
void copy_tensor(const Tensor& dst, const Tensor& src);

namespace cpu {
// Host-to-host strided copy with conversion (no overlap handling).
void copy_cast(const Tensor& dst, const Tensor& src);
}  // namespace cpu

}  // namespace kiln
