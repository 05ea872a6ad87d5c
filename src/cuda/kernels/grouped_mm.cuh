// Device code of grouped_mm and of the MoE block's expert products: raw pointers, sizes and strides in.
// The launcher is src/cuda/moe.cu.
//
// Every form is a list of products C_g = A_g @ B_g (f32 accumulation) described by GmmArgs:
//   RowGroups  rows [s[g-1], s[g]) of A and C use B[g]; rows past s[G-1] are written as 0      (2d x 3d,
//              and 3d x 2d through the transposes out^T = b^T @ a[g]^T)
//   KGroups    the K range [s[g-1], s[g]) of A and B forms C[g]; an empty range gives C[g] = 0 (2d x 2d)
//   Batched    C[g] = A[g] @ B[g] over all of K                                                  (3d x 3d)
// where s are the sanitised offsets: s[g] = min(max(offs[0..g], 0), extent) (running max, clamped). For
// valid offsets s = offs; for invalid ones s is still non-decreasing and within [0, extent], so every
// index below stays in bounds, and one block records the error (device_error.h) for the host to raise at
// its next synchronisation. The host never reads offs: each block loads them into shared memory, scans
// them and finds its own group (a binary search), and exits when it has none; the decode kernel's warps
// each find their row's group straight from offs (gmm_row_group_warp: a ballot per 32 offsets).
//
// Two kernels:
//  - gmm_decode_kernel (RowGroups, few rows per group): matrix-vector style. blockIdx.y is a row slot j of
//    A; the block finds j's group g and works only if j starts a run of kDecRows rows of g (so each
//    expert's weights are read once per kDecRows rows: once for decode, where a group holds one row);
//    blockIdx.x tiles the output columns. A weight row of B[g] (K contiguous: the checkpoints' [N, K]
//    expert layout) is streamed with 16-byte loads like linear's gemv (gemv.cuh), warps split K.
//  - gmm_tile_kernel (every mode): 64 x 64 output tiles, K steps of 32 through shared memory (a three-stage
//    cp.async ring when rows are 16-byte aligned, else element loads); bf16/f16 on
//    tensor cores (WMMA m16n16k16, f32 accumulators), f32 on CUDA cores (f32 FMAs: exact f32 semantics,
//    no TF32). In RowGroups mode blockIdx.y is an m-tile slot: group g has ceil(rows_g / 64) m-tiles
//    (the rows past s[G-1] form a last pseudo-group written as 0), so ceil(M / 64) + G + 1 slots bound
//    them; each block finds its (group, m-tile) by a scan of the tile counts and a binary search.
//
// MoE extras: a_rows (A row m is row a_rows[m] of the tensor: the token of the m-th sorted (token, expert)
// pair, so x is never gathered), c_rows (C row m is written at c_rows[m]), act (the SiLU-mul epilogue: the
// product has 2N columns, gate then up, and C[m, n] = silu(P[m, n]) * P[m, N + n] rounded once to C's dtype:
// the intermediate activation h of the expert MLP).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/device_error.h"
#include "cuda/kernels/fp8.cuh"
#include "cuda/kernels/gemv.cuh"
#include "ops/moe_math.h"

