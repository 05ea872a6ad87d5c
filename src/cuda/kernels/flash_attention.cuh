// Tensor-core attention tiles (sm_80+ mma.sync m16n8k16, f16/bf16 in, f32 accumulate) for head dims 64 and
// 128: the flash prefill kernel and the split-KV decode kernel share one warp-level step.
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

#include <cooperative_groups.h>
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
constexpr int kMaxSplits = 128;  // splits of the decode kernel
constexpr int kMaxClusterSplits = 8;  // splits combined inside a cluster (the portable cluster size)
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
__device__ __forceinline__ void load_q(WarpState<D>& st, const uint16_t* qs, int ld) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(st.q[kk], qs + ((mi & 1) * 8 + r) * ld + kk * 16 + (mi >> 1) * 8);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
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

// One step over NK keys (key0 is the index of the first): ks/vs point at that key's row of the shared tiles.
// Key j is visible to the lane's row rr when j < e[rr] (and the mask, if any, allows it).
template <class Tag, int D, int NK, int Mask = kNoMask>
__device__ __forceinline__ void warp_step(WarpState<D>& st, const uint16_t* ks, const uint16_t* vs, int ld,
                                          int64_t key0, const int64_t (&e)[2], float scale_log2,
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
      ldmatrix_x4(b, ks + (8 * (j + (mi >> 1)) + r) * ld + kk * 16 + (mi & 1) * 8);
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
      ldmatrix_x4_trans(b, vs + (16 * kk + (mi & 1) * 8 + r) * ld + 8 * (n + (mi >> 1)));
      Mma<Tag>::mma(st.o[n], a, b[0], b[1]);
      Mma<Tag>::mma(st.o[n + 1], a, b[2], b[3]);
    }
  }
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

struct DecodeParams {
  uint16_t* out;                    // contiguous [B, Hq, Lq, D]
  float *part_o, *part_m, *part_l;  // [B * Hq * Lq, splits, D], [B * Hq * Lq, splits] (splits > 1)
  const uint16_t *q, *k, *v;
  const int32_t* lengths;
  am::Layout L;  // decode layout: outer = B (strides bq/bk/bv[0]), heads = Hq, gk = gv = Hq / Hkv
  float scale_log2;
  int splits, row_tiles;
  int lq, rows;  // queries per sequence; rows of a KV group (Hq / Hkv * Lq), both < 2^31 (checked)
  bool q_vec;    // q rows can be read in 16-byte pieces (contiguous channels, 8-element strides, aligned)
  bool cluster;  // the splits of a tile form one thread-block cluster and combine through its shared memory
  int64_t hkv;
  DeviceErrorRecord* err;
};

