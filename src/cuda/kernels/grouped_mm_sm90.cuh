// Hopper (sm_90a) tile kernels of grouped_mm and of the MoE expert products (kernels/grouped_mm.cuh describes
// the modes and GmmArgs): the RowGroups and Batched forms with 16-bit inputs and 16-byte rows, on warpgroup
// MMA. The launcher (cuda/moe_sm90.cu) takes them where they apply; everything else runs gmm_tile_kernel.
// Two kernels: gmm_tma_kernel (below; the default where its operands fit tensor maps and A needs no row
// gather) and gmm_wgmma_kernel (the cp.async kernel: here).
//
// gmm_wgmma_kernel. Block = two warpgroups (256 threads) over a 128 x BN product tile, BN = 128 or 256
// (opt-in: GroupedMmPath::TiledWide); with act, BN / 2 output columns: the gate columns and the matching up
// columns side by side in the product. Warpgroup w owns rows 64w..64w+63. K advances in steps of 64 (one
// 128-byte swizzled row, kernels/wgmma.cuh) through a cp.async ring (BN = 128: three stages, two blocks per
// SM; 256: four, one block per SM) filled (stages - 2) steps ahead; A rows are gathered through a_rows as
// they load (x is never permuted). Per step each warpgroup issues four m64nBNk16 MMAs with both operands
// in shared memory and waits only for the previous step's, so loads, MMAs and the next step's barrier
// overlap. The epilogue works on the accumulators in registers: SiLU-mul pairs gate column j with up
// column j + BN / 2, held by the same thread.
// Group and tile selection on the device as in gmm_tile_kernel (the offsets scanned in shared memory).
#pragma once

#include <type_traits>

#include "cuda/kernels/grouped_mm.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace kiln::cuda::kernels::gmm90 {

using namespace kiln::cuda::wgmma;

constexpr int kThreads = 256;
constexpr int kBM = 128, kBK = 64;  // product tile rows and K step; the columns (BN) are 128 or 256
#ifndef KILN_GMM90_STAGES
#define KILN_GMM90_STAGES 3
#endif
// Ring stages and steps issued ahead of the one multiplied. 128 x 128 tiles: three stages (96 KB) fit two
// blocks per SM, four (128 KB) one; on the H200 three were faster at every benchmark shape (grouped_mm
// geomean 0.63x PyTorch against 0.53x, 2026-12-02). 128 x 256 tiles (opt-in, GroupedMmPath::TiledWide):
// four stages of 48 KB, one block per SM: each K step brings 48 KB for twice the products of the 32 KB of a
// 128 x 128 step (85 against 64 flops a byte from L2).
template <int BN>
constexpr int stages() {
  return BN == 128 ? KILN_GMM90_STAGES : 4;
}
template <int BN>
constexpr int blocks_per_sm() {
  return BN == 128 && stages<BN>() <= 3 ? 2 : 1;
}
constexpr uint32_t kATileBytes = kBM * kBK * 2;  // one A stage: 16 KB
template <int BN>
constexpr uint32_t stage_bytes() {
  return kATileBytes + static_cast<uint32_t>(BN) * kBK * 2;  // A, then B
}

// Output columns per block.
__host__ __device__ constexpr int tile_cols(bool act, int bn) { return act ? bn / 2 : bn; }
// Dynamic shared memory: the ring (1024-byte aligned), then the scanned offsets (2 G + 1 ints).
template <int BN>
constexpr size_t smem_bytes(int groups) {
  return static_cast<size_t>(stages<BN>()) * stage_bytes<BN>() + 1024 + static_cast<size_t>(2 * groups + 1) * 4;
}

// The four m64nBNk16 MMAs of one 64-wide K step, both operands in shared memory (128-byte swizzle): 64
// A rows from a_addr, BN B rows from b_addr.
template <class T, int BN>
__device__ __forceinline__ void mma_k64(float (&acc)[BN / 2], uint32_t a_addr, uint32_t b_addr) {
  const uint64_t da = smem_desc(a_addr, 16, 1024), db = smem_desc(b_addr, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    Wgmma<std::is_same_v<T, BFloat16>, BN>::ss(acc, da + ((kk * 32) >> 4), db + ((kk * 32) >> 4), 1);
}

// Two values rounded (to nearest even) to the 16-bit C type T, packed low column first (one 4-byte store of a
// column pair): one hardware conversion of the pair. The portable conversion (T(float): a NaN test, a
// rounding bias and a shift per value for bf16, more for f16) made up most of a 128 x 256 tile's epilogue
// instructions. The same roundings; only a NaN's bits may differ (the canonical NaN).
template <class T>
__device__ __forceinline__ uint32_t gmm90_pack2(float v0, float v1) {
  uint32_t r;
  if constexpr (std::is_same_v<T, BFloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(v1), "f"(v0));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(v1), "f"(v0));
  return r;
}

