// Hopper (sm_90a) flash prefill on warpgroup MMA (wgmma): the same math as flash_prefill_kernel
// (kernels/flash_attention.cuh) with four times the rows per block and tensor-core instructions that read
// their operands straight from shared memory.
//
// Block = two warpgroups (256 threads) = 128 query rows of one (batch, head); warpgroup w owns rows
// 64w..64w+63, and inside it warp i rows 16i..16i+15 with the lane layout of mma.sync (lane l: rows l/4 and
// l/4 + 8). K/V stream in 128-key tiles through shared memory with cp.async, double buffered. Per tile and
// warpgroup: S = q k^T by wgmma m64n128k16 with both operands in shared memory (q and k "K-major"), the
// online softmax in registers (log2 domain, f32), P rounded to 16 bits and kept in registers as wgmma's A
// operand, o += P v by wgmma m64nDk16 with v read "MN-major" (transposed by the instruction, no copy).
//
// Shared tiles use the 128-byte swizzle wgmma understands: a tile of R rows x D columns is D/64 column
// blocks of R rows x 128 bytes; the 16-byte chunk c of row r sits at chunk position c ^ (r % 8). Every
// tile starts on a 1024-byte boundary. A matrix descriptor holds the start address and two strides (all in
// 16-byte units): for K-major operands the stride between 8-row groups (1024 bytes) and, inside the
// 128-byte row, k steps of 16 elements advance the start address by 32 bytes; for the MN-major v the stride
// between 8-key groups (1024 bytes) and between 64-column blocks (R x 128 bytes).
//
// Compiled only for sm_90a (the wgmma instructions do not exist elsewhere); other targets get a body that
// traps, and the host never launches it there (see cuda/attention_sm90.cu).
#pragma once

#include "cuda/kernels/flash_attention.cuh"

