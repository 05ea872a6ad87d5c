// CPU kernels of the mixture-of-experts and FP8 family (namespace kiln::cpu). Arguments are checked by
// src/ops/moe.cpp and src/ops/fp8.cpp; these assume valid shapes.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// out [T, H] (x's dtype, contiguous) = the MoE block for x [T, H] contiguous, experts [T, k] i32 and
// weights [T, k] (x's dtype) from the router, gate_up [E, 2I, H] and down [E, H, I] contiguous in x's dtype.
void moe_experts(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                 const Tensor& gate_up, const Tensor& down);

// out [M, N] (f32/f16/bf16, contiguous) = x [M, K] (contiguous, any float) @ dequant(w)^T + bias, where
// w [N, K] is float8 (contiguous) and scale(n, k) = scales[n / block_n][k / block_k] (f32 contiguous; a
// tensor-wise scale is [1, 1] with blocks of N x K, a row-wise one [N, 1] with block_n = 1).
void linear_fp8(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& scales, int64_t block_n,
                int64_t block_k, const Tensor* bias);

// out [T, H] f32 = the MoE block for x [T, H] f32 (contiguous), experts [T, k] i32 and weights [T, k] f32 from
// the router, with e4m3 experts read in place: gate_up [E, 2I, H] and down [E, H, I] (contiguous) and their
// block scales [E, ceil(2I / block_n), ceil(H / block_k)] and [E, ceil(H / block_n), ceil(I / block_k)] (f32,
// contiguous). Only the selected experts' weights are read.
void moe_experts_fp8(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                     const Tensor& gate_up, const Tensor& gate_up_scales, const Tensor& down,
                     const Tensor& down_scales, int64_t block_n, int64_t block_k);

}  // namespace kiln::cpu
