// Device code of the one-row TMA-stream matrix-vector kernel (sm_90): y[j] = sum_k x[k] * w[j, k] (+ bias[j]),
// for 16-bit weights (linear) and e4m3 weights with f32 block scales (linear(Fp8Weight)), one row of 16-bit
// activations. The launcher is src/cuda/gemv_tma.h.
//
// Why. The register kernels (kernels/gemv.cuh, kernels/fp8.cuh) keep the weight stream in flight through each
// thread's own loads, so the bytes in flight fall whenever a warp stops to convert and multiply, and a block
// near the end of the grid holds few. Here one copy warp per block keeps a ring of TMA boxes full without
// doing any arithmetic, and the eight math warps only read shared memory: the bytes in flight per block are
// the ring's whatever the math does.
//
// Work. A unit is 8 consecutive weight rows; a box is those 8 rows x KB bytes of K (a TMA copy of 8 x KB/8
// 8-byte words, out-of-range rows and words filled with zeros). Blocks are persistent: block b takes units
// b, b + grid, ... and the copy warp's lane 0 streams the boxes of all its units through the ring, unit
// after unit, with no gap between them. Math warp r owns row r of every box: its lanes read 16-byte chunks
// (KB / 512 a lane per box, consecutive lanes at consecutive chunks: no bank conflict), meet the matching
// activations (read through L1: the 8 warps share them) and add into one f32 accumulator. At the end of a
// unit the warp sums its lanes and lane 0 writes the row: no shared-memory partials and no block barrier.
//
// Ring. SLOTS = 32 KB / (8 KB) boxes, each with a "full" barrier (the TMA's bytes) and an "empty" barrier
// (one arrival per math warp after its last read of the slot). Fill i of slot s waits until the slot's
// (i - 1)th round was emptied.
//
// FP8: a chunk is 16 e4m3 weights inside one K block (the launcher requires the scale block to be a whole
// number of chunks): their dot product with 16 activations is multiplied once by the weight's block scale,
// as in kernels/fp8.cuh.
//
// Dependent launch (kernels/pdl.cuh): the copy warp never waits (weights are never written by a kernel); the
// math warps wait before they read x or write y.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/fp8.cuh"
#include "cuda/kernels/gemv.cuh"
#include "cuda/kernels/pdl.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "kiln/scalar_types.h"

