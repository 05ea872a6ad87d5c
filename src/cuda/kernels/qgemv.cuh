// Device code of the products with llama.cpp-format quantised weights (linear(x, Q8Weight | Q4Weight |
// Q4KWeight | Q5KWeight | Q6KWeight) on CUDA): the activations' quantisation to int8 per block of 32, the matrix-vector kernel on int8
// dot products, and the dequantisation to a float type. Raw pointers, sizes and strides in; the launchers are
// in src/cuda/quant.cu.
//
// Formats (kiln/nn.h; the CPU kernels in src/cpu/q8_dot.cpp are the reference):
//   Q8_0  values int8 [n, k], scales f16 [n, k / 32]             value = q x d
//   Q4_0  values uint8 [n, k / 2], scales f16 [n, k / 32]        value = (code - 8) x d; byte j of a block's 16
//                                                                holds code j (low nibble) and j + 16 (high)
//   Q4_K  blocks uint8 [n, k / 256 x 144]: per 256 values f16 d, f16 dmin, 12 bytes of 6-bit scales s_j and
//         mins m_j of 8 sub-blocks of 32, 128 bytes of codes (32 bytes per pair of sub-blocks: 2c in the low
//         nibbles, 2c + 1 in the high ones)                       value = d s_j code - dmin m_j
//   Q5_K  blocks uint8 [n, k / 256 x 176]: Q4_K's 16-byte head, 32 bytes of fifth bits qh (bit j of qh[l] is
//         the fifth bit of value l of sub-block j), then Q4_K's 128 bytes of low nibbles
//                                                                  value = d s_j code - dmin m_j, code 0..31
//   Q6_K  blocks uint8 [n, k / 256 x 210] (2-byte aligned only): 128 bytes of low nibbles ql, 64 bytes of
//         high bit pairs qh, 16 int8 scales (one per 16 values), f16 d. Sub-block b = 4h + j (32 values) of
//         half h takes ql[64h + 32 (j % 2) + l] (low nibble for j < 2, high for j >= 2) and bits 2j, 2j + 1
//         of qh[32h + l]; its first 16 values scale sc[8h + 2j], its last 16 sc[8h + 2j + 1]
//                                                                  value = d sc (code - 32), code 0..63
//
// The product (as the CPU's, and llama.cpp's): x is quantised to int8 per block of 32 (x_q, its scale x_d =
// max|x| / 127 and the sum of its codes x_s), so that each block's dot product is an exact integer sum of
// dp4a instructions (four int8 products each), scaled once:
//   Q8_0: d x_d sum(q x_q);  Q4_0: d x_d (sum(code x_q) - 8 x_s);
//   Q4_K, Q5_K: d s_j x_d sum(code x_q) - dmin m_j x_d x_s   per sub-block j;
//   Q6_K: d x_d sum over its two halves of sc sum((code - 32) x_q)   per block of 32.
// A block of x holding NaN or an infinity gets a NaN scale: the rows it meets come out NaN.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/gemv.cuh"
#include "cuda/kernels/pdl.cuh"

namespace kiln::cuda::kernels {

enum QFormat : int { kQ8_0 = 0, kQ4_0 = 1, kQ4_K = 2, kQ5_K = 3, kQ6_K = 4 };
inline constexpr int kQBlock = 32;  // values per block of x (and of Q8_0 / Q4_0 weights)
inline constexpr int kQ4KValues = 256, kQ4KBytes = 144, kQ5KBytes = 176, kQ6KBytes = 210;  // super-blocks

// The super-block formats (no separate scales tensor), and their bytes per 256 values.
__host__ __device__ constexpr bool q_super_blocks(int f) { return f == kQ4_K || f == kQ5_K || f == kQ6_K; }
__host__ __device__ constexpr int q_super_bytes(int f) {
  return f == kQ4_K ? kQ4KBytes : f == kQ5_K ? kQ5KBytes : kQ6KBytes;
}

// Output (and bias) element types of the launches: one kernel instance serves all three.
enum QOut : int { kQOutF32 = 0, kQOutF16 = 1, kQOutBF16 = 2 };

__device__ __forceinline__ float q_load_as_f32(const void* p, int64_t i, int type) {
  if (type == kQOutF32) return static_cast<const float*>(p)[i];
  if (type == kQOutF16) return gemv_to_f32(static_cast<const Half*>(p)[i]);
  return gemv_to_f32(static_cast<const BFloat16*>(p)[i]);
}
__device__ __forceinline__ void q_store_f32_as(void* p, int64_t i, int type, float v) {
  if (type == kQOutF32) static_cast<float*>(p)[i] = v;
  else if (type == kQOutF16) static_cast<Half*>(p)[i] = gemv_from_f32<Half>(v);
  else static_cast<BFloat16*>(p)[i] = gemv_from_f32<BFloat16>(v);
}

__device__ __forceinline__ float q_f16(uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); }

