// Device code of linear's matrix-vector kernel (decode: 1..16 activation rows): raw pointers, sizes and
// strides in. The launcher is src/cuda/linear.cu.
//
//   y[m, j] = sum_k x[m, k] * w[j, k] + bias[j]      m < rows (<= MT), j < n
//
// Work split. A block of kGemvThreads threads is kGemvWarps warps; `split` consecutive warps form a group
// that owns R = gemv_rows_per_warp<MT>() weight rows and shares their K range (32 * split threads stride
// over it together). A block holds kGemvWarps / split groups. Each weight row is read from memory once for
// all MT activation rows: every loaded weight element meets MT activations (and every loaded activation
// element meets R weight rows), so the activations, which sit in L1/L2, are read M/R times per weight byte.
// Partial sums: f32 per (weight row, activation row) per thread, summed over the warp with shuffles, then
// over the group's warps in shared memory in warp order: no atomics, one launch, and the same bits on every
// run for a given launch shape.
//
// Loads. vec (chosen by the launcher): x rows, weight rows and their strides are 16-byte aligned and k is a
// multiple of the 16-byte vector, so every load is one uint4 (8 bf16/f16 or 4 f32); each thread keeps
// U * R of them in flight. Weight loads bypass L1 (they are streamed once; L1 is left to the activations).
// Otherwise the scalar path reads one element at a time (misaligned slices, k not a multiple of 8/4).
//
// Dependent launch (kernels/pdl.cuh). The launcher may start the kernel while the previous one still runs:
// each thread issues its first weight loads (it is launched so only for constant weights: launch_dependent_if
// in launch.h), then waits for the previous grid before it reads x or stores anything, so the weight stream's
// first round trip overlaps the previous kernel's tail and the launch.
//
// Bounds. Rows beyond n and activation rows beyond `rows` are clamped to the last valid row for loading
// (so no load leaves the tensors) and not stored. Every chunk index is < k / vec_elems (vec) or < k.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/pdl.cuh"
#include "kiln/scalar_types.h"
#include "ops/moe_math.h"

namespace kiln::cuda::kernels {

inline constexpr int kGemvThreads = 256;
inline constexpr int kGemvWarps = kGemvThreads / 32;
inline constexpr int kGemvMaxRows = 16;  // activation rows per launch (the largest MT)

// Weight rows per warp group: more rows reuse each activation load more often (see above) at the cost of
// registers (R * MT accumulators + R * 8 unpacked weights) and of fewer groups for small n. Chosen so that no
// instantiation spills under the 128-register cap of two blocks per SM: MT = 16 with R = 4 needs ~160.
// TUNE (H200 benchmark): MT = 16 reads activations 8x per weight byte (L1/L2 traffic); R = 4 at one block
// per SM is the alternative.
template <int MT>
constexpr int gemv_rows_per_warp() {
  return MT <= 2 ? 1 : (MT == 8 ? 4 : 2);
}
// 16-byte chunks per thread per unrolled step: U * R = 4 independent weight loads in flight per thread.
template <int R>
constexpr int gemv_unroll() {
  return 4 / R;
}

template <class T>
constexpr int gemv_vec_elems() {
  return static_cast<int>(16 / sizeof(T));
}

// A 16-byte load that does not allocate in L1 (read-only data, streamed once). (An L2 prefetch hint on it,
// .L2::128B or .L2::256B, was measured on the H200 and gained nothing: each warp's load covers whole lines.)
#define KILN_GEMV_LD "ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
__device__ __forceinline__ uint4 gemv_load_stream(const uint4* p) {
  uint4 v;
  asm(KILN_GEMV_LD : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The same load, kept in program order before the volatile asm that follows it (pdl_wait): a prefetch. Not
// .nc: ptxas moves .nc loads across griddepcontrol.wait in either direction (kernels/pdl.cuh), and would
// move some of these prefetches after it; a coherent load stays before it.
__device__ __forceinline__ uint4 gemv_load_stream_early(const uint4* p) { return ld_stream_coherent(p); }

// The U x R 16-byte weight loads of one unrolled step: chunk c + u * stride of each weight row (w + woff[r],
// W the weight's element type). A thread's first step (waited false) issues them in program order before the
// dependent-launch wait (kernels/pdl.cuh), then waits: the launcher makes the kernel a dependent only for
// constant weights (launch.h); x may be written by the kernel just before.
template <int U, int R, class W>
__device__ __forceinline__ void gemv_load_step(uint4 (&wv)[U][R], const W* w, const int64_t (&woff)[R], int c,
                                               int stride, bool& waited) {
  if (!waited) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w + woff[r]) + c + u * stride);
    pdl_wait();
    waited = true;
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = gemv_load_stream(reinterpret_cast<const uint4*>(w + woff[r]) + c + u * stride);
  }
}

