// Element copies between tensors of one shape, any dtypes and devices.
#pragma once

#include "kiln/tensor.h"

namespace kiln {

// dst and src have the same shape; dtypes and devices may differ. Safe when they overlap in memory.
void copy_tensor(const Tensor& dst, const Tensor& src);

// Every kiln op that writes into an existing tensor calls this first. A constant mark on t's storage
// (Storage::set_constant) no longer holds, so it is dropped: the products launched after the write then read
// that memory only once the kernel before them has finished. Views share the storage, and so the drop.
void note_write(const Tensor& t);

namespace cpu {
// Host-to-host strided copy with conversion (no overlap handling).
void copy_cast(const Tensor& dst, const Tensor& src);
}  // namespace cpu

}  // namespace kiln
