// pad's one-pass CUDA kernel, with the contract of cpu/pad.h. Only in KILN_HAVE_CUDA builds.
#pragma once

#include "kiln/tensor.h"
#include "ops/pad_index.h"

namespace kiln::cuda {
void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value);
}  // namespace kiln::cuda
