// The Hopper (sm_90a) tile launcher of grouped_mm and the MoE expert products, in its own translation unit:
// kernels/grouped_mm_sm90.cuh.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/grouped_mm.cuh"

namespace kiln::cuda {

// Launches the wgmma tile kernel for p (RowGroups or Batched, 16-bit inputs, unit K strides, 16-byte rows:
// the caller's "vec" conditions) when wgmma_available(device); returns false, launching nothing, otherwise.
// wide: 128 x 256 product tiles instead of 128 x 128. tma: the warp-specialised TMA kernel
// (gmm_tma_kernel) where it applies (no a_rows, operands that fit tensor maps), else the cp.async kernel.
bool launch_gmm_sm90(const kernels::GmmArgs& p, bool bf16, bool wide, bool tma, int device, cudaStream_t stream,
                     const char* op);

}  // namespace kiln::cuda
