// CUDA grouped_mm, MoE router and MoE block (kernels in src/cuda/kernels/grouped_mm.cuh and moe.cuh). Only
// in KILN_HAVE_CUDA builds. The op layer (src/ops/moe.cpp) has checked shapes, dtypes and devices; nothing
// here reads device memory from the host or synchronises: invalid offsets are recorded on the device and
// raised at the next synchronisation.
#pragma once

#include <cstdint>

#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// out (allocated by the caller: [M, N] or [G, M, N], the inputs' dtype or f32) = grouped_mm(a, b, offs) for
// the four forms of kiln::grouped_mm; offs null for 3-d x 3-d.
void grouped_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor* offs);

// Which kernel grouped_mm and the MoE block take for the row-grouped form: the matrix-vector kernel while
// groups hold few rows (M <= 16 or M <= 2 G: at most a couple of rows per group on average), else tiles:
// on Hopper (wgmma_available) for 16-bit inputs with 16-byte rows in the row-grouped and batched forms the
// warp-specialised TMA kernel (kernels/grouped_mm_sm90.cuh; the MoE block first gathers x's rows into
// expert order for it) where the operands fit tensor maps, else the cp.async wgmma kernel; elsewhere the
// portable tiles. Forced by set_forced_grouped_mm_path (tests, benchmarks) or KILN_GROUPED_MM_PATH (auto,
// decode, tiled, tiled-wide, tma, tma-64, tma-wide, tma-wide-pair, tma-cluster2, tma-cluster4, portable):
// Tiled / TiledWide the cp.async wgmma kernel with 128 x 128 / 128 x 256 tiles, TiledTma the TMA kernel with
// 128 x 128 tiles, TiledTma64 with 64 x 128 tiles, TiledTmaWide with 128 x 256 tiles (Auto takes one of these
// three by the rows per group: 64 x 128 up to 48 on average, 128 x 256 from 96; KILN_GMM_TMA64_ROWS,
// KILN_GMM_WIDE_ROWS), TiledTmaWidePair 128 x 256 tiles in pairs along M sharing each B tile, TiledTmaCluster2
// / 4 the TMA kernel in clusters of 2 / 4 blocks sharing each A tile, TiledPortable the portable tiles only;
// Auto: the heuristic.
enum class GroupedMmPath {
  Auto,
  Decode,
  Tiled,
  TiledWide,
  TiledTma,
  TiledTma64,
  TiledTmaWide,
  TiledTmaWidePair,
  TiledTmaCluster2,
  TiledTmaCluster4,
  TiledPortable
};
void set_forced_grouped_mm_path(GroupedMmPath p);
// The register bound of the matrix-vector kernel's one-row instance (one-token products and the MoE block's
// decode): 1 (the compiler's choice: 56 registers for 16-bit inputs, 4 blocks per SM), 6 blocks per SM (40
// registers, a little spilling) or 0 (the default: 1; measured on the H200 as fast or faster at every
// one-token shape once the warps find their group without a block-wide scan, 2026-12-04). Also KILN_GMM_DECODE_MINB=0|1|6. KILN_GMM_DECODE_SPLIT=1|2|4|8 forces the matrix-vector kernel's
// warps per weight-row group (A/B runs; unset: the rule in moe.cu, decode_split).
void set_grouped_decode_min_blocks(int n);
int grouped_decode_min_blocks();
// The Hopper tile kernels' epilogue for whole tiles of C (16-bit, or f32 without SiLU-mul) with contiguous
// aligned columns: a straight run of paired stores (kernels/grouped_mm_sm90.cuh, gmm90_store_run) instead
// of the general loop, whose checks and store forms per element make a long stretch of code for the
// instruction cache. On by default (measured faster at every tiled shape); also KILN_GMM_FAST_EPILOGUE=0|1.
void set_grouped_fast_epilogue(bool on);
bool grouped_fast_epilogue();
// That straight run's 16-bit C in 16-byte stores (the four lanes that hold a row's eight columns exchange
// their pairs first) where C's rows are 16-byte aligned. On by default (measured faster on large groups);
// also KILN_GMM_WIDE_STORES=0|1.
void set_grouped_wide_stores(bool on);
bool grouped_wide_stores();
// The 128-row tile kernels on Hopper: a math warpgroup whose 64 rows all lie past the tile's end (a group's
// last tile of at most 64 rows) skips its MMAs and its epilogue. On by default; also
// KILN_GMM_SKIP_IDLE_HALF=0|1.
void set_grouped_skip_idle_half(bool on);
bool grouped_skip_idle_half();
// The 128-row TMA tile kernels on Hopper: a math warpgroup whose 64 rows all belong to the tile's group
// stages its C rows in shared memory and stores them with TMA, asynchronously, instead of storing from
// registers (16-bit C, rows contiguous and 16-byte aligned, no row scatter, at most 241 groups). On by
// default since it writes with stmatrix: on the H200 it took 1.7% and 0.7% less time than the register
// stores over the six T4096 benchmark products (geomean, two runs), single products from 4% faster to 2%
// slower (2026-12-04). Also KILN_GMM_TMA_STORE=0|1. grouped_tma_store_launches():
// launches that took it so far (for tests).
void set_grouped_tma_store(bool on);
bool grouped_tma_store();
int64_t grouped_tma_store_launches();
// Launches so far of the TMA tile kernel instance a path forces (TiledTma, TiledTma64, TiledTmaWide,
// TiledTmaWidePair, TiledTmaCluster2 or TiledTmaCluster4; tests check that a forced path ran).
int64_t grouped_tma_launches(GroupedMmPath path);

