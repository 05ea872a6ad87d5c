// Tensor-core attention tiles (sm_80+ mma.sync m16n8k16, f16/bf16 in, f32 accumulate) for head dims 64 and
// 128: the flash prefill kernel here and the split-KV decode kernel (decode_attention.cuh) share one warp-level
// step.
//
// A warp owns 16 query rows (lane l holds rows l/4 and l/4 + 8 of every fragment) and keeps their q
// fragments, output accumulator o[16 x D], running max m and running sum l in registers. For each tile of
// keys in shared memory it computes S = q k^T with mma (k fragments by ldmatrix), masks keys beyond each
// row's limit, updates the online softmax in the log2 domain (exp2 of scores pre-multiplied by
// scale * log2(e)), rounds P to 16 bits and accumulates o += P v (v fragments by ldmatrix.trans). Lq x Lkv
// is never materialised. K/V tiles stream through shared memory with cp.async, double buffered; rows of the
// shared tiles are padded by 8 elements (16 bytes) so ldmatrix's eight row addresses fall in distinct bank
// groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/device_error.h"
#include "cuda/kernels/cp_async.cuh"
#include "cuda/kernels/pdl.cuh"
#include "ops/attention_math.h"

namespace kiln::cuda::attn {

namespace am = attention_math;
using kernels::pdl_allow_dependents;

constexpr int kPad = 8;       // elements of padding per shared-memory row
constexpr int kTileKeys = 64;  // keys per K/V tile
constexpr int kThreads = 128;  // 4 warps
constexpr float kLog2e = 1.4426950408889634f;

// 16-bit element types as raw bits in memory; the traits convert and pack.
struct Bf16Tag {};
struct F16Tag {};

template <class Tag>
struct Mma;
template <>
struct Mma<Bf16Tag> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static uint16_t from_float(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<F16Tag> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ static uint16_t from_float(float x) { return __half_as_ushort(__float2half_rn(x)); }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// Per-warp state for 16 query rows.
template <int D>
struct WarpState {
  uint32_t q[D / 16][4];
  float o[D / 8][4];
  float m[2], l[2];  // rows lane/4 and lane/4 + 8; l is this lane's partial sum (its quad adds up at the end)
};

// q fragments of 16 rows from a shared tile (row stride ld elements).
template <int D>
__device__ __forceinline__ void load_q_frags(WarpState<D>& st, const uint16_t* qs, int ld) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(st.q[kk], qs + ((mi & 1) * 8 + r) * ld + kk * 16 + (mi >> 1) * 8);
}
// An empty softmax state: o = 0, m = -inf, l = 0.
template <int D>
__device__ __forceinline__ void clear_state(WarpState<D>& st) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
}
// The q fragments and an empty softmax state.
template <int D>
__device__ __forceinline__ void load_q(WarpState<D>& st, const uint16_t* qs, int ld) {
  load_q_frags<D>(st, qs, ld);
  clear_state<D>(st);
}

// An attention mask read by the tiles: none, bool (true = attend) or f32 added to the scaled scores. `row`
// holds the element offset of each of the lane's two rows; key j of a row is at row + j * col. Rows past
// Lq must have e = 0 so that their (nonexistent) mask rows are never read.
enum TileMask { kNoMask = 0, kBoolMask = 1, kFloatMask = 2 };
struct MaskRows {
  const void* base;
  int64_t row[2];
  int64_t col;
};

// Where element (row, col) of a shared K or V tile lies, rows counted from the step's first key.
// Padded rows, ld elements apart:
struct PaddedRows {
  const uint16_t* base;
  int ld;
  __device__ __forceinline__ const uint16_t* at(int row, int col) const { return base + row * ld + col; }
};
// The 128-byte swizzle of kernels/wgmma.cuh (what TMA writes): 64-column blocks of Rows rows x 128 bytes, the
// 16-byte chunk c of row r at position c ^ (r % 8); base is row 0, column 0 of the step, whose first row is a
// multiple of 8 within the tile.
template <int Rows>
struct SwizzledRows {
  const uint16_t* base;
  __device__ __forceinline__ const uint16_t* at(int row, int col) const {
    return base + ((col >> 6) * (Rows * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3));
  }
};