// One element to f32 (exact for every dtype here).
// The last step of a thread's chunks (fewer than U left): the loads of chunks c + u * stride < chunks, all
// issued before any is used (one memory round trip). Issued in program order (the early loads), so a
// caller may place them before its dependent-launch wait.
template <int U, int R, class W>
__device__ __forceinline__ void gemv_load_tail(uint4 (&wv)[U][R], const W* w, const int64_t (&woff)[R], int c,
                                               int stride, int chunks) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (c + u * stride < chunks)
        wv[u][r] = gemv_load_stream_early(reinterpret_cast<const uint4*>(w + woff[r]) + c + u * stride);
}

template <class T>
__device__ __forceinline__ float gemv_to_f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, BFloat16>) return __uint_as_float(static_cast<uint32_t>(v.x) << 16);
  else return __half2float(__ushort_as_half(v.x));
}

// Two packed 16-bit elements (low half first) to f32.
template <class T>
__device__ __forceinline__ void gemv_unpack2(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
}

// The gemv_vec_elems<T>() elements of one 16-byte chunk to f32, in memory order.
template <class T>
__device__ __forceinline__ void gemv_unpack(const uint4& v, float (&f)[gemv_vec_elems<T>()]) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  } else {
    gemv_unpack2<T>(v.x, f[0], f[1]);
    gemv_unpack2<T>(v.y, f[2], f[3]);
    gemv_unpack2<T>(v.z, f[4], f[5]);
    gemv_unpack2<T>(v.w, f[6], f[7]);
  }
}

// f32 to the output dtype with the conversion the CPU uses (round to nearest even, PyTorch's NaN bits).
template <class T>
__device__ __forceinline__ T gemv_from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return T(v);
}

// Sums each thread's partials over its warp (butterfly: every lane ends with the total) and lane 0 stores
// the warp's R x MT sums at partial[(warp * R + r) * MT + m], for the block's fixed-order epilogue. Shared by
// the matrix-vector kernels (linear, FP8 linear, grouped decode).
template <int R, int MT>
__device__ __forceinline__ void gemv_publish_warp_sums(float (&acc)[R][MT], float* partial, int warp, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
      acc[r][m] = v;
    }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) partial[(warp * R + r) * MT + m] = acc[r][m];
  }
}

// Outputs per warp group: its R weight rows, or (ACT) one output from its gate and up rows.
template <int MT, bool ACT>
constexpr int gemv_outputs_per_group() {
  return ACT ? 1 : gemv_rows_per_warp<MT>();
}

