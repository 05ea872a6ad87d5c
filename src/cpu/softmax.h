// CPU kernels of softmax / log_softmax (src/cpu/softmax.cpp). The op layer (src/ops/softmax.cpp) has
// checked the arguments, converted x to the output dtype and allocated `out`.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// out = (log_)softmax(x) along dim (already wrapped, 0 <= dim < x.dim(); x.dim() >= 1). x and out have
// the same shape and dtype (f16/bf16/f32/f64); out is contiguous, x may have any strides.
void softmax(const Tensor& out, const Tensor& x, int64_t dim, bool log);

}  // namespace kiln::cpu
