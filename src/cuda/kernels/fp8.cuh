// Device code of the FP8 family: quantisation (scales per group), dequantisation and the FP8 matrix-vector
// kernel that serves linear(x, Fp8Weight) and scaled_mm for 1..16 activation rows. Raw pointers, sizes and
// strides in; the launchers are in src/cuda/fp8.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/cp_async.cuh"
#include "cuda/kernels/gemv.cuh"
#include "kiln/scalar_types.h"

namespace kiln::cuda::kernels {

// ---- quantisation ----------------------------------------------------------------------------------------
//
// The CPU definition (src/ops/fp8.cpp), step for step, so that values and scales match bit for bit:
//   amax = max |x| over the group (f32, exact whatever the order), finite = no NaN/inf in the group;
//   scale = !finite ? NaN : amax == 0 ? 1 : amax / fp8_max          (IEEE division, round to nearest)
//   q = x / scale (IEEE division), clamped to [-fp8_max, fp8_max] unless NaN, converted with kiln's
//   f32 -> fp8 rule (PyTorch's).

template <class T>
__device__ __forceinline__ float fp8_load_f32(const T* p) {
  return static_cast<float>(*p);  // kiln's storage types convert exactly to f32
}

// NaN operands as x86's divss / mulss (the CPU reference) treat them: a NaN first operand is returned, else a
// NaN second one; CUDA would return its canonical NaN instead, whose sign can differ (-NaN inputs) and so the
// fp8 bits (0xFF vs 0x7F).
__device__ __forceinline__ float fp8_x86_nan(float a, float b) {
  return a != a ? __uint_as_float(__float_as_uint(a) | 0x400000u) : __uint_as_float(__float_as_uint(b) | 0x400000u);
}

template <class F8>
__device__ __forceinline__ F8 fp8_quantize_one(float v, float scale, float fmax) {
  float q = (v != v || scale != scale) ? fp8_x86_nan(v, scale) : __fdiv_rn(v, scale);
  if (!(q != q)) q = q < -fmax ? -fmax : (fmax < q ? fmax : q);
  return F8(q);
}

__device__ __forceinline__ float fp8_scale_of(float amax, bool finite, float fmax) {
  return !finite ? __int_as_float(0x7FC00000) : amax == 0.f ? 1.f : __fdiv_rn(amax, fmax);
}

__device__ __forceinline__ void fp8_warp_amax(float& amax, bool& finite) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
    finite = __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(finite), d) != 0 && finite;
  }
}

inline constexpr int kQuantThreads = 256;

// One warp per group (bm x bk rectangle of x; the last ones clipped to M, K): amax, scale, then the group's
// values, re-read from L1/L2. groups = sm * sk; group g covers rows (g / sk) * bm.., columns (g % sk) * bk...
// x: [M, K] with strides (sx0, sx1); q: [M, K] contiguous; scales: [sm, sk] contiguous.
template <class X, class F8>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_quantize_groups_kernel(const X* __restrict__ x, int64_t sx0, int64_t sx1, int64_t M, int64_t K, int64_t bm,
                               int64_t bk, int64_t sk, int64_t groups, float fmax, F8* __restrict__ q,
                               float* __restrict__ scales) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (kQuantThreads / 32) + (threadIdx.x >> 5);
  if (g >= groups) return;  // whole warps exit together
  const int64_t gi = g / sk, gj = g % sk;
  const int64_t m0 = gi * bm, k0 = gj * bk;
  const int64_t m1 = m0 + bm < M ? m0 + bm : M, k1 = k0 + bk < K ? k0 + bk : K;
  float amax = 0.f;
  bool finite = true;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = k0 + lane; k < k1; k += 32) {
      const float v = fp8_load_f32(x + m * sx0 + k * sx1);
      finite = finite && ::isfinite(v);
      amax = fmaxf(amax, fabsf(v));
    }
  fp8_warp_amax(amax, finite);
  const float s = fp8_scale_of(amax, finite, fmax);
  if (lane == 0) scales[g] = s;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = k0 + lane; k < k1; k += 32) q[m * K + k] = fp8_quantize_one<F8>(fp8_load_f32(x + m * sx0 + k * sx1), s, fmax);
}

