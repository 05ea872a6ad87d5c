// Hopper (sm_90a) flash prefill on warpgroup MMA (wgmma) and TMA copies: the same math as
// flash_prefill_kernel (kernels/flash_attention.cuh) with twice the rows per block and tensor-core
// instructions that read their operands straight from shared memory.
//
// Work item = 128 query rows of one (batch, head). Block = two math warpgroups (256 threads) + one copy warpgroup
// (which gives up most of its registers to the math warpgroups: setmaxnreg).
// The kernel is persistent: one block per multiprocessor takes items in turn, the first from its block
// index and the rest from a device counter (zero at launch) or, for at most two rounds, in a fixed order
// (TmaParams::next_item),
// so the next item's q and first K/V tiles are in flight while the current item ends, and no block pays a
// launch, a barrier setup and an unhidden first copy per item.
//
// Math: warpgroup w owns rows 64w..64w+63 of the item, and inside it warp i rows 16i..16i+15 with the lane
// layout of mma.sync (lane l: rows l/4 and l/4 + 8). K/V stream in 128-key tiles. Per tile and warpgroup:
// S = q k^T by wgmma m64n128k16 with both operands in shared memory (q and k K-major), the online softmax in
// registers (log2 domain, f32), P rounded to 16 bits and kept in registers as wgmma's A operand, o += P v by
// wgmma m64nDk16 with v read MN-major (transposed by the instruction, no copy). Shared tiles use the 128-byte
// swizzle and descriptors of kernels/wgmma.cuh.
//
// Software pipeline per warpgroup: iteration t issues S_t = q k_t^T and then o += P_{t-1} v_{t-1}, waits
// for S_t only, and runs the softmax of tile t while the tensor cores still work on P_{t-1} v_{t-1}; then
// it waits for that, rescales o and keeps P_t in registers for the next iteration. With ping-pong the
// warpgroups take turns issuing their MMAs through two named barriers, so that one warpgroup's softmax
// overlaps the other's MMAs; the turns run on across items.
//
// Copies: one thread of the copy warpgroup issues tensor-memory-accelerator (TMA) copies, each a 3-d box (64
// columns x 64 or 128 rows x 1 slot) that lands already swizzled; rows past the tensor's end arrive as zeros.
// K and V tiles go through three stages each, numbered across the block's items (tile g of the block in stage
// g % 3), so the ring runs on from one item into the next; each warpgroup's 64 q rows have their own buffer.
// Buffers are handed over with mbarriers: a "full" barrier is armed with the byte count its copies deliver
// and the math warps wait on it; after their last read (S done for K and for q, P v done for V) the math
// threads arrive on its "empty" barrier, which the copy thread waits on before refilling it. The copy
// thread also writes the item's index next to the q buffers before arming them (-1: no more items).
//
// A slot is one (batch, head) matrix of the operand: element (c, row) of slot s is at
// base + s * slot_stride + row * row_stride + c, so that every head's offset is a whole number of slots
// (the host takes the gcd of the head and batch strides as slot_stride).
//
// Compiled only for sm_90a (the wgmma and TMA instructions do not exist elsewhere); other targets get a
// body that traps, and the host never launches it there (see cuda/attention_sm90.cu).
#pragma once

#include <type_traits>

#include "cuda/kernels/flash_attention.cuh"
#include "cuda/kernels/pdl.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace kiln::cuda::attn::sm90 {

using namespace kiln::cuda::wgmma;
using kernels::pdl_allow_dependents;
using kernels::pdl_wait;
template <class Tag, int N>
using Wg = Wgmma<std::is_same_v<Tag, Bf16Tag>, N>;

constexpr int kBM = 128;       // query rows per block
constexpr int kBN = 128;       // keys per K/V tile
constexpr int kMath = 256;             // two math warpgroups
constexpr int kThreads = kMath + 128;  // and one copy warpgroup
// Registers per thread after the split (setmaxnreg): 128 x 56 + 256 x 224 <= 64K (at 24 for the copy
// warpgroup its code spilled).
constexpr int kCopyRegs = 56, kMathRegs = 224;

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x; -inf gives +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

struct TmaParams {
  CUtensorMap tq, tk, tv;  // 64-byte aligned opaque maps: [slots][rows][D] of q (64-row boxes), k, v (128)
  FlashParams p;
  int64_t q_slot, k_slot, v_slot;  // slot strides in elements
  int items;                       // q_tiles * heads * outer
  // Zero at launch: items past the grid's first are taken from it. Null: round r of block b takes item
  // r * gridDim.x + b on even rounds and r * gridDim.x + gridDim.x - 1 - b on odd ones (heavy items pair
  // with light ones; used for at most two rounds, where it balances as well as the counter).
  int* next_item;
};

