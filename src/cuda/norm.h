// CUDA launchers of rms_norm, add_rms_norm, silu_and_mul and rotary embeddings (namespace kiln::cuda), the
// counterparts of src/cpu/norm.h. The op layer (src/ops/norm.cpp) checks arguments, converts the weight and
// allocates outputs; every launcher is asynchronous on the current stream of its tensors' device and never
// synchronises (graph-capturable). Per-element math: src/ops/norm_math.h; kernels: kernels/norm.cuh.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// out = rms_norm(x) over the last dim. x and out contiguous with one shape and dtype; weight [D] contiguous,
// of x's dtype, f32 or f64 (promote_types(weight, x)).
void rms_norm(const Tensor& out, const Tensor& x, const Tensor& weight, double eps);

// residual = residual + x (rounded to residual's dtype, as add_), then out = rms_norm(residual): one pass.
// x, residual and out contiguous, one shape and one dtype; x is either residual itself (the same view) or
// does not overlap it. weight as for rms_norm.
void add_rms_norm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight, double eps);

// out [..., I] = silu(in[..., :I]) * in[..., I:]; in contiguous [..., 2I], out contiguous, one dtype.
void silu_and_mul(const Tensor& out, const Tensor& in);

// Rotates the first 2 * inv_freq.numel() channels of q [T, Hq, D] and k [T, Hk, D] in place (any strides),
// angles positions[t] * inv_freq[j] in f32; positions i32/i64 [T] (any stride), inv_freq f32 contiguous.
// One launch when q and k share a dtype.
void rope_(const Tensor& q, const Tensor& k, const Tensor& positions, const Tensor& inv_freq, double scaling);

}  // namespace kiln::cuda
