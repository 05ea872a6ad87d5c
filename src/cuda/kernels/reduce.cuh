// Device code of the reductions: raw pointers, sizes and strides in. The per-element math is the op
// struct of src/ops/reduce_functors.h (identity / reduce / combine), the same one the CPU runs; a Store
// functor turns each output's accumulator into the output value(s).
//
// Three kernels (the launcher, src/cuda/reduce_launch.cuh, picks one by shape):
//  - reduce_rows_kernel: rows of `len` contiguous elements, `ld` apart; a group of `width` lanes of one
//    warp per row (width < 32 packs several short rows into a warp), combined with shuffles.
//  - reduce_split_rows_kernel: few long rows; block (s, row) folds chunk s of the row and writes one
//    partial; reduce_rows_kernel over the partials (FoldPartial) finishes. Two passes instead of float
//    atomics keep the result identical from run to run.
//  - reduce_columns_kernel: the reduced dim is outside the kept inner dim; each thread owns one output and
//    walks the reduced dim (adjacent threads read adjacent addresses), optionally over a chunk of it only
//    (blockIdx.y), writing partials that reduce_rows_kernel then combines.
// Every combination order is fixed by the launch shape, so results are deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kiln::cuda::kernels {

inline constexpr int kReduceThreads = 256;

// __shfl_down_sync of any trivially copyable value (accumulators are structs up to 24 bytes).
template <class T>
__device__ __forceinline__ T shfl_down_any(const T& v, unsigned delta, int width) {
  constexpr int kWords = static_cast<int>((sizeof(T) + 3) / 4);
  unsigned w[kWords] = {};
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __shfl_down_sync(0xffffffffu, w[k], delta, width);
  T r = v;
  memcpy(&r, w, sizeof(T));
  return r;
}

// Combines the accumulators of aligned groups of `width` lanes (a power of two <= 32); lane 0 of each group
// gets the result. Every lane of the warp must call it with the same width.
template <class Op, class Acc>
__device__ __forceinline__ Acc group_reduce(const Op& op, Acc a, int width) {
  for (int d = width / 2; d > 0; d /= 2) a = op.combine(a, shfl_down_any(a, static_cast<unsigned>(d), width));
  return a;
}

// The whole block's accumulators combined; the result is valid in thread 0.
template <class Op, class Acc>
__device__ __forceinline__ Acc block_reduce(const Op& op, Acc a) {
  __shared__ alignas(16) unsigned char smem[(kReduceThreads / 32) * sizeof(Acc)];
  Acc* partial = reinterpret_cast<Acc*>(smem);
  a = group_reduce(op, a, 32);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) partial[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : op.identity();
    a = group_reduce(op, a, 32);
  }
  return a;
}

// Folds input elements into an accumulator (op.reduce, which also sees the element's index).
template <class Op, class In>
struct FoldInput {
  using value_t = In;
  using acc_t = typename Op::acc_t;
  static constexpr bool kVectorizable = 16 % sizeof(In) == 0;
  Op op;
  __device__ __forceinline__ acc_t operator()(acc_t a, In x, int64_t i) const { return op.reduce(a, x, i); }
};

// Folds partial accumulators written by an earlier pass (op.combine).
template <class Op>
struct FoldPartial {
  using value_t = typename Op::acc_t;
  using acc_t = typename Op::acc_t;
  static constexpr bool kVectorizable = false;
  Op op;
  __device__ __forceinline__ acc_t operator()(acc_t a, acc_t x, int64_t) const { return op.combine(a, x); }
};