// Loads of the activations' scales and code sums, which the quantisation kernel just before writes: coherent
// and kept after the dependent-launch wait (kernels/pdl.cuh).
__device__ __forceinline__ float q_ld_f32_after_wait(const float* p) {
  return __int_as_float(ld_after_wait(reinterpret_cast<const int*>(p)));
}

// ---- activations -----------------------------------------------------------------------------------------

// One warp per block of 32 values of x (rows x k, row stride ldx, unit inner stride), as the CPU's
// q8_quantize_row step for step (so the codes and scales are the same bits): d = max|x| / 127, q = round(x x
// (1 / d)) half away from zero, zeros when d is below the smallest normal float; a block holding NaN or an
// infinity gives zero codes and a NaN scale. Out: q [rows, k] int8, d and s (the sum of the codes) [rows, k / 32],
// contiguous. Launched as a dependent: x is read after the wait.
template <class T>
__global__ void __launch_bounds__(256) quantize_x_q8_kernel(const T* x, int64_t ldx, int rows, int k, int8_t* q,
                                                            float* d, int* s) {
  pdl_allow_dependents();
  pdl_wait();
  const int64_t nb = k / kQBlock;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (blk >= rows * nb) return;  // the whole warp
  const int64_t m = blk / nb, b = blk % nb;
  const float v = gemv_to_f32(x[m * ldx + b * kQBlock + lane]);
  float a = fabsf(v);
  const bool finite = __all_sync(0xFFFFFFFFu, isfinite(v)) != 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  int code = 0;
  float dd = __int_as_float(0x7FC00000);  // NaN
  if (finite) {
    dd = __fdiv_rn(a, 127.f);
    const float id = dd >= FLT_MIN ? __fdiv_rn(1.f, dd) : 0.f;
    code = static_cast<int>(roundf(__fmul_rn(v, id)));
  }
  q[m * k + b * kQBlock + lane] = static_cast<int8_t>(code);
  int sum = code;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  if (lane == 0) {
    d[m * nb + b] = dd;
    s[m * nb + b] = sum;
  }
}

// ---- matrix-vector -----------------------------------------------------------------------------------------
//
// The work split is the bf16 GEMV's (gemv.cuh) with one weight row per warp group: `split` warps stride over
// the row's 16-byte chunks of codes together, partials are summed over the warp by shuffles and over the
// group's warps in shared memory in warp order (the same bits on every run for a launch shape). A chunk is
// 16 values of Q8_0, one block of 32 of Q4_0, or half of a Q4_K / Q5_K sub-block pair's 32 bytes of codes
// (bytes 16h..16h + 15 of pair p: 16 values of sub-block 2p and 16 of 2p + 1), which its thread reads with the
// super-block's 16-byte head (d, dmin, the packed scales: one sector shared by the eight threads of the
// super-block) and, for Q5_K, the 16 bytes of fifth bits of those values; or a Q6_K chunk (Q6Chunk: 32 values,
// 8 of each sub-block of a half, read with 16-bit loads since Q6_K's 210-byte blocks are 2-byte aligned).
//
// Loads: each thread issues the loads of up to U chunks (codes, head or scale) before using any; a thread's
// first ones go out before the dependent-launch wait (the weights are constant: the launcher makes the kernel
// a dependent only then), the activations' codes, scales and sums after it.

template <int F>
__host__ __device__ constexpr int q_chunks_per_row(int k) {
  return F == kQ8_0 ? k / 16 : k / 32;
}

