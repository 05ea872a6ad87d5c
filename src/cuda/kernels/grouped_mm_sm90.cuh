// Hopper (sm_90a) tile kernel of grouped_mm and of the MoE expert products (kernels/grouped_mm.cuh describes
// the modes and GmmArgs): the RowGroups and Batched forms with 16-bit inputs and 16-byte rows, on warpgroup
// MMA. The launcher (cuda/moe_sm90.cu) takes it where it applies; everything else runs gmm_tile_kernel.
//
// Block = two warpgroups (256 threads) over a 128 x 128 product tile (with act: 64 output columns, the gate
// columns and the matching up columns side by side in the product); warpgroup w owns rows 64w..64w+63.
// K advances in steps of 64 (one 128-byte swizzled row, kernels/wgmma.cuh) through a three-stage cp.async
// ring filled one step ahead (two blocks per SM); A rows are gathered through a_rows as they load (x is never permuted). Per
// step each warpgroup issues four m64n128k16 MMAs with both operands in shared memory and waits only for
// the previous step's, so loads, MMAs and the next step's barrier overlap. The epilogue works on the
// accumulators in registers: SiLU-mul pairs gate column j with up column j + 64, held by the same thread.
// Group and tile selection on the device as in gmm_tile_kernel (the offsets scanned in shared memory).
#pragma once

#include <type_traits>

#include "cuda/kernels/grouped_mm.cuh"
#include "cuda/kernels/pdl.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace kiln::cuda::kernels::gmm90 {

using namespace kiln::cuda::wgmma;

constexpr int kThreads = 256;
constexpr int kBM = 128, kBN = 128, kBK = 64;  // product tile and K step
#ifndef KILN_GMM90_STAGES
#define KILN_GMM90_STAGES 3
#endif
// Ring stages and steps issued ahead of the one multiplied. Three stages (96 KB) fit two blocks per SM,
// four (128 KB) one; on the H200 three were faster at every benchmark shape (grouped_mm geomean 0.63x
// PyTorch against 0.53x, docs/benchmarks.md).
constexpr int kStages = KILN_GMM90_STAGES, kAhead = kStages - 2;
constexpr int kBlocksPerSm = kStages <= 3 ? 2 : 1;
constexpr uint32_t kTileBytes = kBM * kBK * 2;  // one A or B stage: 16 KB
static_assert(kStages == kAhead + 2, "a stage is refilled once the MMAs two steps back are done");

// Output columns per block.
__host__ __device__ constexpr int tile_cols(bool act) { return act ? kBN / 2 : kBN; }
// Dynamic shared memory: the ring (1024-byte aligned), then the scanned offsets (2 G + 1 ints).
constexpr size_t smem_bytes(int groups) {
  return static_cast<size_t>(kStages) * 2 * kTileBytes + 1024 + static_cast<size_t>(2 * groups + 1) * 4;
}

// Epilogue of a warpgroup's 64 x BN accumulator (rows m0 + 64 wg.., product columns from n0; with act the
// gate columns 0..BN/2 and the up columns BN/2..BN) from registers: acc[4j + i] is row 16 warp + lane/4 + 8 (i / 2),
// column 8j + 2 (lane % 4) + i % 2. A thread's two rows are looked up once (c_rows); its column pairs go out
// as one 4-byte (8-byte for f32) store where C's columns are contiguous and aligned.
template <class T, int BN>
__device__ __forceinline__ void gmm_wg_epilogue(const GmmArgs& p, const float (&acc)[BN / 2], int64_t cg, int m0,
                                                int m1, int64_t n0, int wg) {
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
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
          const T lo = gemv_from_f32<T>(v0), hi = gemv_from_f32<T>(v1);
          *reinterpret_cast<uint32_t*>(static_cast<T*>(p.c) + off) =
              static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
        }
      } else {
        gmm_store_at<T>(p, off, v0);
        if (n + 1 < p.N) gmm_store_at<T>(p, off + p.c_sn, v1);
      }
    }
  }
}

