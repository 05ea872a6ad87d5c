// FP8 weights times 16-bit activations for a few rows (decode), on tensor cores: linear(x, Fp8Weight) for
// x [M <= 8, K] f16/bf16, W [N, K] e4m3 with f32 scales (tensor-, row- or block-wise). Opt-in
// (Fp8Path::GemvMma) until measured against the CUDA-core kernel of fp8.cuh.
//
// Why: the CUDA-core kernel spends about 47 instructions per 16 weight bytes (16 conversions to f32 and 16
// FMAs per activation row, scales, activations); this one about 16 (8 conversions e4m3x2 -> f16x2, two
// m16n8k16 MMAs, a load of staged activations, the scale fold).
//
// Two kernels. Stage 1 (one block per activation row) writes the row as f16 scaled by a power of two (2^e
// with the row's largest magnitude in [2^14, 2^15)) into a scratch [M, K] and 2^-e beside it. Stage 2 is the
// product; launched as a dependent, it issues its first weight loads before it waits for stage 1 (weights are
// never written by a kernel), so stage 1 costs little more than its launch.
//
// Exactness: every e4m3 value is an f16 value, and the products of two f16 values are exact in the MMA's f32
// accumulators. A scaled bf16 activation within 2^-28 of its row's maximum keeps all 8 bits of its mantissa
// (f16 has 11); smaller ones round to the f16 grid, far below the output's precision. The sums are f32
// throughout: per 64-element step an MMA sum, times the weight block's scale, added to the f32 accumulator;
// the result times 2^-e, plus bias, rounded once to x's dtype. The scale comes from the finite activations
// (inf and NaN keep their values through it), so inf and NaN propagate as in the definition; NaN weights are
// f16 NaNs. The accumulator holds the result times 2^e: a row of activations near 2^-100 against weight
// scales near 2^100 could overflow it where the definition stays finite.
//
// Layout (stage 2). Block = 8 warps. A warp owns 16 weight rows and a share of K: `split` warps of a group
// take the 64-wide K steps of the group's 16 rows in turn (step i goes to warp i % split), and their sums
// meet in shared memory at the end; a block holds 8 / split groups. Per K step, lane (g = lane / 4,
// t = lane % 4) loads 16 weight bytes of rows g and g + 8 (elements [64 i + 16 t, 64 i + 16 t + 16)) and 16
// staged activations of row g (rows past M are zero) at the same elements, then runs four m16n8k16 MMAs:
// the MMA's K slots of lane quad t (2t, 2t + 1, 2t + 8, 2t + 9 in sub-step s) stand for elements
// 64 i + 16 t + 4 s + (0, 1, 2, 3) on both operands, so the product is the dot product over the whole step.
// C's 16 x 8 fragment then holds rows (g, g + 8) x activation rows (2t, 2t + 1). The next batch of weights
// is in flight while a batch multiplies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/gemv.cuh"
#include "cuda/kernels/pdl.cuh"