// Sub-block j's 6-bit scale and min from a Q4_K head (words: h1 = bytes 4..7, h2 = 8..11, h3 = 12..15 of the
// super-block; the packed bytes q[0..11] are bytes 4..15), as ggml's get_scale_min_k4.
__device__ __forceinline__ void q4k_scale_min(int j, uint32_t h1, uint32_t h2, uint32_t h3, int& sc, int& mn) {
  const uint64_t lo = static_cast<uint64_t>(h1) | (static_cast<uint64_t>(h2) << 32);  // q[0..7]
  auto qb = [&](int i) -> int {
    return i < 8 ? static_cast<int>((lo >> (8 * i)) & 0xFFu) : static_cast<int>((h3 >> (8 * (i - 8))) & 0xFFu);
  };
  if (j < 4) {
    sc = qb(j) & 63;
    mn = qb(j + 4) & 63;
  } else {
    sc = (qb(j + 4) & 0xF) | ((qb(j - 4) >> 6) << 4);
    mn = (qb(j + 4) >> 4) | ((qb(j) >> 6) << 4);
  }
}

__device__ __forceinline__ int q_dot16(const uint4& a, const uint4& b, int acc) {
  acc = __dp4a(static_cast<int>(a.x), static_cast<int>(b.x), acc);
  acc = __dp4a(static_cast<int>(a.y), static_cast<int>(b.y), acc);
  acc = __dp4a(static_cast<int>(a.z), static_cast<int>(b.z), acc);
  return __dp4a(static_cast<int>(a.w), static_cast<int>(b.w), acc);
}
__device__ __forceinline__ uint4 q_low_nibbles(const uint4& v) {
  return make_uint4(v.x & 0x0F0F0F0Fu, v.y & 0x0F0F0F0Fu, v.z & 0x0F0F0F0Fu, v.w & 0x0F0F0F0Fu);
}
__device__ __forceinline__ uint4 q_high_nibbles(const uint4& v) {
  return make_uint4((v.x >> 4) & 0x0F0F0F0Fu, (v.y >> 4) & 0x0F0F0F0Fu, (v.z >> 4) & 0x0F0F0F0Fu,
                    (v.w >> 4) & 0x0F0F0F0Fu);
}

// Q5_K: the fifth bits of a chunk's 16 values (bit `bit` of each byte of h) joined to their 4-bit codes.
__device__ __forceinline__ uint4 q_fifth_bits(const uint4& v, const uint4& h, int bit) {
  auto f = [&](uint32_t c, uint32_t q) { return c | (((q >> bit) & 0x01010101u) << 4); };
  return make_uint4(f(v.x, h.x), f(v.y, h.y), f(v.z, h.z), f(v.w, h.w));
}