// One step over NK keys (key0 is the index of the first): kt/vt address the shared tiles from that key's row.
// Key j is visible to the lane's row rr when j < e[rr] (and the mask, if any, allows it).
template <class Tag, int D, int NK, int Mask = kNoMask, class Tile>
__device__ __forceinline__ void warp_step_tiles(WarpState<D>& st, const Tile& kt, const Tile& vt, int64_t key0,
                                                const int64_t (&e)[2], float scale_log2,
                                                const MaskRows& mask = MaskRows{}) {
  static_assert(NK % 16 == 0 && D % 16 == 0, "tile sizes");
  const int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8, t = lane % 4;
  float s[NK / 8][4];
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < NK / 8; j += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, kt.at(8 * (j + (mi >> 1)) + r, kk * 16 + (mi & 1) * 8));
      Mma<Tag>::mma(s[j], st.q[kk], b[0], b[1]);
      Mma<Tag>::mma(s[j + 1], st.q[kk], b[2], b[3]);
    }
  }
  const bool need_mask = key0 + NK > (e[0] < e[1] ? e[0] : e[1]);
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      float v = s[j][x] * scale_log2;
      const int64_t key = key0 + 8 * j + 2 * t + (x & 1);
      if (need_mask && key >= e[x >> 1]) {
        v = -INFINITY;
      } else if constexpr (Mask == kBoolMask) {
        if (!static_cast<const bool*>(mask.base)[mask.row[x >> 1] + key * mask.col]) v = -INFINITY;
      } else if constexpr (Mask == kFloatMask) {
        v += static_cast<const float*>(mask.base)[mask.row[x >> 1] + key * mask.col] * kLog2e;
      }
      s[j][x] = v;
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = st.m[rr];
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * rr], s[j][2 * rr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with every key so far masked keeps m = -inf; subtracting 0 then makes its p exactly 0.
    const float base = mx == -INFINITY ? 0.f : mx;
    const float corr = exp2f(st.m[rr] - base);
    st.m[rr] = mx;
    float rs = 0.f;
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) {
      s[j][2 * rr] = exp2f(s[j][2 * rr] - base);
      s[j][2 * rr + 1] = exp2f(s[j][2 * rr + 1] - base);
      rs += s[j][2 * rr] + s[j][2 * rr + 1];
    }
    st.l[rr] = st.l[rr] * corr + rs;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      st.o[n][2 * rr] *= corr;
      st.o[n][2 * rr + 1] *= corr;
    }
  }
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    const uint32_t a[4] = {Mma<Tag>::pack(s[2 * kk][0], s[2 * kk][1]), Mma<Tag>::pack(s[2 * kk][2], s[2 * kk][3]),
                           Mma<Tag>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           Mma<Tag>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vt.at(16 * kk + (mi & 1) * 8 + r, 8 * (n + (mi >> 1))));
      Mma<Tag>::mma(st.o[n], a, b[0], b[1]);
      Mma<Tag>::mma(st.o[n + 1], a, b[2], b[3]);
    }
  }
}

// warp_step_tiles over padded tiles: ks/vs point at the step's first key row, rows ld elements apart.
template <class Tag, int D, int NK, int Mask = kNoMask>
__device__ __forceinline__ void warp_step(WarpState<D>& st, const uint16_t* ks, const uint16_t* vs, int ld,
                                          int64_t key0, const int64_t (&e)[2], float scale_log2,
                                          const MaskRows& mask = MaskRows{}) {
  warp_step_tiles<Tag, D, NK, Mask>(st, PaddedRows{ks, ld}, PaddedRows{vs, ld}, key0, e, scale_log2, mask);
}

// The quad's total of l for both rows (every lane of the quad gets it).
template <int D>
__device__ __forceinline__ void finish_l(WarpState<D>& st) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    st.l[rr] += __shfl_xor_sync(0xffffffffu, st.l[rr], 1);
    st.l[rr] += __shfl_xor_sync(0xffffffffu, st.l[rr], 2);
  }
}

// Loads keys [key0, key0 + 64) of one head (rows `row_stride` apart, D contiguous elements each, 16-byte
// aligned) into a shared tile; keys at or beyond `limit` are zero-filled without being read.
template <int D>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t row_stride, int64_t key0,
                                          int64_t limit) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  constexpr int ld = D + kPad;
#pragma unroll
  for (int i = threadIdx.x; i < kTileKeys * kChunks; i += kThreads) {
    const int row = i / kChunks, c = i % kChunks;
    const int64_t key = key0 + row;
    const bool valid = key < limit;
    cp_async16(dst + row * ld + c * 8, valid ? src + key * row_stride + c * 8 : src, valid);
  }
}

