// The Hopper (sm_90a) flash prefill launcher, in its own translation unit: kernels/flash_attention_sm90.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include "kiln/tensor.h"
#include "ops/attention_math.h"

namespace kiln::cuda {

// Launches the wgmma prefill kernel when wgmma_available(device) (cuda/launch.h), L has no mask and q's rows are
// 16-byte aligned contiguous channels (k and v are checked by the caller); returns false, launching
// nothing, otherwise.
bool launch_prefill_sm90(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const attention_math::Layout& L, double scale, cudaStream_t stream);

// Tensor maps over the decode caches (L a decode layout) for the Hopper decode kernel
// (kernels/decode_attention_sm90.cuh): [slot][row][D], boxes of 64 columns x 64 rows with the 128-byte
// swizzle; *k_slot / *v_slot receive the slot strides in elements. False when a cache does not fit a map.
bool encode_decode_maps(CUtensorMap* tk, int64_t* k_slot, CUtensorMap* tv, int64_t* v_slot, const Tensor& k,
                        const Tensor& v, const attention_math::Layout& L);

}  // namespace kiln::cuda