// The epilogue's straight run (GmmArgs::fast_epilogue, the default): every column pair of the thread's two
// rows (C offsets roff) as one store (4 bytes of 16-bit C, 8 of f32 C) at columns nb + 8 j, no per-element
// check: the caller has established that both rows are stored, C's columns are contiguous and aligned and
// the tile lies inside N. One short block of code per form (16-bit C with SiLU-mul or not, f32 C without)
// instead of the general loop's checks and store forms per element, whose code the instruction cache must
// hold across every tile. C: the output element type (T, or float).
//
// gmm90_store_run16 (GmmArgs::wide_stores, the default): 16-bit C in 16-byte stores. The four lanes of a quad
// hold one row's columns 8 j .. 8 j + 7 as four 4-byte pairs; for every four consecutive j they transpose
// those words (two exchange rounds, shfl_xor 1 and 2), so that lane t holds all eight columns of j = 4 q + t
// and stores them at once: a quarter of the store instructions, each quad writing 64 contiguous bytes of a
// row instead of 16 (Nsight Compute showed the 128 x 256 tiles stalled on the store queue, lg_throttle,
// about 2.9 warps per issued instruction). Needs C's rows 16-byte aligned.
template <class T, int BN>
__device__ __forceinline__ void gmm90_store_run16(T* c, const int64_t (&roff)[2], int64_t n0, const float (&acc)[BN / 2],
                                                  bool act, int lane) {
  constexpr int kOutJ = BN / 8;
  const int t = lane % 4;
  const bool odd = t & 1, hi = t & 2;
  // The quad's lanes share their rows, so they take this path together; other quads of the warp may not.
  const unsigned quad = 0xFu << (lane & ~3);
  // w[i]: this lane's pair of j = j0 + i; out: the eight columns of j0 + t, stored at column n0 + 8 (j0 + t).
  auto emit = [&](int64_t off, uint32_t (&w)[4], int j0) {
    // Round 1 (lanes t, t ^ 1): a word whose index differs from t in bit 0 comes from the partner's index ^ 1.
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      const uint32_t r = __shfl_xor_sync(quad, odd ? w[k] : w[k + 1], 1);
      if (odd) w[k] = r;
      else w[k + 1] = r;
    }
    // Round 2 (lanes t, t ^ 2): the same in bit 1.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t r = __shfl_xor_sync(quad, hi ? w[k] : w[k + 2], 2);
      if (hi) w[k] = r;
      else w[k + 2] = r;
    }
    *reinterpret_cast<uint4*>(c + off + n0 + 8 * (j0 + t)) = make_uint4(w[0], w[1], w[2], w[3]);
  };
  if (act) {
#pragma unroll
    for (int j0 = 0; j0 < kOutJ / 2; j0 += 4)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = j0 + i;
          w[i] = gmm90_pack2<T>(moe_math::silu_mul(acc[4 * j + 2 * h], acc[4 * (j + kOutJ / 2) + 2 * h]),
                      moe_math::silu_mul(acc[4 * j + 2 * h + 1], acc[4 * (j + kOutJ / 2) + 2 * h + 1]));
        }
        emit(roff[h], w, j0);
      }
  } else {
#pragma unroll
    for (int j0 = 0; j0 < kOutJ; j0 += 4)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = gmm90_pack2<T>(acc[4 * (j0 + i) + 2 * h], acc[4 * (j0 + i) + 2 * h + 1]);
        emit(roff[h], w, j0);
      }
  }
}

