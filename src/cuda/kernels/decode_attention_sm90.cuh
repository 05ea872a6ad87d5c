// Split-KV decode attention on Hopper (sm_90): the work of decode_attention_kernel (decode_attention.cuh:
// Lq <= 8 new queries per sequence over a KV cache whose current lengths live on the device, the same
// splits, the same warp step and merge, the same partials for decode_combine_kernel), with the copies taken
// off the math warps so that more bytes are in flight.
//
// Block = four math warps (threads 0..127, as in decode_attention_kernel: warp w takes keys 16w..16w+15 of
// every 64-key tile) and one copy warp (threads 128..159). The copy warp loads each K and V tile as D / 64
// tensor-map boxes of 64 rows x 128 bytes (TMA, 128-byte swizzle: kernels/wgmma.cuh; the warp step reads
// them through SwizzledRows) into a ring of stages that fills about 200 KB, so one block runs per
// multiprocessor; the q rows come by one-dimensional bulk copies into padded rows. mbarriers hand the
// stages over (full: the copies' bytes; empty: the four math warps after their last read), so nothing
// waits for a whole-block barrier per tile.
//
// Keys past the split's end: rows past the cache (Lmax) arrive as zeros; rows between the sequence's length
// and Lmax hold whatever the cache holds there (never written, possibly NaN), so each math warp zeroes its
// V rows past the end before its step (their scores are masked to -inf, so p = 0, and 0 * NaN would be
// NaN).
//
// Persistent: the grid has at most one block per multiprocessor, and block j takes work items j, j + grid,
// ... (item = split, KV head x row tile, sequence; split-major, so a block's items spread over heads). Both
// roles walk the same item list; the ring and the double-buffered q run on from one item into the next, so
// the copies of the next item are in flight while the math warps merge the last one (in the last tile's
// stage, released after the merge). A split past the sequence's current length has no tile: nothing is
// copied and it stores an empty partial.
//
// Opt-in (DecodeTuning::kernel = Tma, KILN_DECODE_TUNING=kernel=tma), not the default: on the H200
// (2026-12-03) it was 1-3% faster than the cp.async kernel at L = 32768 and 5-20% slower at shorter caches.
// Tensor-map boxes, four copies per tile, because copying every K/V row separately (128 bulk copies of 256
// bytes per tile) streamed K/V at about 1.0 TB/s against the cp.async kernel's 3.3 (L = 32768): the copy
// engine's cost per copy, not the bytes, sets the rate.
#pragma once

#include "cuda/kernels/decode_attention.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace kiln::cuda::attn::dec90 {

using wgmma::mbar_arrive;
using wgmma::mbar_expect_tx;
using wgmma::mbar_init;
using wgmma::mbar_wait;

constexpr int kMath = 128;            // the four math warps
constexpr int kThreads = kMath + 32;  // and the copy warp
// Ring stages: as many 64-key K+V tiles as fit next to the q buffers in 227 KB.
template <int D>
constexpr int stages() {
  return D == 128 ? 6 : 13;
}
template <int D>
constexpr uint32_t tile_bytes() {
  return static_cast<uint32_t>(kTileKeys) * D * 2u;  // one K or V tile: D / 64 blocks of 64 rows x 128 bytes
}
template <int D>
constexpr uint32_t q_bytes() {
  return 16u * (D + kPad) * 2u;  // 16 padded q rows
}
// 1024 bytes of alignment slack, the ring (stage = K tile, V tile), two q buffers, the merge's max and sum
// (128 floats; its accumulators go to the last tile's stage), then the barriers: full[S], empty[S],
// q_full[2], q_empty[2].
template <int D>
constexpr size_t smem_bytes() {
  return 1024 + static_cast<size_t>(stages<D>()) * 2 * tile_bytes<D>() + 2 * q_bytes<D>() + 512 +
         8 * (2 * stages<D>() + 4);
}
static_assert(smem_bytes<128>() <= 232448 && smem_bytes<64>() <= 232448, "one block fits a multiprocessor");
static_assert(4 * 16 * 128 * 4 <= 2 * tile_bytes<128>() && 4 * 16 * 64 * 4 <= 2 * tile_bytes<64>(),
              "the merge's accumulators fit in one stage");

struct Params {
  CUtensorMap tk, tv;      // [slot][row][D] over the caches; boxes of 64 columns x 64 rows, 128-byte swizzle
  DecodeParams p;
  int64_t k_slot, v_slot;  // slot strides in elements
  int items;               // splits x (KV heads x row tiles) x sequences
  int head_rows;           // KV heads x row tiles
};

