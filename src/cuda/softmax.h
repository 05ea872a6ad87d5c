// CUDA softmax / log_softmax (src/cuda/softmax.cu), the counterpart of src/cpu/softmax.h. The op layer
// (src/ops/softmax.cpp) has checked the arguments and allocated `out`.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// out = (log_)softmax(x) along dim (already wrapped, 0 <= dim < x.dim(); x.dim() >= 1). x is f16/bf16/f32/
// f64 with any strides; out is contiguous with x's shape and x's dtype, or f32 for f16/bf16 x (the dtype=f32
// option: the exact widening is fused into the kernel). Asynchronous on the current stream of x's device,
// no host synchronisation (graph-capturable).
void softmax(const Tensor& out, const Tensor& x, int64_t dim, bool log);

// The split path launches its second kernel as a programmatic dependent launch on sm_90 (on by default).
// Off: two plainly serialised launches. For tests and measurements; applies to later calls, all threads.
void set_softmax_dependent_launch(bool enabled);

}  // namespace kiln::cuda