template <class C, int BN>
__device__ __forceinline__ void gmm90_store_run(C* c, const int64_t (&roff)[2], int64_t nb, const float (&acc)[BN / 2],
                                                bool act) {
  constexpr int kOutJ = BN / 8;
  auto put = [&](int64_t off, float v0, float v1) {
    if constexpr (std::is_same_v<C, float>) {
      *reinterpret_cast<float2*>(c + off) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<uint32_t*>(c + off) = gmm90_pack2<C>(v0, v1);
    }
  };
  if (!std::is_same_v<C, float> && act) {
#pragma unroll
    for (int j = 0; j < kOutJ / 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        put(roff[h] + nb + 8 * j, moe_math::silu_mul(acc[4 * j + 2 * h], acc[4 * (j + kOutJ / 2) + 2 * h]),
            moe_math::silu_mul(acc[4 * j + 2 * h + 1], acc[4 * (j + kOutJ / 2) + 2 * h + 1]));
  } else {
#pragma unroll
    for (int j = 0; j < kOutJ; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) put(roff[h] + nb + 8 * j, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  }
}

// The epilogue from registers, shared by both kernels: thread tid (< 256) of the two warpgroups that hold
// the 128 x BN product tile of rows [m0, m1) (rows past m1 are not stored) and output columns from n0.
// acc[4j + i] is row 16 warp + lane/4 + 8 (i / 2), column 8j + 2 (lane % 4) + i % 2. A thread's two rows are
// looked up once (c_rows); its column pairs go out as one 4-byte (8-byte for f32) store where C's columns
// are contiguous and aligned. act: product column j (a gate column) pairs with j + BN / 2 (its up column).
template <class T, int BN>
__device__ __forceinline__ void gmm90_epilogue(const GmmArgs& p, const float (&acc)[BN / 2], int64_t cg, int m0, int m1,
                                               int64_t n0, int tid) {
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int row_base = m0 + wg * 64 + warp * 16 + lane / 4;
  int64_t roff[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = row_base + 8 * h;
    roff[h] = m < m1 ? cg * p.c_sg + (p.c_rows ? static_cast<int64_t>(p.c_rows[m]) : m) * p.c_sm : -1;
  }
  const int esz = p.out_f32 ? 4 : 2;
  const bool pairs = p.c_sn == 1 && ((p.c_sm | p.c_sg) & 1) == 0 &&
                     reinterpret_cast<uintptr_t>(p.c) % static_cast<uintptr_t>(2 * esz) == 0;
  constexpr int kOutJ = BN / 8;  // column groups of 8 in the product
  if (p.fast_epilogue && pairs && !(p.out_f32 && p.act) && roff[0] >= 0 && roff[1] >= 0 &&
      n0 + (p.act ? BN / 2 : BN) <= p.N) {
    if (p.out_f32) gmm90_store_run<float, BN>(static_cast<float*>(p.c), roff, n0 + 2 * (lane % 4), acc, false);
    else if (p.wide_stores && ((p.c_sm | p.c_sg) & 7) == 0 && reinterpret_cast<uintptr_t>(p.c) % 16 == 0)
      gmm90_store_run16<T, BN>(static_cast<T*>(p.c), roff, n0, acc, p.act, lane);
    else gmm90_store_run<T, BN>(static_cast<T*>(p.c), roff, n0 + 2 * (lane % 4), acc, p.act);
    return;
  }
#pragma unroll
  for (int j = 0; j < kOutJ; ++j) {
    if (p.act && j >= kOutJ / 2) break;  // up columns: consumed with their gate column
    const int64_t n = n0 + 8 * j + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (roff[h] < 0 || n >= p.N) continue;
      float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if (p.act) {
        v0 = moe_math::silu_mul(v0, acc[4 * (j + kOutJ / 2) + 2 * h]);
        v1 = moe_math::silu_mul(v1, acc[4 * (j + kOutJ / 2) + 2 * h + 1]);
      }
      const int64_t off = roff[h] + n * p.c_sn;
      if (pairs && n + 1 < p.N) {
        if (p.out_f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.c) + off) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<uint32_t*>(static_cast<T*>(p.c) + off) = gmm90_pack2<T>(v0, v1);
        }
      } else {
        gmm_store_at<T>(p, off, v0);
        if (n + 1 < p.N) gmm_store_at<T>(p, off + p.c_sn, v1);
      }
    }
  }
}

// RowGroups: grid = (ceil(N / tile_cols(act, BN)), ceil(M / kBM) + G + 1). Batched: (.., ceil(M / kBM), G).
template <class T, int BN>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<BN>()) gmm_wgmma_kernel(GmmArgs p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!std::is_same_v<T, float>, "16-bit inputs");
  static_assert(BN == 128 || BN == 256, "128 or 256 product columns");
  constexpr int kStages = stages<BN>(), kAhead = kStages - 2;  // a stage is refilled once the MMAs two steps back are done
  constexpr uint32_t kStage = stage_bytes<BN>();
  extern __shared__ __align__(16) unsigned char sm_raw[];  // the ring aligns itself
  __shared__ int warp_tmp[kThreads / 32];
  const uint32_t raw = smem_addr(sm_raw);
  const uint32_t ring = (raw + 1023u) & ~1023u;  // stage s: A at ring + s kStage, B after it
  int* dyn = reinterpret_cast<int*>(sm_raw + (ring - raw) + kStages * kStage);

  const int tid = static_cast<int>(threadIdx.x);
  const int ncols = tile_cols(p.act, BN);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * ncols;
  int g, m0, m1;
  bool zero_rows = false;
  if (p.mode == GmmMode::RowGroups) {
    if (!gmm_row_tile<kThreads, kBM>(p, dyn, warp_tmp, g, m0, m1)) return;  // more slots than tiles
    zero_rows = g == p.G;
  } else {  // Batched
    g = static_cast<int>(blockIdx.z);
    m0 = static_cast<int>(blockIdx.y) * kBM;
    m1 = m0 + kBM < p.M ? m0 + kBM : p.M;
  }
  const int64_t cg = p.mode == GmmMode::RowGroups ? 0 : g;
  if (zero_rows) {
    gmm_store_zeros<T, kThreads>(p, cg, m0, m1, n0, ncols);
    return;
  }

  // Loads: thread tid copies 16-byte chunk c = tid % 8 of the step's 64 K elements for tile rows
  // r0 + 32 i (i < 4 for A, BN / 32 for B); rows 32 apart keep the same swizzle phase.
  constexpr int kBRows = BN / 32;
  const T* a = static_cast<const T*>(p.a) + static_cast<int64_t>(g) * p.a_sg;
  const T* b = static_cast<const T*>(p.b) + static_cast<int64_t>(g) * p.b_sg;
  const int c = tid % 8, r0 = tid / 8;
  const T* arow[4];
  const T* brow[kBRows];
  bool aok[4], bok[kBRows];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + r0 + 32 * i;
    aok[i] = m < m1;
    arow[i] = a + (aok[i] ? gmm_a_row(p, m) * p.a_sm : 0);
  }
