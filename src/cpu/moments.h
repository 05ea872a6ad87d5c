// layer_norm, group_norm and batch_norm on the CPU (src/cpu/moments.cpp), with the contract of cuda/moments.h:
// contiguous f16, bf16, f32 or f64 input; statistics, weights and biases in the accumulation dtype (f64 for f64
// input, else f32).
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// mean and var [sets] (biased): set r holds `runs` runs of `len` contiguous elements, run j starting at
// r * set_stride + j * run_stride.
void moments(const Tensor& x, int64_t sets, int64_t runs, int64_t len, int64_t set_stride, int64_t run_stride,
             Tensor& mean, Tensor& var);
// y = (x - mean[r]) / sqrt(var[r] + eps) * w[c] + b[c] over rows of d = x.size(-1); w, b [d] or undefined.
void normalize_rows(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
                    Tensor& y);
// Over the planes of x [N, C, ...]: statistics index c (per_channel) or p / stat_div for plane p = n C + c.
void normalize_planes(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                      double eps, int64_t channels, int64_t stat_div, bool per_channel, Tensor& y);

}  // namespace kiln::cpu
