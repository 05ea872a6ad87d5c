// Device code of rms_norm / add_rms_norm, silu_and_mul and rotary embeddings. The per-element formulas are
// those of the CPU kernels (src/ops/norm_math.h), so the results match the CPU bit for bit wherever the
// device's libm agrees with the host's (see src/cuda/norm.cu: compiled without fma contraction).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/pdl.cuh"
#include "cuda/device_error.h"
#include "ops/binary_functors.h"
#include "ops/norm_math.h"

namespace kiln::cuda {

using kernels::pdl_allow_dependents;
using kernels::pdl_wait;

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
    rms_norm_rows(X* __restrict__ out, X* residual, const X* x, const P* weight, int64_t rows, int d, double eps) {
  using C = std::conditional_t<std::is_same_v<X, double>, double, float>;
  using M = opmath_t<X>;
  using XP = NormPack<X, VEC>;
  using WP = NormPack<P, VEC>;
  __shared__ double partial[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  pdl_allow_dependents();  // the next kernel (a matrix-vector product) may start its weight loads
  pdl_wait();              // launched as a dependent: nothing is read or written before this
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
__global__ void silu_and_mul_rows(T* __restrict__ out, const T* in, int64_t rows, int64_t inner) {
  using C = opmath_t<T>;
  pdl_allow_dependents();
  pdl_wait();  // launched as a dependent (kernels/pdl.cuh)
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

// ---- fused q/k norm + rotary + KV-cache append (qk_norm_rope_append_) ------------------------------------

// One warp per head row: lane l holds the rotary pairs j = l + 32 i (channels j and j + half, so each pair
// rotates within one lane) and the channels past rotary_dim r + l + 32 i. Loads are strided by lane, so a
// warp's accesses to a row with unit channel stride are contiguous. D, Dv <= 32 * kQkMaxSlots.
inline constexpr int kQkMaxSlots = 8;                  // head dims up to 256
inline constexpr int kQkMaxPairs = kQkMaxSlots / 2;    // rotary pairs up to 128
inline constexpr int kQkWarpsPerBlock = 4;

// Sizes and strides (in elements) of one call. Rows 0 .. T * (Hq + Hk) - 1 are (token, head) of q heads ++ k
// heads; the next T * Hk rows are the v heads, copied.
struct QkRopeDims {
  int64_t t_len = 0;
  int hq = 0, hk = 0, d = 0, dv = 0, half = 0;
  int64_t q_st = 0, q_sh = 0, q_sd = 0, k_st = 0, k_sh = 0, k_sd = 0, v_st = 0, v_sh = 0, v_sd = 0;
  int64_t kc_sh = 0, kc_sp = 0, kc_sd = 0, vc_sh = 0, vc_sp = 0, vc_sd = 0;  // cache (head, position, channel)
  int64_t lmax = 0;
  int64_t pos_stride = 0;
  bool pos_i64 = false;
  float scaling = 1.f;
  double eps = 0;
};

// The same steps, formulas and rounding points as rms_norm_rows (norm), rope_heads (rotation) and
// kv_append_kernel (cache writes), so the result equals that composition: the one difference is the order in
// which the f64 sum of squares adds its f32 terms (an exact sum for all but extreme rows; see norm.cu). q is
// updated in place: a warp reads its whole row before it writes it, and q overlaps neither k nor v (checked
// on the host). k and v are only read. `at` is read on the device; outside [0, lmax - T] nothing is written
// to either cache and the error is recorded once (by lane 0 of token 0's first k head), as kv_append_kernel
// does; q is still normalised and rotated. Every load a warp needs (at, its row, the weights, the position
// and inv_freq) is issued before any of them is used, so the kernel costs about one memory round trip.
// Launched as a dependent of the qkv projection before it.
template <class T, class P>
__global__ void __launch_bounds__(32 * kQkWarpsPerBlock)
    qk_norm_rope_append_kernel(T* q, const T* k, const T* v, const P* q_norm, const P* k_norm, const void* positions,
                               const float* inv_freq, T* k_cache, T* v_cache, const int32_t* at, QkRopeDims a,
                               DeviceErrorRecord* err) {
  using C = float;  // rms_norm's compute type for f16 / bf16 / f32
  kernels::pdl_allow_dependents();  // the attention that reads q and the caches waits for this grid anyway
  kernels::pdl_wait();              // launched as a dependent (kernels/pdl.cuh): nothing is touched before this
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kQkWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t qk_heads = a.hq + a.hk;
  const int64_t n_qk = a.t_len * qk_heads;
  if (row >= n_qk + a.t_len * a.hk) return;  // whole warps only: the row is warp-uniform
  const int64_t p0 = at[0];

  if (row >= n_qk) {  // a v head: raw copy into the value cache
    const int64_t r = row - n_qk, t = r / a.hk, h = r - t * a.hk;
    const T* src = v + t * a.v_st + h * a.v_sh;
    T vals[kQkMaxSlots];
#pragma unroll
    for (int i = 0; i < kQkMaxSlots; ++i) {
      const int c = lane + 32 * i;
      if (c < a.dv) vals[i] = src[c * a.v_sd];
    }
    if (p0 < 0 || p0 > a.lmax - a.t_len) return;
    T* dst = v_cache + h * a.vc_sh + (p0 + t) * a.vc_sp;
#pragma unroll
    for (int i = 0; i < kQkMaxSlots; ++i) {
      const int c = lane + 32 * i;
      if (c < a.dv) dst[c * a.vc_sd] = vals[i];
    }
    return;
  }
  const int64_t t = row / qk_heads;
  const int h = static_cast<int>(row - t * qk_heads);
  const bool is_q = h < a.hq;
  const T* src = is_q ? q + t * a.q_st + h * a.q_sh : k + t * a.k_st + (h - a.hq) * a.k_sh;
  const int64_t sd = is_q ? a.q_sd : a.k_sd;
  const P* w = is_q ? q_norm : k_norm;
  const int half = a.half, rot = 2 * a.half;

  T lo[kQkMaxPairs], hi[kQkMaxPairs], rest[kQkMaxSlots];
  P wlo[kQkMaxPairs], whi[kQkMaxPairs], wrest[kQkMaxSlots];
  float freq[kQkMaxPairs];
#pragma unroll
  for (int i = 0; i < kQkMaxPairs; ++i) {
    const int j = lane + 32 * i;
    if (j < half) {
      lo[i] = src[j * sd];
      hi[i] = src[(j + half) * sd];
      freq[i] = inv_freq[j];
      if (w != nullptr) {
        wlo[i] = w[j];
        whi[i] = w[j + half];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kQkMaxSlots; ++i) {
    const int c = rot + lane + 32 * i;
    if (c < a.d) {
      rest[i] = src[c * sd];
      if (w != nullptr) wrest[i] = w[c];
    }
  }
  const float pos = a.pos_i64 ? convert<float>(static_cast<const int64_t*>(positions)[t * a.pos_stride])
                              : convert<float>(static_cast<const int32_t*>(positions)[t * a.pos_stride]);

  if (!is_q && (p0 < 0 || p0 > a.lmax - a.t_len)) {  // k is written nowhere but the cache: nothing to do
    if (t == 0 && h == a.hq && lane == 0)
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::QkNormRopeAppend, p0, a.lmax - a.t_len + 1);
    return;
  }

  if (w != nullptr) {  // per-head RMSNorm (warp-uniform branch)
    double acc = 0;
#pragma unroll
    for (int i = 0; i < kQkMaxPairs; ++i) {
      if (lane + 32 * i < half) {
        const C x0 = convert<C>(lo[i]), x1 = convert<C>(hi[i]);
        acc += static_cast<double>(x0 * x0);
        acc += static_cast<double>(x1 * x1);
      }
    }
#pragma unroll
    for (int i = 0; i < kQkMaxSlots; ++i) {
      if (rot + lane + 32 * i < a.d) {
        const C x = convert<C>(rest[i]);
        acc += static_cast<double>(x * x);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const C inv = norm_math::rms_inv<C>(static_cast<C>(acc), a.d, a.eps);
#pragma unroll
    for (int i = 0; i < kQkMaxPairs; ++i) {
      if (lane + 32 * i < half) {
        lo[i] = norm_math::rms_apply<T, P, C>(lo[i], inv, wlo[i]);
        hi[i] = norm_math::rms_apply<T, P, C>(hi[i], inv, whi[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kQkMaxSlots; ++i)
      if (rot + lane + 32 * i < a.d) rest[i] = norm_math::rms_apply<T, P, C>(rest[i], inv, wrest[i]);
  }

#pragma unroll
  for (int i = 0; i < kQkMaxPairs; ++i) {
    if (lane + 32 * i < half) {
      float c, s;
      norm_math::rope_cos_sin(pos, freq[i], a.scaling, c, s);
      norm_math::rope_pair<T>(lo[i], hi[i], c, s);
    }
  }

  T* dst;
  int64_t dsd;
  if (is_q) {
    dst = q + t * a.q_st + h * a.q_sh;
    dsd = a.q_sd;
  } else {
    dst = k_cache + (h - a.hq) * a.kc_sh + (p0 + t) * a.kc_sp;
    dsd = a.kc_sd;
  }
#pragma unroll
  for (int i = 0; i < kQkMaxPairs; ++i) {
    const int j = lane + 32 * i;
    if (j < half) {
      dst[j * dsd] = lo[i];
      dst[(j + half) * dsd] = hi[i];
    }
  }
#pragma unroll
  for (int i = 0; i < kQkMaxSlots; ++i) {
    const int c = rot + lane + 32 * i;
    if (c < a.d) dst[c * dsd] = rest[i];
  }
}

}  // namespace kiln::cuda
