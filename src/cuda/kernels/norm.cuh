// Device code of rms_norm / add_rms_norm, silu_and_mul and rotary embeddings. The per-element formulas are
// those of the CPU kernels (src/ops/norm_math.h), so the results match the CPU bit for bit wherever the
// device's libm agrees with the host's (see src/cuda/norm.cu: compiled without fma contraction).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/binary_functors.h"
#include "ops/norm_math.h"

namespace kiln::cuda {

// N consecutive elements moved as one access: 16 bytes (or a multiple) when N > 1, one element otherwise.
template <class T, int N>
struct alignas(sizeof(T) * N) NormPack {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ NormPack<T, N> norm_load(const T* p) {
  NormPack<T, N> r;
  if constexpr (sizeof(r) % 16 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(p);
    uint4* dst = reinterpret_cast<uint4*>(&r);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(r) / 16); ++i) dst[i] = src[i];
  } else {
    r = *reinterpret_cast<const NormPack<T, N>*>(p);
  }
  return r;
}

template <class T, int N>
__device__ __forceinline__ void norm_store(T* p, const NormPack<T, N>& v) {
  if constexpr (sizeof(v) % 16 == 0) {
    uint4* dst = reinterpret_cast<uint4*>(p);
    const uint4* src = reinterpret_cast<const uint4*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 16); ++i) dst[i] = src[i];
  } else {
    *reinterpret_cast<NormPack<T, N>*>(p) = v;
  }
}

// ---- rms_norm / add_rms_norm -----------------------------------------------------------------------------

// Vectors per thread kept in registers between the sum of squares and the scaling pass; a longer row
// (more than kNormMaxThreads * kNormCache vectors) reads its remainder twice.
inline constexpr int kNormCache = 4;
inline constexpr int kNormMaxThreads = 512;

// Sum over the threadIdx.x group of one row: one warp (blockDim.x == 32, several rows per block along y)
// or the whole block (one row per block). Every lane gets the same value: the xor butterfly adds the same
// pairs in every lane (addition is commutative), and every warp reads the same partials.
__device__ __forceinline__ double norm_row_sum(double v, double* partial /* [32] shared */) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (blockDim.x == 32) return v;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double t = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// One row of D = d elements per threadIdx.x group, row = blockIdx.x * blockDim.y + threadIdx.y; VEC elements
// per access (d % VEC == 0 and every pointer aligned to its pack, checked on the host). ADD: residual[row]
// += x[row] (in residual's dtype, as add_), written in the same pass, and the sum is normalised. x may be
// residual itself (each element is read before the same thread writes it) but must not overlap it otherwise.
// The sum of squares accumulates f32 squares in f64, as the CPU kernel does, and rounds once to f32.
template <class X, class P, bool ADD, int VEC>
__global__ void __launch_bounds__(kNormMaxThreads)
    rms_norm_rows(X* __restrict__ out, X* residual, const X* x, const P* __restrict__ weight, int64_t rows, int d,
                  double eps) {
  using C = std::conditional_t<std::is_same_v<X, double>, double, float>;
  using M = opmath_t<X>;
  using XP = NormPack<X, VEC>;
  using WP = NormPack<P, VEC>;
  __shared__ double partial[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // only whole warps of the last block in the warp-per-row layout
  const int nvec = d / VEC;
  const int64_t base = row * static_cast<int64_t>(d);
  const X* xr = x + base;
  X* rr = ADD ? residual + base : nullptr;
  X* orow = out + base;

  XP xs[kNormCache], rs[kNormCache];
  WP ws[kNormCache];
  // All loads first (x and residual may be one buffer: no store may sit between them), weights too, so the
  // scaling pass does not wait for memory after the reduction.
#pragma unroll
  for (int k = 0; k < kNormCache; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < nvec) {
      xs[k] = norm_load<X, VEC>(xr + static_cast<int64_t>(v) * VEC);
      if constexpr (ADD) rs[k] = norm_load<X, VEC>(rr + static_cast<int64_t>(v) * VEC);
      ws[k] = norm_load<P, VEC>(weight + static_cast<int64_t>(v) * VEC);
    }
  }
  const fn::AddFn<M> add{static_cast<M>(1)};
  double acc = 0;
#pragma unroll
  for (int k = 0; k < kNormCache; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < nvec) {
      if constexpr (ADD) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) xs[k].v[e] = convert<X>(add(convert<M>(rs[k].v[e]), convert<M>(xs[k].v[e])));
        norm_store<X, VEC>(rr + static_cast<int64_t>(v) * VEC, xs[k]);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const C h = convert<C>(xs[k].v[e]);
        acc += static_cast<double>(h * h);
      }
    }
  }
  // Rows longer than the register cache: the rest is read (and for ADD updated) here, read again below.
  for (int v = threadIdx.x + kNormCache * blockDim.x; v < nvec; v += blockDim.x) {
    XP a = norm_load<X, VEC>(xr + static_cast<int64_t>(v) * VEC);
    if constexpr (ADD) {
      const XP r = norm_load<X, VEC>(rr + static_cast<int64_t>(v) * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) a.v[e] = convert<X>(add(convert<M>(r.v[e]), convert<M>(a.v[e])));
      norm_store<X, VEC>(rr + static_cast<int64_t>(v) * VEC, a);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const C h = convert<C>(a.v[e]);
      acc += static_cast<double>(h * h);
    }
  }

  const double total = norm_row_sum(acc, partial);
  const C inv = norm_math::rms_inv<C>(static_cast<C>(total), d, eps);