namespace kiln::cuda::kernels {

enum class GmmMode : int { RowGroups = 0, KGroups = 1, Batched = 2 };

struct GmmArgs {
  const void* a;
  int64_t a_sg, a_sm, a_sk;  // element strides: group (0 when A is 2-d), row, K
  const void* b;
  int64_t b_sg, b_sk, b_sn;  // group (0 when B is 2-d), K, column
  void* c;
  int64_t c_sg, c_sm, c_sn;  // group (0 when C is 2-d), row, column
  const int32_t* a_rows;     // null, or A's row of product row m (RowGroups only)
  const int32_t* c_rows;     // null, or C's row of product row m (RowGroups only)
  const int32_t* offs;       // G cumulative ends (RowGroups, KGroups); null for Batched
  // null, or the group of each product row (RowGroups, decode kernel): from a trusted producer (the MoE
  // routing) whose offsets describe the same rows. Each row then takes its own block, with no scan of the
  // offsets before the weight loads. Values are clamped into [0, G).
  const int32_t* row_groups;
  // The decode kernel with row_groups (one row per block or warp group) may read row_groups and comb_pairs and
  // stream the weights they select before its dependent-launch wait (kernels/pdl.cuh): set only when those
  // were written before the kernel launched just ahead of this one on the stream, and that kernel is a
  // decode kernel that lets its dependents start only after its own wait (so the writer has completed).
  // The MoE block's down product after its gate_up product, with FP8 experts: down's first weights are then
  // in flight while gate_up ends. The launcher takes the kernel's kDecEarly instance for it.
  bool groups_before_wait;
  // The decode kernel lets its dependents start only after its own wait, not at its start (the launcher takes
  // the kDecAfterWait instance): set for the product whose dependent has groups_before_wait (gate_up ahead
  // of that down).
  bool dependents_after_wait;
  // null, or the MoE combine fused into one token's down product (decode kernel, one row per block's warp
  // group: RowGroups with row_groups, no act, M = the token's k slots with kDecWarps % M == 0, launched with
  // split kDecWarps / M and one block row): warp group m of every block takes product row m over the block's
  // columns, and the block writes comb_out[n] = sum over slots s in order of comb_weights[s] * P[row of s, n]
  // (f32, one rounding to T, as moe_combine_kernel), the row of slot s being the m with comb_pairs[m] == s.
  // C and c_rows are then unused.
  const void* comb_weights;   // T [M], the token's routing weights in slot order
  const int32_t* comb_pairs;  // [M]: product row m's slot (the permutation's rows_pair)
  void* comb_out;             // T [N]
  // FP8 experts (decode kernel, RowGroups, act or not): B holds float8_e4m3fn values and b_scales the f32
  // scale of each b_bn x b_bk block of B[g] ([N or 2N, K] rows): the scale of weight row n, element k is
  // b_scales[g * bs_sg + (n / b_bn) * bs_sn + k / b_bk]. b_bk is a multiple of 16.
  const float* b_scales;
  int64_t bs_sg, bs_sn;
  int b_bn, b_bk;
  int b_bk_shift;  // log2(b_bk) when a power of two, else -1 (divide)
  int G;
  int M;                     // product rows (RowGroups: the extent the offsets index)
  int N;                     // output columns (with act: the product has 2N)
  int K;                     // reduction length (KGroups: the extent the offsets index)
  GmmMode mode;
  bool act;
  bool out_f32;              // C is f32 (else the input dtype)
  bool fast_epilogue;        // Hopper tile kernels: straight runs of stores for whole tiles (gmm90_store_run)
  bool wide_stores;          // and of 16-bit C in 16-byte stores (gmm90_store_run16)
  bool skip_idle_half;       // Hopper 128-row tiles: a warpgroup whose 64 rows all lie past the tile's end skips its MMAs
  DeviceErrorRecord* err;
};

// The largest G whose offsets the kernels scan in shared memory (two int arrays of G + 1).
inline constexpr int kGmmMaxGroups = 2048;

// ---- offsets -----------------------------------------------------------------------------------------------

struct ScanMax {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct ScanSum {
  __device__ int operator()(int a, int b) const { return a + b; }
};

// Inclusive scan of data[0, n) in shared memory by all THREADS threads of the block (n uniform).
// warp_tmp: THREADS / 32 ints of shared memory. Ends with a barrier.
template <int THREADS, class Op>
__device__ void gmm_block_scan(int* data, int n, Op op, int identity, int* warp_tmp) {
  constexpr int kWarps = THREADS / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  __syncthreads();
  int carry = identity;
  for (int base = 0; base < n; base += THREADS) {
    const int i = base + static_cast<int>(threadIdx.x);
    int v = i < n ? data[i] : identity;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xFFFFFFFFu, v, d);
      if (lane >= d) v = op(o, v);
    }
    if (lane == 31) warp_tmp[warp] = v;
    __syncthreads();
    int prefix = carry;
    for (int w = 0; w < warp; ++w) prefix = op(prefix, warp_tmp[w]);
    if (i < n) data[i] = op(prefix, v);
    int total = carry;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total = op(total, warp_tmp[w]);
    carry = total;
    __syncthreads();  // warp_tmp is rewritten by the next chunk
  }
}

// Offset g is invalid: negative, past the extent or below the one before it.
__device__ __forceinline__ bool gmm_offset_invalid(const int32_t* __restrict__ offs, int g, int v, int extent) {
  const int prev = g > 0 ? offs[g - 1] : 0;
  return v < 0 || v > extent || v < prev;
}

// s[0, G) = the sanitised offsets (see the top of the file); `report`: this block records invalid ones.
template <int THREADS>
__device__ void gmm_load_offsets(const int32_t* __restrict__ offs, int G, int extent, int* s, int* warp_tmp,
                                 DeviceErrorRecord* err, bool report) {
  for (int g = static_cast<int>(threadIdx.x); g < G; g += THREADS) {
    const int v = offs[g];
    if (report && gmm_offset_invalid(offs, g, v, extent))
      report_device_error(err, DeviceErrorCode::InvalidOffsets, OpId::GroupedMm, v, extent);
    s[g] = v < 0 ? 0 : (v > extent ? extent : v);
  }
  gmm_block_scan<THREADS>(s, G, ScanMax{}, 0, warp_tmp);
}

// Invalid offsets recorded (as gmm_load_offsets' `report`), without the scan. Every thread of the block calls.
template <int THREADS>
__device__ void gmm_report_offsets(const int32_t* __restrict__ offs, int G, int extent, DeviceErrorRecord* err) {
  for (int g = static_cast<int>(threadIdx.x); g < G; g += THREADS) {
    const int v = offs[g];
    if (gmm_offset_invalid(offs, g, v, extent))
      report_device_error(err, DeviceErrorCode::InvalidOffsets, OpId::GroupedMm, v, extent);
  }
}

