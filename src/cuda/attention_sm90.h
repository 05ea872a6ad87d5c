// The Hopper (sm_90a) flash prefill launcher, in its own translation unit: kernels/flash_attention_sm90.cuh.
#pragma once

#include <cuda_runtime.h>

#include "kiln/tensor.h"
#include "ops/attention_math.h"

namespace kiln::cuda {

// Launches the wgmma prefill kernel when wgmma_available(device) (cuda/launch.h), L has no mask and q's rows are
// 16-byte aligned contiguous channels (k and v are checked by the caller); returns false, launching
// nothing, otherwise.
bool launch_prefill_sm90(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const attention_math::Layout& L, double scale, cudaStream_t stream);

}  // namespace kiln::cuda