struct FlashParams {
  uint16_t* out;  // contiguous [outer, H, Lq, D]
  const uint16_t *q, *k, *v;
  const void* mask;  // bool or f32 per L.mask (non-causal only), indexed by L's mask strides
  am::Layout L;
  float scale_log2;
  int64_t q_tiles;  // ceil(Lq / rows per block)
  // Block order: false: by (batch, head), each one's query tiles heaviest first (its K/V stay in L2 while
  // its tiles run); true: every head's heaviest tiles first (causal work balanced across the waves; for
  // K/V small enough to stay in L2 together).
  bool tiles_major = false;
};

// Prefill: one block per (64 query rows, head, outer index); warp w owns rows 16w..16w+15 of the block.
// Causal (top-left): row i sees keys <= i, so the block stops at key m0 + 63 and a warp skips tiles that
// start past its last row. Shared memory: Q tile + 2 stages of K and V tiles, all [64][D + 8].
template <class Tag, int D, bool Causal, int Mask>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(FlashParams p) {
  constexpr int ld = D + kPad;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* qs = sm;
  uint16_t* ks = qs + kTileKeys * ld;          // [2][64][ld]
  uint16_t* vs = ks + 2 * kTileKeys * ld;      // [2][64][ld]
  const am::Layout& L = p.L;
  const int64_t x = blockIdx.x;
  const int64_t qt = p.q_tiles - 1 - x % p.q_tiles;  // heaviest causal tiles first
  const int64_t task = x / p.q_tiles;
  const int64_t h = task % L.heads, o = task / L.heads;
  const am::Offsets off = am::batch_offsets(L, o, h);
  const int64_t m0 = qt * kTileKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const int64_t kv_end = Causal ? (m0 + kTileKeys < L.lkv ? m0 + kTileKeys : L.lkv) : L.lkv;
  const int64_t tiles = (kv_end + kTileKeys - 1) / kTileKeys;
  if (tiles > 0) {
    load_tile<D>(ks, p.k + off.k, L.k_row, 0, L.lkv);
    load_tile<D>(vs, p.v + off.v, L.v_row, 0, L.lkv);
  }
  cp_async_commit();
  // The Q tile with plain loads (any strides); rows past Lq are zero.
  for (int i = threadIdx.x; i < kTileKeys * D; i += kThreads) {
    const int rr = i / D, c = i % D;
    const int64_t row = m0 + rr;
    qs[rr * ld + c] = row < L.lq ? p.q[off.q + row * L.q_row + c * L.q_col] : uint16_t(0);
  }
  __syncthreads();
  WarpState<D> st;
  load_q<D>(st, qs + warp * 16 * ld, ld);
  const int64_t row_lo = m0 + warp * 16 + lane / 4;
  int64_t e[2];
  MaskRows mrows{p.mask, {0, 0}, L.m_col};
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t row = row_lo + 8 * rr;
    e[rr] = Causal ? (row + 1 < L.lkv ? row + 1 : L.lkv) : L.lkv;
    if (Mask != kNoMask && row >= L.lq) e[rr] = 0;  // never read a mask row past Lq
    mrows.row[rr] = off.m + row * L.m_row;
  }
  const int64_t warp_last_row = m0 + warp * 16 + 15;
  for (int64_t t = 0; t < tiles; ++t) {
    const int stage = static_cast<int>(t & 1);
    if (t + 1 < tiles) {
      const int nxt = stage ^ 1;
      load_tile<D>(ks + nxt * kTileKeys * ld, p.k + off.k, L.k_row, (t + 1) * kTileKeys, L.lkv);
      load_tile<D>(vs + nxt * kTileKeys * ld, p.v + off.v, L.v_row, (t + 1) * kTileKeys, L.lkv);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t key0 = t * kTileKeys;
    if (!Causal || key0 <= warp_last_row)
      warp_step<Tag, D, kTileKeys, Mask>(st, ks + stage * kTileKeys * ld, vs + stage * kTileKeys * ld, ld, key0, e,
                                         p.scale_log2, mrows);
    __syncthreads();  // the stage is overwritten by the load at the top of iteration t + 1
  }
  finish_l<D>(st);
  const int t4 = lane % 4;
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t row = row_lo + 8 * rr;
    if (row >= L.lq) continue;
    const float inv = st.l[rr] > 0.f ? 1.f / st.l[rr] : 0.f;  // no visible key: 0
    uint32_t* orow = reinterpret_cast<uint32_t*>(p.out + (task * L.lq + row) * D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      orow[(8 * n + 2 * t4) / 2] = Mma<Tag>::pack(st.o[n][2 * rr] * inv, st.o[n][2 * rr + 1] * inv);
  }
}

}  // namespace kiln::cuda::attn