#pragma unroll
  for (int i = 0; i < kBRows; ++i) {
    const int jc = r0 + 32 * i;  // product column (act: gate columns, then the matching up columns)
    const int half = BN / 2;
    int64_t n = p.act ? n0 + (jc < half ? jc : jc - half) : n0 + jc;
    bok[i] = n < p.N;
    if (!bok[i]) n = 0;
    if (p.act && jc >= half) n += p.N;
    brow[i] = b + n * p.b_sn;
  }
  const uint32_t soff = r0 * 128 + ((c ^ (r0 & 7)) << 4);
  const int steps = (p.K + kBK - 1) / kBK;
  auto issue = [&](int step) {
    const uint32_t as = ring + (step % kStages) * kStage, bs = as + kATileBytes;
    const int k = step * kBK + c * 8;
    const bool kok = k < p.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async16(as + soff + i * 32 * 128, aok[i] && kok ? arow[i] + k : a, aok[i] && kok);
#pragma unroll
    for (int i = 0; i < kBRows; ++i) cp_async16(bs + soff + i * 32 * 128, bok[i] && kok ? brow[i] + k : b, bok[i] && kok);
  };

  const int wg = tid / 128;
  // A warpgroup none of whose 64 rows the tile stores (a group's last tile of at most 64 rows) issues no MMAs.
  const bool busy = !p.skip_idle_half || m0 + 64 * wg < m1;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < steps) issue(st);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int step = 0; step < steps; ++step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1) : "memory");  // this thread's step is in
    fence_proxy_async();
    __syncthreads();  // every thread's step is in; every warpgroup is done with step - 2's stage
    if (step + kAhead < steps) issue(step + kAhead);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (!busy) continue;
    const uint32_t as = ring + (step % kStages) * kStage;
    wg_fence();
    mma_k64<T, BN>(acc, as + wg * 64 * 128, as + kATileBytes);
    wg_commit();
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // step - 1 is done
    fence_regs(acc);
  }
  wg_wait_all();
  fence_regs(acc);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

  if (busy) gmm90_epilogue<T, BN>(p, acc, cg, m0, m1, n0, tid);
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

