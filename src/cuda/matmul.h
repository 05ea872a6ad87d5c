// CUDA matrix products (cuBLAS) for mm, bmm, matmul and addmm. Only in KILN_HAVE_CUDA builds.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kiln/tensor.h"

namespace kiln::cuda {

// out = beta * input + alpha * a @ b over batches, as a new contiguous [batch..., n, m] tensor of a's dtype
// on a's device. a: [batch..., n, k], b: [batch..., k, m] with the same batch sizes (broadcasting already
// expanded: any strides, 0 included); input: undefined, or [batch..., n, m] with any strides. With beta == 0
// (or no input) input is not read, so NaN in it does not propagate. Dtypes f16, bf16, f32, f64, c64; half
// types accumulate in f32 and round once. Asynchronous on the current stream; graph-capture safe.
Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& input, const Scalar& beta, const Scalar& alpha);

// The cuBLAS workspace for `stream` on `device` (the caller holds a DeviceGuard), shared with the other
// cuBLAS/cuBLASLt users of kiln: one per (thread, device, stream) outside a graph capture, a fresh one per
// call inside one. Keep the tensor alive until the call that uses it has been enqueued.
Tensor blas_workspace(Device device, cudaStream_t stream);

// The calling thread's cuBLAS handle for `device` (the caller holds a DeviceGuard), bound to the current stream
// with kiln's workspace, which `ws` keeps alive (until the calls that use it have been enqueued); host pointer mode.
cublasHandle_t blas_handle(Device device, Tensor& ws);


}  // namespace kiln::cuda