#ifndef KILN_PREFILL_PINGPONG
#define KILN_PREFILL_PINGPONG 1
#endif
constexpr bool kPingPong = KILN_PREFILL_PINGPONG != 0;  // the two warpgroups take turns issuing MMAs

// Shared memory: q, three K and three V stages, alignment slack, 16 mbarriers, the item ring (2 ints).
constexpr size_t tma_smem_bytes(int d) { return static_cast<size_t>(kBM + 6 * kBN) * d * 2 + 1024 + 16 * 8 + 8; }

// Item x: its query tile (heaviest causal tiles first, see FlashParams::tiles_major) and (batch, head) task.
struct Item {
  int64_t qt, task;
};
__device__ __forceinline__ Item item_at(const FlashParams& p, int64_t x) {
  const int64_t tasks = p.L.heads * p.L.outer;
  return {p.q_tiles - 1 - (p.tiles_major ? x / tasks : x % p.q_tiles), p.tiles_major ? x % tasks : x / p.q_tiles};
}
template <bool Causal>
__device__ __forceinline__ int item_tiles(const am::Layout& L, int64_t m0) {  // K/V tiles the item reads
  const int64_t kv_end = Causal ? (m0 + kBM < L.lkv ? m0 + kBM : L.lkv) : L.lkv;
  return static_cast<int>((kv_end + kBN - 1) / kBN);
}

