// CUDA launchers of attention (kernels in src/cuda/kernels/attention_*.cuh and flash_attention.cuh). The op
// layer (src/ops/attention.cpp) checks the arguments and describes the operands in an attention_math::Layout
// exactly as for the CPU reference (src/cpu/attention.h).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"
#include "ops/attention_math.h"

namespace kiln::cuda {

// As cpu::attention. Picks the decode kernel (L.has_lengths, Lq <= 8, contiguous 16-byte rows), the flash
// prefill kernel (D = Dv in {64, 128}, f16/bf16, no mask, unit column strides) or the general kernel.
// Lengths outside [0, Lkv] are reported through the device error record.
void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
               const Tensor& lengths, const attention_math::Layout& L, double scale);

// k_cache [B, H, Lmax, D] and v_cache [B, H, Lmax, Dv] (any strides) <- k_src [B, H, T, D] / v_src (in
// the caches' dtypes) at positions[b] (i32 [B], contiguous), in one launch: a sequence whose range leaves
// [0, Lmax] is skipped and reported through the device error record.
void kv_cache_append(const Tensor& k_cache, const Tensor& k_src, const Tensor& v_cache, const Tensor& v_src,
                     const Tensor& positions, int64_t lmax);

}  // namespace kiln::cuda
