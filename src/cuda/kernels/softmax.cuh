// Device code of softmax / log_softmax (launchers: src/cuda/softmax.cu; the row math, shared with the CPU:
// src/ops/softmax_math.h). Tin is the input type, Tout the output's (Tin, or f32 for f16/bf16 input), A the
// compute type (f32; f64 for f64 input).
//
// Kernels (the launcher picks one by shape):
//  - softmax_rows_kernel: a row per warp (short rows) or a row per block (medium rows), the whole row held
//    in registers: max, then sum of exp(x - max), then the outputs, from one read of x.
//  - softmax_split_partial_kernel + softmax_split_write_kernel: few long rows. Each row is cut into chunks,
//    one block per chunk; the first kernel writes each chunk's (max, sum) pair; in the second every block
//    folds its row's pairs (a few hundred bytes, from L2) into the row's (max, sum) and writes its chunk,
//    re-reading it from L2. No host synchronisation, two launches, both graph-capturable; on sm_90 the
//    second is a programmatic dependent launch that loads its x chunk while the first kernel finishes.
//  - softmax_strided_kernel: the reduced dim is not the innermost ([outer, n, inner], inner > 1): a block
//    takes 32 adjacent inner positions (coalesced) and 8 threads down the reduced dim for each.
//
// Element mapping inside a row: group g holds elements [g*V, g*V + V), V = 16 bytes of Tin. A group is one
// 16-byte load (store) when the row start is 16-byte aligned (the launcher checks base and row stride) and
// the group lies inside the limit; otherwise element by element. Elements at or past the limit read as -inf,
// which never changes a result (softmax_math.h), so ragged tails need no special reduction.
// Every combination order is fixed by the launch shape: results are deterministic from run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/pdl.cuh"
#include "ops/softmax_math.h"

namespace kiln::cuda::kernels {

inline constexpr int kSoftmaxWarpRowThreads = 256;  // a row per warp: 8 rows per block
inline constexpr int kSoftmaxBlockRowMaxThreads = 512;
inline constexpr int kSoftmaxSplitThreads = 256;
inline constexpr int kSoftmaxSplitUnroll = 4;  // groups each thread has in flight in the split kernels
inline constexpr int kSoftmaxStridedX = 32, kSoftmaxStridedY = 8;

template <class T>
inline constexpr int kSoftmaxVec = static_cast<int>(16 / sizeof(T));

namespace softmax_detail {

namespace sm = softmax_math;

template <class A>
__device__ __forceinline__ A neg_inf() {
  return static_cast<A>(-INFINITY);
}

struct MaxNan {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return sm::max_nan(a, b);
  }
};
struct Plus {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};

// Butterfly over the warp: every lane ends with the same value (f is commutative).
template <class A, class F>
__device__ __forceinline__ A warp_all_reduce(A v, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The whole block's values combined, returned to every thread (blockDim.x a multiple of 32, <= 1024).
// `smem` holds 32 values; the leading barrier makes back-to-back calls with the same smem safe.
template <class A, class F>
__device__ __forceinline__ A block_all_reduce(A v, F f, A* smem) {
  v = warp_all_reduce(v, f);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  A r = smem[0];
  for (int w = 1; w < warps; ++w) r = f(r, smem[w]);
  return r;
}

// (max, sum) pairs of the block combined in the n-ary form (softmax_math.h): the block's max first, then
// each pair rescaled to it once and summed. Returned to every thread (same contract as block_all_reduce).
template <class A>
__device__ __forceinline__ sm::MaxSum<A> block_all_max_sum(sm::MaxSum<A> v, A* smem) {
  const A m = block_all_reduce(v.max, MaxNan{}, smem);
  const A s = block_all_reduce(sm::rescale_sum(v.sum, v.max, m), Plus{}, smem);
  return {m, s};
}

// Element q of a group from its 32-bit words, and a group to words, by shifts: no byte copies through local
// memory. T is float, double, Half or BFloat16.
template <class T>
__device__ __forceinline__ T from_words(const uint32_t* w, int q) {
  if constexpr (sizeof(T) == 2) return T(static_cast<uint16_t>(w[q >> 1] >> (16 * (q & 1))), FromBits{});
  else if constexpr (sizeof(T) == 4) return __uint_as_float(w[q]);
  else return __hiloint2double(static_cast<int>(w[2 * q + 1]), static_cast<int>(w[2 * q]));
}
template <class T, int V, int W>
__device__ __forceinline__ void to_words(const T (&o)[V], uint32_t (&w)[W]) {
  static_assert(W * 4 == V * static_cast<int>(sizeof(T)), "words hold the group exactly");
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if constexpr (sizeof(T) == 2) w[j] = static_cast<uint32_t>(o[2 * j].x) | (static_cast<uint32_t>(o[2 * j + 1].x) << 16);
    else if constexpr (sizeof(T) == 4) w[j] = __float_as_uint(o[j]);
    else w[j] = static_cast<uint32_t>(j & 1 ? __double2hiint(o[j >> 1]) : __double2loint(o[j >> 1]));
  }
}

// v = the group of V elements from xr[i0] (i0 a multiple of V); elements at or past `lim` are -inf.
template <class T, class A, int V>
__device__ __forceinline__ void load_group(const T* __restrict__ xr, int64_t i0, int64_t lim, bool vec,
                                           A (&v)[V]) {
  if (vec && i0 + V <= lim) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(xr + i0));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int q = 0; q < V; ++q) v[q] = convert<A>(from_words<T>(w, q));
  } else {
#pragma unroll
    for (int q = 0; q < V; ++q) v[q] = i0 + q < lim ? convert<A>(xr[i0 + q]) : neg_inf<A>();
  }
}