// One item's coordinates and key range (both roles compute the same).
struct Item {
  int split, rt, hk, b, n;
  int kb, ke, tiles;
};
__device__ __forceinline__ Item decode_item(const Params& tp, int i) {
  const DecodeParams& p = tp.p;
  Item it;
  const int per_split = tp.head_rows * static_cast<int>(p.L.outer);
  it.split = i / per_split;
  const int rest = i - it.split * per_split;
  it.b = rest / tp.head_rows;
  const int hr = rest - it.b * tp.head_rows;
  it.rt = p.row_tiles == 1 ? 0 : hr % p.row_tiles;
  it.hk = p.row_tiles == 1 ? hr : hr / p.row_tiles;
  int n = p.lengths[it.b];
  if (n < 0 || n > p.L.lkv) n = 0;  // reported by the math warps
  it.n = n;
  const int per = (n + p.splits - 1) / p.splits;
  const int chunk = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  it.kb = it.split * chunk;
  it.ke = it.kb + chunk < n ? it.kb + chunk : n;
  it.tiles = it.ke > it.kb ? (it.ke - it.kb + kTileKeys - 1) / kTileKeys : 0;
  return it;
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Barrier 1 over the four math warps (the copy warp runs on).
__device__ __forceinline__ void named_sync_math() { asm volatile("bar.sync 1, %0;\n" ::"n"(kMath) : "memory"); }
// Generic-proxy writes to shared memory ordered before later TMA writes to it.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <class Tag, int D>
__global__ void __launch_bounds__(kThreads, 1) decode_attention_tma_kernel(const __grid_constant__ Params tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int ld = D + kPad;  // q rows
  constexpr int S = stages<D>();
  constexpr uint32_t kTile = tile_bytes<D>(), kStage = 2 * kTile;
  constexpr uint32_t kRowBytes = D * 2;
  extern __shared__ __align__(1024) unsigned char sm_raw[];
  const uint32_t raw = smem_addr(sm_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle needs 1024-byte aligned tiles
  unsigned char* const gen = sm_raw + (base - raw);
  const uint32_t qbuf = base + S * kStage;
  const uint32_t ml = qbuf + 2 * q_bytes<D>();
  const uint32_t full = ml + 512, empty = full + 8 * S, q_full = empty + 8 * S, q_empty = q_full + 16;
  const DecodeParams& p = tp.p;
  const am::Layout& L = p.L;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  if (tid == kMath) {  // the tensor maps on their way while the barriers are set up
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tp.tk)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tp.tv)) : "memory");
  }
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 4);
    }
    for (int i = 0; i < 2; ++i) {
      mbar_init(q_full + 8 * i, 1);
      mbar_init(q_empty + 8 * i, 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  pdl_allow_dependents();  // the combine (or the next layer's kernels) may launch and wait
  kernels::pdl_wait();     // q, the caches and the lengths come from earlier kernels
  const int group = static_cast<int>(L.gk);
  const int grid = static_cast<int>(gridDim.x);

  if (warp == 4) {  // the copy warp: lanes 0..15 copy q rows, lane 0 issues the K/V boxes
    uint32_t tile = 0, qn = 0;  // tiles and q fills so far (ring position and phase)
    for (int i = static_cast<int>(blockIdx.x); i < tp.items; i += grid) {
      const Item it = decode_item(tp, i);
      if (it.tiles == 0) continue;
      const int row0 = it.rt * 16;
      const int nrows = p.rows - row0 < 16 ? p.rows - row0 : 16;
      {  // q: 16 rows (rows past the group's repeat its first: their results are never stored)
        const uint32_t qb = qn & 1, qbar = q_full + 8 * qb;
        mbar_wait(q_empty + 8 * qb, ((qn >> 1) & 1) ^ 1);
        if (lane == 0) mbar_expect_tx(qbar, 16 * kRowBytes);
        __syncwarp();
        if (lane < 16) {
          const int row = row0 + (lane < nrows ? lane : 0);
          const int g = p.lq == 1 ? row : row / p.lq, t = row - g * p.lq;
          const uint16_t* src = p.q + it.b * L.bq[0] + (static_cast<int64_t>(it.hk) * group + g) * L.hq +
                                static_cast<int64_t>(t) * L.q_row;
          bulk_copy(qbuf + qb * q_bytes<D>() + lane * ld * 2, src, kRowBytes, qbar);
        }
        ++qn;
      }
      const int kslot = static_cast<int>((it.b * L.bk[0] + it.hk * L.hk) / tp.k_slot);
      const int vslot = static_cast<int>((it.b * L.bv[0] + it.hk * L.hv) / tp.v_slot);
      for (int t = 0; t < it.tiles; ++t, ++tile) {
        const uint32_t s = tile % S, bar = full + 8 * s;
        mbar_wait(empty + 8 * s, ((tile / S) & 1) ^ 1);
        if (lane == 0) {
          mbar_expect_tx(bar, kStage);  // rows past the cache arrive as zeros and count too
          const int k0 = it.kb + t * kTileKeys;
          const uint32_t dst = base + s * kStage;
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb) {
            wgmma::tma_load_3d(dst + cb * (kTileKeys * 128), &tp.tk, cb * 64, k0, kslot, bar);
            wgmma::tma_load_3d(dst + kTile + cb * (kTileKeys * 128), &tp.tv, cb * 64, k0, vslot, bar);
          }
        }
        __syncwarp();
      }
    }
    return;
  }

  // The math warps.
  uint32_t tile = 0, qn = 0;
  for (int i = static_cast<int>(blockIdx.x); i < tp.items; i += grid) {
    const Item it = decode_item(tp, i);
    const int row0 = it.rt * 16;
    const int nrows = p.rows - row0 < 16 ? p.rows - row0 : 16;
    if (tid == 0 && it.split == 0 && it.rt == 0 && it.hk == 0) {
      const int n = p.lengths[it.b];
      if (n < 0 || n > L.lkv) report_device_error(p.err, DeviceErrorCode::IndexOutOfRange, OpId::DecodeAttention, n, L.lkv + 1);
    }
    WarpState<D> st;
    clear_state<D>(st);
    if (it.tiles == 0) {  // no key: the output 0, or an empty partial
      for (int j = tid; j < nrows * (D / 4); j += kMath) {
        const int rr = j / (D / 4), c = (j % (D / 4)) * 4;
        const int row = row0 + rr, g = p.lq == 1 ? row : row / p.lq, t = row - g * p.lq;
        const int64_t out_row =
            (static_cast<int64_t>(it.b) * L.heads + static_cast<int64_t>(it.hk) * group + g) * p.lq + t;
        if (p.splits == 1) {
          *reinterpret_cast<uint2*>(p.out + out_row * D + c) = make_uint2(0u, 0u);
        } else {
          *reinterpret_cast<float4*>(p.part_o + (out_row * p.splits + it.split) * D + c) = make_float4(0.f, 0.f, 0.f, 0.f);
          if (c == 0) p.part_ml[out_row * p.splits + it.split] = make_float2(-INFINITY, 0.f);
        }
      }
      continue;
    }
    {
      const uint32_t qb = qn & 1;
      mbar_wait(q_full + 8 * qb, (qn >> 1) & 1);
      load_q_frags<D>(st, reinterpret_cast<const uint16_t*>(gen + S * kStage + qb * q_bytes<D>()), ld);
      __syncwarp();
      if (lane == 0) mbar_arrive(q_empty + 8 * qb);
      ++qn;
    }
    int64_t e[2];  // one past the last key of the lane's rows within this split (bottom-right causal)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = row0 + lane / 4 + 8 * rr;
      const int64_t lim = am::key_end(p.lq == 1 ? 0 : row % p.lq, p.lq, it.n, true, true);
      e[rr] = lim < it.ke ? lim : it.ke;
    }
    uint32_t s = 0;
    for (int t = 0; t < it.tiles; ++t, ++tile) {
      s = tile % S;
      mbar_wait(full + 8 * s, (tile / S) & 1);
      unsigned char* const kt = gen + s * kStage;
      unsigned char* const vt = kt + kTile;
      const int k0 = it.kb + t * kTileKeys + warp * 16;  // this warp's first key
      if (k0 + 16 > it.ke) {
        // V rows of this warp's keys at or past the end: zeros (every 16-byte chunk of the row, so the swizzle
        // does not matter). Only the item's last tile has such rows: the fence after the merge orders these
        // writes before the stage's next copies.
        for (int j = lane; j < 16 * (D / 8); j += 32) {
          const int r = j / (D / 8), c = j % (D / 8);
          if (k0 + r >= it.ke)
            *reinterpret_cast<uint4*>(vt + (c / 8) * (kTileKeys * 128) + (warp * 16 + r) * 128 + (c % 8) * 16) =
                make_uint4(0u, 0u, 0u, 0u);
        }
        __syncwarp();
      }
      const SwizzledRows<kTileKeys> ktile{reinterpret_cast<const uint16_t*>(kt) + warp * 16 * 64};
      const SwizzledRows<kTileKeys> vtile{reinterpret_cast<const uint16_t*>(vt) + warp * 16 * 64};
      warp_step_tiles<Tag, D, 16>(st, ktile, vtile, k0, e, p.scale_log2);
      if (t + 1 < it.tiles) {  // the last tile's stage holds the merge below, then is released
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
      }
    }
    finish_l<D>(st);
    decode_merge_store<Tag, D>(st, reinterpret_cast<float*>(gen + s * kStage),
                               reinterpret_cast<float*>(gen + (ml - base)), p, nrows, row0, it.b, it.hk, it.split,
                               [] { named_sync_math(); });
    // The merge wrote the stage through the generic proxy; the next copies into it come through the async one.
    fence_async_shared();
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * s);
  }
#else
  __trap();  // the host launches this kernel only on compute capability 9.0 and above
#endif
}

}  // namespace kiln::cuda::attn::dec90