// Tensor-wise, pass 1: each block's amax over a grid-stride share of x, as +inf when its share holds a NaN or
// inf (a finite amax is always < inf, so the final max tells both facts apart). partial: gridDim.x floats.
template <class X>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_amax_partial_kernel(const X* __restrict__ x, int64_t sx0, int64_t sx1, int64_t M, int64_t K,
                            float* __restrict__ partial) {
  __shared__ float red[kQuantThreads / 32];
  const int64_t n = M * K;
  float amax = 0.f;
  bool finite = true;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kQuantThreads) {
    const int64_t m = i / K, k = i % K;
    const float v = fp8_load_f32(x + m * sx0 + k * sx1);
    finite = finite && ::isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  fp8_warp_amax(amax, finite);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = finite ? amax : __int_as_float(0x7F800000);
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = red[0];
    for (int w = 1; w < kQuantThreads / 32; ++w) a = fmaxf(a, red[w]);
    partial[blockIdx.x] = a;
  }
}

// Tensor-wise, pass 2: every block reduces the `parts` partials (a few hundred floats, from L2) to the one
// scale, block 0 stores it, and all quantise their grid-stride share. parts == 0 (empty x) gives scale 1.
template <class X, class F8>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_quantize_tensor_kernel(const X* __restrict__ x, int64_t sx0, int64_t sx1, int64_t M, int64_t K,
                               const float* __restrict__ partial, int parts, float fmax, F8* __restrict__ q,
                               float* __restrict__ scale) {
  __shared__ float red[kQuantThreads / 32];
  __shared__ float s_shared;
  float a = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < parts; i += kQuantThreads) a = fmaxf(a, partial[i]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, d));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = red[0];
    for (int w = 1; w < kQuantThreads / 32; ++w) t = fmaxf(t, red[w]);
    const float s = fp8_scale_of(t, !::isinf(t), fmax);
    s_shared = s;
    if (blockIdx.x == 0) *scale = s;
  }
  __syncthreads();
  const float s = s_shared;
  const int64_t n = M * K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kQuantThreads) {
    const int64_t m = i / K, k = i % K;
    q[i] = fp8_quantize_one<F8>(fp8_load_f32(x + m * sx0 + k * sx1), s, fmax);
  }
}

// ---- dequantisation --------------------------------------------------------------------------------------

// out[m, k] = v[m, k] * scales[(m / bm) * ss0 + (k / bk) * ss1], f32 (the CPU's dequantize_fp8 and the
// operands of scaled_mm's reference formula). v: [M, K] with strides (sv0, sv1); out: [M, K] contiguous.
template <class F8, class O>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_dequantize_kernel(const F8* __restrict__ v, int64_t sv0, int64_t sv1, int64_t M, int64_t K,
                          const float* __restrict__ scales, int64_t bm, int64_t bk, int64_t ss0, int64_t ss1,
                          O* __restrict__ out) {
  const int64_t n = M * K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kQuantThreads) {
    const int64_t m = i / K, k = i % K;
    const float a = static_cast<float>(v[m * sv0 + k * sv1]), s = scales[(m / bm) * ss0 + (k / bk) * ss1];
    const float r = (a != a || s != s) ? fp8_x86_nan(a, s) : __fmul_rn(a, s);
    out[i] = O(r);
  }
}

// ---- matrix-vector ---------------------------------------------------------------------------------------
//
//   y[m, j] = sum_kb  (sum_{k in block kb} x[m, k] * w[j, k]) * ws(j, kb) * xs(m, kb)  + bias[j]
//
// w: n x k float8 (e4m3) weight rows; x: rows x k activations (f32/f16/bf16 for linear, e4m3 for scaled_mm).
// Scales: the weight's ws(j, kb) = ws[(j / bn) * ws_sn + kb * ws_sk] and the activations' (nullable)
// xs(m, kb) = xs[m * xs_sm + kb * xs_sk], with kb = k / kblk (k >> kshift where kshift >= 0: 30 when one block
// spans all of k < 2^30, log2(kblk) for a power of two); tensor- and row-wise scales pass stride 0
// along K (and kblk = k), so one code path serves every recipe.
//
// The work split is the bf16 GEMV's (gemv.cuh): warp groups of `split` warps own R weight rows and stride
// over K together; partials summed by shuffles, then across the group's warps in shared memory in warp order.
//
// Loads (vec): one 16-byte load is 16 fp8 weights; they become f32 through the hardware conversion
// (cvt.rn.f16x2.e4m3x2, exact: every e4m3 value is an f16) and meet 16 activations. The partial dot of
// those 16 products is scaled once (the chunk lies in one K block: kblk % 16 == 0 on this path) and added
// to the f32 accumulator. Requires k % 16 == 0, 16-byte aligned rows of w and x (and strides).
// Otherwise (scalar path) one element at a time: acc += (x * xs) * (w * ws), the CPU's formula.
//
// Bounds: rows beyond n and activation rows beyond `rows` are clamped to the last valid one for loading
// and not stored; chunk indices stay below k / 16.