#pragma unroll
  for (int k = 0; k < kNormCache; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < nvec) {
      XP o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = norm_math::rms_apply<X, P, C>(xs[k].v[e], inv, ws[k].v[e]);
      norm_store<X, VEC>(orow + static_cast<int64_t>(v) * VEC, o);
    }
  }
  for (int v = threadIdx.x + kNormCache * blockDim.x; v < nvec; v += blockDim.x) {
    // The same thread wrote residual[v] above: reading it back gives the updated value.
    const XP a = norm_load<X, VEC>((ADD ? rr : xr) + static_cast<int64_t>(v) * VEC);
    const WP w = norm_load<P, VEC>(weight + static_cast<int64_t>(v) * VEC);
    XP o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) o.v[e] = norm_math::rms_apply<X, P, C>(a.v[e], inv, w.v[e]);
    norm_store<X, VEC>(orow + static_cast<int64_t>(v) * VEC, o);
  }
}

// ---- silu_and_mul ----------------------------------------------------------------------------------------

// Rows of in [rows, 2 * inner] to out [rows, inner]: blockIdx.y strides over rows, x-threads over the row's
// VEC-element vectors (inner % VEC == 0 and both pointers aligned, checked on the host). No division.
template <class T, int VEC>
__global__ void silu_and_mul_rows(T* __restrict__ out, const T* __restrict__ in, int64_t rows, int64_t inner) {
  using C = opmath_t<T>;
  const int64_t nvec = inner / VEC;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* g = in + r * 2 * inner;
    const T* u = g + inner;
    T* o = out + r * inner;
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec; v += step) {
      const NormPack<T, VEC> gv = norm_load<T, VEC>(g + v * VEC);
      const NormPack<T, VEC> uv = norm_load<T, VEC>(u + v * VEC);
      NormPack<T, VEC> ov;
#pragma unroll
      for (int e = 0; e < VEC; ++e) ov.v[e] = norm_math::silu_mul<T, C>(gv.v[e], uv.v[e]);
      norm_store<T, VEC>(o + v * VEC, ov);
    }
  }
}

// ---- rotary embeddings -----------------------------------------------------------------------------------

// The heads of one of q / k: element (t, h, c) at base[t * st + h * sh + c * sd].
template <class T>
struct RopeHeads {
  T* base;
  int64_t st, sh, sd;
  int heads;
};