// The group of row r (0 <= r < extent) under the sanitised offsets s, found by one warp on its own (all 32
// lanes call; no shared memory, no barrier): the first g with s[g] > r, or G. As r < extent, s[g] > r exactly
// when some offs[i <= g] > r, so g is the first index whose raw offset exceeds r; then start = s[g - 1] (the
// largest clamped offset before g, 0 for g = 0) and end = s[g] = clamp(offs[g]) (end = extent for g = G).
// The offsets load 128 at a time (four per lane in flight), one ballot per 32 of them; the lanes' running
// maxima of the clamped offsets meet in one warp reduction, only for the chunk that holds g.
__device__ __forceinline__ int gmm_row_group_warp(const int32_t* __restrict__ offs, int G, int extent, int r, int& start,
                                                  int& end) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  auto clamp = [extent](int v) { return v < 0 ? 0 : (v > extent ? extent : v); };
  auto warp_max = [](int v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const int o = __shfl_xor_sync(0xFFFFFFFFu, v, d);
      v = o > v ? o : v;
    }
    return v;
  };
  int lmax = 0;  // this lane's largest clamped offset in the chunks passed
  for (int base = 0; base < G; base += 128) {
    int v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int g = base + 32 * u + lane;
      v[u] = g < G ? ld_after_wait(offs + g) : -1;  // past G: never above r, clamps to 0
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, v[u] > r);
      if (hit != 0) {
        const int first = __ffs(hit) - 1;
        const int c = clamp(v[u]);
        start = warp_max(lane < first && c > lmax ? c : lmax);
        end = __shfl_sync(0xFFFFFFFFu, c, first);
        return base + 32 * u + first;
      }
      const int c = clamp(v[u]);
      lmax = c > lmax ? c : lmax;
    }
  }
  start = warp_max(lmax);
  end = extent;
  return G;
}

// The first index i in [0, n) with s[i] > r, or n (s non-decreasing).
__device__ __forceinline__ int gmm_upper_bound(const int* s, int n, int r) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (s[mid] > r) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// RowGroups, tiles of BM rows: the offsets sanitised and scanned in dyn (2 G + 1 ints of shared memory: s,
// then the m-tiles per group and the tail pseudo-group, as an inclusive scan: tiles[G] is the m-tile count);
// `report`: this block records invalid offsets. Every thread of the block calls.
template <int THREADS, int BM>
__device__ void gmm_scan_row_tiles(const GmmArgs& p, int* dyn, int* warp_tmp, bool report) {
  int* s = dyn;
  int* tiles = dyn + p.G;
  gmm_load_offsets<THREADS>(p.offs, p.G, p.M, s, warp_tmp, p.err, report);
  for (int q = static_cast<int>(threadIdx.x); q <= p.G; q += THREADS) {
    const int lo = q > 0 ? s[q - 1] : 0, hi = q < p.G ? s[q] : p.M;
    tiles[q] = (hi - lo + BM - 1) / BM;
  }
  gmm_block_scan<THREADS>(tiles, p.G + 1, ScanSum{}, 0, warp_tmp);
}

// The group g and rows [m0, m1) of m-tile slot `slot` from gmm_scan_row_tiles' dyn; g == G is the rows past
// the last offset, written as 0. False when the slot has no tile.
template <int BM>
__device__ __forceinline__ bool gmm_row_tile_at(const GmmArgs& p, const int* dyn, int slot, int& g, int& m0, int& m1) {
  const int* s = dyn;
  const int* tiles = dyn + p.G;
  g = gmm_upper_bound(tiles, p.G + 1, slot);
  if (g > p.G) return false;
  const int tile = slot - (g > 0 ? tiles[g - 1] : 0);
  const int lo = g > 0 ? s[g - 1] : 0, hi = g < p.G ? s[g] : p.M;
  m0 = lo + tile * BM;
  m1 = m0 + BM < hi ? m0 + BM : hi;
  return true;
}

// RowGroups: the group g and rows [m0, m1) of this block's m-tile slot (blockIdx.y) for tiles of BM rows
// (the grid bounds the slots, ceil(M / BM) + G + 1; false when the slot has no tile).
template <int THREADS, int BM>
__device__ bool gmm_row_tile(const GmmArgs& p, int* dyn, int* warp_tmp, int& g, int& m0, int& m1) {
  gmm_scan_row_tiles<THREADS, BM>(p, dyn, warp_tmp, blockIdx.x == 0 && blockIdx.y == 0);
  return gmm_row_tile_at<BM>(p, dyn, static_cast<int>(blockIdx.y), g, m0, m1);
}

// ---- shared epilogue pieces ------------------------------------------------------------------------------

// One value at element offset `off` of C, in C's dtype.
template <class T>
__device__ __forceinline__ void gmm_store_at(const GmmArgs& p, int64_t off, float v) {
  if (p.out_f32) static_cast<float*>(p.c)[off] = v;
  else static_cast<T*>(p.c)[off] = gemv_from_f32<T>(v);
}

template <class T>
__device__ __forceinline__ void gmm_store(const GmmArgs& p, int64_t g, int m, int64_t n, float v) {
  const int64_t row = p.c_rows ? p.c_rows[m] : m;
  gmm_store_at<T>(p, g * p.c_sg + row * p.c_sm + n * p.c_sn, v);
}

// Zeros into C rows [m0, m1) x columns [n0, n0 + ncols) (the rows past the last offset).
template <class T, int THREADS>
__device__ void gmm_store_zeros(const GmmArgs& p, int64_t cg, int m0, int m1, int64_t n0, int ncols) {
  for (int i = static_cast<int>(threadIdx.x); i < (m1 - m0) * ncols; i += THREADS) {
    const int m = m0 + i / ncols;
    const int64_t n = n0 + i % ncols;
    if (n < p.N) gmm_store<T>(p, cg, m, n, 0.f);
  }
}

__device__ __forceinline__ int64_t gmm_a_row(const GmmArgs& p, int m) { return p.a_rows ? p.a_rows[m] : m; }

// ---- decode: matrix-vector per group ----------------------------------------------------------------------

