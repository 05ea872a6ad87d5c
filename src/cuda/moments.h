// layer_norm, group_norm and batch_norm on CUDA (src/cuda/moments.cu), for src/ops/functional.cpp: contiguous
// f16, bf16, f32 or f64 input; statistics, weights and biases in the accumulation dtype (f64 for f64 input, else
// f32). Asynchronous on the current stream, no host synchronisation. Only in KILN_HAVE_CUDA builds.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// mean and var [sets] (biased) of `sets` sets of x's elements: set r holds `runs` runs of `len` contiguous
// elements, run j starting at r * set_stride + j * run_stride. Two launches: partial moments of chunks of each
// set by many blocks, then their merge.
void moments(const Tensor& x, int64_t sets, int64_t runs, int64_t len, int64_t set_stride, int64_t run_stride,
             Tensor& mean, Tensor& var);

// layer_norm of rows of d = x.size(-1) in one launch, a row per block held in registers, where d is a multiple of
// 16 bytes and at most 4 x 256 packs of them, and x and y are aligned: y = (x - mean) / sqrt(var + eps) * w + b.
// False (nothing launched) otherwise.
bool layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y);

// layer_norm's pass over rows of d = x.size(-1): y = (x - mean[r]) / sqrt(var[r] + eps) * w[c] + b[c]; w and b
// [d] or undefined.
void normalize_rows(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
                    Tensor& y);

// group_norm's and batch_norm's pass over the planes of x [N, C, ...] (plane p = n C + c, its trailing elements):
// statistics index s = c (per_channel) or p / stat_div; y = (x - mean[s]) / sqrt(var[s] + eps) * w[c] + b[c]; w
// and b [C] or undefined.
void normalize_planes(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                      double eps, int64_t channels, int64_t stat_div, bool per_channel, Tensor& y);

}  // namespace kiln::cuda