// Weight rows per warp group and 16-byte loads in flight per row, under the 128-register cap of two blocks per
// SM (ptxas -v: only the 16-row instantiations with 16-bit or f32 activations and the 8-row f32 one spill,
// 16-40 bytes; the one-row shapes do not). M = 1 (decode) shares each activation chunk
// between 4 weight rows and keeps 8 weight loads in flight per thread.
// TUNE (H200, `kiln bench ops`): R and U per row count.
// CFG (M = 1 with 16-bit activations only, linear's decode case; 0 elsewhere) selects one of eight shapes;
// 1..3 take fewer registers, so that more blocks fit per multiprocessor: 1: R = 2, U = 4, three blocks;
// 2: R = 4, U = 1, three blocks; 3: R = 2, U = 2, four blocks. 4..6 software-pipeline the steps (the next
// step's U * R loads are issued before the current step's products, so a warp keeps loads in flight while it
// converts and multiplies): 4: R = 2, U = 1, four blocks; 5: R = 2, U = 2, three blocks; 6: R = 4, U = 1,
// two blocks (it spills at three). 7 is the tensor-core kernel below (fp8_gemv_mma_kernel; where the operands
// do not fit it, auto's shape). 8 is config 3's shape through the general loop (each weight row unpacked just
// before its 16 products) instead of fp8_gemv_row16: the same products in the same order, faster at the
// largest layers. The launcher picks one per layer shape (auto_config in cuda/fp8.cu;
// cuda::set_fp8_gemv_config / KILN_FP8_GEMV_CONFIG force one).
inline constexpr int kFp8GemvConfigs = 9;
inline constexpr int kFp8GemvGeneralLoop = 8;
template <int MT, int CFG = 0>
constexpr int fp8_gemv_rows_per_warp() {
  return CFG == 1 || CFG == 3 || CFG == 4 || CFG == 5 || CFG == 8 ? 2 : MT == 1 ? 4 : 2;
}
template <int MT, class X, int CFG = 0>
constexpr int fp8_gemv_unroll() {
  return CFG == 1 ? 4 : CFG == 2 || CFG == 4 || CFG == 6 ? 1 : CFG == 3 || CFG == 5 || CFG == 8 ? 2
         : MT >= 8 || (MT >= 4 && sizeof(X) == 4) ? 1 : 2;
}
template <int CFG>
constexpr int fp8_gemv_min_blocks() {
  return CFG == 0 || CFG == 6 ? 2 : CFG == 3 || CFG == 4 || CFG == 8 ? 4 : 3;
}
template <int CFG>
constexpr bool fp8_gemv_pipelined() {
  return CFG >= 4 && CFG <= 6;
}

// Sixteen e4m3 values (one 16-byte load) to f32, in memory order.
__device__ __forceinline__ void fp8_unpack16(const uint4& v, float (&f)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] & 0xFFFFu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i] >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo));
    const float2 b = __half22float2(__half2(hi));
    f[4 * i + 0] = a.x;
    f[4 * i + 1] = a.y;
    f[4 * i + 2] = b.x;
    f[4 * i + 3] = b.y;
  }
}

// Sixteen activations starting at p (16-byte aligned) to f32.
template <class X>
__device__ __forceinline__ void fp8_load_x16(const X* p, float (&f)[16]) {
  if constexpr (std::is_same_v<X, Float8_e4m3fn>) {
    fp8_unpack16(ld_after_wait(reinterpret_cast<const uint4*>(p)), f);
  } else {
    constexpr int V = gemv_vec_elems<X>();  // 4 (f32) or 8 (f16/bf16) per 16 bytes
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < 16 / V; ++i) {
      float t[V];
      gemv_unpack<X>(ld_after_wait(q + i), t);
#pragma unroll
      for (int e = 0; e < V; ++e) f[i * V + e] = t[e];
    }
  }
}

// Two register buffers in turn, no copies between them: batch(cur, next) issues the next batch's loads into
// `next` (if there is one), uses `cur`, and returns whether there was a next batch. The pipelined CUDA-core
// shapes and the tensor-core kernel share it.
template <class Buf, class Batch>
__device__ __forceinline__ void fp8_two_buffers(Buf& a, Buf& b, Batch&& batch) {
  while (batch(a, b) && batch(b, a)) {
  }
}