namespace kiln::cuda::kernels {

inline constexpr int kFp8MmaThreads = 256;
inline constexpr int kFp8MmaWarps = kFp8MmaThreads / 32;
inline constexpr int kFp8MmaMaxRows = 8;  // activation rows: the MMA's N
inline constexpr int kFp8MmaStep = 64;    // K elements per warp step
inline constexpr int kFp8MmaU = 4;        // steps whose weights are loaded together

struct Fp8MmaArgs {
  const uint16_t* xh;  // [rows, k] the activations as scaled f16 (stage 1), contiguous
  const float* inv;    // [rows] the inverse scales
  int rows;            // 1..8
  const uint8_t* w;  // e4m3 [n, k], row stride ldw bytes, 16-byte aligned rows
  int64_t ldw, n;
  int k;          // a multiple of kFp8MmaStep
  const float* ws;  // scale of (row, element): ws[(row / bn) * ws_sn + (element >> kshift or / kblk) * ws_sk]
  int64_t bn, ws_sn, ws_sk;
  int kblk, kshift;  // kblk a multiple of kFp8MmaStep or >= k; kshift as fp8_gemv_kernel's (-1: divide)
  const void* bias;  // [n] in x's dtype, or null
  void* y;           // [rows, n] in x's dtype, row stride ldy
  int64_t ldy;
  int split;         // warps per 16-row group: 1, 2, 4 or 8
};

__device__ __forceinline__ uint32_t fp8_mma_cvt2(uint32_t two_bytes) {  // e4m3x2 -> f16x2 (exact)
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ void fp8_mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <class X>
__device__ __forceinline__ float fp8_mma_x_to_f32(uint16_t bits) {
  if constexpr (std::is_same_v<X, BFloat16>) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
}

// Stage 1, one block per activation row: the row's largest finite magnitude m, e with m * 2^e in [2^14, 2^15)
// (0 when m is 0; clamped to 126), the row times 2^e as f16 into xh [rows, k] (inf and NaN stay what they
// are) and 2^-e into inv[row].
template <class X>
__global__ void __launch_bounds__(kFp8MmaThreads) fp8_mma_stage_x_kernel(const X* __restrict__ x, int64_t ldx, int k,
                                                                         uint16_t* __restrict__ xh,
                                                                         float* __restrict__ inv) {
  __shared__ float red[kFp8MmaWarps];
  __shared__ float scale_s;
  pdl_allow_dependents();
  pdl_wait();  // x comes from an earlier kernel
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, m = static_cast<int>(blockIdx.x);
  const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx);
  const int vecs = k / 8;
  float mx = 0.f;
  for (int i = tid; i < vecs; i += kFp8MmaThreads) {
    const uint4 v = xr[i];  // after pdl_wait: x is written by an earlier kernel
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = fabsf(fp8_mma_x_to_f32<X>(static_cast<uint16_t>(words[j] & 0xFFFFu)));
      const float hi = fabsf(fp8_mma_x_to_f32<X>(static_cast<uint16_t>(words[j] >> 16)));
      if (lo < INFINITY) mx = fmaxf(mx, lo);  // finite values only (false for inf and NaN)
      if (hi < INFINITY) mx = fmaxf(mx, hi);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (tid == 0) {
    float all = 0.f;
#pragma unroll
    for (int w = 0; w < kFp8MmaWarps; ++w) all = fmaxf(all, red[w]);
    int e = 0;
    if (all > 0.f) {
      e = 14 - ilogbf(all);  // >= 14 - 127
      e = e > 126 ? 126 : e;
    }
    scale_s = ldexpf(1.f, e);
    inv[m] = ldexpf(1.f, -e);
  }
  __syncthreads();
  const float sc = scale_s;
  uint4* out = reinterpret_cast<uint4*>(xh + static_cast<int64_t>(m) * k);
  for (int i = tid; i < vecs; i += kFp8MmaThreads) {
    uint4 v = xr[i];
    uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = fp8_mma_x_to_f32<X>(static_cast<uint16_t>(words[j] & 0xFFFFu)) * sc;
      const float hi = fp8_mma_x_to_f32<X>(static_cast<uint16_t>(words[j] >> 16)) * sc;
      const __half2 h = __floats2half2_rn(lo, hi);
      words[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    out[i] = v;
  }
}

// Stage 2: the product (see the top of this file); xh and inv from stage 1.
template <class X>
__global__ void __launch_bounds__(kFp8MmaThreads, 2) fp8_gemv_mma_kernel(const Fp8MmaArgs a) {
  __shared__ float partial[kFp8MmaWarps][16 * kFp8MmaMaxRows];

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int split = a.split, groups = kFp8MmaWarps / split, grp = warp / split, part = warp % split;
  const int64_t row_base = (static_cast<int64_t>(blockIdx.x) * groups + grp) * 16;
  const int64_t r0 = row_base + g < a.n ? row_base + g : a.n - 1;  // loads clamped, stores masked
  const int64_t r1 = row_base + g + 8 < a.n ? row_base + g + 8 : a.n - 1;
  const uint8_t* w0 = a.w + r0 * a.ldw + 16 * t;
  const uint8_t* w1 = a.w + r1 * a.ldw + 16 * t;
  const float* s0 = a.ws + (r0 / a.bn) * a.ws_sn;
  const float* s1 = a.ws + (r1 / a.bn) * a.ws_sn;
  const int steps = a.k / kFp8MmaStep;
  pdl_allow_dependents();

  // The first batch of weights, before the wait (kernels/pdl.cuh): weights are never written by a kernel.
  uint4 cur[kFp8MmaU][2];
  int step = part;
#pragma unroll
  for (int u = 0; u < kFp8MmaU; ++u) {
    const int s = step + u * split;
    if (s < steps) {
      cur[u][0] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w0 + static_cast<int64_t>(s) * kFp8MmaStep));
      cur[u][1] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w1 + static_cast<int64_t>(s) * kFp8MmaStep));
    } else {
      cur[u][0] = cur[u][1] = make_uint4(0, 0, 0, 0);
    }
  }
  pdl_wait();  // the staged activations (stage 1)

  // The lane's activation row (B's column g; rows past M are zero) at its 16 elements of each step.
  const bool has_x = g < a.rows;
  const uint4* xrow = reinterpret_cast<const uint4*>(a.xh + static_cast<int64_t>(has_x ? g : 0) * a.k + 16 * t);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (; step < steps; step += kFp8MmaU * split) {
    uint4 nxt[kFp8MmaU][2];
#pragma unroll
    for (int u = 0; u < kFp8MmaU; ++u) {
      const int s = step + (kFp8MmaU + u) * split;
      if (s < steps) {  // volatile loads: never executed speculatively past the row's end
        nxt[u][0] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w0 + static_cast<int64_t>(s) * kFp8MmaStep));
        nxt[u][1] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w1 + static_cast<int64_t>(s) * kFp8MmaStep));
      } else {
        nxt[u][0] = nxt[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
    // Activations and scales of step u: loaded one step ahead of its MMAs.
    auto load_xs = [&](int s, uint4& xa, uint4& xb, float& sc0, float& sc1) {
      const int e0 = s * kFp8MmaStep;
      const int kb = a.kshift >= 0 ? e0 >> a.kshift : e0 / a.kblk;
      sc0 = __ldg(s0 + kb * a.ws_sk);
      sc1 = __ldg(s1 + kb * a.ws_sk);
      xa = xb = make_uint4(0, 0, 0, 0);
      if (has_x) {
        xa = xrow[e0 / 8];  // written by stage 1: read after pdl_wait
        xb = xrow[e0 / 8 + 1];
      }
    };
    uint4 xa_n, xb_n;
    float sc0_n, sc1_n;
    load_xs(step, xa_n, xb_n, sc0_n, sc1_n);  // step < steps here
#pragma unroll
    for (int u = 0; u < kFp8MmaU; ++u) {
      const int s = step + u * split;
      if (s >= steps) break;  // uniform over the warp
      const uint4 xa = xa_n, xb = xb_n;
      const float sc0 = sc0_n, sc1 = sc1_n;
      if (u + 1 < kFp8MmaU && s + split < steps) load_xs(s + split, xa_n, xb_n, sc0_n, sc1_n);
      const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      const uint32_t q0[4] = {cur[u][0].x, cur[u][0].y, cur[u][0].z, cur[u][0].w};
      const uint32_t q1[4] = {cur[u][1].x, cur[u][1].y, cur[u][1].z, cur[u][1].w};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int sub = 0; sub < 4; ++sub) {
        // Elements 4 sub .. 4 sub + 3 of the lane's 16: weight bytes of word `sub`, activations of words
        // 2 sub and 2 sub + 1.
        const uint32_t h0lo = fp8_mma_cvt2(q0[sub] & 0xFFFFu), h0hi = fp8_mma_cvt2(q0[sub] >> 16);
        const uint32_t h1lo = fp8_mma_cvt2(q1[sub] & 0xFFFFu), h1hi = fp8_mma_cvt2(q1[sub] >> 16);
        fp8_mma_16816(c, h0lo, h1lo, h0hi, h1hi, xw[2 * sub], xw[2 * sub + 1]);
      }
      acc[0] = fmaf(c[0], sc0, acc[0]);
      acc[1] = fmaf(c[1], sc0, acc[1]);
      acc[2] = fmaf(c[2], sc1, acc[2]);
      acc[3] = fmaf(c[3], sc1, acc[3]);
    }
#pragma unroll
    for (int u = 0; u < kFp8MmaU; ++u) {
      cur[u][0] = nxt[u][0];
      cur[u][1] = nxt[u][1];
    }
  }

  // The group's warps meet: C fragment (rows g, g + 8; activation rows 2t, 2t + 1) into shared memory.
  float* pw = partial[warp];
  pw[g * kFp8MmaMaxRows + 2 * t] = acc[0];
  pw[g * kFp8MmaMaxRows + 2 * t + 1] = acc[1];
  pw[(g + 8) * kFp8MmaMaxRows + 2 * t] = acc[2];
  pw[(g + 8) * kFp8MmaMaxRows + 2 * t + 1] = acc[3];
  __syncthreads();
  const X* bias = static_cast<const X*>(a.bias);
  X* y = static_cast<X*>(a.y);
  for (int i = tid; i < groups * 16 * a.rows; i += kFp8MmaThreads) {
    const int m = i / (groups * 16), local = i % (groups * 16), gq = local / 16, r = local % 16;
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * groups + gq) * 16 + r;
    if (row >= a.n) continue;
    float sum = 0.f;
    for (int q = 0; q < split; ++q) sum += partial[gq * split + q][r * kFp8MmaMaxRows + m];
    sum *= a.inv[m];
    if (bias != nullptr) sum += static_cast<float>(bias[row]);
    y[static_cast<int64_t>(m) * a.ldy + row] = X(sum);
  }
}

}  // namespace kiln::cuda::kernels
