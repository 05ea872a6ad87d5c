// Elementwise kernels: out[i] = f(in0[i], ..., inK[i]) over one (broadcast) shape, any number of inputs.
//
// Two paths, chosen on the host (src/cuda/elementwise.h):
//  - contiguous: every operand dense in the same order and 16-byte aligned: each thread moves Vec
//    elements per operand with one 16-byte (or narrower) load/store, grid-stride, scalar tail.
//  - strided: any strides (broadcast = stride 0); element offsets from the linear index through an
//    OffsetCalc over the coalesced shape. 32-bit index math when everything fits (IndexT = uint32_t).
// f receives storage-type values and returns the storage-type output (the launcher wraps the shared
// KILN_HD functor with the conversions), so these kernels know nothing about ops.
#pragma once

#include <cuda/std/tuple>

#include <cstdint>
#include <utility>

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

template <class T, int Vec>
__device__ __forceinline__ Pack<T, Vec> load_pack(const T* p, int64_t i) {
  return reinterpret_cast<const Pack<T, Vec>*>(p)[i];
}

// f applied to element j of each input pack.
template <class F, class Tuple, size_t... I>
__device__ __forceinline__ auto call_lane(const F& f, const Tuple& packs, int j, std::index_sequence<I...>) {
  return f(::cuda::std::get<I>(packs).v[j]...);
}

// ---- contiguous ----------------------------------------------------------------------------------------

template <int Vec, class Out, class F, class... In>
__global__ void elementwise_contig(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / Vec;
  for (int64_t p = tid; p < packs; p += stride) {
    const auto loaded = ::cuda::std::make_tuple(load_pack<In, Vec>(in, p)...);  // all loads before any use
    Pack<Out, Vec> y;
#pragma unroll
    for (int j = 0; j < Vec; ++j) y.v[j] = call_lane(f, loaded, j, std::index_sequence_for<In...>{});
    reinterpret_cast<Pack<Out, Vec>*>(out)[p] = y;
  }
  for (int64_t i = packs * Vec + tid; i < n; i += stride) out[i] = f(in[i]...);
}

// ---- strided -------------------------------------------------------------------------------------------

template <class IndexT, class Out, class F, class... In, size_t... I>
__device__ __forceinline__ void strided_one(const OffsetCalc<1 + sizeof...(In), IndexT>& oc, IndexT i, const F& f,
                                            Out* out, std::index_sequence<I...>, const In*... in) {
  IndexT off[1 + sizeof...(In)];
  oc.get(i, off);
  out[off[0]] = f(in[off[I + 1]]...);
}

template <class IndexT, class Out, class F, class... In>
__global__ void elementwise_strided(IndexT n, OffsetCalc<1 + sizeof...(In), IndexT> oc, F f, Out* out,
                                    const In*... in) {
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    strided_one(oc, i, f, out, std::index_sequence_for<In...>{}, in...);
}

}  // namespace kiln::cuda
