// Element offsets of strided operands that share one logical shape (device code only). Element i is the
// i-th element in row-major order over the shape; each operand has its own strides (in elements, stride 0
// for a broadcast dim). The launcher drops size-1 dims and merges dims that are contiguous for every
// operand first, so most calls do one or two divisions per element.
#pragma once

#include <cstdint>

namespace kiln::cuda {

inline constexpr int kMaxDims = 16;

template <int N>
struct Offsets {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void get(int64_t i, int64_t (&out)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t s = sizes[d];
      const int64_t c = i % s;
      i /= s;
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += c * strides[k][d];
    }
  }
};

// The number of threads of a grid (for grid-stride loops), in 64 bits.
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace kiln::cuda