inline constexpr int kDecThreads = 256;
inline constexpr int kDecWarps = kDecThreads / 32;
inline constexpr int kDecRows = 4;  // A rows of one group per block (runtime count <= this)
inline constexpr int kDecR = 2;     // weight rows per warp group: one column pair (gate, up) with act
inline constexpr int kDecU = 2;     // 16-byte chunks per weight row per unrolled step: kDecU * kDecR loads in flight
// TUNE (H200, `kiln bench ops --filter 'grouped_mm/bf16/T1/|moe/bf16/T1/|moe/e4m3'`, 2026-12-03): with one A
// row per block (MT = 1) this is the best of R = 2, 4, 8 weight rows per warp group and U = 1, 2, 4.

// Output columns per block for a given split (warps per weight-row group).
__host__ __device__ constexpr int gmm_decode_cols_per_block(int split, bool act) {
  return (kDecWarps / split) * (act ? kDecR / 2 : kDecR);
}

// grid = (ceil(N / gmm_decode_cols_per_block(split, act)), M); no dynamic shared memory.
// vec: A rows, B's weight rows and their strides are 16-byte aligned, K % (16 / sizeof(T)) == 0, unit K
// strides. Otherwise every element is loaded on its own through the strides.
// F8: B is FP8 with block scales (see GmmArgs; the launcher takes this path only with vec): each 16-byte
// load holds 16 weights, dequantised in registers (value x its block's scale, f32) against 16 activations.
// MT: A rows of one group per block, kDecRows, or 1 where every group is known to hold at most a few rows
// (decode: fewer accumulators, more blocks resident).
// MINB: blocks per SM the registers must allow (__launch_bounds__): 1 (the compiler's choice, 56 registers
// for 16-bit inputs: 4 blocks per SM), or 6 (at most 40 registers, a small spill; opt-in), which fits a
// one-token product's grid of 768 blocks (8 experts x 768 column pairs) into one round but measured slower.
// ORDER, where the dependent-launch wait and trigger go (kernels/pdl.cuh): kDecAtOnce, dependents may start at
// once and the kernel waits before its first load (only the launch overlaps the previous kernel);
// kDecAfterWait, dependents start only after the wait (GmmArgs::dependents_after_wait), so that one which
// reads its row groups early finds their writer complete; kDecEarly (MT = 1 with row_groups and
// GmmArgs::groups_before_wait), the row groups read and the first weight loads issued before the wait, then
// the dependents let start. Each its own instance, so that the usual one keeps its code.
inline constexpr int kDecAtOnce = 0, kDecAfterWait = 1, kDecEarly = 2;
template <class T, bool F8 = false, int MT = kDecRows, int MINB = 1, int ORDER = kDecAtOnce>
__global__ void __launch_bounds__(kDecThreads, MINB) gmm_decode_kernel(GmmArgs p, int split, bool vec) {
  constexpr int R = kDecR, U = kDecU;
  constexpr int VEC = gemv_vec_elems<T>();
  __shared__ float partial[kDecWarps * R * MT];
  __shared__ int slot_row[kDecWarps];  // fused combine: the product row of each slot
  static_assert(ORDER != kDecEarly || MT == 1, "the early instance is the one-row one");
  constexpr bool early = ORDER == kDecEarly;
  bool waited = !early;
  if constexpr (ORDER == kDecAtOnce) pdl_allow_dependents();
  if constexpr (!early) pdl_wait();
  if constexpr (ORDER == kDecAfterWait) pdl_allow_dependents();
  auto wait_once = [&] {
    if (!waited) {
      pdl_wait();
      pdl_allow_dependents();
      waited = true;
    }
  };

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int grp = warp / split;
  // Fused combine (GmmArgs::comb_weights): every warp group its own product row, all on the block's columns.
  const bool fuse = MT == 1 && p.comb_weights != nullptr;
  const int j = fuse ? grp : static_cast<int>(blockIdx.y);
  const int gcol = fuse ? 0 : grp;  // the warp group's column slot in the block
  const int groups = kDecWarps / split;
  const int cols_per_group = p.act ? R / 2 : R;
  const int block_cols = fuse ? cols_per_group : groups * cols_per_group;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * block_cols;
  if (fuse && threadIdx.x < static_cast<unsigned>(p.M)) {
    const int s = early ? __ldcg(p.comb_pairs + threadIdx.x) : p.comb_pairs[threadIdx.x];  // early: from L2
    slot_row[s < 0 ? 0 : (s >= p.M ? p.M - 1 : s)] = static_cast<int>(threadIdx.x);
  }
  int g, rows;
  if (p.row_groups) {  // the row's group given: one row per block (fused: per warp group)
    g = early ? __ldcg(p.row_groups + j) : p.row_groups[j];  // early: read before the wait, from L2
    g = g < 0 ? 0 : (g >= p.G ? p.G - 1 : g);
    rows = 1;
  } else {
    // Each warp finds row j's group itself (one round trip for the offsets, no barrier before the weight
    // loads); one block records invalid offsets.
    if (blockIdx.x == 0 && blockIdx.y == 0) gmm_report_offsets<kDecThreads>(p.offs, p.G, p.M, p.err);
    int start, end;
    g = gmm_row_group_warp(p.offs, p.G, p.M, j, start, end);  // start <= j < end unless g == G
    if (g == p.G) {  // row j lies past the last offset: zeros
      for (int i = static_cast<int>(threadIdx.x); i < block_cols; i += kDecThreads)
        if (col0 + i < p.N) gmm_store<T>(p, 0, j, col0 + i, 0.f);
      return;
    }
    if ((j - start) % MT != 0) return;                   // another block takes row j with its run
    rows = end - j < MT ? end - j : MT;
  }

  const int t = (warp % split) * 32 + lane;
  const int gt = 32 * split;
  const T* __restrict__ a = static_cast<const T*>(p.a);
  const T* __restrict__ b = static_cast<const T*>(p.b);

  // Weight rows (B's columns) of this warp group, clamped into range; the stores are masked instead.
  int64_t woff[R];
  const float* wscale[R];  // F8: the scale row of each weight row's blocks
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int64_t n;
    if (p.act) {
      n = col0 + gcol;
      if (n >= p.N) n = p.N - 1;
      n += r ? p.N : 0;  // r = 0: gate row n, r = 1: up row N + n
    } else {
      n = col0 + gcol * R + r;
      if (n >= p.N) n = p.N - 1;
    }
    woff[r] = static_cast<int64_t>(g) * p.b_sg + n * p.b_sn;
    if constexpr (F8) wscale[r] = p.b_scales + static_cast<int64_t>(g) * p.bs_sg + (n / p.b_bn) * p.bs_sn;
  }
  int64_t xoff[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) xoff[m] = gmm_a_row(p, j + (m < rows ? m : rows - 1)) * p.a_sm;

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

  if constexpr (F8) {
    // 16 weights per chunk; a chunk lies in one scale block (b_bk % 16 == 0). Each step issues the U8 x R
    // weight loads and their scale loads together (one memory round trip), then computes.
    constexpr int U8 = 4;
    const uint8_t* __restrict__ b8 = static_cast<const uint8_t*>(p.b);
    const int chunks = p.K / 16;
    for (int c = t; c < chunks; c += U8 * gt) {
      uint4 wv[U8][R];
      float wsc[U8][R];
#pragma unroll
      for (int u = 0; u < U8; ++u) {
        const int cu = c + u * gt;
        if (cu < chunks) {
          const int kb = p.b_bk_shift >= 0 ? (cu * 16) >> p.b_bk_shift : (cu * 16) / p.b_bk;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint4* const wp = reinterpret_cast<const uint4*>(b8 + woff[r]) + cu;
            wv[u][r] = early ? gemv_load_stream_early(wp) : gemv_load_stream(wp);  // early: kept before the wait
            wsc[u][r] = __ldg(wscale[r] + kb);
          }
        }
      }
      // Early (the MoE block's down product): every kernel before the block has completed (gate_up let this
      // one start only after its own wait) and none of the block writes the experts; the activations come after.
      wait_once();
#pragma unroll
      for (int u = 0; u < U8; ++u) {
        const int cu = c + u * gt;
        if (cu >= chunks) break;
        float wf[R][16];
#pragma unroll
        for (int r = 0; r < R; ++r) fp8_unpack16(wv[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m < rows) {
            float xf[16];
            fp8_load_x16<T>(a + xoff[m] + static_cast<int64_t>(cu) * 16, xf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float d = 0.f;
#pragma unroll
              for (int e = 0; e < 16; ++e) d = fmaf(wf[r][e], xf[e], d);
              acc[r][m] = fmaf(d, wsc[u][r], acc[r][m]);
            }
          }
        }
      }
    }
  } else if (vec) {
    const int chunks = p.K / VEC;
    int c = t;
    for (; c + (U - 1) * gt < chunks; c += U * gt) {
      uint4 wv[U][R];
      if (!waited) {  // early: the first step's weight loads, in program order before the wait
        gemv_load_tail<U, R>(wv, b, woff, c, gt, chunks);
        wait_once();
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r)
            wv[u][r] = gemv_load_stream(reinterpret_cast<const uint4*>(b + woff[r]) + c + u * gt);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float wf[R][VEC];
#pragma unroll
        for (int r = 0; r < R; ++r) gemv_unpack<T>(wv[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m < rows) {
            float xf[VEC];
            gemv_unpack<T>(ld_after_wait(reinterpret_cast<const uint4*>(a + xoff[m]) + c + u * gt), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
          }
        }
      }
    }
    // The rest (fewer than U chunks for this thread): every load issued before any is used, one round trip.
    if (c < chunks) {
      uint4 wv[U][R];
      gemv_load_tail<U, R>(wv, b, woff, c, gt, chunks);
      wait_once();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u * gt >= chunks) break;
        float wf[R][VEC];
#pragma unroll
        for (int r = 0; r < R; ++r) gemv_unpack<T>(wv[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m < rows) {
            float xf[VEC];
            gemv_unpack<T>(ld_after_wait(reinterpret_cast<const uint4*>(a + xoff[m]) + c + u * gt), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int e = 0; e < VEC; ++e) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
          }
        }
      }
    }
  } else {
    wait_once();
#pragma unroll 1
    for (int i = t; i < p.K; i += gt) {
      float wf[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wf[r] = gemv_to_f32(b[woff[r] + static_cast<int64_t>(i) * p.b_sk]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < rows) {
          const float xv = gemv_to_f32(a[xoff[m] + static_cast<int64_t>(i) * p.a_sk]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][m] = fmaf(wf[r], xv, acc[r][m]);
        }
      }
    }
  }

  wait_once();  // a thread with no chunk: before the stores
  gemv_publish_warp_sums<R, MT>(acc, partial, warp, lane);
  __syncthreads();

  if (fuse) {
    // One thread per column: each slot's product (its group's warps summed in order) times its weight, the
    // slots in order.
    const T* __restrict__ cw = static_cast<const T*>(p.comb_weights);
    for (int r = static_cast<int>(threadIdx.x); r < block_cols; r += kDecThreads) {
      const int64_t n = col0 + r;
      if (n >= p.N) continue;
      float sum = 0.f;
      for (int s = 0; s < p.M; ++s) {
        const int sr = slot_row[s], m = sr < 0 ? 0 : (sr >= p.M ? p.M - 1 : sr);  // (comb_pairs: a permutation)
        float v = partial[((m * split) * R + r) * MT];
        for (int q = 1; q < split; ++q) v += partial[((m * split + q) * R + r) * MT];
        sum += gemv_to_f32(cw[s]) * v;
      }
      static_cast<T*>(p.comb_out)[n] = gemv_from_f32<T>(sum);
    }
    return;
  }

  // One thread per (A row, output column of the block); the group's warps are summed in order.
  for (int i = static_cast<int>(threadIdx.x); i < block_cols * MT; i += kDecThreads) {
    const int m = i / block_cols, lc = i % block_cols;
    const int64_t n = col0 + lc;
    if (m >= rows || n >= p.N) continue;
    float v;
    if (p.act) {
      float gs = partial[((lc * split) * R + 0) * MT + m], us = partial[((lc * split) * R + 1) * MT + m];
      for (int q = 1; q < split; ++q) {
        gs += partial[((lc * split + q) * R + 0) * MT + m];
        us += partial[((lc * split + q) * R + 1) * MT + m];
      }
      v = moe_math::silu_mul(gs, us);
    } else {
      const int gq = lc / R, r = lc % R;
      v = partial[((gq * split) * R + r) * MT + m];
      for (int q = 1; q < split; ++q) v += partial[((gq * split + q) * R + r) * MT + m];
    }
    gmm_store<T>(p, 0, j + m, n, v);
  }
}