// Writes the group's elements below `lim` (one or two 16-byte stores when `vec` and the group is whole).
template <class T, int V>
__device__ __forceinline__ void store_group(T* __restrict__ yr, int64_t i0, int64_t lim, bool vec,
                                            const T (&o)[V]) {
  static_assert((V * sizeof(T)) % 16 == 0, "a group of outputs is whole 16-byte words");
  if (vec && i0 + V <= lim) {
    constexpr int kWords = static_cast<int>(V * sizeof(T) / 4);
    uint32_t w[kWords];
    to_words(o, w);
    uint4* dst = reinterpret_cast<uint4*>(yr + i0);
#pragma unroll
    for (int j = 0; j < kWords / 4; ++j) dst[j] = make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
  } else {
#pragma unroll
    for (int q = 0; q < V; ++q)
      if (i0 + q < lim) yr[i0 + q] = o[q];
  }
}

// The outputs of one group. `k` is the row's sum (softmax) or log(sum) (log_softmax); for softmax `v`
// holds exp(x - max) already when `have_exp`, else x.
template <class Tout, class A, int V>
__device__ __forceinline__ void finish_group(const A (&v)[V], A max, A k, bool log, bool have_exp, Tout (&o)[V]) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    A r;
    if (log) r = sm::log_softmax_value(v[q], max, k);
    else r = sm::softmax_from_exp(have_exp ? v[q] : sm::exp_shifted(v[q], max), k);
    o[q] = convert<Tout>(r);
  }
}

}  // namespace softmax_detail

