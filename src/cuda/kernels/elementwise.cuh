// Elementwise kernels: out[i] = f(in0[i], ..., inK[i]) over one (broadcast) shape, for 1 to 3 inputs.
//
// Two paths, chosen on the host (src/cuda/elementwise.h):
//  - contiguous: every operand dense in the same order and 16-byte aligned: each thread moves Vec
//    elements per operand with one 16-byte (or narrower) load/store, grid-stride, scalar tail.
//  - strided: any strides (broadcast = stride 0); element offsets from the linear index through an
//    OffsetCalc over the coalesced shape. 32-bit index math when everything fits (IndexT = uint32_t).
// f receives storage-type values and returns the storage-type output (the launcher wraps the shared
// KILN_HD functor with the conversions), so these kernels know nothing about ops.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln::cuda {

inline constexpr int kMaxDims = 12;

template <int N, class IndexT>
struct OffsetCalc {
  int ndim;
  IndexT sizes[kMaxDims];        // innermost last
  IndexT strides[kMaxDims][N];   // in elements; operand 0 is the output
  __device__ __forceinline__ void get(IndexT linear, IndexT (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const IndexT i = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[d][k];
    }
  }
};

template <class T, int Vec>
struct alignas(sizeof(T) * Vec) Pack {
  T v[Vec];
};

// ---- contiguous ----------------------------------------------------------------------------------------

template <int Vec, class Out, class A, class F>
__global__ void elementwise1_contig(int64_t n, F f, Out* __restrict__ out, const A* __restrict__ a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / Vec;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<A, Vec> x = reinterpret_cast<const Pack<A, Vec>*>(a)[p];
    Pack<Out, Vec> y;
#pragma unroll
    for (int j = 0; j < Vec; ++j) y.v[j] = f(x.v[j]);
    reinterpret_cast<Pack<Out, Vec>*>(out)[p] = y;
  }
  for (int64_t i = packs * Vec + tid; i < n; i += stride) out[i] = f(a[i]);
}

template <int Vec, class Out, class A, class B, class F>
__global__ void elementwise2_contig(int64_t n, F f, Out* __restrict__ out, const A* __restrict__ a,
                                    const B* __restrict__ b) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / Vec;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<A, Vec> x = reinterpret_cast<const Pack<A, Vec>*>(a)[p];
    const Pack<B, Vec> z = reinterpret_cast<const Pack<B, Vec>*>(b)[p];
    Pack<Out, Vec> y;
#pragma unroll
    for (int j = 0; j < Vec; ++j) y.v[j] = f(x.v[j], z.v[j]);
    reinterpret_cast<Pack<Out, Vec>*>(out)[p] = y;
  }
  for (int64_t i = packs * Vec + tid; i < n; i += stride) out[i] = f(a[i], b[i]);
}

template <int Vec, class Out, class A, class B, class C, class F>
__global__ void elementwise3_contig(int64_t n, F f, Out* __restrict__ out, const A* __restrict__ a,
                                    const B* __restrict__ b, const C* __restrict__ c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / Vec;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<A, Vec> x = reinterpret_cast<const Pack<A, Vec>*>(a)[p];
    const Pack<B, Vec> z = reinterpret_cast<const Pack<B, Vec>*>(b)[p];
    const Pack<C, Vec> w = reinterpret_cast<const Pack<C, Vec>*>(c)[p];
    Pack<Out, Vec> y;
#pragma unroll
    for (int j = 0; j < Vec; ++j) y.v[j] = f(x.v[j], z.v[j], w.v[j]);
    reinterpret_cast<Pack<Out, Vec>*>(out)[p] = y;
  }
  for (int64_t i = packs * Vec + tid; i < n; i += stride) out[i] = f(a[i], b[i], c[i]);
}

// ---- strided -------------------------------------------------------------------------------------------

template <class IndexT, class Out, class A, class F>
__global__ void elementwise1_strided(IndexT n, OffsetCalc<2, IndexT> oc, F f, Out* out, const A* a) {
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    IndexT off[2];
    oc.get(i, off);
    out[off[0]] = f(a[off[1]]);
  }
}

template <class IndexT, class Out, class A, class B, class F>
__global__ void elementwise2_strided(IndexT n, OffsetCalc<3, IndexT> oc, F f, Out* out, const A* a, const B* b) {
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    IndexT off[3];
    oc.get(i, off);
    out[off[0]] = f(a[off[1]], b[off[2]]);
  }
}

template <class IndexT, class Out, class A, class B, class C, class F>
__global__ void elementwise3_strided(IndexT n, OffsetCalc<4, IndexT> oc, F f, Out* out, const A* a, const B* b,
                                     const C* c) {
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    IndexT off[4];
    oc.get(i, off);
    out[off[0]] = f(a[off[1]], b[off[2]], c[off[3]]);
  }
}

}  // namespace kiln::cuda
