// CPU kernels of the range factories; `out` is a fresh contiguous tensor.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {
void arange_fill(Tensor& out, const Scalar& start, const Scalar& step);
void linspace_fill(Tensor& out, double start, double end);
void logspace_fill(Tensor& out, double start, double end, double base);
void eye_fill(Tensor& out);  // out is zeroed first by the caller
}  // namespace kiln::cpu