// linear's one-row product with 16-bit activations, the vectorised path of fp8_gemv_kernel (its CFG's R, U and
// pipelining; see there). Per 16-weight chunk c of each of the R weight rows: p = sum_e w[e] * x[e] in memory
// order (f32 FMAs), acc += p * the chunk's weight scale: the general path's products in the same order, so the
// same bits. The work per chunk is kept to the conversions, the FMAs, the loads and one address each: weight
// and activation addresses from row pointers and the chunk index, the scale block by a shift (SHIFT) or a
// division, no per-chunk activation-scale code and no test of the dependent-launch wait inside the loop
// (the first step is issued before the wait, then the loop runs without it).
template <class X, int R, int U, bool PIPE, bool SHIFT>
__device__ __forceinline__ void fp8_gemv_row16(float (&acc)[R][1], const X* __restrict__ x,
                                               const Float8_e4m3fn* __restrict__ w, const int64_t (&woff)[R],
                                               const float* (&wsr)[R], int64_t ws_sk, int kshift, int kblk,
                                               int chunks, int t, int gt) {
  static_assert(sizeof(X) == 2, "16-bit activations");
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = reinterpret_cast<const uint4*>(w + woff[r]);
  const uint4* const xq = reinterpret_cast<const uint4*>(x);  // chunk c: xq[2c], xq[2c + 1]
  const bool one_scale = wsr[R - 1] == wsr[0];
  const int wsk = static_cast<int>(ws_sk);

  auto chunk = [&](const uint4 (&wv)[R], int c) {
    const int kb = (SHIFT ? (c << 4) >> kshift : (c << 4) / kblk) * wsk;
    float s[R];
    s[0] = __ldg(wsr[0] + kb);
#pragma unroll
    for (int r = 1; r < R; ++r) s[r] = one_scale ? s[0] : __ldg(wsr[r] + kb);
    const uint4 xa = ld_after_wait(xq + 2 * c), xb = ld_after_wait(xq + 2 * c + 1);
    const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) p[r] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // weight word i: weights 4i .. 4i + 3, activations in xw[2i], xw[2i + 1]
      float xf[4];
      gemv_unpack2<X>(xw[2 * i], xf[0], xf[1]);
      gemv_unpack2<X>(xw[2 * i + 1], xf[2], xf[3]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t word = i == 0 ? wv[r].x : i == 1 ? wv[r].y : i == 2 ? wv[r].z : wv[r].w;
        const float2 lo = __half22float2(__half2(
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xFFFFu), __NV_E4M3)));
        const float2 hi = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3)));
        p[r] = fmaf(lo.x, xf[0], p[r]);
        p[r] = fmaf(lo.y, xf[1], p[r]);
        p[r] = fmaf(hi.x, xf[2], p[r]);
        p[r] = fmaf(hi.y, xf[3], p[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = fmaf(p[r], s[r], acc[r][0]);
  };
  // The U x R weight loads of the step at chunk c; `early` ones stay in program order before pdl_wait.
  auto load = [&](uint4 (&wv)[U][R], int c, auto early) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = decltype(early)::value ? gemv_load_stream_early(wrow[r] + c + u * gt)
                                          : gemv_load_stream(wrow[r] + c + u * gt);
  };

  const int step = U * gt;
  int c = t;
  bool waited = false;
  if (c + (U - 1) * gt < chunks) {
    if constexpr (PIPE) {
      // Two register buffers in turn: the loads of step i + 1 are in flight while step i is computed.
      uint4 a[U][R], b[U][R];
      load(a, c, std::true_type{});
      pdl_wait();
      fp8_two_buffers(a, b, [&](const uint4 (&cur)[U][R], uint4 (&next)[U][R]) {
        const bool more = c + step + (U - 1) * gt < chunks;
        if (more) load(next, c + step, std::false_type{});
#pragma unroll
        for (int u = 0; u < U; ++u) chunk(cur[u], c + u * gt);
        c += step;
        return more;
      });
    } else {
      uint4 wv[U][R];
      load(wv, c, std::true_type{});
      pdl_wait();
      for (;;) {
#pragma unroll
        for (int u = 0; u < U; ++u) chunk(wv[u], c + u * gt);
        c += step;
        if (c + (U - 1) * gt >= chunks) break;
        load(wv, c, std::false_type{});
      }
    }
    waited = true;
  }
  // The rest (fewer than U chunks for this thread), one chunk at a time.
  for (; c < chunks; c += gt) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = gemv_load_stream_early(wrow[r] + c);
    if (!waited) pdl_wait();
    waited = true;
    chunk(wv, c);
  }
  if (!waited) pdl_wait();  // a thread with no chunk
}

template <class T>
__device__ __forceinline__ float fp8_elem_f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return static_cast<float>(v);
}