// Rows of n (<= R * P * V) elements, row r of x at x + r * ld, of y at y + r * n. WarpPerRow: P = 32 lanes
// per row, 8 rows per block; else P = blockDim.x (a multiple of 32, <= 512) threads per row. Grid-stride
// over rows (the loop condition is uniform per warp / per block, as the shuffles and barriers need).
template <class Tin, class Tout, int R, bool WarpPerRow>
__global__ void __launch_bounds__(WarpPerRow ? kSoftmaxWarpRowThreads : kSoftmaxBlockRowMaxThreads)
    softmax_rows_kernel(const Tin* __restrict__ x, Tout* __restrict__ y, int64_t rows, int n, int64_t ld,
                        bool vec_x, bool vec_y, bool log) {
  namespace sd = softmax_detail;
  namespace sm = softmax_math;
  using A = opmath_t<Tin>;
  constexpr int V = kSoftmaxVec<Tin>;
  __shared__ A smem[32];
  const int per_block = WarpPerRow ? static_cast<int>(blockDim.x >> 5) : 1;
  const int P = WarpPerRow ? 32 : static_cast<int>(blockDim.x);
  const int t = WarpPerRow ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
  const int64_t step = static_cast<int64_t>(gridDim.x) * per_block;
  int64_t row = static_cast<int64_t>(blockIdx.x) * per_block + (WarpPerRow ? (threadIdx.x >> 5) : 0);
  for (; row < rows; row += step) {
    const Tin* xr = x + row * ld;
    Tout* yr = y + row * static_cast<int64_t>(n);
    A v[R][V];
#pragma unroll
    for (int j = 0; j < R; ++j) sd::load_group(xr, static_cast<int64_t>(j * P + t) * V, n, vec_x, v[j]);
    A m = sd::neg_inf<A>();
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int q = 0; q < V; ++q) m = sm::max_nan(m, v[j][q]);
    if constexpr (WarpPerRow) m = sd::warp_all_reduce(m, sd::MaxNan{});
    else m = sd::block_all_reduce(m, sd::MaxNan{}, smem);
    A s = 0;
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const A e = sm::exp_shifted(v[j][q], m);
        s += e;
        if (!log) v[j][q] = e;
      }
    if constexpr (WarpPerRow) s = sd::warp_all_reduce(s, sd::Plus{});
    else s = sd::block_all_reduce(s, sd::Plus{}, smem);
    const A k = log ? math::log(s) : s;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t i0 = static_cast<int64_t>(j * P + t) * V;
      if (i0 >= n) break;
      Tout o[V];
      sd::finish_group(v[j], m, k, log, true, o);
      sd::store_group(yr, i0, n, vec_y, o);
    }
  }
}

// Split path, pass 1: block b = row * chunks + c reduces elements [c * chunk, min(n, (c + 1) * chunk)) of
// its row (chunk a multiple of V) to partial[b] = (max, sum of exp(x - max)).
template <class Tin>
__global__ void __launch_bounds__(kSoftmaxSplitThreads)
    softmax_split_partial_kernel(const Tin* __restrict__ x, int64_t n, int64_t ld, int64_t chunk, int chunks,
                                 bool vec_x, softmax_math::MaxSum<opmath_t<Tin>>* __restrict__ partial) {
  namespace sd = softmax_detail;
  namespace sm = softmax_math;
  using A = opmath_t<Tin>;
  constexpr int V = kSoftmaxVec<Tin>;
  constexpr int U = kSoftmaxSplitUnroll;
  constexpr int64_t kStride = static_cast<int64_t>(kSoftmaxSplitThreads) * V;
  __shared__ A smem[32];
  kernels::pdl_allow_dependents();  // all of this grid's blocks are running: the second pass may be scheduled
  const int64_t row = blockIdx.x / chunks;
  const int64_t lo = (blockIdx.x % chunks) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  const Tin* xr = x + row * ld;
  sm::MaxSum<A> acc = sm::max_sum_identity<A>();
  for (int64_t g0 = lo + threadIdx.x * V; g0 < hi; g0 += U * kStride) {
    A v[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) sd::load_group(xr, g0 + u * kStride, hi, vec_x, v[u]);
    A m = sd::neg_inf<A>();
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < V; ++q) m = sm::max_nan(m, v[u][q]);
    A s = 0;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < V; ++q) s += sm::exp_shifted(v[u][q], m);
    acc = sm::combine(acc, sm::MaxSum<A>{m, s});
  }
  acc = sd::block_all_max_sum(acc, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Split path, pass 2: every block folds its row's `chunks` partials (the same order in every block, so the
// row's blocks agree bit for bit) and writes its chunk of y (row r at y + r * n). The first batch of x is
// loaded before waiting for pass 1 (see kernels/pdl.cuh).
template <class Tin, class Tout>
__global__ void __launch_bounds__(kSoftmaxSplitThreads)
    softmax_split_write_kernel(const Tin* __restrict__ x, Tout* __restrict__ y, int64_t n, int64_t ld,
                               int64_t chunk, int chunks, bool vec_x, bool vec_y,
                               const softmax_math::MaxSum<opmath_t<Tin>>* partial, bool log) {
  namespace sd = softmax_detail;
  namespace sm = softmax_math;
  using A = opmath_t<Tin>;
  constexpr int V = kSoftmaxVec<Tin>;
  constexpr int U = kSoftmaxSplitUnroll;
  constexpr int64_t kStride = static_cast<int64_t>(kSoftmaxSplitThreads) * V;
  __shared__ A smem[32];
  const int64_t row = blockIdx.x / chunks;
  const int64_t lo = (blockIdx.x % chunks) * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  const Tin* xr = x + row * ld;
  Tout* yr = y + row * n;
  int64_t g0 = lo + threadIdx.x * V;
  A v[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) sd::load_group(xr, g0 + u * kStride, hi, vec_x, v[u]);

  kernels::pdl_wait();
  sm::MaxSum<A> acc = sm::max_sum_identity<A>();
  for (int i = static_cast<int>(threadIdx.x); i < chunks; i += kSoftmaxSplitThreads)
    acc = sm::combine(acc, partial[row * chunks + i]);
  acc = sd::block_all_max_sum(acc, smem);
  const A m = acc.max, k = log ? math::log(acc.sum) : acc.sum;

  while (g0 < hi) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      Tout o[V];
      sd::finish_group(v[u], m, k, log, false, o);
      sd::store_group(yr, g0 + u * kStride, hi, vec_y, o);
    }
    g0 += U * kStride;
    if (g0 >= hi) break;
#pragma unroll
    for (int u = 0; u < U; ++u) sd::load_group(xr, g0 + u * kStride, hi, vec_x, v[u]);
  }
}

