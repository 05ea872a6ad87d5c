// Hopper (sm_90a) building blocks shared by the wgmma kernels (flash_attention_sm90.cuh, grouped_mm_sm90.cuh):
// warpgroup MMA (wgmma) wrappers, shared-memory matrix descriptors for the 128-byte swizzle, mbarriers and
// TMA tensor copies (16-byte cp.async: kernels/cp_async.cuh).
//
// Swizzled tiles: a tile of R rows x C 16-bit columns is C/64 column blocks of R rows x 128 bytes; the
// 16-byte chunk c of row r sits at chunk position c ^ (r % 8), and every tile starts on a 1024-byte
// boundary (the swizzle repeats every 8 rows). A descriptor holds the start address and two strides, all
// in 16-byte units. K-major operands (rows of the operand contiguous along the reduction): the stride
// between 8-row groups (1024 bytes); inside the 128-byte row, steps of 16 elements advance the start
// address by 32 bytes. MN-major operands (the B operand read transposed, e.g. attention's v): the stride
// between 8-row groups along the reduction (1024 bytes) and between 64-column blocks (R x 128 bytes).
//
// The accumulator of m64nNk16 gives thread (warp w of the warpgroup, lane l) rows 16w + l/4 (+8) and
// columns 8j + 2 (l % 4) (+1): element 4j + i is row 16w + l/4 + 8 (i / 2), column 8j + 2 (l % 4) + i % 2,
// the mma.sync m16n8 layout repeated; a register A operand has the mma.sync m16n8k16 A layout.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; maps are encoded by the host)

#include <cstdint>

#include "cuda/kernels/cp_async.cuh"

namespace kiln::cuda::wgmma {

template <bool Bf16, int N>
struct Wgmma;  // ss: D (+)= A B with A, B in shared memory; rs: D += A B with A in registers, B MN-major

// The accumulator operands of m64n64 (32 f32 registers a thread), m64n128 (64) and m64n256 (128), as asm text
// and operands.
#define KILN_WG_REGS32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WG_REGS64 \
  KILN_WG_REGS32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WG_ACC32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KILN_WG_ACC64 \
  KILN_WG_ACC32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KILN_WG_REGS128 \
  KILN_WG_REGS64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define KILN_WG_ACC128 \
  KILN_WG_ACC64, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// One specialisation: TY is the PTX type, NR the accumulator registers a thread, and the operand numbers
// after them (descriptors, the scale-d register; A's four registers, B's descriptor, the scale-d register)
// as strings.
#define KILN_WGMMA(BF16, TY, N, NR, REGS, ACC, SS_AB, SS_P, RS_A, RS_B, RS_P)                           \
  template <>                                                                                            \
  struct Wgmma<BF16, N> {                                                                                \
    __device__ static void ss(float (&d)[NR], uint64_t a, uint64_t b, int scale_d) {                     \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_P ", 0;\n"                                     \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, " SS_AB    \
                   ", p, 1, 1, 0, 0;\n}\n"                                                              \
                   : ACC                                                                                 \
                   : "l"(a), "l"(b), "r"(scale_d));                                                      \
    }                                                                                                    \
    __device__ static void rs(float (&d)[NR], const uint32_t (&a)[4], uint64_t b) {                      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " RS_P ", 0;\n"                                     \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, {" RS_A    \
                   "}, " RS_B ", p, 1, 1, 1;\n}\n"                                                      \
                   : ACC                                                                                 \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                        \
    }                                                                                                    \
  };
KILN_WGMMA(true, "bf16", 64, 32, KILN_WG_REGS32, KILN_WG_ACC32, "%32, %33", "%34", "%32, %33, %34, %35", "%36", "%37")
KILN_WGMMA(true, "bf16", 128, 64, KILN_WG_REGS64, KILN_WG_ACC64, "%64, %65", "%66", "%64, %65, %66, %67", "%68", "%69")
KILN_WGMMA(false, "f16", 64, 32, KILN_WG_REGS32, KILN_WG_ACC32, "%32, %33", "%34", "%32, %33, %34, %35", "%36", "%37")
KILN_WGMMA(false, "f16", 128, 64, KILN_WG_REGS64, KILN_WG_ACC64, "%64, %65", "%66", "%64, %65, %66, %67", "%68", "%69")
KILN_WGMMA(true, "bf16", 256, 128, KILN_WG_REGS128, KILN_WG_ACC128, "%128, %129", "%130", "%128, %129, %130, %131", "%132", "%133")
KILN_WGMMA(false, "f16", 256, 128, KILN_WG_REGS128, KILN_WG_ACC128, "%128, %129", "%130", "%128, %129, %130, %131", "%132", "%133")
#undef KILN_WGMMA
#undef KILN_WG_ACC128
#undef KILN_WG_ACC64
#undef KILN_WG_ACC32
#undef KILN_WG_REGS128
#undef KILN_WG_REGS64
#undef KILN_WG_REGS32

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMAs that own it.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Writes by cp.async (the generic proxy) become visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory matrix descriptor with the 128-byte swizzle; addr, lbo, sbo in bytes.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}

template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
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
// Waits until the phase of the given parity has completed (a fresh barrier counts its phase "1" as done).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// A box from shared memory at src into the tensor at (c0, c1, c2) (elements outside the tensor are not
// written), as part of this thread's current bulk group.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups have finished reading shared memory (its source may be written again).
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// This thread's bulk groups are complete (their writes performed).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Thread-block clusters.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster, converged.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrival on the barrier at the same shared-memory offset in block `rank` of the cluster, with the default
// (CTA-scope) release: the stage was read by this block's MMAs, already complete. A cluster-scope release
// is a memory barrier per arrival: on the H200 the math warps then stalled on it about 5 cycles per issued
// instruction and the kernel ran at half speed.
__device__ __forceinline__ void mbar_arrive_in(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [r];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// A box into the same shared-memory offset of every block in `mask`, each block's barrier at `bar` counting it.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                      uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

}  // namespace kiln::cuda::wgmma