// Two bytes of a Q6_K weight (2-byte aligned blocks): before the dependent-launch wait a coherent load kept in
// program order, after it a read-only one; both allocate in L1, where the neighbouring threads' loads of the
// same sectors hit.
__device__ __forceinline__ uint32_t q_ld16(const uint8_t* p, bool waited) {
  unsigned short v;
  if (waited) asm("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  else asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
// Eight bytes at a 2-byte aligned address, as two words.
__device__ __forceinline__ uint2 q_ld8_a2(const uint8_t* p, bool waited) {
  return make_uint2(q_ld16(p, waited) | (q_ld16(p + 2, waited) << 16),
                    q_ld16(p + 4, waited) | (q_ld16(p + 6, waited) << 16));
}
// Eight bytes of the activations' codes, after the wait (as ld_after_wait).
__device__ __forceinline__ uint2 q_ld8_after_wait(const int8_t* p) {
  uint2 v;
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// A Q6_K chunk: 8 consecutive values (l = 8 lq .. 8 lq + 7) of each of the four sub-blocks of half h of a
// super-block. Its bytes: ql[64h + 8lq ..] (a) and ql[64h + 32 + 8lq ..] (b), qh[32h + 8lq ..] (q), the four
// scale pairs sc[8h + 2j ..] as 16-bit words (s: j = 0, 1 in x, 2, 3 in y) and d.
struct Q6Chunk {
  uint2 a, b, q, s;
  uint32_t d;
};
__device__ __forceinline__ Q6Chunk q6_load(const uint8_t* blk, int h, int lq, bool waited) {
  Q6Chunk r;
  r.a = q_ld8_a2(blk + 64 * h + 8 * lq, waited);
  r.b = q_ld8_a2(blk + 64 * h + 32 + 8 * lq, waited);
  r.q = q_ld8_a2(blk + 128 + 32 * h + 8 * lq, waited);
  r.s = q_ld8_a2(blk + 192 + 8 * h, waited);
  r.d = q_ld16(blk + 208, waited);
  return r;
}
// Sub-block j's 8 codes of the chunk, each minus 32, as signed bytes in two words; and its scale.
__device__ __forceinline__ void q6_codes(const Q6Chunk& c, int j, int lq, int& w0, int& w1, int& sc) {
  const uint32_t s0 = (j & 1) ? c.b.x : c.a.x, s1 = (j & 1) ? c.b.y : c.a.y;
  const uint32_t n0 = (j < 2 ? s0 : s0 >> 4) & 0x0F0F0F0Fu, n1 = (j < 2 ? s1 : s1 >> 4) & 0x0F0F0F0Fu;
  w0 = static_cast<int>(__vsub4(n0 | (((c.q.x >> (2 * j)) & 0x03030303u) << 4), 0x20202020u));
  w1 = static_cast<int>(__vsub4(n1 | (((c.q.y >> (2 * j)) & 0x03030303u) << 4), 0x20202020u));
  const uint32_t sw = j < 2 ? c.s.x : c.s.y;
  sc = static_cast<int8_t>((sw >> (16 * (j & 1) + 8 * (lq >> 1))) & 0xFFu);
}

// Chunks per thread per step.
template <int MT>
constexpr int qgemv_unroll() {
  return MT <= 4 ? 4 : 2;
}

// Grouped launches (MoE experts in block formats): blockIdx.y picks group g of the weight stack, whose index
// e = ids[g] (written by the kernel before: read after the dependent-launch wait) selects the weight at
// w + e x gw bytes (scales at ws + e x gws); group g reads x's rows from row g x gx and writes y from element
// g x gy. ids null: one group, the plain product.
struct QGroups {
  const int32_t* ids = nullptr;
  int num = 1;           // entries of the stack (ids outside [0, num) read entry 0)
  int64_t gw = 0, gws = 0, gx = 0, gy = 0;
};

// One thread's weight loads of a step: up to U chunks c0, c0 + stride, ... (codes, and the head, fifth bits or
// scale each needs). early: the loads that stay before the dependent-launch wait (gemv_load_stream_early).
template <int F, int U>
struct QStep {
  uint4 wv[U], hv[U], qv[U];
  Q6Chunk c6[F == kQ6_K ? U : 1];
  float dw[U];
};

template <int F, int U>
__device__ __forceinline__ void q_load_step(QStep<F, U>& s, const uint8_t* wr, const uint16_t* sr, int c0, int stride,
                                            int chunks, bool waited) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + u * stride;
    if (c >= chunks) break;
    if constexpr (F == kQ6_K) {
      s.c6[u] = q6_load(wr + static_cast<int64_t>(c >> 3) * kQ6KBytes, (c >> 2) & 1, c & 3, waited);
    } else {
      const uint4* p;
      if constexpr (F == kQ4_K || F == kQ5_K) {
        const uint8_t* blk = wr + static_cast<int64_t>(c >> 3) * q_super_bytes(F);
        p = reinterpret_cast<const uint4*>(blk + (F == kQ5_K ? 48 : 16) + 16 * (c & 7));
        const uint4* h = reinterpret_cast<const uint4*>(blk);
        s.hv[u] = waited ? gemv_load_stream(h) : gemv_load_stream_early(h);
        if constexpr (F == kQ5_K) {
          const uint4* q = reinterpret_cast<const uint4*>(blk + 16 + 16 * (c & 1));
          s.qv[u] = waited ? gemv_load_stream(q) : gemv_load_stream_early(q);
        }
      } else {
        p = reinterpret_cast<const uint4*>(wr) + c;
        s.dw[u] = q_f16(__ldg(sr + (F == kQ8_0 ? c >> 1 : c)));
      }
      s.wv[u] = waited ? gemv_load_stream(p) : gemv_load_stream_early(p);
    }
  }
}

// The step's chunks against the activations (read after the wait) into acc[m], m < rows.
template <int F, int U, int MT>
__device__ __forceinline__ void q_compute_step(const QStep<F, U>& s, int c0, int stride, int chunks, const int8_t* xq,
                                               const float* xd, const int* xs, int rows, int k, int nb,
                                               float (&acc)[1][MT]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + u * stride;
    if (c >= chunks) break;
    if constexpr (F == kQ8_0) {
      const int b = c >> 1;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= rows) break;
        const uint4 xv = ld_after_wait(reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(m) * k) + c);
        const int si = q_dot16(s.wv[u], xv, 0);
        acc[0][m] = fmaf(static_cast<float>(si), s.dw[u] * q_ld_f32_after_wait(xd + m * nb + b), acc[0][m]);
      }
    } else if constexpr (F == kQ4_0) {
      const uint4 lo = q_low_nibbles(s.wv[u]), hi = q_high_nibbles(s.wv[u]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= rows) break;
        const uint4* xp = reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(m) * k + c * kQBlock);
        const int si = q_dot16(hi, ld_after_wait(xp + 1), q_dot16(lo, ld_after_wait(xp), 0)) -
                       8 * ld_after_wait(xs + m * nb + c);
        acc[0][m] = fmaf(static_cast<float>(si), s.dw[u] * q_ld_f32_after_wait(xd + m * nb + c), acc[0][m]);
      }
    } else if constexpr (F == kQ6_K) {
      const int bx = (c >> 3) * 8 + 4 * ((c >> 2) & 1), lq = c & 3;  // the x block of sub-block j: bx + j
      const float d = q_f16(s.c6[u].d);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int w0, w1, sc;
        q6_codes(s.c6[u], j, lq, w0, w1, sc);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= rows) break;
          const uint2 xv = q_ld8_after_wait(xq + static_cast<int64_t>(m) * k + (bx + j) * kQBlock + 8 * lq);
          const int si = __dp4a(w1, static_cast<int>(xv.y), __dp4a(w0, static_cast<int>(xv.x), 0)) * sc;
          acc[0][m] = fmaf(d * q_ld_f32_after_wait(xd + m * nb + bx + j), static_cast<float>(si), acc[0][m]);
        }
      }
    } else {
      const int sb = c >> 3, pair = (c >> 1) & 3, hf = c & 1;
      const float d = q_f16(s.hv[u].x & 0xFFFFu), dmin = q_f16(s.hv[u].x >> 16);
      int sc0, m0, sc1, m1;
      q4k_scale_min(2 * pair, s.hv[u].y, s.hv[u].z, s.hv[u].w, sc0, m0);
      q4k_scale_min(2 * pair + 1, s.hv[u].y, s.hv[u].z, s.hv[u].w, sc1, m1);
      const float f0 = d * static_cast<float>(sc0), f1 = d * static_cast<float>(sc1);
      const float g0 = dmin * static_cast<float>(m0), g1 = dmin * static_cast<float>(m1);
      uint4 lo = q_low_nibbles(s.wv[u]), hi = q_high_nibbles(s.wv[u]);
      if constexpr (F == kQ5_K) {
        lo = q_fifth_bits(lo, s.qv[u], 2 * pair);
        hi = q_fifth_bits(hi, s.qv[u], 2 * pair + 1);
      }
      const int b0 = sb * 8 + 2 * pair;  // the x blocks of sub-blocks 2 pair and 2 pair + 1
      const int v0 = sb * kQ4KValues + 64 * pair + 16 * hf;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= rows) break;
        const int8_t* xr = xq + static_cast<int64_t>(m) * k;
        const int s0 = q_dot16(lo, ld_after_wait(reinterpret_cast<const uint4*>(xr + v0)), 0);
        const int s1 = q_dot16(hi, ld_after_wait(reinterpret_cast<const uint4*>(xr + v0 + 32)), 0);
        const float d0 = q_ld_f32_after_wait(xd + m * nb + b0), d1 = q_ld_f32_after_wait(xd + m * nb + b0 + 1);
        float a = fmaf(f0 * d0, static_cast<float>(s0), acc[0][m]);
        a = fmaf(f1 * d1, static_cast<float>(s1), a);
        if (hf == 0) {  // the sub-blocks' mins, once per sub-block (by its first half's thread)
          a -= g0 * d0 * static_cast<float>(ld_after_wait(xs + m * nb + b0));
          a -= g1 * d1 * static_cast<float>(ld_after_wait(xs + m * nb + b0 + 1));
        }
        acc[0][m] = a;
      }
    }
  }
}

