// Device code of the matmul family: the strided gather that makes an operand (or addmm's broadcast input)
// contiguous for cuBLAS, optionally scaled by beta. The products themselves are cuBLAS's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln::cuda::kernels {

// Sizes and element strides of a source with at most kMaxGatherDims dims (after the host merged the dims
// it could): passed by value as a kernel argument.
inline constexpr int kMaxGatherDims = 16;
struct GatherIndex {
  int ndim;
  int64_t sizes[kMaxGatherDims];
  int64_t strides[kMaxGatherDims];
};

// x * s as the CPU computes it (src/cpu/matmul.cpp, k = 0): reduced floats in float and rounded once,
// complex as (a+bi)(c+di) with separately rounded products (no FMA contraction, which would differ from
// the host's results in the last bit).
template <class T, class S>
__device__ __forceinline__ T scale_value(T x, S s) {
  if constexpr (std::is_same_v<T, Complex64>) {
    return Complex64(__fsub_rn(__fmul_rn(x.re, s.re), __fmul_rn(x.im, s.im)),
                     __fadd_rn(__fmul_rn(x.re, s.im), __fmul_rn(x.im, s.re)));
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(x) * s);
  } else {
    return x * s;
  }
}

// dst[i] = src[offset(i)] (times s when `scale`) for the n elements of a contiguous dst, where offset(i)
// maps i's row-major coordinates through ix's strides. 64-bit indices: n may exceed 2^31.
template <class T, class S>
__global__ void gather_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t n, GatherIndex ix,
                              bool scale, S s) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    int64_t rest = i, off = 0;
    for (int d = ix.ndim - 1; d >= 0; --d) {
      const int64_t size = ix.sizes[d];
      off += (rest % size) * ix.strides[d];
      rest /= size;
    }
    const T v = src[off];
    dst[i] = scale ? scale_value(v, s) : v;
  }
}

}  // namespace kiln::cuda::kernels
