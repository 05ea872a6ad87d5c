// CPU kernels of the norm / activation / rotary family (namespace kiln::cpu). Arguments are checked by the
// ops in src/ops/norm.cpp; these assume valid shapes.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// out = rms_norm(x) row by row over the last dim. x and out contiguous, same shape and dtype; weight
// contiguous [D] already converted to promote_types(weight, x).
void rms_norm(const Tensor& out, const Tensor& x, const Tensor& weight, double eps);

// out [..., I] = silu(in[..., :I]) * in[..., I:]; in contiguous [..., 2I], out contiguous, same dtype.
void silu_and_mul(const Tensor& out, const Tensor& in);

// cos/sin tables [T, rotary_dim/2] (f32, contiguous) for positions [T] (i32/i64) and inv_freq (f32, contig.).
void rope_cos_sin(const Tensor& cos, const Tensor& sin, const Tensor& positions, const Tensor& inv_freq,
                  double scaling);

// Rotates the first 2 * cos.size(1) channels of x [T, H, D] in place (any strides).
void rope_apply(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace kiln::cpu
