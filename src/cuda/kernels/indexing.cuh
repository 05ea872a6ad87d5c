// Device code of the indexing ops: gather (index_select, gather), take, scatter / scatter_add and the
// strided copies they need. Pure data movement works on unsigned integers as wide as one element (U).
// Every kernel checks each index against its bound before touching memory: an index out of range skips
// the element and is reported through the device error record (cuda/device_error.h), which the host
// raises at its next synchronisation.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/device_error.h"
#include "cuda/kernels/strided.cuh"
#include "kiln/scalar_types.h"

namespace kiln::cuda {

// out (contiguous, n elements) [i] = src[src_off(i) + idx[idx_off(i)] * dim_stride]; off = {src, idx}.
// Indices must lie in [0, bound).
template <class U, class I>
__global__ void gather_kernel(U* __restrict__ out, const U* __restrict__ src, const I* __restrict__ idx,
                              Offsets<2> off, int64_t n, int64_t dim_stride, int64_t bound,
                              DeviceErrorRecord* err, OpId op) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    int64_t o[2];
    off.get(i, o);
    const int64_t k = static_cast<int64_t>(idx[o[1]]);
    if (k < 0 || k >= bound) {
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, op, k, bound);
      continue;
    }
    out[i] = src[o[0] + k * dim_stride];
  }
}

// out (contiguous, n elements) [i] = x[flat index idx[idx_off(i)]], x strided (x_off over x's shape);
// indices in [-numel, numel), negative ones counting from the end.
template <class U, class I>
__global__ void take_kernel(U* __restrict__ out, const U* __restrict__ x, const I* __restrict__ idx,
                            Offsets<1> idx_off, Offsets<1> x_off, int64_t n, int64_t numel,
                            DeviceErrorRecord* err) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    int64_t oi[1];
    idx_off.get(i, oi);
    int64_t k = static_cast<int64_t>(idx[oi[0]]);
    if (k < -numel || k >= numel) {
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::Take, k, numel);
      continue;
    }
    if (k < 0) k += numel;
    int64_t ox[1];
    x_off.get(k, ox);
    out[i] = x[ox[0]];
  }
}

// For every position p of index (n positions, off = {index, src, self restrided with stride 0 on dim}):
// self[self_off(p) + index[p] * dim_stride] = src[src_off(p)] (or `value` when src is null). Duplicate
// indices race: which write lands is unspecified, as in PyTorch's CUDA scatter.
template <class U, class I>
__global__ void scatter_kernel(U* self, const U* __restrict__ src, U value, const I* __restrict__ idx,
                               Offsets<3> off, int64_t n, int64_t dim_stride, int64_t bound,
                               DeviceErrorRecord* err, OpId op) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    int64_t o[3];
    off.get(i, o);
    const int64_t k = static_cast<int64_t>(idx[o[0]]);
    if (k < 0 || k >= bound) {
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, op, k, bound);
      continue;
    }
    self[o[2] + k * dim_stride] = src ? src[o[1]] : value;
  }
}

// Wrapping add of a 1- or 2-byte integer through a CAS loop on the aligned 32-bit word holding it (the
// word lies inside the allocation: blocks are at least 256-byte aligned and sized in 512-byte granules).
template <class T>
__device__ __forceinline__ void atomic_add_narrow(T* p, T v) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  unsigned* word = reinterpret_cast<unsigned*>(addr & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3u) * 8u;
  const unsigned lane = (1u << (8 * sizeof(T))) - 1u;
  const unsigned add = static_cast<unsigned>(static_cast<std::make_unsigned_t<T>>(v));
  unsigned old = *word, assumed;
  do {
    assumed = old;
    const unsigned sum = (((assumed >> shift) & lane) + add) & lane;
    old = atomicCAS(word, assumed, (assumed & ~(lane << shift)) | (sum << shift));
  } while (old != assumed);
}

// *p += v for the accumulator types of scatter_add (integers wrap; bool is logical or).
template <class A>
__device__ __forceinline__ void atomic_accumulate(A* p, A v) {
  if constexpr (std::is_same_v<A, bool>) {
    if (v) *p = true;  // every racing writer stores the same value
  } else if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<A, Complex64>) {
    atomicAdd(&p->re, v.re);
    atomicAdd(&p->im, v.im);
  } else if constexpr (sizeof(A) == 4) {
    atomicAdd(reinterpret_cast<unsigned*>(p), static_cast<unsigned>(v));
  } else if constexpr (sizeof(A) == 8) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else {
    atomic_add_narrow(p, v);
  }
}

// scatter_add: acc[acc_off(p) + index[p] * dim_stride] += A(src[src_off(p)]); off = {index, src, acc
// restrided}. A is T, or float for f16/bf16 (whose launcher accumulates into an f32 copy of self).
template <class A, class T, class I>
__global__ void scatter_add_kernel(A* acc, const T* __restrict__ src, const I* __restrict__ idx, Offsets<3> off,
                                   int64_t n, int64_t dim_stride, int64_t bound, DeviceErrorRecord* err) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    int64_t o[3];
    off.get(i, o);
    const int64_t k = static_cast<int64_t>(idx[o[0]]);
    if (k < 0 || k >= bound) {
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::ScatterAdd, k, bound);
      continue;
    }
    atomic_accumulate(acc + o[2] + k * dim_stride, convert<A>(src[o[1]]));
  }
}

}  // namespace kiln::cuda