template <class X, class O, class B, int MT, int CFG = 0>
__global__ void __launch_bounds__(kGemvThreads, fp8_gemv_min_blocks<CFG>())
    fp8_gemv_kernel(const X* x, int64_t ldx, int rows, const Float8_e4m3fn* __restrict__ w, int64_t ldw, int64_t n,
                    int k, const float* __restrict__ ws, int64_t bn, int64_t ws_sn, int64_t ws_sk, const float* xs,
                    int64_t xs_sm, int64_t xs_sk, int kblk, int kshift,
                    const B* __restrict__ bias, O* __restrict__ y, int64_t ldy, int split, bool vec) {
  constexpr int R = fp8_gemv_rows_per_warp<MT, CFG>();
  constexpr int U = fp8_gemv_unroll<MT, X, CFG>();
  __shared__ float partial[kGemvWarps * R * MT];

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int groups = kGemvWarps / split;
  const int group = warp / split;
  const int t = (warp % split) * 32 + lane;
  const int group_threads = 32 * split;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * groups + group) * R;

  pdl_allow_dependents();
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

  int64_t woff[R];
  const float* wsr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;
    woff[r] = row * ldw;
    wsr[r] = ws + (row / bn) * ws_sn;
  }
  auto xrow = [&](int m) -> int64_t { return static_cast<int64_t>(m < rows ? m : rows - 1); };
  // The scale block of element index e < k: a shift when kblk is a power of two (kshift = 30 when one block
  // spans all of k < 2^30), a division otherwise.
  auto kblock = [&](int e) -> int { return kshift >= 0 ? e >> kshift : e / kblk; };

  // One row of 16-bit activations (linear's decode case): fp8_gemv_row16, the general path's products in the
  // same order with less work per chunk.
  constexpr bool kRow16 = MT == 1 && sizeof(X) == 2 && CFG != kFp8GemvGeneralLoop;
  static_assert(CFG == 0 || (MT == 1 && sizeof(X) == 2), "the kernel shapes are for one row of 16-bit activations");
  if (vec) {
    if constexpr (kRow16) {
      constexpr bool kPipe = fp8_gemv_pipelined<CFG>();
      const int chunks = k >> 4;
      if (kshift >= 0)
        fp8_gemv_row16<X, R, U, kPipe, true>(acc, x, w, woff, wsr, ws_sk, kshift, kblk, chunks, t, group_threads);
      else
        fp8_gemv_row16<X, R, U, kPipe, false>(acc, x, w, woff, wsr, ws_sk, kshift, kblk, chunks, t, group_threads);
    } else {
      // Per 16-element chunk: one scale load for all R rows when they share a scale row (block-wise scales with
      // bn a multiple of R, tensor-wise), 32-bit offsets along K (the launcher checks that they fit), and for
      // 16-bit or f32 activations no activation-scale code at all (linear passes none).
      constexpr bool kXs = std::is_same_v<X, Float8_e4m3fn>;
      const bool one_scale = wsr[R - 1] == wsr[0];
      const int wsk = static_cast<int>(ws_sk), xsk = static_cast<int>(xs_sk);
      // Row starts of the activations and their scales (hoisted for one row; computed per chunk for more rows,
      // where MT pointers would cost 2 * MT registers).
      auto xrow_ptr = [&](int m) { return x + xrow(m) * ldx; };
      auto xs_ptr = [&](int m) { return kXs && xs != nullptr ? xs + xrow(m) * xs_sm : nullptr; };
      const X* const x0 = xrow_ptr(0);
      const float* const xs0 = xs_ptr(0);
      // One 16-element chunk c of the R rows (weights already loaded into wv).
      auto chunk = [&](const uint4 (&wv)[R], int c) {
        const int kb = kblock(c << 4);
        float wsc[R];
        wsc[0] = wsr[0][kb * wsk];
#pragma unroll
        for (int r = 1; r < R; ++r) wsc[r] = one_scale ? wsc[0] : wsr[r][kb * wsk];
        if constexpr (MT == 1) {
          // One activation row: its chunk first, then each weight row unpacked just before its 16 products.
          float xf[16];
          fp8_load_x16<X>(x0 + (c << 4), xf);
          const float xsc = kXs && xs0 != nullptr ? xs0[kb * xsk] : 1.f;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float wf[16];
            fp8_unpack16(wv[r], wf);
            float p = 0.f;
#pragma unroll
            for (int e = 0; e < 16; ++e) p = fmaf(wf[e], xf[e], p);
            acc[r][0] = fmaf(p, kXs ? wsc[r] * xsc : wsc[r], acc[r][0]);
          }
        } else {
          // Every weight row unpacked once, each activation chunk read once for the R rows.
          float wf[R][16];
#pragma unroll
          for (int r = 0; r < R; ++r) fp8_unpack16(wv[r], wf[r]);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            float xf[16];
            fp8_load_x16<X>(xrow_ptr(m) + (c << 4), xf);
            const float* const xsm = xs_ptr(m);
            const float xsc = kXs && xsm != nullptr ? xsm[kb * xsk] : 1.f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float p = 0.f;
#pragma unroll
              for (int e = 0; e < 16; ++e) p = fmaf(wf[r][e], xf[e], p);
              acc[r][m] = fmaf(p, kXs ? wsc[r] * xsc : wsc[r], acc[r][m]);
            }
          }
        }
      };
      const int chunks = k >> 4;
      const int step = U * group_threads;
      int c = t;
      // Full steps: U chunks per thread, all U * R weight loads issued before any is used. The first step's
      // loads go out before the dependent-launch wait (kernels/pdl.cuh): x and its scales come after it.
      bool waited = false;
      for (; c + (U - 1) * group_threads < chunks; c += step) {
        uint4 wv[U][R];
        gemv_load_step<U, R>(wv, w, woff, c, group_threads, waited);
#pragma unroll
        for (int u = 0; u < U; ++u) chunk(wv[u], c + u * group_threads);
      }
      for (; c < chunks; c += group_threads) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w + woff[r]) + c);
        if (!waited) pdl_wait();
        waited = true;
        chunk(wv, c);
      }
      if (!waited) pdl_wait();  // a thread with no chunk
    }
  } else {
    pdl_wait();
#pragma unroll 1
    for (int i = t; i < k; i += group_threads) {
      const int kb = kblock(i);
      float wf[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wf[r] = fp8_elem_f32(w[woff[r] + i]) * wsr[r][kb * ws_sk];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int64_t xm = xrow(m);
        float xv = fp8_elem_f32(x[xm * ldx + i]);
        if (xs != nullptr) xv *= xs[xm * xs_sm + kb * xs_sk];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][m] = fmaf(xv, wf[r], acc[r][m]);
      }
    }
  }

  gemv_publish_warp_sums<R, MT>(acc, partial, warp, lane);
  __syncthreads();

  const int block_rows = groups * R;
  for (int i = static_cast<int>(threadIdx.x); i < block_rows * MT; i += kGemvThreads) {
    const int m = i / block_rows, local = i % block_rows;
    const int g = local / R, r = local % R;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * block_rows + local;
    if (m >= rows || row >= n) continue;
    float s = partial[((g * split) * R + r) * MT + m];
    for (int q = 1; q < split; ++q) s += partial[((g * split + q) * R + r) * MT + m];
    if (bias != nullptr) s += fp8_elem_f32(bias[row]);
    y[static_cast<int64_t>(m) * ldy + row] = O(s);
  }
}