// ---- TMA, warp-specialised, persistent ---------------------------------------------------------------------
//
// gmm_tma_kernel: the same products (RowGroups without a_rows, and Batched) with the copies taken off the
// math warps. Tiles of BM x 128 (BM = 128, or 64 below). Block = BM / 64 math warpgroups (rows 64 wg.. of
// the tile, the epilogue above) and a copy warpgroup of which one thread issues every copy: per K step one
// tensor-map box of A (64 K x BM rows) and two of B (64 K x 64 rows: with act the gate rows n0.. and the up
// rows N + n0..), 128-byte swizzle, into a ring of stages (BM = 128: about 192 KB, one block per SM) handed
// over by mbarriers (full: the boxes' bytes; empty: the math warps after their MMAs on the stage are done).
// Rows past a group's end are loaded (they belong to the next group, or lie past M and read as zero) and
// not stored; K past the end reads as zero.
// Persistent: the grid has at most tma_blocks_per_sm blocks per SM, and block b takes tiles b, b + grid, ... of the list
// (m-tile slot, n-tile), n fastest, so the blocks at work at one time share A tiles and a few groups' B.
// Both roles walk the same list (the offsets are scanned once per block: gmm_scan_row_tiles); the ring
// runs on from one tile into the next, so the next tile's loads overlap this tile's epilogue.
//
// BM = 64 (GroupedMmPath::TiledTma64; Auto where groups average at most 48 rows): 64 x 128 tiles for groups of a few dozen rows, where most of a
// 128-row tile would be rows of other groups loaded and multiplied for nothing. One math warpgroup
// (m64n128 MMAs) and the copy warpgroup, four 24 KB stages, two blocks per SM, so one block's epilogue
// overlaps the other's MMAs. No cluster variant.
// BN = 256 (GroupedMmPath::TiledTmaWide, BM = 128; Auto where groups average 96 rows or more): four 48 KB
// stages and 128 accumulators per math thread, a quarter fewer bytes received per product than 128 x 128.
// With the general epilogue it measured 0.63x PyTorch geomean against 0.78x for 128 x 128 on the H200
// (2026-12-03; Nsight Compute: 7.5 instruction-fetch stalls per issued instruction, the tensor pipe
// active 19% of the time); with the straight-run epilogue it is the fastest tile at 256 and 512 rows a group
// (tensor pipe 48%, the stalls on the store queue and L2 at 82% of its throughput).
// With that epilogue, pairs of 128 x 256 tiles in clusters sharing B by multicast cut L2 throughput from 82%
// to 71% but were 0-8% slower at T4096: the L2 was not what held the tile back. With the staged epilogue
// below they are Auto's choice at 192-383 rows a group (PB, below; moe.cu).
// CS > 1 (GroupedMmPath::TiledTmaCluster2 / 4, BM = 128): thread-block clusters of CS blocks along n share
// each A tile. The cluster walks the list of (m-tile, CS consecutive n-tiles); block rank r takes the r-th
// n-tile (past the last n-tile it multiplies and stores nothing) and loads rows 128 r / CS.. of the A tile
// into every block of the cluster at once (TMA multicast), so each block pulls 1 / CS of A through L2
// instead of all of it. Opt-in: on the H200 clusters of 2 were about as fast as single blocks (grouped_mm
// geomean 0.82x PyTorch against 0.81x) and clusters of 4 slower (0.76x; 2026-12-03):
// each SM still receives every byte of its tiles.
// PB (GroupedMmPath::TiledTmaWidePair, 128 x 256 tiles, CS = 2): the pair of blocks shares B instead, as
// PyTorch's CUTLASS grouped kernel does at these shapes (clusters of 2 along M). The list is of (256-row
// span of one group, n-tile), n fastest; rank r takes rows 128 r.. of the span, and each block loads one of
// the two B boxes into both blocks (multicast), so each SM pulls 16 KB of A and 16 KB of B through L2 per K
// step instead of 16 and 32. A rank with no rows in the span (a group's last, short span) loads no A and
// issues no MMAs: it only relays its B box to its peer and releases each stage.
// A stage is refilled only once the math warps of every block of the cluster are done with it (their
// arrivals go to each block's empty barrier: one per math warp of each block); every block's full barrier
// counts all the stage's bytes, its own and its peers'. The blocks of a cluster meet at the start (barriers
// initialised before any peer arrives or copies); at the end each copy thread waits until its stages' last
// uses are released by the whole cluster, so no block exits while a peer may still arrive on its barriers.
template <int BM>
constexpr int tma_math_threads() {
  return BM / 64 * 128;  // one math warpgroup per 64 rows
}
template <int BM>
constexpr int tma_threads() {
  return tma_math_threads<BM>() + 128;  // and the copy warpgroup
}
template <int BM>
constexpr int tma_blocks_per_sm() {
  return BM == 64 ? 2 : 1;
}
// BM = 128: registers per thread after the split (setmaxnreg): 128 x 40 + 256 x 232 = 64512, exactly the
// 384 x 168 the kernel is compiled for (__launch_bounds__(384, 1)); asking for more than the block holds would
// stall. BM = 64 needs no split: two blocks of 256 threads at up to 128 registers.
constexpr int kTmaCopyRegs = 40, kTmaMathRegs = 232;
static_assert(128 * kTmaCopyRegs + 256 * kTmaMathRegs <= 384 * 168, "the split fits the block's registers");
template <int BM>
constexpr uint32_t tma_a_bytes() {
  return BM * kBK * 2;  // one A stage
}
template <int BM, int BN>
constexpr uint32_t tma_stage_bytes() {
  return tma_a_bytes<BM>() + BN * kBK * 2;  // A, then B
}
template <int BM, int BN>
constexpr int tma_stages() {
  return BM == 64 ? 4 : BN == 128 ? 6 : 4;  // 4 x 24 KB (two blocks per SM), 6 x 32 KB or 4 x 48 KB
}
// The epilogue through shared memory (GmmTmaParams::c_tma; 128-row tiles, no clusters but the pairs sharing
// B): each math warpgroup stages its 64 rows of C, 128 columns at a time, in two 64 x 64 boxes (16 KB,
// 128-byte rows with the 128-byte swizzle; stmatrix writes), and one of its threads stores them with TMA,
// asynchronously: the warpgroup goes on to the next tile's MMAs while the boxes drain, and waits for them
// only when it next writes the buffer. The default (grouped_tma_store): on the H200 1.7% and 0.7% less time
// than the register stores over the T4096 benchmark products (geomean of two runs, 2026-12-04).
constexpr uint32_t kCStageBytes = 2 * 16384;  // both warpgroups' buffers
template <int BM, int CS, bool PB = false>
constexpr bool tma_store_capable() {
  return BM == 128 && (CS == 1 || PB);
}
// The ring (1024-aligned), the C staging buffers (c_stage), full[S] and empty[S] barriers, then the scanned
// offsets (2 G + 1 ints).
template <int BM, int BN>
constexpr size_t tma_smem_bytes(int groups, bool c_stage = false) {
  return 1024 + static_cast<size_t>(tma_stages<BM, BN>()) * tma_stage_bytes<BM, BN>() + (c_stage ? kCStageBytes : 0) +
         16 * tma_stages<BM, BN>() + static_cast<size_t>(2 * groups + 1) * 4;
}