// RowGroups: grid = (ceil(N / tile_cols(act)), ceil(M / kBM) + G + 1). Batched: (.., ceil(M / kBM), G).
template <class T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) gmm_wgmma_kernel(GmmArgs p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!std::is_same_v<T, float>, "16-bit inputs");
  extern __shared__ __align__(1024) unsigned char sm_raw[];
  __shared__ int warp_tmp[kThreads / 32];
  const uint32_t raw = smem_addr(sm_raw);
  const uint32_t ring = (raw + 1023u) & ~1023u;  // stage s: A at ring + 2 s T, B at ring + (2 s + 1) T
  int* dyn = reinterpret_cast<int*>(sm_raw + (ring - raw) + kStages * 2 * kTileBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int ncols = tile_cols(p.act);
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
  // r0 + 32 i (i < 4); rows 32 apart keep the same swizzle phase.
  const T* a = static_cast<const T*>(p.a) + static_cast<int64_t>(g) * p.a_sg;
  const T* b = static_cast<const T*>(p.b) + static_cast<int64_t>(g) * p.b_sg;
  const int c = tid % 8, r0 = tid / 8;
  const T* arow[4];
  const T* brow[4];
  bool aok[4], bok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + r0 + 32 * i;
    aok[i] = m < m1;
    arow[i] = a + (aok[i] ? gmm_a_row(p, m) * p.a_sm : 0);
    const int jc = r0 + 32 * i;  // product column (act: gate columns, then the matching up columns)
    const int half = kBN / 2;
    int64_t n = p.act ? n0 + (jc < half ? jc : jc - half) : n0 + jc;
    bok[i] = n < p.N;
    if (!bok[i]) n = 0;
    if (p.act && jc >= half) n += p.N;
    brow[i] = b + n * p.b_sn;
  }
  const uint32_t soff = r0 * 128 + ((c ^ (r0 & 7)) << 4);
  const int steps = (p.K + kBK - 1) / kBK;
  auto issue = [&](int step) {
    const uint32_t as = ring + (step % kStages) * 2 * kTileBytes, bs = as + kTileBytes;
    const int k = step * kBK + c * 8;
    const bool kok = k < p.K;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      cp_async16(as + soff + i * 32 * 128, aok[i] && kok ? arow[i] + k : a, aok[i] && kok);
      cp_async16(bs + soff + i * 32 * 128, bok[i] && kok ? brow[i] + k : b, bok[i] && kok);
    }
  };

  const int wg = tid / 128;
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
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
    const uint32_t as = ring + (step % kStages) * 2 * kTileBytes, bs = as + kTileBytes;
    const uint64_t da = smem_desc(as + wg * 64 * 128, 16, 1024), db = smem_desc(bs, 16, 1024);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      Wgmma<std::is_same_v<T, BFloat16>, kBN>::ss(acc, da + ((kk * 32) >> 4), db + ((kk * 32) >> 4), 1);
    wg_commit();
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // step - 1 is done
    fence_regs(acc);
  }
  wg_wait_all();
  fence_regs(acc);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

  gmm_wg_epilogue<T, kBN>(p, acc, cg, m0, m1, n0, wg);
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