namespace kiln::cuda::attn::sm90 {

constexpr int kBM = 128;       // query rows per block
constexpr int kBN = 128;       // keys per K/V tile
constexpr int kThreads = 256;  // two warpgroups

// Dynamic shared memory: the q tile, two stages of K, three of V, and slack to align the start to 1024 bytes.
constexpr size_t smem_bytes(int d) { return static_cast<size_t>(kBM + 5 * kBN) * d * 2 + 1024; }

template <class Tag, int N>
struct Wgmma;  // ss: D (+)= A B with A, B in shared memory; rs: D += A B with A in registers, B MN-major

template <>
struct Wgmma<Bf16Tag, 64> {
  __device__ static void ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  __device__ static void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<Bf16Tag, 128> {
  __device__ static void ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  __device__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<F16Tag, 64> {
  __device__ static void ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  __device__ static void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<F16Tag, 128> {
  __device__ static void ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  __device__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};

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

// Byte offset of 16-byte chunk c of row r in a swizzled tile of R rows.
template <int R>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Rows [row0, row0 + R) of one head (rows `row_stride` elements apart, D contiguous elements each, 16-byte
// aligned) into a swizzled tile at shared address dst; rows at or beyond `limit` are zero-filled unread.
// Thread i copies chunk i % (D / 8) of rows i / (D / 8) + k * (256 / (D / 8)): a multiple of 8 rows apart,
// so its swizzled offset only moves by whole rows and its source pointer by a fixed step.
template <int R, int D>
__device__ __forceinline__ void load_tile_swz(uint32_t dst, const uint16_t* src, int64_t row_stride, int64_t row0,
                                              int64_t limit) {
  constexpr int kChunks = D / 8, kRowsPerPass = kThreads / kChunks, kPasses = R / kRowsPerPass;
  static_assert(kRowsPerPass % 8 == 0 && R % kRowsPerPass == 0, "tile shape");
  const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  const uint32_t soff = dst + (c >> 3) * (R * 128) + r0 * 128 + (((c & 7) ^ (r0 & 7)) << 4);
  const int64_t rem64 = limit - row0 - r0;  // rows of this thread that exist: those below rem
  const int rem = rem64 < 0 ? 0 : rem64 > R ? R : static_cast<int>(rem64);
  const uint16_t* g = src + (row0 + r0) * row_stride + c * 8;
  const int64_t step = kRowsPerPass * row_stride;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const bool valid = i * kRowsPerPass < rem;
    cp_async16_to(soff + i * kRowsPerPass * 128, valid ? g : src, valid);
    g += step;
  }
}

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x; -inf gives +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// Prefill: one block per (128 query rows, head, outer index), heaviest causal tiles first. Needs q, k and v
// rows of 16-byte aligned contiguous channels; no mask (masked prefill takes flash_prefill_kernel).
//
// Software pipeline per warpgroup: iteration t issues S_t = q k_t^T and then o += P_{t-1} v_{t-1}, waits
// for S_t only, and runs the softmax of tile t while the tensor cores still work on P_{t-1} v_{t-1}; then
// it waits for that, rescales o and keeps P_t in registers for the next iteration. K tiles take two stages
// (k_t is dead once S_t is done), V tiles three (v_{t-1} is still read during iteration t while v_{t+1}
// loads).
template <class Tag, int D, bool Causal>
__global__ void __launch_bounds__(kThreads, 1) flash_prefill_sm90_kernel(FlashParams p) {
  static_assert(kBM == kBN, "a causal tile is never wholly in a warpgroup's future");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char sm_raw[];
  constexpr uint32_t kQBytes = kBM * D * 2, kTileBytes = kBN * D * 2;
  const uint32_t qs = (smem_addr(sm_raw) + 1023u) & ~1023u;
  const uint32_t ks = qs + kQBytes;          // [2][kBN][D]
  const uint32_t vs = ks + 2 * kTileBytes;   // [3][kBN][D]
  const am::Layout& L = p.L;
  const int64_t x = blockIdx.x;
  const int64_t qt = p.q_tiles - 1 - x % p.q_tiles;  // heaviest causal tiles first
  const int64_t task = x / p.q_tiles;
  const int64_t h = task % L.heads, o = task / L.heads;
  const am::Offsets off = am::batch_offsets(L, o, h);
  const int64_t m0 = qt * kBM;
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const uint16_t* kbase = p.k + off.k;
  const uint16_t* vbase = p.v + off.v;

  const int64_t kv_end = Causal ? (m0 + kBM < L.lkv ? m0 + kBM : L.lkv) : L.lkv;
  const int tiles = static_cast<int>((kv_end + kBN - 1) / kBN);
  load_tile_swz<kBM, D>(qs, p.q + off.q, L.q_row, m0, L.lq);  // rows past Lq are zero
  if (tiles > 0) {
    load_tile_swz<kBN, D>(ks, kbase, L.k_row, 0, L.lkv);
    load_tile_swz<kBN, D>(vs, vbase, L.v_row, 0, L.lkv);
  }
  cp_async_commit();

  const int64_t row_lo = m0 + wg * 64 + warp * 16 + lane / 4;
  int64_t e[2];  // keys [0, e) are visible to the lane's rows row_lo and row_lo + 8
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t row = row_lo + 8 * rr;
    e[rr] = Causal ? (row + 1 < L.lkv ? row + 1 : L.lkv) : L.lkv;
  }
  // Keys below e_wg are visible to every row of the warpgroup: tiles that end there need no mask.
  const int64_t wg_row0 = m0 + wg * 64;
  const int64_t e_wg = Causal ? (wg_row0 + 1 < L.lkv ? wg_row0 + 1 : L.lkv) : L.lkv;
  const float scale = p.scale_log2;
  const uint64_t dq = smem_desc(qs + wg * 64 * 128, 16, 1024);  // this warpgroup's 64 q rows
  int v_prev = 2;  // the V stage of tile t - 1
  float acc[D / 2];   // o: acc[4n + i] holds row (i < 2 ? lo : lo + 8), column 8n + 2 (lane % 4) + i % 2
  float s[kBN / 2];   // scores of one tile, same layout with key 8j + 2 (lane % 4) + i % 2
  uint32_t pa[kBN / 16][4];  // P of the previous tile: wgmma's A fragments, one per 16 keys
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kBN / 16; ++i) pa[i][0] = pa[i][1] = pa[i][2] = pa[i][3] = 0u;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int t4 = lane % 4;

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // k_t, v_t are in; every warpgroup is done with k_{t-1} and v_{t-2}
    if (t + 1 < tiles) {
      load_tile_swz<kBN, D>(ks + ((t + 1) & 1) * kTileBytes, kbase, L.k_row, int64_t{t + 1} * kBN, L.lkv);
      const int v_next = v_prev == 0 ? 2 : v_prev - 1;  // (t + 1) % 3
      load_tile_swz<kBN, D>(vs + v_next * kTileBytes, vbase, L.v_row, int64_t{t + 1} * kBN, L.lkv);
    }
    cp_async_commit();
    const int64_t key0 = int64_t{t} * kBN;
    const uint64_t dk = smem_desc(ks + (t & 1) * kTileBytes, 16, 1024);

    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {  // S_t = q k_t^T over D in steps of 16 (32 bytes into the row)
      const uint32_t col = (kk % 4) * 32;
      Wgmma<Tag, kBN>::ss(s, dq + (((kk / 4) * (kBM * 128) + col) >> 4), dk + (((kk / 4) * (kBN * 128) + col) >> 4),
                          kk > 0 ? 1 : 0);
    }
    wg_commit();
    if (t > 0) {  // o += P_{t-1} v_{t-1} over its keys in steps of 16
      const uint64_t dv = smem_desc(vs + v_prev * kTileBytes, kBN * 128, 1024);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) Wgmma<Tag, D>::rs(acc, pa[kk], dv + ((kk * 16 * 128) >> 4));
    }
    wg_commit();
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_t is done
    fence_regs(s);