// x: rows x k activations, row stride ldx (elements), unit inner stride. w: n x k weights, row stride ldw,
// unit inner stride. bias: n elements or null. y: rows x n, row stride ldy. 1 <= rows <= MT, n >= 1,
// k >= 0; split in {1, 2, 4, 8}; grid = ceil(n / (outputs per group * kGemvWarps / split)) blocks of
// kGemvThreads.
// ACT (one activation row): w has 2n rows, gate rows then up rows, and y[0, j] = silu(x . w[j]) * (x . w[n + j])
// from the f32 sums, rounded once (silu_and_mul of the product without rounding the product); no bias. A
// group reads the gate and the up row of its output (R = 2).
// MINB: the blocks per SM the registers must allow (__launch_bounds__): 2 (the compiler's choice: 53 registers
// in the 16-bit one-row instances, four blocks per SM) or 5 (at most 48 registers, 8 bytes spilled; one-row
// instances, cuda::set_gemv_min_blocks).
template <class T, int MT, bool ACT = false, int MINB = 2>
__global__ void __launch_bounds__(kGemvThreads, MINB)
    gemv_kernel(const T* x, int64_t ldx, int rows, const T* __restrict__ w, int64_t ldw,
                int64_t n, int k, const T* __restrict__ bias, T* __restrict__ y, int64_t ldy, int split,
                bool vec) {
  static_assert(!ACT || MT == 1, "the fused activation is for one activation row");
  constexpr int R = ACT ? 2 : gemv_rows_per_warp<MT>();
  constexpr int OPG = gemv_outputs_per_group<MT, ACT>();
  constexpr int U = gemv_unroll<R>();
  constexpr int VEC = gemv_vec_elems<T>();
  __shared__ float partial[kGemvWarps * R * MT];

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int groups = kGemvWarps / split;
  const int group = warp / split;
  const int t = (warp % split) * 32 + lane;  // this thread's index within its group
  const int group_threads = 32 * split;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * groups + group) * OPG;

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

  // Element offsets of this group's weight rows and of the activation rows, clamped into range.
  int64_t woff[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if constexpr (ACT) woff[r] = ((row0 < n ? row0 : n - 1) + (r ? n : 0)) * ldw;  // gate row, up row
    else woff[r] = (row0 + r < n ? row0 + r : n - 1) * ldw;
  }
  auto xoff = [&](int m) -> int64_t { return static_cast<int64_t>(m < rows ? m : rows - 1) * ldx; };

  pdl_allow_dependents();
  if (vec) {
    const int chunks = k / VEC;
    const int64_t ldx_vec = ldx / VEC;  // ldx is a multiple of VEC on this path
    int c = t;
    // Full steps: U chunks per thread, all U * R weight loads issued before any is used. The first step's
    // loads go out before the dependent-launch wait.
    bool waited = false;
    for (; c + (U - 1) * group_threads < chunks; c += U * group_threads) {
      uint4 wv[U][R];
      gemv_load_step<U, R>(wv, w, woff, c, group_threads, waited);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float wf[R][VEC];
#pragma unroll
        for (int r = 0; r < R; ++r) gemv_unpack<T>(wv[u][r], wf[r]);
        const uint4* xp = reinterpret_cast<const uint4*>(x) + c + u * group_threads;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float xf[VEC];
          gemv_unpack<T>(ld_after_wait(xp), xf);
          xp += m + 1 < rows ? ldx_vec : 0;  // rows past `rows` reread the last one
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
        }
      }
    }
    // The rest: fewer than U chunks left for this thread. Their loads are all issued before any is used
    // (predicated), so a short row or a ragged tail costs one memory round trip, not one per chunk: K = 896
    // (112 chunks, no full step) ran at 0.70x of cuBLAS with one load in flight per iteration.
    if (c < chunks) {
      uint4 wv[U][R];
      gemv_load_tail<U, R>(wv, w, woff, c, group_threads, chunks);
      if (!waited) pdl_wait();
      waited = true;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u * group_threads >= chunks) break;
        float wf[R][VEC];
#pragma unroll
        for (int r = 0; r < R; ++r) gemv_unpack<T>(wv[u][r], wf[r]);
        const uint4* xp = reinterpret_cast<const uint4*>(x) + c + u * group_threads;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float xf[VEC];
          gemv_unpack<T>(ld_after_wait(xp), xf);
          xp += m + 1 < rows ? ldx_vec : 0;
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
        }
      }
    }
    if (!waited) pdl_wait();  // a thread with no chunk
  } else {
    pdl_wait();
#pragma unroll 1
    for (int i = t; i < k; i += group_threads) {
      float wf[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wf[r] = gemv_to_f32(w[woff[r] + i]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float xv = gemv_to_f32(x[xoff(m) + i]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][m] = fmaf(wf[r], xv, acc[r][m]);
      }
    }
  }

  gemv_publish_warp_sums<R, MT>(acc, partial, warp, lane);
  __syncthreads();

  // Epilogue: one thread per (activation row, weight row of the block); consecutive threads take
  // consecutive weight rows, so the stores of one activation row are contiguous.
  const int block_rows = groups * OPG;
  for (int i = static_cast<int>(threadIdx.x); i < block_rows * MT; i += kGemvThreads) {
    const int m = i / block_rows, local = i % block_rows;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * block_rows + local;
    if (m >= rows || row >= n) continue;
    if constexpr (ACT) {
      float gs = partial[(local * split) * R * MT], us = partial[((local * split) * R + 1) * MT];
      for (int q = 1; q < split; ++q) {
        gs += partial[((local * split + q) * R) * MT];
        us += partial[((local * split + q) * R + 1) * MT];
      }
      y[row] = gemv_from_f32<T>(moe_math::silu_mul(gs, us));
    } else {
      const int g = local / R, r = local % R;
      // The group's warps in order: the same sum on every run.
      float s = partial[((g * split) * R + r) * MT + m];
      for (int q = 1; q < split; ++q) s += partial[((g * split + q) * R + r) * MT + m];
      if (bias != nullptr) s += gemv_to_f32(bias[row]);
      y[static_cast<int64_t>(m) * ldy + row] = gemv_from_f32<T>(s);
    }
  }
}

}  // namespace kiln::cuda::kernels