struct GmmTmaParams {
  CUtensorMap ta;  // A: (K, rows, slots), slots = groups for Batched A with a group stride, else 1; box rows BM / CS
  CUtensorMap tb;  // B: (K, rows = N or 2 N with act, slots = groups, or 1 when B has no group stride)
  CUtensorMap tc;  // C (c_tma): (N, M, slots = groups for Batched C, else 1), boxes of 64 x 64
  GmmArgs p;
  int a_slots, b_slots;  // 1: the group picks the slot; 0: slot 0
  int ntiles;            // n-tiles: ceil(N / tile_cols(act, BN))
  int mtiles;            // Batched: m-tiles per group, ceil(M / BM)
  int c_tma;             // 1: whole warpgroup row ranges of C go out through tc (16-bit C, no c_rows; tma_store_capable)
};

// The staged epilogue of one math warpgroup (thread t of its 128) over C rows row0..row0 + 63 (all stored),
// output columns from n0, slot `slot` of tc; `bar`: the warpgroup's named barrier; cbuf: its 16 KB buffer
// (128 columns: two 64 x 64 boxes of 128-byte rows, 128-byte swizzle), filled and stored once per 128 output
// columns. acc as in gmm90_epilogue: the pair of column group j (8 columns) in row half h (rows 8 h.. of the
// warp's 16) is acc[4 j + 2 h], acc[4 j + 2 h + 1] at row (t % 32) / 4 of that 8 x 8 block, columns
// 2 (t % 4)..: the fragment layout of stmatrix. So one stmatrix.x4 writes column groups j and j + 1 of both
// row halves (four 8 x 8 blocks): lane l gives the address of row l % 8 of block l / 8, chunk j ^ (row % 8)
// of its box row, and each block's eight rows land in eight different chunks (no bank conflicts).
template <class T, int BN>
__device__ __forceinline__ void gmm90_epilogue_tma(const CUtensorMap* tc, uint32_t cbuf, int bar, const float (&acc)[BN / 2],
                                                   bool act, int row0, int64_t n0, int slot, int t) {
  constexpr int kOutJ = BN / 8;  // column groups of 8 in the product
  const int lane = t % 32;
  const int blk = lane / 8, rr = lane % 8;  // the block (column group j + blk / 2, row half blk % 2) and row lane addresses
  const uint32_t row_addr = cbuf + static_cast<uint32_t>((t / 32) * 16 + 8 * (blk % 2) + rr) * 128;
  const int groups = act ? kOutJ / 2 : kOutJ;  // output column groups
  // The pair of column group j, row half h (act: gate column group j with its up column group).
  auto pair = [&](int j, int h) {
    if (act) {
      const int ju = j + kOutJ / 2 < kOutJ ? j + kOutJ / 2 : j;  // (in range for every unrolled j)
      return gmm90_pack2<T>(moe_math::silu_mul(acc[4 * j + 2 * h], acc[4 * ju + 2 * h]),
                            moe_math::silu_mul(acc[4 * j + 2 * h + 1], acc[4 * ju + 2 * h + 1]));
    }
    return gmm90_pack2<T>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  };
#pragma unroll
  for (int rd = 0; rd < (kOutJ + 15) / 16; ++rd) {
    if (rd * 16 >= groups) break;
    if (t == 0) bulk_wait_read_all();  // the buffer's previous boxes have been read
    named_sync(bar, 128);
#pragma unroll
    for (int jj = 0; jj < 16; jj += 2) {
      const int j = rd * 16 + jj;
      if (j >= kOutJ || j >= groups) break;
      const int jm = jj + blk / 2;  // this lane's column group within the round
      const uint32_t addr = row_addr + static_cast<uint32_t>(jm / 8) * 8192 + ((static_cast<uint32_t>(jm % 8) ^ rr) << 4);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(pair(j, 0)),
                   "r"(pair(j, 1)), "r"(pair(j + 1, 0)), "r"(pair(j + 1, 1))
                   : "memory");
    }
    fence_proxy_async();  // the writes, visible to the copy engine
    named_sync(bar, 128);
    if (t == 0) {
      const int nb = groups - rd * 16 > 8 ? 2 : 1;
      for (int b = 0; b < nb; ++b)
        tma_store_3d(tc, cbuf + static_cast<uint32_t>(b) * 8192, static_cast<int>(n0) + 128 * rd + 64 * b, row0, slot);
      bulk_commit();
    }
  }
}