template <class Tag, int D, bool Causal>
__global__ void __launch_bounds__(kThreads, 1) flash_prefill_tma_kernel(const __grid_constant__ TmaParams tp) {
  static_assert(kBM == kBN, "a causal tile is never wholly in a warpgroup's future");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char sm_raw[];
  constexpr uint32_t kQBytes = kBM * D * 2, kTileBytes = kBN * D * 2;
  const uint32_t qs = (smem_addr(sm_raw) + 1023u) & ~1023u;
  const uint32_t ks = qs + kQBytes;          // [3][kBN][D]
  const uint32_t vs = ks + 3 * kTileBytes;   // [3][kBN][D]
  const uint32_t bars = vs + 3 * kTileBytes;  // full_q[2], empty_q[2], full_k[3], full_v[3], empty_k[3], empty_v[3]
  const uint32_t full_q = bars, empty_q = bars + 16, full_k = bars + 32, full_v = bars + 56, empty_k = bars + 80,
                 empty_v = bars + 104;
  int* const ring = reinterpret_cast<int*>(sm_raw + (bars + 128 - smem_addr(sm_raw)));  // item index per q fill
  const FlashParams& p = tp.p;
  const am::Layout& L = p.L;

  if (threadIdx.x == kMath) {  // the copy thread: the tensor maps on their way while the barriers are set up
    for (const CUtensorMap* map : {&tp.tq, &tp.tk, &tp.tv})
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(full_q + 8 * i, 1);
      mbar_init(empty_q + 8 * i, 128);
    }
    for (int i = 0; i < 3; ++i) {
      mbar_init(full_k + 8 * i, 1);
      mbar_init(full_v + 8 * i, 1);
      mbar_init(empty_k + 8 * i, kMath);
      mbar_init(empty_v + 8 * i, kMath);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Launched as a dependent (launch_dependent): the set-up above overlapped the previous kernel's end; from
  // here on the kernel reads its inputs and writes its output. The next kernel may launch now (its blocks
  // take multiprocessors as this grid's blocks leave, and wait for this grid to complete).
  pdl_wait();
  pdl_allow_dependents();

  if (threadIdx.x >= kMath) {  // the copy warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopyRegs));
    if (threadIdx.x != kMath) return;
    // Tile g of the block (tile t of its item) into stage g % 3 once its previous contents are released.
    auto load = [&](uint32_t stages, uint32_t full, uint32_t empty, const CUtensorMap* map, int slot, uint32_t g,
                    int t) {
      const uint32_t st = g % 3;
      mbar_wait(empty + 8 * st, ((g / 3) & 1) ^ 1);
      mbar_expect_tx(full + 8 * st, kTileBytes);
#pragma unroll
      for (int cb = 0; cb < D / 64; ++cb)
        tma_load_3d(stages + st * kTileBytes + cb * (kBN * 128), map, cb * 64, t * kBN, slot, full + 8 * st);
    };
    uint32_t g = 0;
    int64_t x = blockIdx.x;
    for (int n = 0;; ++n) {
      // The next item's index is fetched now and used at the end of this one.
      const int64_t round_next = int64_t{n + 1} * gridDim.x;
      const int64_t next = x >= tp.items  ? x
                           : tp.next_item ? gridDim.x + atomicAdd(tp.next_item, 1)
                                          : round_next + ((n + 1) & 1 ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
      int tiles = 0, kslot = 0, vslot = 0;
      int64_t m0 = 0, qslot = 0;
      if (x < tp.items) {
        const Item it = item_at(p, x);
        const am::Offsets off = am::batch_offsets(L, it.task / L.heads, it.task % L.heads);
        m0 = it.qt * kBM;
        tiles = item_tiles<Causal>(L, m0);
        kslot = static_cast<int>(off.k / tp.k_slot);
        vslot = static_cast<int>(off.v / tp.v_slot);
        qslot = off.q / tp.q_slot;
      }
      // K/V tile 0 first (their stages free up before the q buffers do), then q, then the rest.
      if (tiles > 0) {
        load(ks, full_k, empty_k, &tp.tk, kslot, g, 0);
        load(vs, full_v, empty_v, &tp.tv, vslot, g, 0);
      }
      for (int h = 0; h < 2; ++h) {
        mbar_wait(empty_q + 8 * h, (n & 1) ^ 1);
        if (h == 0) ring[n & 1] = x < tp.items ? static_cast<int>(x) : -1;
        if (x < tp.items) {
          mbar_expect_tx(full_q + 8 * h, kQBytes / 2);
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_3d(qs + cb * (kBM * 128) + h * (64 * 128), &tp.tq, cb * 64, static_cast<int>(m0 + 64 * h),
                        static_cast<int>(qslot), full_q + 8 * h);
        } else {
          mbar_arrive(full_q + 8 * h);  // no more items: the math warps read -1
        }
      }
      if (x >= tp.items) return;
      for (int t = 1; t < tiles; ++t) {
        load(ks, full_k, empty_k, &tp.tk, kslot, g + t, t);
        load(vs, full_v, empty_v, &tp.tv, vslot, g + t, t);
      }
      g += tiles;
      x = next;
    }
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegs));
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const float scale = p.scale_log2;
  const uint64_t dq = smem_desc(qs + wg * 64 * 128, 16, 1024);
  const int t4 = lane % 4;
  float acc[D / 2];
  float s[kBN / 2];
  uint32_t pa[kBN / 16][4];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kBN / 16; ++i) pa[i][0] = pa[i][1] = pa[i][2] = pa[i][3] = 0u;

  // Ping-pong: warpgroup 0 issues first (warpgroup 1 opens its barrier; warpgroup 0 arrives alone on a
  // spare one). The barrier ids come from selects, not branches: the MMAs must not sit on a divergent path.
  if (kPingPong) named_arrive(wg == 1 ? 1 : 3, wg == 1 ? kMath : 128);
  uint32_t g = 0;  // the block's K/V tiles so far (stage and phase of each tile, as the copy thread counts)
  for (int n = 0;; ++n) {
    mbar_wait(full_q + 8 * wg, n & 1);
    const int x = ring[n & 1];
    if (x < 0) break;
    const Item it = item_at(p, x);
    const int64_t m0 = it.qt * kBM;
    const int tiles = item_tiles<Causal>(L, m0);
    const int64_t row_lo = m0 + wg * 64 + warp * 16 + lane / 4;
    int64_t e[2];  // keys [0, e) are visible to the lane's rows row_lo and row_lo + 8
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t row = row_lo + 8 * rr;
      e[rr] = Causal ? (row + 1 < L.lkv ? row + 1 : L.lkv) : L.lkv;
    }
    const int64_t wg_row0 = m0 + wg * 64;
    const int64_t e_wg = Causal ? (wg_row0 + 1 < L.lkv ? wg_row0 + 1 : L.lkv) : L.lkv;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    if (tiles == 0) mbar_arrive(empty_q + 8 * wg);

    for (int t = 0; t < tiles; ++t) {
      const int64_t key0 = int64_t{t} * kBN;
      const uint32_t gt = g + t;
      const uint32_t sk = gt % 3, sv_prev = (gt + 2) % 3;  // stages of k_t and v_{t-1}
      mbar_wait(full_k + 8 * sk, (gt / 3) & 1);
      if (t > 0) mbar_wait(full_v + 8 * sv_prev, ((gt - 1) / 3) & 1);
      if (kPingPong) named_sync(1 + wg, kMath);  // this warpgroup's turn to issue
      const uint64_t dk = smem_desc(ks + sk * kTileBytes, 16, 1024);
      const uint64_t dv = smem_desc(vs + sv_prev * kTileBytes, kBN * 128, 1024);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;
        Wg<Tag, kBN>::ss(s, dq + (((kk / 4) * (kBM * 128) + col) >> 4), dk + (((kk / 4) * (kBN * 128) + col) >> 4),
                            kk > 0 ? 1 : 0);
      }
      wg_commit();
      if (t > 0) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) Wg<Tag, D>::rs(acc, pa[kk], dv + ((kk * 16 * 128) >> 4));
      }
      wg_commit();
      if (kPingPong) named_arrive(2 - wg, kMath);  // the other warpgroup's turn
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_t is done
      fence_regs(s);
      mbar_arrive(empty_k + 8 * sk);
      if (t == tiles - 1) mbar_arrive(empty_q + 8 * wg);  // the q rows are read for the last time

      if (key0 + kBN > e_wg) {
        int lim[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int64_t d = e[rr] - key0;
          lim[rr] = (d < 0 ? 0 : d > kBN ? kBN : static_cast<int>(d)) - 2 * t4;
        }
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (8 * j + (i & 1) >= lim[i >> 1]) s[4 * j + i] = -INFINITY;
      }
      float corr[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // four chains: shorter dependencies
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
          mx4[j % 4] = fmaxf(mx4[j % 4], fmaxf(s[4 * j + 2 * rr], s[4 * j + 2 * rr + 1]));
        float mx = fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[rr], mx * scale);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        corr[rr] = fast_exp2(m[rr] - base);
        m[rr] = m_new;
        float rs4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          s[4 * j + 2 * rr] = fast_exp2(fmaf(s[4 * j + 2 * rr], scale, -base));
          s[4 * j + 2 * rr + 1] = fast_exp2(fmaf(s[4 * j + 2 * rr + 1], scale, -base));
          rs4[j % 4] += s[4 * j + 2 * rr] + s[4 * j + 2 * rr + 1];
        }
        l[rr] = l[rr] * corr[rr] + ((rs4[0] + rs4[1]) + (rs4[2] + rs4[3]));
      }
      wg_wait_all();  // P_{t-1} v_{t-1} is in o
      fence_regs(acc);
      fence_regs(pa);
      if (t > 0) mbar_arrive(empty_v + 8 * sv_prev);
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {  // skipped while no row max moved
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          acc[4 * n8 + 0] *= corr[0];
          acc[4 * n8 + 1] *= corr[0];
          acc[4 * n8 + 2] *= corr[1];
          acc[4 * n8 + 3] *= corr[1];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        pa[kk][0] = Mma<Tag>::pack(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = Mma<Tag>::pack(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = Mma<Tag>::pack(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = Mma<Tag>::pack(s[8 * kk + 6], s[8 * kk + 7]);
      }
    }
    if (tiles > 0) {  // the last tile's o += P v
      const uint32_t gl = g + tiles - 1, sv = gl % 3;
      mbar_wait(full_v + 8 * sv, (gl / 3) & 1);
      const uint64_t dv = smem_desc(vs + sv * kTileBytes, kBN * 128, 1024);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) Wg<Tag, D>::rs(acc, pa[kk], dv + ((kk * 16 * 128) >> 4));
      wg_commit();
      wg_wait_all();
      fence_regs(acc);
      fence_regs(pa);
      mbar_arrive(empty_v + 8 * sv);
    }
    g += tiles;

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
    }
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t row = row_lo + 8 * rr;
      if (row >= L.lq) continue;
      const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
      uint32_t* orow = reinterpret_cast<uint32_t*>(p.out + (it.task * L.lq + row) * D);
#pragma unroll
      for (int n8 = 0; n8 < D / 8; ++n8)
        orow[(8 * n8 + 2 * t4) / 2] = Mma<Tag>::pack(acc[4 * n8 + 2 * rr] * inv, acc[4 * n8 + 2 * rr + 1] * inv);
    }
  }
  // Ping-pong: warpgroup 1's last arrival on barrier 1 is taken by warpgroup 0 (warpgroup 1 syncs alone on
  // a spare barrier).
  if (kPingPong) named_sync(wg == 0 ? 1 : 4, wg == 0 ? kMath : 128);
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

}  // namespace kiln::cuda::attn::sm90