// ---- one row on the tensor cores (linear's decode case) --------------------------------------------------
//
// y[j] = sum_kb (sum_{k in kb} x[k] * w[j, k]) * ws(j, kb) + bias[j] for one row of 16-bit activations, with
// the products on mma.sync m16n8k16 (f16 in, f32 accumulate): the e4m3 weights become f16 exactly
// (cvt.rn.f16x2.e4m3x2) straight into the A fragments, 16 weight rows per warp tile (the MMA's M); the
// activation is every column of B, so each column of C holds the same 16 dot products. Against the
// CUDA-core kernel this issues about a quarter of the instructions per weight byte: one conversion per two
// weights and one MMA per 256, instead of a conversion and an FMA per weight.
//
// The activations reach the MMA as f16. Each block copies the row into shared memory (cp.async, every piece
// in flight at once, after the dependent-launch wait) and, for bf16, converts it in place by pieces of
// 2^pshift activations (64, 128 or 256, each inside one weight-scale block): the piece is scaled by
// 2^(15 - e), where 2^e bounds its largest finite |x| (a power of two, so exact), and rounded to f16; the
// piece's sums are multiplied back by 2^(e - 15) with the weight scale. Every activation within 2^-28 of its
// piece's largest keeps all its bits (bf16 has 8, f16 11); smaller ones lose bits as f16 subnormals, an error
// below 2^-25 of that largest magnitude per term. Inf and NaN pass through unchanged (the scale is taken
// from the finite values only). f16 activations need no scaling and are used as copied. The lanes of a piece
// find its maximum by shuffles, so the block meets one barrier before its first product.
//
// Work: a warp owns 16 weight rows and a contiguous range of K in steps of 64 (4 MMAs; each thread loads 16
// bytes of rows g and g + 8, g = lane / 4, at 16 * (lane % 4) and reads the 16 activations there from shared
// memory; A and B agree on that k order, and the MMA's sum does not care which it is). `split` warps share a
// tile and are summed in shared memory in warp order. Steps are loaded in batches of kFp8MmaU, the next batch
// in flight while the current one is converted and multiplied; the first batch goes out before the
// dependent-launch wait. (Measured and dropped on the H200, 2026-12-04: the weights through a per-thread
// cp.async ring of 6 slots in shared memory instead of registers; at K4096 x N14336 it ran at 1.71 TB/s against
// 2.89, with 8 warps splitting each tile's K and every block converting the whole row, the blocks were
// mostly start-up.) Requires k % 64 == 0, the scale block a multiple of 64 (or all of k), 16-byte
// aligned rows of x and w.
inline constexpr int kFp8MmaThreads = 256;
inline constexpr int kFp8MmaWarps = kFp8MmaThreads / 32;
inline constexpr int kFp8MmaRows = 16;   // weight rows per warp tile
inline constexpr int kFp8MmaStepK = 64;  // K per warp step
inline constexpr int kFp8MmaU = 2;       // steps per batch