template <class T, int BM, int BN, int CS, bool PB = false>
__global__ void __launch_bounds__(tma_threads<BM>(), tma_blocks_per_sm<BM>())
    gmm_tma_kernel(const __grid_constant__ GmmTmaParams tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!std::is_same_v<T, float>, "16-bit inputs");
  static_assert(CS == 1 || CS == 2 || CS == 4, "clusters of 1, 2 or 4 blocks");
  static_assert((BM == 128 && BN == 128) || CS == 1 || (PB && BM == 128 && BN == 256 && CS == 2),
                "clusters of 128 x 128 tiles sharing A, or pairs of 128 x 256 tiles sharing B");
  static_assert(!PB || CS == 2, "B is shared by pairs");
  static_assert((BM == 128 && (BN == 128 || BN == 256)) || (BM == 64 && BN == 128), "128 x 128, 128 x 256 or 64 x 128 tiles");
  constexpr int S = tma_stages<BM, BN>();
  constexpr uint32_t kStage = tma_stage_bytes<BM, BN>();
  constexpr int kMath = tma_math_threads<BM>(), kThreadsAll = tma_threads<BM>();
  constexpr int kARows = PB ? BM : BM / CS;  // A rows each block of a cluster copies
  constexpr int kSpan = PB ? 2 * BM : BM;     // rows of one list entry
  // 16-byte aligned (the ring aligns itself): an __align__(1024) here would reserve 1 KB of static shared
  // memory, which the C staging buffers need at 128 groups.
  extern __shared__ __align__(16) unsigned char gmm_tma_raw[];
  __shared__ int warp_tmp[kThreadsAll / 32];
  const uint32_t raw = smem_addr(gmm_tma_raw);
  const uint32_t ring = (raw + 1023u) & ~1023u;
  // C staging buffers (tp.c_tma) after the ring: 1024-aligned, as the 128-byte swizzle of the boxes needs.
  const bool c_tma = tma_store_capable<BM, CS, PB>() && tp.c_tma != 0;
  const uint32_t cstage = ring + S * kStage;
  const uint32_t full = cstage + (c_tma ? kCStageBytes : 0), empty = full + 8 * S;
  int* const dyn = reinterpret_cast<int*>(gmm_tma_raw + (empty + 8 * S - raw));  // gmm_scan_row_tiles' 2 G + 1 ints
  const GmmArgs& p = tp.p;
  const int tid = static_cast<int>(threadIdx.x);
  const int rank = CS > 1 ? static_cast<int>(cluster_rank()) : 0;

  if (tid == kMath) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tp.ta)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tp.tb)) : "memory");
  }
  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(full + 8 * i, 1);
      mbar_init(empty + 8 * i, kMath / 32 * CS);  // the math warps of every block of the cluster that read the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  const bool rows = p.mode == GmmMode::RowGroups;
  // The list: (m-tile, group of CS n-tiles), the latter fastest; this block's n-tile in a group is its rank.
  // PB: (span of 2 BM rows of one group, n-tile), n fastest; this block's rows in a span are its rank's half.
  const int ngroups = PB ? tp.ntiles : (tp.ntiles + CS - 1) / CS;
  const int mspans = PB ? (tp.mtiles + 1) / 2 : tp.mtiles;  // Batched: list rows per group
  int total;
  if (rows) {
    gmm_scan_row_tiles<kThreadsAll, kSpan>(p, dyn, warp_tmp, blockIdx.x == 0);
    total = dyn[2 * p.G] * ngroups;  // the m-tile (span) count, times the n-tile groups
  } else {
    total = p.G * mspans * ngroups;
  }
  __syncthreads();  // the barriers are initialised; the scans are complete
  if constexpr (CS > 1) cluster_sync();  // and so are the peers' barriers

  const int ncols = tile_cols(p.act, BN);
  const int steps = (p.K + kBK - 1) / kBK;
  const int first = static_cast<int>(blockIdx.x) / CS, stride = static_cast<int>(gridDim.x) / CS;
  // Entry u of the list: group g (RowGroups: g == G is the rows past the last offset), rows [m0, m1), this
  // block's columns from n0; false when that n-tile lies past the last (a cluster's spare block). PB: m0 >= m1
  // (and false) for a rank with no rows in its span.
  auto tile_at = [&](int u, int& g, int& m0, int& m1, int64_t& n0) {
    const int mt = u / ngroups;
    const int nt = PB ? u % ngroups : (u % ngroups) * CS + rank;
    n0 = static_cast<int64_t>(nt) * ncols;
    if (rows) {
      gmm_row_tile_at<kSpan>(p, dyn, mt, g, m0, m1);  // mt < the m-tile count: always a tile
    } else {
      g = mt / mspans;
      m0 = (mt % mspans) * kSpan;
      m1 = m0 + kSpan < p.M ? m0 + kSpan : p.M;
    }
    if constexpr (PB) {
      const int end = m1;
      m0 += rank * BM;
      m1 = m0 + BM < end ? m0 + BM : end;
      return m0 < m1;
    }
    return nt < tp.ntiles;
  };

  if (tid >= kMath) {  // the copy warpgroup
    if constexpr (BM == 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kTmaCopyRegs));
    if (tid != kMath) return;
    {
      uint32_t it = 0;  // K steps issued by this block, over all its tiles
      for (int u = first; u < total; u += stride) {
        int g, m0, m1;
        int64_t n0;
        tile_at(u, g, m0, m1, n0);  // a spare block still copies its share of A (its B: rows past N, or unused)
        if (rows && g == p.G) continue;  // zeros: nothing to load (the whole cluster skips the tile)
        const int aslot = tp.a_slots ? g : 0, bslot = tp.b_slots ? g : 0;
        const int nb0 = static_cast<int>(n0), nb1 = static_cast<int>(p.act ? p.N + n0 : n0 + BN / 2);
        const bool load_a = !PB || m0 < m1;  // PB: a rank without rows only relays its B box
        for (int ks = 0; ks < steps; ++ks, ++it) {
          const uint32_t st = it % S;
          mbar_wait(empty + 8 * st, ((it / S) & 1) ^ 1);
          mbar_expect_tx(full + 8 * st, load_a ? kStage : kStage - tma_a_bytes<BM>());
          const uint32_t as = ring + st * kStage, bs = as + tma_a_bytes<BM>();
          if constexpr (CS == 1 || PB) {
            if (load_a) tma_load_3d(as, &tp.ta, ks * kBK, m0, aslot, full + 8 * st);
          } else {
            tma_load_3d_multicast(as + rank * kARows * 128, &tp.ta, ks * kBK, m0 + rank * kARows, aslot,
                                  full + 8 * st, static_cast<uint16_t>((1u << CS) - 1));
          }
          if constexpr (PB) {  // B box `rank` into both blocks
            tma_load_3d_multicast(bs + rank * (BN / 2) * 128, &tp.tb, ks * kBK, rank ? nb1 : nb0, bslot, full + 8 * st,
                                  static_cast<uint16_t>(3));
          } else {
            tma_load_3d(bs, &tp.tb, ks * kBK, nb0, bslot, full + 8 * st);
            tma_load_3d(bs + (BN / 2) * 128, &tp.tb, ks * kBK, nb1, bslot, full + 8 * st);
          }
        }
      }
      // Clusters: this block exits only once every math warp of the cluster has released each stage's last
      // use (waits as if for S more steps), so no peer arrives on its barriers after it is gone.
      if constexpr (CS > 1) {
        for (int i = 0; i < S; ++i, ++it) mbar_wait(empty + 8 * (it % S), ((it / S) & 1) ^ 1);
      }
    }
    return;
  }

  if constexpr (BM == 128) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kTmaMathRegs));
  const int wg = tid / 128, lane = tid % 32;
  // The math warps release a stage to the copy threads of every block of the cluster.
  auto release = [&](uint32_t st) {
    if (lane != 0) return;
    if constexpr (CS == 1) {
      mbar_arrive(empty + 8 * st);
    } else {
#pragma unroll
      for (int r = 0; r < CS; ++r) mbar_arrive_in(empty + 8 * st, static_cast<uint32_t>(r));
    }
  };
  uint32_t it = 0;  // K steps of this block's tiles so far (the copy thread's count)
  // Every math warpgroup on every tile, warpgroup w on rows 64 w...
  float acc[BN / 2];
  for (int u = first; u < total; u += stride) {
    int g, m0, m1;
    int64_t n0;
    const bool mine = tile_at(u, g, m0, m1, n0);
    const int64_t cg = rows ? 0 : g;
    if (rows && g == p.G) {
      if (mine) gmm_store_zeros<T, kMath>(p, cg, m0, m1, n0, ncols);
      continue;
    }
    // BM = 128: a warpgroup none of whose 64 rows the tile stores (a group's last tile of at most 64 rows)
    // only passes each stage on; the other one's MMAs then have the tensor cores to themselves. PB: so do
    // both warpgroups of a rank without rows.
    if (BM == 128 && ((PB && !mine) || (p.skip_idle_half && m0 + 64 * wg >= m1))) {
      for (int ks = 0; ks < steps; ++ks, ++it) {
        const uint32_t st = it % S;
        mbar_wait(full + 8 * st, (it / S) & 1);
        release(st);
      }
      continue;
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int ks = 0; ks < steps; ++ks, ++it) {
      const uint32_t st = it % S;
      mbar_wait(full + 8 * st, (it / S) & 1);
      const uint32_t as = ring + st * kStage;
      wg_fence();
      mma_k64<T, BN>(acc, as + wg * 64 * 128, as + tma_a_bytes<BM>());
      wg_commit();
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // the previous step's MMAs are done
      fence_regs(acc);
      if (ks > 0) release((it - 1) % S);
    }
    wg_wait_all();
    fence_regs(acc);
    if (steps > 0) release((it - 1) % S);
    if (!mine) continue;
    if constexpr (tma_store_capable<BM, CS, PB>()) {
      if (c_tma && m0 + 64 * wg + 64 <= m1) {  // the warpgroup's 64 rows are all this group's
        gmm90_epilogue_tma<T, BN>(&tp.tc, cstage + static_cast<uint32_t>(wg) * (kCStageBytes / 2), 1 + wg, acc, p.act,
                                  m0 + 64 * wg, n0, static_cast<int>(cg), tid % 128);
        continue;
      }
    }
    gmm90_epilogue<T, BN>(p, acc, cg, m0, m1, n0, tid);
  }
  if constexpr (tma_store_capable<BM, CS, PB>()) {
    if (c_tma && tid % 128 == 0) bulk_wait_all();  // the staged boxes are written before the block exits
  }
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

}  // namespace kiln::cuda::kernels::gmm90