// Reduced dim not innermost: x and y contiguous [outer, n, inner]. Block (32, 8) over `tiles` tiles of 32
// inner positions per outer index; grid-stride over outer * tiles blocks. Three passes down each column
// (max, sum, write); the column stays in L1/L2 between them.
template <class Tin, class Tout>
__global__ void __launch_bounds__(kSoftmaxStridedX* kSoftmaxStridedY)
    softmax_strided_kernel(const Tin* __restrict__ x, Tout* __restrict__ y, int64_t outer, int64_t n,
                           int64_t inner, int64_t tiles, bool log) {
  namespace sd = softmax_detail;
  namespace sm = softmax_math;
  using A = opmath_t<Tin>;
  __shared__ A smem[kSoftmaxStridedY][kSoftmaxStridedX + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int64_t b = blockIdx.x; b < outer * tiles; b += gridDim.x) {
    const int64_t o = b / tiles;
    const int64_t i = (b % tiles) * kSoftmaxStridedX + tx;
    const bool active = i < inner;
    const int64_t base = o * n * inner + i;
    A m = sd::neg_inf<A>();
    if (active)
      for (int64_t k = ty; k < n; k += kSoftmaxStridedY) m = sm::max_nan(m, convert<A>(x[base + k * inner]));
    smem[ty][tx] = m;
    __syncthreads();
    m = smem[0][tx];
    for (int w = 1; w < kSoftmaxStridedY; ++w) m = sm::max_nan(m, smem[w][tx]);
    __syncthreads();
    A s = 0;
    if (active)
      for (int64_t k = ty; k < n; k += kSoftmaxStridedY) s += sm::exp_shifted(convert<A>(x[base + k * inner]), m);
    smem[ty][tx] = s;
    __syncthreads();
    s = smem[0][tx];
    for (int w = 1; w < kSoftmaxStridedY; ++w) s += smem[w][tx];
    __syncthreads();  // smem is reused by the next tile
    const A kk = log ? math::log(s) : s;
    if (active)
      for (int64_t k = ty; k < n; k += kSoftmaxStridedY) {
        const A xv = convert<A>(x[base + k * inner]);
        const A r = log ? sm::log_softmax_value(xv, m, kk) : sm::softmax_from_exp(sm::exp_shifted(xv, m), kk);
        y[base + k * inner] = convert<Tout>(r);
      }
  }
}

}  // namespace kiln::cuda::kernels
