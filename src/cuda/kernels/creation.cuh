// Device code of the range factories and eye. The per-element formulas are the CPU's (ops/range.h), and
// this file is compiled with --fmad=false, so the device evaluates them with the same roundings (no
// contraction of a separate multiply and add into an fma that the CPU does not do).
#pragma once

#include <cstdint>

#include "cuda/kernels/strided.cuh"

namespace kiln::cuda {

// out[i] = op(i) for i in [0, n); out contiguous.
template <class T, class Op>
__global__ void indexed_fill_kernel(T* __restrict__ out, int64_t n, Op op) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = op(i);
}

// out[i * cols + i] = one for i in [0, diag); the rest of out is already zero.
template <class U>
__global__ void eye_kernel(U* __restrict__ out, int64_t diag, int64_t cols, U one) {
  for (int64_t i = global_thread(); i < diag; i += grid_stride()) out[i * cols + i] = one;
}

}  // namespace kiln::cuda