    // Mask (only tiles that reach past a row's last key; the test is uniform over the warpgroup), then the
    // online softmax (the lane's quad holds a row's 128 scores). Scores stay unscaled until the exponent:
    // scale > 0 (checked by the host), so the row max of the raw scores gives the scaled max, and
    // p = 2^(s * scale - max) is one fma and one ex2 per score.
    if (key0 + kBN > e_wg) {
      int lim[2];  // keys 8j + (i & 1) >= lim are masked for the lane's two rows
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
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * rr], s[4 * j + 2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rr], mx * scale);
      // A row with every key so far masked keeps m = -inf; subtracting 0 then makes its p exactly 0.
      const float base = m_new == -INFINITY ? 0.f : m_new;
      corr[rr] = fast_exp2(m[rr] - base);
      m[rr] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        s[4 * j + 2 * rr] = fast_exp2(fmaf(s[4 * j + 2 * rr], scale, -base));
        s[4 * j + 2 * rr + 1] = fast_exp2(fmaf(s[4 * j + 2 * rr + 1], scale, -base));
        rs += s[4 * j + 2 * rr] + s[4 * j + 2 * rr + 1];
      }
      l[rr] = l[rr] * corr[rr] + rs;
    }
    wg_wait_all();  // P_{t-1} v_{t-1} is in o
    fence_regs(acc);
    fence_regs(pa);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[4 * n + 0] *= corr[0];
      acc[4 * n + 1] *= corr[0];
      acc[4 * n + 2] *= corr[1];
      acc[4 * n + 3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pa[kk][0] = Mma<Tag>::pack(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = Mma<Tag>::pack(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Mma<Tag>::pack(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Mma<Tag>::pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
    v_prev = v_prev == 2 ? 0 : v_prev + 1;  // t % 3
  }
  if (tiles > 0) {  // the last tile's o += P v
    const uint64_t dv = smem_desc(vs + v_prev * kTileBytes, kBN * 128, 1024);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) Wgmma<Tag, D>::rs(acc, pa[kk], dv + ((kk * 16 * 128) >> 4));
    wg_commit();
    wg_wait_all();
    fence_regs(acc);
    fence_regs(pa);
  }
  cp_async_wait<0>();

  // The quad's row sums, then o / l (no visible key: 0) in 16 bits.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t row = row_lo + 8 * rr;
    if (row >= L.lq) continue;
    const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
    uint32_t* orow = reinterpret_cast<uint32_t*>(p.out + (task * L.lq + row) * D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      orow[(8 * n + 2 * t4) / 2] = Mma<Tag>::pack(acc[4 * n + 2 * rr] * inv, acc[4 * n + 2 * rr + 1] * inv);
  }
#else
  __trap();  // not an sm_90a build: the host does not launch this kernel
#endif
}

}  // namespace kiln::cuda::attn::sm90