// ---- warp-specialised persistent kernel ---------------------------------------------------------------------
//
// Block = one copy warpgroup + two math warpgroups (384 threads; setmaxnreg moves registers from the first to
// the others), one block per SM, persistent over the product tiles: 128 rows x 256 product columns (with act:
// 128 gate columns and the matching 128 up columns, 128 outputs). Tiles are numbered m-tile-major (item =
// slot * n_tiles + n-tile), so the blocks running at once share A rows and the group's weights in L2, and
// block b takes items b, b + gridDim.x, ... The offsets are scanned once per block.
//
// Copies: per K step of 64, B's 256 x 64 slice comes by two TMA boxes (128 rows each, 128-byte swizzle; rows
// and K past the end read as zero) and A's 128 x 64 slice by cp.async from the copy warpgroup's 128 threads
// (rows gathered through a_rows: x is never permuted), both into a four-stage ring (48 KB a stage). A stage's
// "full" mbarrier completes when the TMA bytes have landed and each copy thread's cp.asyncs are done
// (cp.async.mbarrier.arrive.noinc); its "empty" mbarrier when one lane of each of the eight math warps has
// seen its MMAs on it finish. The ring runs on across tiles, so the next tile's first steps load during the
// current tile's last MMAs and epilogue.
// Math: each warpgroup owns 64 rows; per step four m64n256k16 MMAs with both operands in shared memory,
// waiting only for the previous step's; the epilogue (gmm_wg_epilogue) from registers.
namespace ws {

constexpr int kMath = 256;
constexpr int kThreads = kMath + 128;
constexpr int kBM = 128, kBN = 256, kBK = 64;
constexpr int kStages = 4;
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
constexpr int kCopyRegs = 80, kMathRegs = 208;  // 128 x 80 + 256 x 208 <= 64K

__host__ __device__ constexpr int tile_cols(bool act) { return act ? kBN / 2 : kBN; }
// Dynamic shared memory: the ring (1024-byte aligned), 2 x kStages mbarriers, the scanned offsets.
constexpr size_t smem_bytes(int groups) {
  return static_cast<size_t>(kStages) * kStageBytes + 1024 + 2 * kStages * 8 + static_cast<size_t>(2 * groups + 1) * 4;
}

struct Params {
  CUtensorMap tb;  // B as [groups or 1][rows: N, or 2N with act][K]
  GmmArgs p;
  int n_tiles;     // ceil(N / tile_cols(act))
  int mt;          // Batched: m-tiles per group
};

struct TileAt {
  int g, m0, m1;
  int64_t n0;
  bool zero;  // rows past the last offset: written as 0
};

}  // namespace ws