// Decode: one launch per (split of the keys, 16 rows of one KV group, KV head, sequence). The rows are the
// group's G = Hq / Hkv query heads times Lq queries (row = g * Lq + t), so K and V are read once for all
// of them. The block's keys [split * chunk, ...) with chunk from the sequence's current length (read here:
// the grid is sized by Lmax, so a captured graph stays valid as lengths grow) go in 64-key tiles; warp w
// takes keys 16w..16w+15 of each tile with its own softmax state, and the four warps merge at the end.
// Query t of the sequence sees keys <= n - Lq + t. With several splits each block's f32 partial (o,
// running max, sum) is combined either by attention_combine_kernel (written to global memory), or, when
// the splits of a (sequence, KV head, row tile) form one cluster (p.cluster, at most kMaxClusterSplits), by
// the cluster itself: each block keeps its partial in shared memory, and after a cluster barrier block r
// folds its share of the outputs from every block's shared memory (distributed shared memory), so decode
// attention is one kernel.
template <class Tag, int D>
__global__ void __launch_bounds__(kThreads) flash_decode_kernel(DecodeParams p) {
  constexpr int ld = D + kPad;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* qs = sm;                         // [16][ld]
  uint16_t* ks = qs + 16 * ld;               // [2][64][ld]
  uint16_t* vs = ks + 2 * kTileKeys * ld;    // [2][64][ld]
  pdl_allow_dependents();  // kernels/pdl.cuh: the combine or the output projection may start early
  kernels::pdl_wait();     // when launched as a dependent: q, the caches and the lengths come from earlier kernels
  const am::Layout& L = p.L;
  int64_t x = blockIdx.x;
  const int split = static_cast<int>(x % p.splits);
  x /= p.splits;
  const int rt = static_cast<int>(x % p.row_tiles);
  x /= p.row_tiles;
  const int64_t hk = x % p.hkv, b = x / p.hkv;
  const int group = static_cast<int>(L.gk);
  const int row0 = rt * 16;
  const int nrows = p.rows - row0 < 16 ? p.rows - row0 : 16;  // real rows of this tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The q tile first (it does not depend on the length): rows past the group's are zero. 32-bit index math.
  const uint16_t* qb = p.q + b * L.bq[0] + hk * group * L.hq;
  if (p.q_vec) {
    constexpr int kChunks = D / 8;
    for (int i = threadIdx.x; i < 16 * kChunks; i += kThreads) {
      const int rr = i / kChunks, c = i % kChunks;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (rr < nrows) {
        const int row = row0 + rr, g = row / p.lq, t = row - g * p.lq;
        val = *reinterpret_cast<const uint4*>(qb + g * L.hq + t * L.q_row + c * 8);
      }
      *reinterpret_cast<uint4*>(qs + rr * ld + c * 8) = val;
    }
  } else {
    for (int i = threadIdx.x; i < 16 * D; i += kThreads) {
      const int rr = i / D, c = i % D;
      uint16_t val = 0;
      if (rr < nrows) {
        const int row = row0 + rr, g = row / p.lq, t = row - g * p.lq;
        val = qb[g * L.hq + t * L.q_row + c * L.q_col];
      }
      qs[rr * ld + c] = val;
    }
  }

  int64_t n = p.lengths[b];
  if (n < 0 || n > L.lkv) {
    if (split == 0 && rt == 0 && hk == 0 && threadIdx.x == 0)
      report_device_error(p.err, DeviceErrorCode::IndexOutOfRange, OpId::DecodeAttention, n, L.lkv + 1);
    n = 0;
  }
  const int64_t per = (n + p.splits - 1) / p.splits;
  const int64_t chunk = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int64_t kb = split * chunk;
  const int64_t ke = kb + chunk < n ? kb + chunk : n;
  const int64_t tiles = ke > kb ? (ke - kb + kTileKeys - 1) / kTileKeys : 0;
  const uint16_t* kbase = p.k + b * L.bk[0] + hk * L.hk;
  const uint16_t* vbase = p.v + b * L.bv[0] + hk * L.hv;
  if (tiles > 0) {
    load_tile<D>(ks, kbase, L.k_row, kb, ke);
    load_tile<D>(vs, vbase, L.v_row, kb, ke);
  }
  cp_async_commit();
  __syncthreads();
  WarpState<D> st;
  load_q<D>(st, qs, ld);
  int64_t e[2];
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + lane / 4 + 8 * rr;
    const int t = row % p.lq;
    const int64_t lim = am::key_end(t, p.lq, n, true, true);
    e[rr] = lim < ke ? lim : ke;
  }
  for (int64_t t = 0; t < tiles; ++t) {
    const int stage = static_cast<int>(t & 1);
    if (t + 1 < tiles) {
      const int nxt = stage ^ 1;
      load_tile<D>(ks + nxt * kTileKeys * ld, kbase, L.k_row, kb + (t + 1) * kTileKeys, ke);
      load_tile<D>(vs + nxt * kTileKeys * ld, vbase, L.v_row, kb + (t + 1) * kTileKeys, ke);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t key0 = kb + t * kTileKeys + warp * 16;
    warp_step<Tag, D, 16>(st, ks + (stage * kTileKeys + warp * 16) * ld, vs + (stage * kTileKeys + warp * 16) * ld,
                          ld, key0, e, p.scale_log2);
    __syncthreads();
  }
  finish_l<D>(st);

  // Merge the four warps through shared memory (the K/V stages are free now: the loop ended on a barrier,
  // or never loaded a tile). Only the tile's real rows.
  float* red_o = reinterpret_cast<float*>(ks);  // [4][16][D]: 32 KiB for D = 128, within the K stages
  float* red_m = red_o + 4 * 16 * D;            // [4][16]
  float* red_l = red_m + 4 * 16;                // [4][16]
  float* red_f = red_l + 4 * 16;                // [4][16]: each warp's factor in the row's total
  float* row_m = red_f + 4 * 16;                // [16]: the row's max and sum over the warps
  float* row_l = row_m + 16;
  const int t4 = lane % 4;
  for (int rr = 0; rr < 2; ++rr) {
    const int row = lane / 4 + 8 * rr;
    if (row >= nrows) continue;
    if (t4 == 0) {
      red_m[warp * 16 + row] = st.m[rr];
      red_l[warp * 16 + row] = st.l[rr];
    }
#pragma unroll
    for (int nn = 0; nn < D / 8; ++nn)
      *reinterpret_cast<float2*>(red_o + (warp * 16 + row) * D + 8 * nn + 2 * t4) =
          make_float2(st.o[nn][2 * rr], st.o[nn][2 * rr + 1]);
  }
  __syncthreads();
  if (threadIdx.x < nrows) {
    const int rr = threadIdx.x;
    float mx = -INFINITY;
    for (int w = 0; w < 4; ++w) mx = fmaxf(mx, red_m[w * 16 + rr]);
    float lsum = 0.f;
    float f[4];
    for (int w = 0; w < 4; ++w) {
      const float mw = red_m[w * 16 + rr];
      f[w] = mw == -INFINITY ? 0.f : exp2f(mw - mx);
      lsum += red_l[w * 16 + rr] * f[w];
    }
    // One split: the factors include 1 / sum (a row with no visible key gives 0). Several: raw factors; the
    // partial keeps (max, sum) for the combine.
    const float scale = p.splits == 1 ? (lsum > 0.f ? 1.f / lsum : 0.f) : 1.f;
    for (int w = 0; w < 4; ++w) red_f[w * 16 + rr] = f[w] * scale;
    row_m[rr] = mx;
    row_l[rr] = lsum;
  }
  __syncthreads();
  float* cpart = reinterpret_cast<float*>(vs);  // cluster: this block's partial o [16][D], in the V stages
  for (int i = threadIdx.x; i < nrows * D; i += kThreads) {
    const int rr = i / D, c = i % D;
    const float acc = red_o[rr * D + c] * red_f[rr] + red_o[(16 + rr) * D + c] * red_f[16 + rr] +
                      red_o[(32 + rr) * D + c] * red_f[32 + rr] + red_o[(48 + rr) * D + c] * red_f[48 + rr];
    const int row = row0 + rr, g = row / p.lq, t = row - g * p.lq;
    const int64_t out_row = (b * L.heads + hk * group + g) * p.lq + t;
    if (p.splits == 1) {
      p.out[out_row * D + c] = Mma<Tag>::from_float(acc);
    } else if (p.cluster) {
      cpart[i] = acc;
    } else {
      p.part_o[(out_row * p.splits + split) * D + c] = acc;
      if (c == 0) {
        p.part_m[out_row * p.splits + split] = row_m[rr];
        p.part_l[out_row * p.splits + split] = row_l[rr];
      }
    }
  }
  if (p.splits == 1 || !p.cluster) return;  // without a cluster, attention_combine_kernel folds the splits
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Cluster combine: block r (= its split) folds outputs [r * chunk, (r + 1) * chunk) of the tile from
  // every block's partial; the second barrier keeps each block's shared memory alive until all have read it.
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int C = p.splits;
  float* fac = red_o;  // [16][C]: each split's factor in a row's output (the merge buffers are free now)
  if (threadIdx.x < nrows) {
    const int rr = threadIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < C; ++s) mx = fmaxf(mx, *cluster.map_shared_rank(row_m + rr, s));
    float total = 0.f;
    for (int s = 0; s < C; ++s) {
      const float ms = *cluster.map_shared_rank(row_m + rr, s);
      const float f = ms == -INFINITY ? 0.f : exp2f(ms - mx);
      fac[rr * C + s] = f;
      total += *cluster.map_shared_rank(row_l + rr, s) * f;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;  // no visible key: 0
    for (int s = 0; s < C; ++s) fac[rr * C + s] *= inv;
  }
  __syncthreads();
  const int n_out = nrows * D, share = (n_out + C - 1) / C;
  const int lo = split * share, hi = lo + share < n_out ? lo + share : n_out;
  for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
    const int rr = i / D, c = i % D;
    float acc = 0.f;
    for (int s = 0; s < C; ++s) {
      const float f = fac[rr * C + s];
      if (f != 0.f) acc += *cluster.map_shared_rank(cpart + i, s) * f;
    }
    const int row = row0 + rr, g = row / p.lq, t = row - g * p.lq;
    const int64_t out_row = (b * L.heads + hk * group + g) * p.lq + t;
    p.out[out_row * D + c] = Mma<Tag>::from_float(acc);
  }
  cluster.sync();
#endif
}

}  // namespace kiln::cuda::attn
