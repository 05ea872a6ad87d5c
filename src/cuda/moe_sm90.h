// The Hopper (sm_90a) tile launcher of grouped_mm and the MoE expert products, in its own translation unit:
// kernels/grouped_mm_sm90.cuh.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/grouped_mm.cuh"

namespace kiln::cuda {

// The Hopper tile kernels (kernels/grouped_mm_sm90.cuh): the cp.async kernel with 128 x 128 or 128 x 256 tiles
// (gmm_wgmma_kernel), and the warp-specialised TMA kernel (gmm_tma_kernel) with 128 x 128 tiles, alone or in
// clusters of 2 or 4 blocks that share each A tile (TMA multicast), or with 64 x 128 tiles (Tma64) or
// 128 x 256 tiles (TmaWide), alone or in pairs along M that share each B tile (TmaWidePair). The TMA kernel
// applies without a_rows and where the operands fit tensor maps; elsewhere its choices fall back to the
// cp.async kernel.
enum class Gmm90Kernel { CpAsync, CpAsyncWide, Tma, Tma64, TmaWide, TmaWidePair, TmaCluster2, TmaCluster4 };
// Launches of the TMA kernel instance of `which` (Tma, Tma64, TmaWide, TmaWidePair, TmaCluster2 or TmaCluster4)
// so far.
int64_t gmm_tma_launches(Gmm90Kernel which);

// Launches a wgmma tile kernel for p (RowGroups or Batched, 16-bit inputs, unit K strides, 16-byte rows:
// the caller's "vec" conditions) when wgmma_available(device); returns false, launching nothing, otherwise.
bool launch_gmm_sm90(const kernels::GmmArgs& p, bool bf16, Gmm90Kernel which, int device, cudaStream_t stream,
                     const char* op);

}  // namespace kiln::cuda
