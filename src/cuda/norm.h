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

// The largest head dims D and Dv of qk_norm_rope_append (one warp per head, 8 channels per lane).
inline constexpr int64_t kQkNormRopeMaxD = 256;

// qk_norm_rope_append_ in one launch (see include/kiln/nn.h): q [T, Hq, D] updated in place; k [T, Hk, D]
// and v [T, Hk, Dv] read; k_cache [1, Hk, Lmax, D] and v_cache [1, Hk, Lmax, Dv] written at slots at[0] + t.
// q, k, v and the caches of one dtype (f16, bf16 or f32), any strides; D, Dv <= kQkNormRopeMaxD; q overlapping
// neither k nor v nor the caches (checked by the op layer). q_norm / k_norm contiguous [D] in q's dtype or f32
// (one dtype when both are given), or undefined (no norm). positions i32/i64 [T] (any stride), inv_freq f32
// contiguous [r/2] with r <= D, at i32 with one element. An `at` outside [0, Lmax - T] writes neither cache
// and is raised at the next synchronisation (OpId::QkNormRopeAppend).
void qk_norm_rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                         double eps, const Tensor& positions, const Tensor& inv_freq, double scaling,
                         const Tensor& k_cache, const Tensor& v_cache, const Tensor& at);

}  // namespace kiln::cuda