// ---- tiles -------------------------------------------------------------------------------------------------

inline constexpr int kTileThreads = 128;  // 4 warps, 2 x 2 over the tile, 32 x 32 each
inline constexpr int kBM = 64, kBN = 64, kBK = 32;
inline constexpr int kCLd = kBN + 4;  // f32 staging tile row stride (a multiple of 4 for WMMA stores)

template <class T>
constexpr int gmm_tile_ld() {
  return kBK + static_cast<int>(16 / sizeof(T));  // rows stay 16-byte aligned, banks shift per row
}
// K steps in flight on the bf16/f16 vector path (a cp.async ring of A and B tiles); the f32 and scalar
// paths use one stage. Three stages of 10 KB, with the 2 G + 1 ints of offsets (G <= kGmmMaxGroups), stay
// under the 48 KB a block gets without opting in.
template <class T>
constexpr int gmm_tile_stages() {
  return std::is_same_v<T, float> ? 1 : 3;
}
template <class T>
constexpr int gmm_tile_stage_elems() {
  return (kBM + kBN) * gmm_tile_ld<T>();
}
template <class T>
constexpr int gmm_tile_smem_bytes() {
  const int ab = gmm_tile_stages<T>() * gmm_tile_stage_elems<T>() * static_cast<int>(sizeof(T));
  const int cs = kBM * kCLd * static_cast<int>(sizeof(float));
  return ab > cs ? ab : cs;
}
static_assert(3 * (kBM + kBN) * (kBK + 8) * 2 + (2 * kGmmMaxGroups + 1) * 4 + 64 <= 48 * 1024,
              "tile kernel shared memory exceeds the default 48 KB");

