// Split-KV decode attention on Hopper (sm_90): the work of decode_attention_kernel (decode_attention.cuh:
// Lq <= 8 new queries per sequence over a KV cache whose current lengths live on the device, the same
// splits, the same warp step and merge, the same partials for decode_combine_kernel), with the copies taken
// off the math warps so that more bytes are in flight.
//
// Block = four math warps (threads 0..127, as in decode_attention_kernel: warp w takes keys 16w..16w+15 of
// every 64-key tile) and one copy warp (threads 128..159). The copy warp moves every K and V row (and the q
// rows) with one-dimensional bulk copies (cp.async.bulk) into a ring of kStages padded tiles, which hold
// about 200 KB: one block per multiprocessor. mbarriers hand the stages over (full: the copies' bytes;
// empty: the four math warps after their last read), so nothing waits for a whole-block barrier per tile,
// and the number of bytes in flight is not bounded by the math threads' copy instructions.
//
// Persistent: the grid has at most one block per multiprocessor, and block j takes work items j, j + grid,
// ... (item = split, KV head x row tile, sequence; split-major, so a block's items spread over heads). Both
// roles walk the same item list; the ring and the double-buffered q run on from one item into the next, so
// the copies of the next item are in flight while the math warps merge the last one. A split past the
// sequence's current length has no tile: nothing is copied and it stores an empty partial.
//
// Status: opt-in (DecodeTuning::kernel = Bulk, KILN_DECODE_TUNING=kernel=bulk), not the default. It passes
// every decode test and memcheck, but on the H200 it streamed K/V at about 1.0 TB/s against the cp.async
// kernel's 3.3 (L = 32768; 1.6-3.4x slower at every benchmark shape): a tile is 128 separate row copies
// of 256 bytes, and the copy engine's cost per copy, not the bytes, sets the rate. The next step is two
// tensor-map boxes per K and V tile (64 rows x 128 bytes, 128-byte swizzle, as the prefill kernel loads
// them) with swizzled ldmatrix addresses in the warp step, and zeroed V rows past the length.
#pragma once

#include "cuda/kernels/decode_attention.cuh"

namespace kiln::cuda::attn::dec90 {

constexpr int kMath = 128;              // the four math warps
constexpr int kThreads = kMath + 32;    // and the copy warp
// Ring stages: as many padded 64-key K+V tiles as fit next to the two q buffers in 227 KB.
template <int D>
constexpr int stages() {
  return D == 128 ? 6 : 12;
}
template <int D>
constexpr uint32_t stage_bytes() {
  return 2u * kTileKeys * (D + kPad) * 2u;  // K tile then V tile
}
template <int D>
constexpr uint32_t q_bytes() {
  return 16u * (D + kPad) * 2u;
}
// Ring, two q buffers, then the barriers: full[S], empty[S], q_full[2], q_empty[2].
template <int D>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(stages<D>()) * stage_bytes<D>() + 2 * q_bytes<D>() + 8 * (2 * stages<D>() + 4);
}
static_assert((4 * 16 * 128 + 128) * 4 <= stage_bytes<128>() && (4 * 16 * 64 + 128) * 4 <= stage_bytes<64>(),
              "the merge fits in one stage");

struct Params {
  DecodeParams p;
  int items;     // splits x (KV heads x row tiles) x sequences
  int head_rows;  // KV heads x row tiles
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
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Barrier 1 over the four math warps (the copy warp runs on).
__device__ __forceinline__ void named_sync_math() { asm volatile("bar.sync 1, %0;\n" ::"n"(kMath) : "memory"); }

template <class Tag, int D>
__global__ void __launch_bounds__(kThreads, 1) decode_attention_bulk_kernel(const __grid_constant__ Params tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int ld = D + kPad;
  constexpr int S = stages<D>();
  constexpr uint32_t kStage = stage_bytes<D>(), kKvTile = kStage / 2;
  constexpr uint32_t kRowBytes = D * 2;
  extern __shared__ __align__(16) uint16_t sm[];
  const uint32_t base = smem_addr(sm);
  const uint32_t qbuf = base + S * kStage;
  const uint32_t full = qbuf + 2 * q_bytes<D>(), empty = full + 8 * S, q_full = empty + 8 * S, q_empty = q_full + 16;
  const DecodeParams& p = tp.p;
  const am::Layout& L = p.L;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
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

  if (warp == 4) {  // the copy warp
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
      const uint16_t* kbase = p.k + it.b * L.bk[0] + it.hk * L.hk;
      const uint16_t* vbase = p.v + it.b * L.bv[0] + it.hk * L.hv;
      for (int t = 0; t < it.tiles; ++t, ++tile) {
        const uint32_t s = tile % S, bar = full + 8 * s;
        mbar_wait(empty + 8 * s, ((tile / S) & 1) ^ 1);
        if (lane == 0) mbar_expect_tx(bar, 2 * kTileKeys * kRowBytes);  // the rows, not their padding
        __syncwarp();
        const int k0 = it.kb + t * kTileKeys;
        const uint32_t dst = base + s * kStage;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = lane + 32 * h;
          const int key = k0 + r < it.ke ? k0 + r : k0;  // rows past the split repeat its first key: masked
          bulk_copy(dst + r * ld * 2, kbase + static_cast<int64_t>(key) * L.k_row, kRowBytes, bar);
          bulk_copy(dst + kKvTile + r * ld * 2, vbase + static_cast<int64_t>(key) * L.v_row, kRowBytes, bar);
        }
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
      const int group_rows = nrows * (D / 4);
      for (int j = tid; j < group_rows; j += kMath) {
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
      load_q_frags<D>(st, sm + (S * kStage + qb * q_bytes<D>()) / 2, ld);
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
      const uint16_t* ks = sm + s * (kStage / 2);
      const int64_t key0 = it.kb + t * kTileKeys + warp * 16;
      warp_step<Tag, D, 16>(st, ks + warp * 16 * ld, ks + kKvTile / 2 + warp * 16 * ld, ld, key0, e, p.scale_log2);
      if (t + 1 < it.tiles) {  // the last tile's stage holds the merge below, then is released
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s);
      }
    }
    finish_l<D>(st);
    decode_merge_store<Tag, D>(st, reinterpret_cast<float*>(sm + s * (kStage / 2)), p, nrows, row0, it.b, it.hk,
                               it.split, [] { named_sync_math(); });
    // The merge wrote the stage through the generic proxy; the next bulk copies into it come through the
    // async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * s);
  }
#else
  __trap();  // the host launches this kernel only on compute capability 9.0 and above
#endif
}

}  // namespace kiln::cuda::attn::dec90