// Block (t, y): token t, heads [y * heads_per_block, ...) of the concatenation q heads ++ k heads. The
// block computes cos/sin of its token's angles once into shared memory ([2 * half] floats, dynamic), then
// rotates the pairs (j, j + half) of its heads. Each thread loads its first pair before the cos/sin work so
// the memory latency overlaps it. VEC > 1: VEC consecutive channels per access (sd == 1, half % VEC == 0,
// strides multiples of VEC and bases aligned, checked on the host).
template <class T, int VEC>
struct RopeItem {
  T* lo;  // channel j of the row; channel j + half is at lo + half * sd
  int j;
  int64_t sd;
};

template <class T, int VEC>
__device__ __forceinline__ RopeItem<T, VEC> rope_item(const RopeHeads<T>& q, const RopeHeads<T>& k, int64_t t, int h0,
                                                      int per_head, int w) {
  const int hl = w / per_head;
  const int j = (w - hl * per_head) * VEC;
  const int h = h0 + hl;
  const bool is_q = h < q.heads;
  T* const base = is_q ? q.base : k.base;
  const int64_t st = is_q ? q.st : k.st, sh = is_q ? q.sh : k.sh, sd = is_q ? q.sd : k.sd;
  T* row = base + t * st + static_cast<int64_t>(is_q ? h : h - q.heads) * sh;
  return {row + j * sd, j, sd};
}

template <class T, int VEC>
__device__ __forceinline__ void rope_rotate(const RopeItem<T, VEC>& it, int half, const float* cos_sin,
                                            NormPack<T, VEC> lo, NormPack<T, VEC> hi) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) norm_math::rope_pair<T>(lo.v[e], hi.v[e], cos_sin[it.j + e], cos_sin[half + it.j + e]);
  if constexpr (VEC == 1) {
    it.lo[0] = lo.v[0];
    it.lo[half * it.sd] = hi.v[0];
  } else {
    norm_store<T, VEC>(it.lo, lo);
    norm_store<T, VEC>(it.lo + half, hi);
  }
}

template <class T, int VEC>
__device__ __forceinline__ void rope_load(const RopeItem<T, VEC>& it, int half, NormPack<T, VEC>& lo,
                                          NormPack<T, VEC>& hi) {
  if constexpr (VEC == 1) {
    lo.v[0] = it.lo[0];
    hi.v[0] = it.lo[half * it.sd];
  } else {
    lo = norm_load<T, VEC>(it.lo);
    hi = norm_load<T, VEC>(it.lo + half);
  }
}

template <class T, class I, int VEC>
__global__ void rope_heads(RopeHeads<T> q, RopeHeads<T> k, const I* __restrict__ positions, int64_t pos_stride,
                           const float* __restrict__ inv_freq, int half, float scaling, int heads_per_block) {
  extern __shared__ float cos_sin[];
  const int64_t t = blockIdx.x;
  const int total = q.heads + k.heads;
  const int h0 = blockIdx.y * heads_per_block;
  const int h1 = min(total, h0 + heads_per_block);
  const int per_head = half / VEC;
  const int items = (h1 - h0) * per_head;

  const int w0 = threadIdx.x;
  RopeItem<T, VEC> first{};
  NormPack<T, VEC> lo0, hi0;
  if (w0 < items) {
    first = rope_item<T, VEC>(q, k, t, h0, per_head, w0);
    rope_load<T, VEC>(first, half, lo0, hi0);
  }
  const float pos = convert<float>(positions[t * pos_stride]);  // positions.float()
  for (int j = threadIdx.x; j < half; j += blockDim.x)
    norm_math::rope_cos_sin(pos, inv_freq[j], scaling, cos_sin[j], cos_sin[half + j]);
  __syncthreads();
  if (w0 < items) rope_rotate<T, VEC>(first, half, cos_sin, lo0, hi0);
  for (int w = w0 + blockDim.x; w < items; w += blockDim.x) {
    const RopeItem<T, VEC> it = rope_item<T, VEC>(q, k, t, h0, per_head, w);
    NormPack<T, VEC> lo, hi;
    rope_load<T, VEC>(it, half, lo, hi);
    rope_rotate<T, VEC>(it, half, cos_sin, lo, hi);
  }
}

}  // namespace kiln::cuda
