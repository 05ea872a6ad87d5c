// CUDA launchers of the range factories (kernels in cuda/kernels/creation.cuh); `out` is a fresh
// contiguous CUDA tensor, as for the CPU kernels of cpu/creation.h, and the values equal the CPU's.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {
void arange_fill(Tensor& out, const Scalar& start, const Scalar& step);
void linspace_fill(Tensor& out, double start, double end);
void logspace_fill(Tensor& out, double start, double end, double base);
void eye_fill(Tensor& out);  // out is zeroed first by the caller
}  // namespace kiln::cuda
