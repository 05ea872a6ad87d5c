// CUDA launchers of attention (kernels in src/cuda/kernels/attention_*.cuh and flash_attention.cuh). The op
// layer (src/ops/attention.cpp) checks the arguments and describes the operands in an attention_math::Layout
// exactly as for the CPU reference (src/cpu/attention.h).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"
#include "ops/attention_math.h"

namespace kiln::cuda {

// As cpu::attention. Picks the decode kernel (L.has_lengths, Lq <= 8, contiguous 16-byte rows), the flash
// prefill kernel (D = Dv in {64, 128}, f16/bf16, no mask, unit column strides) or the general kernel.
// Lengths outside [0, Lkv] are reported through the device error record.
void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
               const Tensor& lengths, const attention_math::Layout& L, double scale);

// How the decode kernel splits the keys (measured on the H200 with `kiln bench ops --filter
// decode_attention`). The splits' partials go through global memory to a combine kernel
// launched as a dependent.
//   min_split_keys    at least this many keys per split (a multiple of 64);
//   blocks_per_sm     the grid aims at this many blocks per multiprocessor (two fit, by shared memory).
//   kernel            Regs (the default): kernels/decode_attention_regs.cuh, K and V loaded straight into
//                     MMA fragments, for KV groups of at most 8 query rows (Hq / Hkv x Lq) with q rows in
//                     16-byte pieces, else CpAsync; same grid and splits as CpAsync. CpAsync:
//                     kernels/decode_attention.cuh, K/V through a shared-memory ring (any group size). Tma:
//                     the Hopper TMA kernel (kernels/decode_attention_sm90.cuh; compute capability 9.0, q rows
//                     in 16-byte pieces and caches that fit tensor maps, else CpAsync), opt-in: slower.
//                     On the H200 Regs was up to 8% faster than CpAsync at 11 of 12 benchmark shapes
//                     (2026-12-03);
//   max_blocks        the TMA kernel's persistent grid: at most this many blocks (0: one per
//                     multiprocessor); blocks_per_sm applies to the cp.async and register kernels.
//   l2_prefetch       the cp.async kernel's K/V copies ask L2 to fetch the 128-byte block around each miss
//                     (128, the default: 1-3% faster at L >= 2048 on the H200) or give no hint (0).
//   row_combine_splits  at most this many splits are combined with one warp per output row
//                     (decode_combine_rows_kernel), more with one block per row (decode_combine_kernel); 0:
//                     always the latter.
//   early             the register kernel before it waits for the kernel before it (programmatic dependent
//                     launch): 0 nothing; 1 it reads the length as it stands and asks L2 for the K/V lines of
//                     each warp's first early_chunks 16-key chunks of the split that length gives; 2 (the
//                     default) also loads the first chunk right after the wait, with the length's load in
//                     flight, and keeps it where the length read then gives that chunk the same keys (else
//                     loads it again).
//   early_chunks      0, 1 (the default) or 2. On the H200 (2026-12-03) early=2
//                     with one chunk against early=0: faster at all 16 benchmark shapes (1.8-6.0%; geomean
//                     1.23x PyTorch against 1.19x); with two chunks 1-5% slower than early=0 at L8192.
//   early_guess_skew  tests: keys added to the length read before the wait, so that the guess is wrong.
// Set for tests and benchmarks by set_decode_tuning, or
// KILN_DECODE_TUNING="keys=64,bps=2,kernel=tma,blocks=8,l2=128,rowc=16,early=2,pf=1" (kernel=regs|cp.async|tma;
// pf: early_chunks).
enum class DecodeKernel { CpAsync, Tma, Regs };
struct DecodeTuning {
  int min_split_keys = 64;
  int blocks_per_sm = 2;
  DecodeKernel kernel = DecodeKernel::Regs;
  int max_blocks = 0;
  int l2_prefetch = 128;
  int row_combine_splits = 16;
  int early = 2;
  int early_chunks = 1;
  int early_guess_skew = 0;
};
DecodeTuning decode_tuning();
void set_decode_tuning(const DecodeTuning& t);
// Decode calls that took the TMA kernel so far in this process (tests check that it ran).
int64_t decode_tma_launches();
// Decode calls that took the register kernel (DecodeKernel::Regs) so far in this process.
int64_t decode_regs_launches();
// paged_decode_attention calls that read the blocks in place (the register kernel through the block table).
int64_t decode_paged_launches();

// Which tensor-core kernel runs prefill without a mask: Auto takes the Hopper wgmma kernel
// (kernels/flash_attention_sm90.cuh) when this build has sm_90a code, the device has compute capability
// 9.0 and the operands fit TMA tensor maps, else the mma.sync kernel (kernels/flash_attention.cuh); Mma
// forces the latter. Masked prefill always takes the mma.sync kernel. Set for tests and benchmarks by
// set_prefill_kernel, or KILN_PREFILL_KERNEL=mma.
enum class PrefillKernel { Auto, Mma };
PrefillKernel prefill_kernel();
void set_prefill_kernel(PrefillKernel k);

// The Hopper prefill kernel is persistent: its grid has at most this many blocks (0: one per multiprocessor,
// the default), which take the query tiles in turn. Set for tests and A/B runs by set_prefill_max_blocks, or
// KILN_PREFILL_BLOCKS=N (a number at least the tile count gives one block per tile).
int prefill_max_blocks();
void set_prefill_max_blocks(int n);

// paged_decode_attention's in-place path (the register decode kernel reading K and V through the block table):
// false, with nothing launched, where it does not apply (the caller gathers the blocks instead). The op layer
// has checked the arguments; table and lengths are contiguous.
bool paged_decode_attention(const Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                            const Tensor& table, const Tensor& lengths, double scale);

// k_cache [B, H, Lmax, D] and v_cache [B, H, Lmax, Dv] (any strides) <- k_src [B, H, T, D] / v_src (in
// the caches' dtypes) at positions[b] (i32 [B], contiguous), in one launch: a sequence whose range leaves
// [0, Lmax] is skipped and reported through the device error record.
void kv_cache_append(const Tensor& k_cache, const Tensor& k_src, const Tensor& v_cache, const Tensor& v_src,
                     const Tensor& positions, int64_t lmax);

}  // namespace kiln::cuda