// xq [rows, k] int8, xd / xs [rows, k / 32] (the activations' codes, scales and code sums; contiguous).
// w: the weight's bytes, row stride ldw bytes; ws: Q8_0 / Q4_0's f16 scales (as bits), row stride ldws; n
// weight rows. bias (nullable) and y in `otype`; y row stride ldy. 1 <= rows <= MT; k a multiple of 32 (the
// super-block formats: 256); w, ldw, gw (Q6_K: 2-byte), xq 16-byte aligned. A block takes `groups` = kGemvWarps /
// split consecutive weight rows at a time (a row block); grid.y: the groups of a grouped launch; blocks of
// kGemvThreads. Every thread takes the same number of steps per row (one past the row's chunks skips its loads).
//   PIPE false: grid.x = the row blocks, one each.
//   PIPE true: any grid.x; a block takes row blocks blockIdx.x, blockIdx.x + gridDim.x, ..., and each thread
//   issues the loads of its next step (the row's next, or the next row block's first) before it computes the
//   current one, so that its loads overlap its arithmetic. Twice the registers for the loads in flight, hence
//   fewer warps per multiprocessor: a choice for the launcher (set_qgemv_blocks_per_sm). The same bits.
template <int F, int MT, bool PIPE>
__global__ void __launch_bounds__(kGemvThreads)
    qgemv_kernel(const int8_t* xq, const float* xd, const int* xs, int rows, int k, const uint8_t* __restrict__ w,
                 int64_t ldw, const uint16_t* __restrict__ ws, int64_t ldws, int64_t n,
                 const void* __restrict__ bias, int otype, void* __restrict__ y, int64_t ldy, int split,
                 QGroups grp) {
  constexpr int U = qgemv_unroll<MT>();
  __shared__ float partial[kGemvWarps * MT];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int groups = kGemvWarps / split, group = warp / split;
  const int t = (warp % split) * 32 + lane, group_threads = 32 * split;
  const int nb = k / kQBlock;

  pdl_allow_dependents();
  bool waited = false;
  if (grp.ids != nullptr) {  // the group's weight, x rows and output
    pdl_wait();
    waited = true;
    const int g = static_cast<int>(blockIdx.y);
    int e = ld_after_wait(grp.ids + g);
    if (e < 0 || e >= grp.num) e = 0;
    w += e * grp.gw;
    if (!q_super_blocks(F)) ws += e * grp.gws;
    xq += g * grp.gx * k;
    xd += g * grp.gx * nb;
    xs += g * grp.gx * nb;
    y = static_cast<char*>(y) + g * grp.gy * (otype == kQOutF32 ? 4 : 2);
  }
  const int chunks = q_chunks_per_row<F>(k);
  const int step_chunks = U * group_threads;
  const int steps = (chunks + step_chunks - 1) / step_chunks;
  const int64_t row_blocks = (n + groups - 1) / groups;
  // The weight row this thread reads in row block rb (rows past n load the last one and store nothing).
  auto row_of = [&](int64_t rb, const uint8_t*& wr, const uint16_t*& sr) {
    const int64_t row = rb * groups + group;
    const int64_t wrow = row < n ? row : n - 1;
    wr = w + wrow * ldw;
    sr = q_super_blocks(F) ? nullptr : ws + wrow * ldws;
  };
  float acc[1][MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[0][m] = 0.f;
  // Row block rb's sums: over the warp by shuffles, over the group's warps in shared memory in warp order.
  auto finish = [&](int64_t rb) {
    gemv_publish_warp_sums<1, MT>(acc, partial, warp, lane);
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < groups * MT; i += kGemvThreads) {
      const int m = i / groups, g = i % groups;
      const int64_t r = rb * groups + g;
      if (m >= rows || r >= n) continue;
      float s = partial[(g * split) * MT + m];
      for (int q = 1; q < split; ++q) s += partial[(g * split + q) * MT + m];
      if (bias != nullptr) s += q_load_as_f32(bias, r, otype);
      q_store_f32_as(y, static_cast<int64_t>(m) * ldy + r, otype, s);
    }
  };

  int64_t rb = blockIdx.x;
  const uint8_t* wr;
  const uint16_t* sr;
  row_of(rb, wr, sr);
  if constexpr (!PIPE) {
    QStep<F, U> cur;
    for (int st = 0; st < steps; ++st) {
      q_load_step<F, U>(cur, wr, sr, t + st * step_chunks, group_threads, chunks, waited);
      if (!waited) {
        pdl_wait();
        waited = true;
      }
      q_compute_step<F, U, MT>(cur, t + st * step_chunks, group_threads, chunks, xq, xd, xs, rows, k, nb, acc);
    }
    finish(rb);
  } else {
    QStep<F, U> cur, nxt;
    int st = 0;
    if (rb < row_blocks) q_load_step<F, U>(cur, wr, sr, t, group_threads, chunks, waited);
    if (!waited) pdl_wait();
    while (rb < row_blocks) {
      int64_t rb1 = rb;
      int st1 = st + 1;
      const uint8_t* wr1 = wr;
      const uint16_t* sr1 = sr;
      if (st1 == steps) {
        st1 = 0;
        rb1 = rb + gridDim.x;
        row_of(rb1, wr1, sr1);
      }
      if (rb1 < row_blocks) q_load_step<F, U>(nxt, wr1, sr1, t + st1 * step_chunks, group_threads, chunks, true);
      q_compute_step<F, U, MT>(cur, t + st * step_chunks, group_threads, chunks, xq, xd, xs, rows, k, nb, acc);
      if (rb1 != rb) {
        finish(rb);
        __syncthreads();  // partial is written again for the next row block
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[0][m] = 0.f;
      }
      cur = nxt;
      rb = rb1;
      st = st1;
      wr = wr1;
      sr = sr1;
    }
  }
}