namespace kiln::cuda::kernels {

inline constexpr int kGemvTmaRows = 8;                         // weight rows per unit and per box: math warps
inline constexpr int kGemvTmaThreads = 32 * (kGemvTmaRows + 1);  // + the copy warp
inline constexpr int kGemvTmaRingBytes = 32 << 10;

// The weight's block scales (e4m3 weights; unused for 16-bit ones): the scale of row j, element e is
// ws[(j / bn) * sn + (e / kblk) * sk] (kshift >= 0: e >> kshift instead of the division).
struct GemvTmaScales {
  const float* ws;
  int64_t bn, sn;
  int sk, kblk, kshift;
};

// wmap: the weight as rows of K * sizeof(W) / 8 8-byte words (n rows, 16-byte aligned rows), boxes of
// KB / 8 words x 8 rows, no swizzle. x: k activations, 16-byte aligned. units = ceil(n / 8); any grid.
template <class W, class X, class B, int KB>
__global__ void __launch_bounds__(kGemvTmaThreads, 4)
    gemv_tma_kernel(const __grid_constant__ CUtensorMap wmap, const X* __restrict__ x, int64_t n, int k,
                    GemvTmaScales sc, const B* __restrict__ bias, X* __restrict__ y, int64_t units) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFp8 = std::is_same_v<W, Float8_e4m3fn>;
  static_assert(kFp8 || sizeof(W) == 2, "16-bit or e4m3 weights");
  static_assert(KB % 512 == 0 && KB / 8 <= 256, "a box row is whole warp chunks and at most 256 words");
  constexpr int BOX = kGemvTmaRows * KB;
  constexpr int SLOTS = kGemvTmaRingBytes / BOX;
  constexpr int CH = KB / 512;                         // 16-byte chunks per lane per box row
  constexpr int WE = static_cast<int>(16 / sizeof(W));  // weights per chunk
  __shared__ __align__(1024) unsigned char ring[kGemvTmaRingBytes];
  __shared__ __align__(8) uint64_t full[SLOTS], empty[SLOTS];

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row_bytes = static_cast<int64_t>(k) * static_cast<int64_t>(sizeof(W));
  const int kboxes = static_cast<int>((row_bytes + KB - 1) / KB);
  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  auto full_bar = [&](int s) { return static_cast<uint32_t>(__cvta_generic_to_shared(&full[s])); };
  auto empty_bar = [&](int s) { return static_cast<uint32_t>(__cvta_generic_to_shared(&empty[s])); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < SLOTS; ++s) {
      wgmma::mbar_init(full_bar(s), 1);
      wgmma::mbar_init(empty_bar(s), kGemvTmaRows);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  pdl_allow_dependents();

  if (warp == kGemvTmaRows) {  // the copy warp: its lane 0 streams every box of the block's units
    if (lane == 0) {
      uint32_t it = 0;
      for (int64_t u = blockIdx.x; u < units; u += gridDim.x)
        for (int b = 0; b < kboxes; ++b, ++it) {
          const int s = static_cast<int>(it % SLOTS);
          wgmma::mbar_wait(empty_bar(s), ((it / SLOTS) & 1) ^ 1);  // a fresh barrier's phase "1" is complete
          wgmma::mbar_expect_tx(full_bar(s), BOX);
          wgmma::tma_load_2d(ring0 + s * BOX, &wmap, b * (KB / 8), static_cast<int>(u * kGemvTmaRows), full_bar(s));
        }
    }
    return;
  }

  pdl_wait();
  uint32_t it = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t row = u * kGemvTmaRows + warp;
    const int64_t lrow = row < n ? row : n - 1;  // rows past n load zeros (TMA fill) and are not stored
    const float* wsr = nullptr;
    if constexpr (kFp8) wsr = sc.ws + (lrow / sc.bn) * sc.sn;
    float acc = 0.f;
    for (int b = 0; b < kboxes; ++b, ++it) {
      const int s = static_cast<int>(it % SLOTS);
      wgmma::mbar_wait(full_bar(s), (it / SLOTS) & 1);
      const unsigned char* rowp = ring + s * BOX + warp * KB;
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int byte = j * 512 + lane * 16;
        const int64_t at = static_cast<int64_t>(b) * KB + byte;  // byte offset along the weight row
        if (at >= row_bytes) break;
        const uint4 wv = *reinterpret_cast<const uint4*>(rowp + byte);
        const int e = static_cast<int>(at / static_cast<int64_t>(sizeof(W)));  // first element of the chunk
        if constexpr (kFp8) {
          float xf[16], wf[16];
          fp8_load_x16<X>(x + e, xf);
          fp8_unpack16(wv, wf);
          float p = 0.f;
#pragma unroll
          for (int i = 0; i < 16; ++i) p = fmaf(wf[i], xf[i], p);
          const int kb = sc.kshift >= 0 ? e >> sc.kshift : e / sc.kblk;
          acc = fmaf(p, wsr[kb * sc.sk], acc);
        } else {
          float wf[WE], xf[WE];
          gemv_unpack<W>(wv, wf);
          gemv_unpack<X>(__ldg(reinterpret_cast<const uint4*>(x + e)), xf);
#pragma unroll
          for (int i = 0; i < WE; ++i) acc = fmaf(wf[i], xf[i], acc);
        }
      }
      __syncwarp();
      if (lane == 0) wgmma::mbar_arrive(empty_bar(s));
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, d);
    if (lane == 0 && row < n) {
      if (bias != nullptr) acc += gemv_to_f32(bias[row]);
      y[row] = gemv_from_f32<X>(acc);
    }
  }
#endif
}

}  // namespace kiln::cuda::kernels