// 16 bytes global -> shared without a register round trip; src_bytes = 0 writes 16 zero bytes (src must
// still be a valid address).
__device__ __forceinline__ void gmm_cp_async16(void* smem, const void* gmem, bool pred) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void gmm_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gmm_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Output columns per tile: with act, half the product's columns (gate and up halves).
__host__ __device__ constexpr int gmm_tile_cols(bool act) { return act ? kBN / 2 : kBN; }

template <class T>
struct WmmaType {
  using type = std::conditional_t<std::is_same_v<T, BFloat16>, __nv_bfloat16, __half>;
};

// RowGroups: grid = (ceil(N / gmm_tile_cols(act)), ceil(M / kBM) + G + 1), dynamic shared 2 G + 1 ints.
// KGroups / Batched: grid = (ceil(N / gmm_tile_cols(act)), ceil(M / kBM), G); KGroups: G ints.
// The column tiles are the fastest grid dim: the blocks resident together share a few A tiles and walk
// across one group's B (an expert's weights, a few MB) while it sits in L2; the other order would stream
// A from memory once per column tile.
// vec: unit K strides of A and B, 16-byte aligned bases and row/group strides, K % (16 / sizeof(T)) == 0
// (never for KGroups, whose K ranges start anywhere).
template <class T>
__global__ void __launch_bounds__(kTileThreads) gmm_tile_kernel(GmmArgs p, bool vec) {
  constexpr int LD = gmm_tile_ld<T>();
  constexpr int VEC = gemv_vec_elems<T>();
  constexpr bool kHalf = !std::is_same_v<T, float>;
  extern __shared__ int gmm_dyn[];
  __shared__ int warp_tmp[kTileThreads / 32];
  __shared__ __align__(128) unsigned char raw[gmm_tile_smem_bytes<T>()];
  T* As = reinterpret_cast<T*>(raw);  // [kBM][LD]: A(m, k) at As[m * LD + k]
  T* Bs = As + kBM * LD;              // [kBN][LD]: B(k, n) at Bs[n * LD + k] (column-major tile)
  float* Cs = reinterpret_cast<float*>(raw);  // [kBM][kCLd], after the K loop

  const int tid = static_cast<int>(threadIdx.x);
  const int ncols = gmm_tile_cols(p.act);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * ncols;
  int g, m0, m1, k0, k1;
  bool zero_rows = false;
  if (p.mode == GmmMode::RowGroups) {
    if (!gmm_row_tile<kTileThreads, kBM>(p, gmm_dyn, warp_tmp, g, m0, m1)) return;  // more slots than tiles
    k0 = 0;
    k1 = p.K;
    zero_rows = g == p.G;
  } else {
    g = static_cast<int>(blockIdx.z);
    m0 = static_cast<int>(blockIdx.y) * kBM;
    m1 = m0 + kBM < p.M ? m0 + kBM : p.M;
    k0 = 0;
    k1 = p.K;
    if (p.mode == GmmMode::KGroups) {
      int* s = gmm_dyn;
      gmm_load_offsets<kTileThreads>(p.offs, p.G, p.K, s, warp_tmp, p.err,
                                     blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0);
      k0 = g > 0 ? s[g - 1] : 0;
      k1 = s[g];
    }
  }
  // Only RowGroups has per-group C offsets through c_sg = 0; KGroups / Batched index C by g.
  const int64_t cg = p.mode == GmmMode::RowGroups ? 0 : g;
  if (zero_rows) {
    gmm_store_zeros<T, kTileThreads>(p, cg, m0, m1, n0, ncols);
    return;
  }

  const T* __restrict__ a = static_cast<const T*>(p.a) + static_cast<int64_t>(g) * p.a_sg;
  const T* __restrict__ b = static_cast<const T*>(p.b) + static_cast<int64_t>(g) * p.b_sg;
  // Product column of tile column jc (act: gate columns, then the matching up columns), clamped; and
  // whether it is a real output column.
  auto b_col = [&](int jc, bool& ok) -> int64_t {
    const int half = kBN / 2;
    int64_t n = p.act ? n0 + (jc < half ? jc : jc - half) : n0 + jc;
    ok = n < p.N;
    if (!ok) n = p.N - 1;
    return p.act && jc >= half ? n + p.N : n;
  };

  using namespace nvcuda;
  using W = typename WmmaType<T>::type;
  const int warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc[2][2];
  float acc[8][4];  // f32 path: rows ty * 8 + i, columns tx + 16 * jj
  if constexpr (kHalf) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) wmma::fill_fragment(fc[i][jj], 0.f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) acc[i][jj] = 0.f;
  }
  const int ty = tid / 16, tx = tid % 16;

  // f32 vector path: the next K step's 16-byte chunks are loaded into registers while the current one is
  // multiplied (a register double buffer); NA / NB chunks per thread (the bf16/f16 path below uses them
  // for its cp.async ring).
  constexpr int CPR = kBK / VEC;
  constexpr int NA = kBM * CPR / kTileThreads, NB = kBN * CPR / kTileThreads;
  static_assert(NA * kTileThreads == kBM * CPR && NB * kTileThreads == kBN * CPR, "tile / thread mismatch");
  uint4 ra[NA], rb[NB];
  auto load_vec = [&](int kt) {
#pragma unroll
    for (int q = 0; q < NA; ++q) {
      const int c = tid + q * kTileThreads;
      const int r = c / CPR, kc = c % CPR;
      const int m = m0 + r, k = kt + kc * VEC;
      ra[q] = make_uint4(0, 0, 0, 0);
      if (m < m1 && k < k1) ra[q] = *reinterpret_cast<const uint4*>(a + gmm_a_row(p, m) * p.a_sm + k);
    }
#pragma unroll
    for (int q = 0; q < NB; ++q) {
      const int c = tid + q * kTileThreads;
      const int jc = c / CPR, kc = c % CPR;
      const int k = kt + kc * VEC;
      bool ok;
      const int64_t n = b_col(jc, ok);
      rb[q] = make_uint4(0, 0, 0, 0);
      if (ok && k < k1) rb[q] = *reinterpret_cast<const uint4*>(b + n * p.b_sn + k);
    }
  };
  auto store_vec = [&] {
#pragma unroll
    for (int q = 0; q < NA; ++q) {
      const int c = tid + q * kTileThreads;
      *reinterpret_cast<uint4*>(As + (c / CPR) * LD + (c % CPR) * VEC) = ra[q];
    }
#pragma unroll
    for (int q = 0; q < NB; ++q) {
      const int c = tid + q * kTileThreads;
      *reinterpret_cast<uint4*>(Bs + (c / CPR) * LD + (c % CPR) * VEC) = rb[q];
    }
  };
  // One K step of tensor-core work on tiles at (as, bs).
  auto mma_step = [&](const T* as, const T* bs) {
    if constexpr (kHalf) {
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[i], reinterpret_cast<const W*>(as + (wm * 32 + i * 16) * LD + kk), LD);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
          wmma::load_matrix_sync(fb[jj], reinterpret_cast<const W*>(bs + (wn * 32 + jj * 16) * LD + kk), LD);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) wmma::mma_sync(fc[i][jj], fa[i], fb[jj], fc[i][jj]);
      }
    }
  };

  bool done = false;
  if constexpr (kHalf) {
    if (vec) {
      // bf16/f16 vector path: a ring of S stages filled by cp.async, S - 1 K steps ahead of the tensor
      // cores. Iteration i waits for step i's group (S - 2 younger groups may still fly), then the barrier
      // both publishes step i's tiles and retires step i - 1's stage, which the next issue overwrites.
      // Every iteration commits one group (empty past the end), so the group count stays exact.
      constexpr int S = gmm_tile_stages<T>();
      constexpr int SE = gmm_tile_stage_elems<T>();
      auto issue = [&](int kt, int stage) {
        T* as = As + stage * SE;
        T* bs = as + kBM * LD;
#pragma unroll
        for (int q = 0; q < NA; ++q) {
          const int c = tid + q * kTileThreads;
          const int r = c / CPR, kc = c % CPR;
          const int m = m0 + r, k = kt + kc * VEC;
          const bool ok = m < m1 && k < k1;
          gmm_cp_async16(as + r * LD + kc * VEC, ok ? a + gmm_a_row(p, m) * p.a_sm + k : a, ok);
        }
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          const int c = tid + q * kTileThreads;
          const int jc = c / CPR, kc = c % CPR;
          const int k = kt + kc * VEC;
          bool ok;
          const int64_t n = b_col(jc, ok);
          ok = ok && k < k1;
          gmm_cp_async16(bs + jc * LD + kc * VEC, ok ? b + n * p.b_sn + k : b, ok);
        }
      };
      const int steps = (k1 - k0 + kBK - 1) / kBK;
#pragma unroll
      for (int st = 0; st < S - 1; ++st) {
        if (st < steps) issue(k0 + st * kBK, st);
        gmm_cp_async_commit();
      }
      for (int i = 0; i < steps; ++i) {
        gmm_cp_async_wait<S - 2>();
        __syncthreads();
        const int next = i + S - 1;
        if (next < steps) issue(k0 + next * kBK, next % S);
        gmm_cp_async_commit();
        const T* as = As + (i % S) * SE;
        mma_step(as, as + kBM * LD);
      }
      gmm_cp_async_wait<0>();
      __syncthreads();  // the ring becomes Cs
      done = true;
    }
  }

  if (!done && vec && k0 < k1) load_vec(k0);

  for (int kt = k0; kt < k1 && !done; kt += kBK) {
    // A tile: rows m0.. (>= m1: 0), K kt.. (>= k1: 0); B tile likewise over its columns.
    if (vec) {
      store_vec();
      __syncthreads();
      if (kt + kBK < k1) load_vec(kt + kBK);
    } else {
      const bool a_kfast = p.a_sk == 1;
      for (int i = tid; i < kBM * kBK; i += kTileThreads) {
        const int r = a_kfast ? i / kBK : i % kBM, kk = a_kfast ? i % kBK : i / kBM;
        const int m = m0 + r, k = kt + kk;
        T v = T(0.f);
        if (m < m1 && k < k1) v = a[gmm_a_row(p, m) * p.a_sm + static_cast<int64_t>(k) * p.a_sk];
        As[r * LD + kk] = v;
      }
      const bool b_kfast = p.b_sk == 1;
      for (int i = tid; i < kBN * kBK; i += kTileThreads) {
        const int jc = b_kfast ? i / kBK : i % kBN, kk = b_kfast ? i % kBK : i / kBN;
        const int k = kt + kk;
        bool ok;
        const int64_t n = b_col(jc, ok);
        T v = T(0.f);
        if (ok && k < k1) v = b[static_cast<int64_t>(k) * p.b_sk + n * p.b_sn];
        Bs[jc * LD + kk] = v;
      }
      __syncthreads();
    }
    if constexpr (kHalf) {
      mma_step(As, Bs);
    } else {
#pragma unroll 4
      for (int kk = 0; kk < kBK; ++kk) {
        float av[8], bv[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) av[i] = As[(ty * 8 + i) * LD + kk];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) bv[jj] = Bs[(tx + 16 * jj) * LD + kk];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) acc[i][jj] = fmaf(av[i], bv[jj], acc[i][jj]);
      }
    }
    __syncthreads();  // the tiles are rewritten by the next step (or become Cs)
  }

  if constexpr (kHalf) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * kCLd + wn * 32 + jj * 16, fc[i][jj], kCLd,
                                wmma::mem_row_major);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) Cs[(ty * 8 + i) * kCLd + tx + 16 * jj] = acc[i][jj];
  }
  __syncthreads();
  for (int i = tid; i < kBM * ncols; i += kTileThreads) {
    const int r = i / ncols, jc = i % ncols;
    const int m = m0 + r;
    const int64_t n = n0 + jc;
    if (m >= m1 || n >= p.N) continue;
    const float v = p.act ? moe_math::silu_mul(Cs[r * kCLd + jc], Cs[r * kCLd + jc + kBN / 2]) : Cs[r * kCLd + jc];
    gmm_store<T>(p, cg, m, n, v);
  }
}

}  // namespace kiln::cuda::kernels