// Folds p[lo, hi) into a, thread t of nt taking every nt-th element (or every nt-th 16-byte vector when
// `vec`: then p + lo is 16-byte aligned, which the launcher guarantees, and the tail is scalar).
template <class Fold>
__device__ __forceinline__ typename Fold::acc_t fold_range(const Fold& fold, const typename Fold::value_t* p,
                                                           int64_t lo, int64_t hi, int64_t t, int64_t nt, bool vec,
                                                           typename Fold::acc_t a) {
  using V = typename Fold::value_t;
  int64_t j = lo + t;
  if constexpr (Fold::kVectorizable) {
    if (vec) {
      constexpr int kV = static_cast<int>(16 / sizeof(V));
      const int64_t nvec = (hi - lo) / kV;
      const uint4* pv = reinterpret_cast<const uint4*>(p + lo);
      for (int64_t c = t; c < nvec; c += nt) {
        const uint4 raw = __ldg(pv + c);
        V v[kV];
        memcpy(v, &raw, sizeof(raw));
#pragma unroll
        for (int k = 0; k < kV; ++k) a = fold(a, v[k], lo + c * kV + k);
      }
      j = lo + nvec * kV + t;
    }
  }
  for (; j < hi; j += nt) a = fold(a, p[j], j);
  return a;
}

// Row `row` = x[row * ld + 0 .. len); out via store(row, acc). width = 1 << group_log2 lanes per row.
template <class Fold, class Store>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_rows_kernel(Fold fold, const typename Fold::value_t* __restrict__ x, int64_t rows, int64_t len, int64_t ld,
                       int group_log2, bool vec, Store store) {
  using Acc = typename Fold::acc_t;
  const int width = 1 << group_log2;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int sub = lane & (width - 1);
  const int64_t rows_per_warp = 32 >> group_log2;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // `base` is uniform across the warp, so every lane runs the same shuffles (rows past the end fold
  // nothing and store nothing).
  for (int64_t base = warp * rows_per_warp; base < rows; base += nwarps * rows_per_warp) {
    const int64_t row = base + (lane >> group_log2);
    Acc a = fold.op.identity();
    if (row < rows) a = fold_range(fold, x + row * ld, 0, len, sub, width, vec, a);
    a = group_reduce(fold.op, a, width);
    if (row < rows && sub == 0) store(row, a);
  }
}

// Block (blockIdx.x = s, blockIdx.y = row) folds x[row * ld + s * chunk ...) up to len and writes
// partial[row * gridDim.x + s]. chunk is a multiple of 16 elements, so with `vec` every chunk starts
// 16-byte aligned.
template <class Fold>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_split_rows_kernel(Fold fold, const typename Fold::value_t* __restrict__ x, int64_t len, int64_t ld,
                             int64_t chunk, bool vec, typename Fold::acc_t* __restrict__ partial) {
  const int64_t row = blockIdx.y, s = blockIdx.x;
  const int64_t lo = s * chunk;
  const int64_t hi = lo + chunk < len ? lo + chunk : len;
  typename Fold::acc_t a = fold.op.identity();
  if (lo < hi) a = fold_range(fold, x + row * ld, lo, hi, threadIdx.x, blockDim.x, vec, a);
  a = block_reduce(fold.op, a);
  if (threadIdx.x == 0) partial[row * gridDim.x + s] = a;
}

// Output o (of `outputs`) reads x[(o / inner) * outer_stride + (o % inner) + r * red_stride] for r in chunk
// blockIdx.y of [0, len). With gridDim.y == 1 it stores; otherwise it writes partial[o * gridDim.y + s].
template <class Fold, class Store>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_columns_kernel(Fold fold, const typename Fold::value_t* __restrict__ x, int64_t outputs, int64_t inner,
                          int64_t outer_stride, int64_t len, int64_t red_stride, int64_t chunk,
                          typename Fold::acc_t* __restrict__ partial, Store store) {
  using Acc = typename Fold::acc_t;
  const int64_t s = blockIdx.y;
  const int64_t lo = s * chunk;
  const int64_t hi = lo + chunk < len ? lo + chunk : len;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = o / inner, m = o - b * inner;
    const typename Fold::value_t* p = x + b * outer_stride + m;
    Acc a = fold.op.identity();
#pragma unroll 4
    for (int64_t r = lo; r < hi; ++r) a = fold(a, p[r * red_stride], r);
    if (gridDim.y == 1) store(o, a);
    else partial[o * gridDim.y + s] = a;
  }
}

}  // namespace kiln::cuda::kernels