__device__ __forceinline__ uint32_t fp8_e4m3x2_to_f16x2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// c += A (rows g, g + 8: the low / high two bytes of word lo_g / lo_g8 of the two weight rows) x B (b0, b1).
__device__ __forceinline__ void fp8_mma_step(float (&c)[4], uint32_t wg, uint32_t wg8, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(fp8_e4m3x2_to_f16x2(wg)), "r"(fp8_e4m3x2_to_f16x2(wg8)), "r"(fp8_e4m3x2_to_f16x2(wg >> 16)),
        "r"(fp8_e4m3x2_to_f16x2(wg8 >> 16)), "r"(b0), "r"(b1));
}

template <class X, class O, class B>
__global__ void __launch_bounds__(kFp8MmaThreads, 4)
    fp8_gemv_mma_kernel(const X* __restrict__ x, const Float8_e4m3fn* __restrict__ w, int64_t ldw, int64_t n, int k,
                        const float* __restrict__ ws, int64_t bn, int64_t ws_sn, int ws_sk, int kblk, int kshift,
                        int pshift, const B* __restrict__ bias, O* __restrict__ y, int split) {
  constexpr int U = kFp8MmaU;
  constexpr bool kScaled = !std::is_same_v<X, Half>;  // f16 activations go to the MMA as they are
  extern __shared__ __align__(16) uint16_t xh[];      // k activations as f16, then one float per piece
  float* const down = reinterpret_cast<float*>(xh + k);
  __shared__ float partial[kFp8MmaWarps][kFp8MmaRows];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tiles = kFp8MmaWarps / split, tile = warp / split, part = warp % split;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * tiles + tile) * kFp8MmaRows;
  // Rows past n load the last row; their sums are dropped.
  const int64_t ra = row0 + g < n ? row0 + g : n - 1, rb = row0 + g + 8 < n ? row0 + g + 8 : n - 1;
  const uint4* wpa = reinterpret_cast<const uint4*>(w + ra * ldw) + t;  // step s: + 4 * s
  const uint4* wpb = reinterpret_cast<const uint4*>(w + rb * ldw) + t;
  const int steps = k / kFp8MmaStepK;
  const int s0 = static_cast<int>(static_cast<int64_t>(steps) * part / split);
  const int s1 = static_cast<int>(static_cast<int64_t>(steps) * (part + 1) / split);

  pdl_allow_dependents();
  uint4 wa[U][2], wb[U][2];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (s0 + u < s1) {
      wa[u][0] = gemv_load_stream_early(wpa + 4 * (s0 + u));
      wa[u][1] = gemv_load_stream_early(wpb + 4 * (s0 + u));
    }
  pdl_wait();

  // The activation row into shared memory: every 16-byte piece copied at once (one round trip), then each
  // thread converts the pieces it copied, in place.
  const int xchunks = k >> 3;
  for (int i = tid; i < xchunks; i += kFp8MmaThreads) cp_async16(xh + 8 * i, x + 8 * i, true);
  cp_async_commit();
  cp_async_wait<0>();
  if constexpr (kScaled) {
    // Per piece of 2^pshift activations (8, 16 or 32 neighbouring lanes' chunks; inside one weight-scale
    // block): 2^e > the piece's largest finite |x| (e = 0 when there is none or it is 0); the piece is scaled
    // by 2^(15 - e) and its sums by down[piece] = 2^(e - 15).
    const int lanes = 1 << (pshift - 3);
    for (int base = 0; base < xchunks; base += kFp8MmaThreads) {
      const int i = base + tid;
      const bool ok = i < xchunks;
      float v[8];
      float m = 0.f;
      if (ok) {
        gemv_unpack<X>(*reinterpret_cast<const uint4*>(xh + 8 * i), v);
#pragma unroll
        for (int q = 0; q < 8; ++q)
          if (::isfinite(v[q])) m = fmaxf(m, fabsf(v[q]));
      }
#pragma unroll
      for (int d = 1; d < 32; d <<= 1)
        if (d < lanes) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, d));
      // m = f * 2^e with f in [0.5, 1), from m's bits (it is finite and not negative); e = 0 for m = 0.
      const uint32_t mb = __float_as_uint(m);
      const int e = mb >= 0x00800000u ? static_cast<int>(mb >> 23) - 126 : mb == 0 ? 0 : 31 - __clz(static_cast<int>(mb)) - 148;
      // 2^(15 - e) in two factors (15 - e reaches 147 for bf16's smallest subnormals), and 2^(e - 15) in one:
      // it lies in [2^-147, 2^113], an f32 (a subnormal at the bottom) exactly.
      const int p = 15 - e, p1 = p / 2, p2 = p - p1;
      const float up1 = __int_as_float((127 + p1) << 23), up2 = __int_as_float((127 + p2) << 23);
      if (ok) {
        uint4 o;
        uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const __half2 h = __floats2half2_rn(v[2 * q] * up1 * up2, v[2 * q + 1] * up1 * up2);
          ow[q] = *reinterpret_cast<const uint32_t*>(&h);
        }
        *reinterpret_cast<uint4*>(xh + 8 * i) = o;
        if ((i & (lanes - 1)) == 0)
          down[i >> (pshift - 3)] = p <= 126 ? __int_as_float((127 - p) << 23) : __int_as_float(1 << (149 - p));
      }
    }
  }
  __syncthreads();

  const float* wsa = ws + (ra / bn) * ws_sn;
  const float* wsb = ws + (rb / bn) * ws_sn;
  float acc_a = 0.f, acc_b = 0.f;  // rows g and g + 8
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  int pc_cur = -1;  // the piece of c's sums (inside one weight-scale block)
  auto flush = [&]() {
    if (pc_cur >= 0) {
      const int k0 = pc_cur << pshift;
      const int kb = kshift >= 0 ? k0 >> kshift : k0 / kblk;
      const float d = kScaled ? down[pc_cur] : 1.f;
      acc_a = fmaf(c[0], wsa[kb * ws_sk] * d, acc_a);
      acc_b = fmaf(c[2], wsb[kb * ws_sk] * d, acc_b);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = 0.f;
  };
  auto step = [&](const uint4 (&wv)[2], int s) {
    const int k0 = s * kFp8MmaStepK;
    const int pc = k0 >> pshift;
    if (pc != pc_cur) {
      flush();
      pc_cur = pc;
    }
    const uint4* xp = reinterpret_cast<const uint4*>(xh + k0 + 16 * t);
    const uint4 xa = xp[0], xb = xp[1];
    fp8_mma_step(c, wv[0].x, wv[1].x, xa.x, xa.y);
    fp8_mma_step(c, wv[0].y, wv[1].y, xa.z, xa.w);
    fp8_mma_step(c, wv[0].z, wv[1].z, xb.x, xb.y);
    fp8_mma_step(c, wv[0].w, wv[1].w, xb.z, xb.w);
  };
  auto load = [&](uint4 (&wv)[U][2], int sb) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (sb + u < s1) {
        wv[u][0] = gemv_load_stream(wpa + 4 * (sb + u));
        wv[u][1] = gemv_load_stream(wpb + 4 * (sb + u));
      }
  };
  int s = s0;
  if (s < s1)
    fp8_two_buffers(wa, wb, [&](const uint4 (&cur)[U][2], uint4 (&next)[U][2]) {
      const bool more = s + U < s1;
      if (more) load(next, s + U);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (s + u < s1) step(cur[u], s + u);
      s += U;
      return more;
    });
  flush();

  if (t == 0) {
    partial[warp][g] = acc_a;
    partial[warp][g + 8] = acc_b;
  }
  __syncthreads();
  if (tid < tiles * kFp8MmaRows) {
    const int ti = tid / kFp8MmaRows, r = tid % kFp8MmaRows;
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * tiles + ti) * kFp8MmaRows + r;
    if (row < n) {
      float sum = partial[ti * split][r];
      for (int q = 1; q < split; ++q) sum += partial[ti * split + q][r];
      if (bias != nullptr) sum += fp8_elem_f32(bias[row]);
      y[row] = O(sum);
    }
  }
}

}  // namespace kiln::cuda::kernels