// The MoE block of one token whose k slots divide the decode kernel's 8 warps (k = 1, 2, 4, 8) with the
// matrix-vector products: the weighted combine of the k expert outputs runs inside the down product
// (kernels/grouped_mm.cuh, GmmArgs::comb_weights: each block computes its columns for all k experts and
// writes their weighted sum): one launch less, and no [k, H] f32 rows in between. On by default; also
// KILN_MOE_FUSED_COMBINE=0|1. moe_fused_combine_launches(): MoE blocks that took it so far (for tests).
void set_moe_fused_combine(bool on);
bool moe_fused_combine();
int64_t moe_fused_combine_launches();

// The MoE block of one token with FP8 experts and the matrix-vector products: its down product reads the
// routing's row groups and issues its first weight loads before its dependent-launch wait, so that they are
// in flight while the gate_up product ends (kernels/grouped_mm.cuh, GmmArgs::groups_before_wait). On by
// default; also KILN_MOE_EARLY_DOWN=0|1. 16-bit experts keep the usual order (measured no faster).
void set_moe_early_down(bool on);
bool moe_early_down();

// moe_route on CUDA (x [T, H], router_weight [E, H]): logits through cuda::linear, then one fused kernel
// (softmax f32, top-k, renormalisation) when E <= 256, else the composed ops.
MoeRouting moe_route(const Tensor& x, const Tensor& router_weight, int64_t top_k, bool norm_topk_prob);

// moe_forward on CUDA: routing, the permutation, gate_up with SiLU-mul fused, down, the combine.
Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Tensor& gate_up, const Tensor& down,
                   int64_t top_k, bool norm_topk_prob);

// The same block over FP8 experts (shapes, dtypes and scales checked by the op layer): the decode-shaped
// products (few rows per expert) dequantise the weights in registers. Returns an undefined tensor, having
// launched nothing, when that kernel does not apply (many rows per expert, f32 activations, rows that are
// not 16-byte multiples): the caller then dequantises the experts.
Tensor moe_forward_fp8(const Tensor& x, const Tensor& router_weight, const Fp8Experts& experts, int64_t top_k,
                       bool norm_topk_prob);

}  // namespace kiln::cuda