template <class T>
__global__ void __launch_bounds__(ws::kThreads, 1) gmm_ws_kernel(const __grid_constant__ ws::Params wp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!std::is_same_v<T, float>, "16-bit inputs");
  extern __shared__ __align__(1024) unsigned char sm_raw[];
  __shared__ int warp_tmp[ws::kThreads / 32];
  const GmmArgs& p = wp.p;
  const uint32_t raw = smem_addr(sm_raw);
  const uint32_t ring = (raw + 1023u) & ~1023u;  // stage s: A at ring + s * ws::kStageBytes, B ws::kABytes after
  const uint32_t full = ring + ws::kStages * ws::kStageBytes, empty = full + 8 * ws::kStages;
  int* dyn = reinterpret_cast<int*>(sm_raw + (empty + 8 * ws::kStages - raw));
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == ws::kMath) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&wp.tb)) : "memory");
  if (tid == 0) {
    for (int i = 0; i < ws::kStages; ++i) {
      mbar_init(full + 8 * i, 129);  // 128 copy threads' cp.asyncs + the TMA bytes' arrival
      mbar_init(empty + 8 * i, 8);   // one lane of each math warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  pdl_wait();  // the offsets and A come from earlier kernels
  int slots;
  if (p.mode == GmmMode::RowGroups) {
    gmm_scan_row_tiles<ws::kThreads, ws::kBM>(p, dyn, warp_tmp, blockIdx.x == 0);  // ends with a barrier
    slots = dyn[p.G + p.G];  // the tile total, tail pseudo-group included
  } else {
    __syncthreads();
    slots = wp.mt * p.G;
  }
  pdl_allow_dependents();
  const int items = slots * wp.n_tiles;
  const int ncols = ws::tile_cols(p.act);
  auto tile_at = [&](int item) {
    ws::TileAt t;
    const int slot = item / wp.n_tiles;
    t.n0 = static_cast<int64_t>(item % wp.n_tiles) * ncols;
    if (p.mode == GmmMode::RowGroups) {
      gmm_row_slot<ws::kBM>(p, dyn, slot, t.g, t.m0, t.m1);
      t.zero = t.g == p.G;
    } else {
      t.g = slot / wp.mt;
      t.m0 = (slot % wp.mt) * ws::kBM;
      t.m1 = t.m0 + ws::kBM < p.M ? t.m0 + ws::kBM : p.M;
      t.zero = false;
    }
    return t;
  };
  const int steps = (p.K + ws::kBK - 1) / ws::kBK;

  if (tid >= ws::kMath) {  // the copy warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ws::kCopyRegs));
    const int ct = tid - ws::kMath, c = ct % 8, r0 = ct / 8;  // 16-byte chunk c of rows r0 + 16 i
    const uint32_t soff = r0 * 128 + ((c ^ (r0 & 7)) << 4);  // rows 16 apart share the swizzle phase
    uint32_t it = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const ws::TileAt t = tile_at(item);
      if (t.zero) continue;
      const T* a = static_cast<const T*>(p.a) + static_cast<int64_t>(t.g) * p.a_sg;
      int64_t aoff[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int m = t.m0 + r0 + 16 * i;
        aoff[i] = m < t.m1 ? gmm_a_row(p, m) * p.a_sm : -1;
      }
      const int bslot = p.b_sg != 0 ? t.g : 0;
      const int row0 = static_cast<int>(t.n0), row1 = static_cast<int>(p.act ? p.N + t.n0 : t.n0 + ws::kBN / 2);
      for (int step = 0; step < steps; ++step, ++it) {
        const uint32_t st = it % ws::kStages, as = ring + st * ws::kStageBytes, bs = as + ws::kABytes;
        mbar_wait(empty + 8 * st, ((it / ws::kStages) & 1) ^ 1);
        if (ct == 0) {
          mbar_expect_tx(full + 8 * st, ws::kBBytes);
          tma_load_3d(bs, &wp.tb, step * ws::kBK, row0, bslot, full + 8 * st);
          tma_load_3d(bs + ws::kBBytes / 2, &wp.tb, step * ws::kBK, row1, bslot, full + 8 * st);
        }
        const int k = step * ws::kBK + c * 8;
        const bool kok = k < p.K;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const bool ok = kok && aoff[i] >= 0;
          cp_async16(as + soff + i * 16 * 128, ok ? a + aoff[i] + k : a, ok);
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full + 8 * st) : "memory");
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ws::kMathRegs));
  const int wg = tid / 128, lane = tid % 32;
  float acc[ws::kBN / 2];
  uint32_t it = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const ws::TileAt t = tile_at(item);
    const int64_t cg = p.mode == GmmMode::RowGroups ? 0 : t.g;
    if (t.zero) {
      gmm_store_zeros<T, ws::kMath>(p, cg, t.m0, t.m1, t.n0, ncols);
      continue;
    }
#pragma unroll
    for (int i = 0; i < ws::kBN / 2; ++i) acc[i] = 0.f;
    for (int step = 0; step < steps; ++step, ++it) {
      const uint32_t st = it % ws::kStages, as = ring + st * ws::kStageBytes, bs = as + ws::kABytes;
      mbar_wait(full + 8 * st, (it / ws::kStages) & 1);
      fence_proxy_async();  // A came by cp.async (the generic proxy); wgmma reads through the async proxy
      const uint64_t da = smem_desc(as + wg * 64 * 128, 16, 1024), db = smem_desc(bs, 16, 1024);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < ws::kBK / 16; ++kk)
        Wgmma<std::is_same_v<T, BFloat16>, ws::kBN>::ss(acc, da + ((kk * 32) >> 4), db + ((kk * 32) >> 4), 1);
      wg_commit();
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // the previous step's MMAs are done
      fence_regs(acc);
      if (step > 0 && lane == 0) mbar_arrive(empty + 8 * ((it - 1) % ws::kStages));
    }
    wg_wait_all();
    fence_regs(acc);
    if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % ws::kStages));
    gmm_wg_epilogue<T, ws::kBN>(p, acc, cg, t.m0, t.m1, t.n0, wg);
  }
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

}  // namespace kiln::cuda::kernels::gmm90