// ---- dequantisation ----------------------------------------------------------------------------------------

// N (a multiple of 8) values rounded to T, stored with 16-byte stores at dst (16-byte aligned).
template <int N, class T>
__device__ __forceinline__ void q_store(T* dst, const float (&v)[N]) {
  uint4* p = reinterpret_cast<uint4*>(dst);
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      p[i] = make_uint4(__float_as_uint(v[4 * i]), __float_as_uint(v[4 * i + 1]), __float_as_uint(v[4 * i + 2]),
                        __float_as_uint(v[4 * i + 3]));
  } else {
    uint32_t w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      w[i] = static_cast<uint32_t>(gemv_from_f32<T>(v[2 * i]).x) |
             (static_cast<uint32_t>(gemv_from_f32<T>(v[2 * i + 1]).x) << 16);
#pragma unroll
    for (int i = 0; i < N / 8; ++i) p[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

// The 16 bytes as 16 signed or unsigned bytes (byte e of the chunk at e).
__device__ __forceinline__ int q_byte(const uint4& v, int e) {
  const uint32_t w = e < 4 ? v.x : e < 8 ? v.y : e < 12 ? v.z : v.w;
  return static_cast<int>((w >> (8 * (e & 3))) & 0xFFu);
}

// out [n, k] (contiguous, 16-byte aligned, T) = the weight's values, with the CPU's arithmetic (Q8_0 / Q4_0:
// code x d, exact in f32; Q4_K, Q5_K: (d s_j) x code - (dmin m_j), each product and the difference rounded in
// f32; Q6_K: (d x sc) x (code - 32), each product rounded), then one rounding to T. One thread per chunk
// (q_chunks_per_row), its 16 or 32 values written with 16-byte stores; grid-stride. w and ldw 16-byte aligned
// (Q6_K: 2-byte).
template <int F, class T>
__global__ void __launch_bounds__(256) dequantize_q_kernel(const uint8_t* __restrict__ w, int64_t ldw,
                                                           const uint16_t* __restrict__ ws, int64_t ldws, int64_t n,
                                                           int k, T* __restrict__ out) {
  const int chunks = q_chunks_per_row<F>(k);
  const int64_t total = n * chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks;
    const int c = static_cast<int>(i % chunks);
    const uint8_t* wr = w + row * ldw;
    T* o = out + row * k;
    float lo[16], hi[16];
    if constexpr (F == kQ8_0) {
      const float d = q_f16(ws[row * ldws + (c >> 1)]);
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(wr) + c);
#pragma unroll
      for (int e = 0; e < 16; ++e) lo[e] = __fmul_rn(static_cast<float>(static_cast<int8_t>(q_byte(q, e))), d);
      q_store<16>(o + 16 * c, lo);
    } else if constexpr (F == kQ4_0) {
      const float d = q_f16(ws[row * ldws + c]);
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(wr) + c);
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int b = q_byte(q, e);
        lo[e] = __fmul_rn(static_cast<float>((b & 0xF) - 8), d);
        hi[e] = __fmul_rn(static_cast<float>((b >> 4) - 8), d);
      }
      q_store<16>(o + 32 * c, lo);
      q_store<16>(o + 32 * c + 16, hi);
    } else if constexpr (F == kQ6_K) {
      const int h = (c >> 2) & 1, lq = c & 3;
      const Q6Chunk q = q6_load(wr + static_cast<int64_t>(c >> 3) * kQ6KBytes, h, lq, true);
      const float d = q_f16(q.d);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int w0, w1, sc;
        q6_codes(q, j, lq, w0, w1, sc);
        const float f = __fmul_rn(d, static_cast<float>(sc));  // (d x scale) x (code - 32), as the CPU
        float v[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          v[e] = __fmul_rn(f, static_cast<float>(static_cast<int8_t>(w0 >> (8 * e))));
          v[4 + e] = __fmul_rn(f, static_cast<float>(static_cast<int8_t>(w1 >> (8 * e))));
        }
        q_store<8>(o + (c >> 3) * kQ4KValues + 128 * h + 32 * j + 8 * lq, v);
      }
    } else {
      const uint8_t* blk = wr + static_cast<int64_t>(c >> 3) * q_super_bytes(F);
      const int pair = (c >> 1) & 3, hf = c & 1;
      const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
      uint4 q = __ldg(reinterpret_cast<const uint4*>(blk + (F == kQ5_K ? 48 : 16) + 16 * (c & 7)));
      uint4 q5 = make_uint4(0, 0, 0, 0);
      if constexpr (F == kQ5_K) q5 = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 16 * hf));
      const float d = q_f16(h.x & 0xFFFFu), dmin = q_f16(h.x >> 16);
      int sc0, m0, sc1, m1;
      q4k_scale_min(2 * pair, h.y, h.z, h.w, sc0, m0);
      q4k_scale_min(2 * pair + 1, h.y, h.z, h.w, sc1, m1);
      const float f0 = __fmul_rn(d, static_cast<float>(sc0)), f1 = __fmul_rn(d, static_cast<float>(sc1));
      const float g0 = __fmul_rn(dmin, static_cast<float>(m0)), g1 = __fmul_rn(dmin, static_cast<float>(m1));
      const int v0 = (c >> 3) * kQ4KValues + 64 * pair + 16 * hf;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int b = q_byte(q, e), f = q_byte(q5, e);  // f: Q5_K's fifth bits
        const int c0 = (b & 0xF) | (((f >> (2 * pair)) & 1) << 4), c1 = (b >> 4) | (((f >> (2 * pair + 1)) & 1) << 4);
        lo[e] = __fsub_rn(__fmul_rn(f0, static_cast<float>(c0)), g0);
        hi[e] = __fsub_rn(__fmul_rn(f1, static_cast<float>(c1)), g1);
      }
      q_store<16>(o + v0, lo);
      q_store<16>(o + v0 + 32, hi);
    }
  }
}

}  // namespace kiln::cuda::kernels
