// CUDA side of the llama.cpp-format weights (linear and dequantisation with Q8Weight, Q4Weight, Q4KWeight,
// Q5KWeight, Q6KWeight; kiln/nn.h). Only in KILN_HAVE_CUDA builds. The op layer (src/ops/quant.cpp) has checked shapes, dtypes and
// devices. Kernels in src/cuda/kernels/qgemv.cuh.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

enum class QuantFormat { Q8_0, Q4_0, Q4_K, Q5_K, Q6_K };

// Q4_K, Q5_K and Q6_K: GGUF's super-blocks as they are, no separate scales.
inline bool super_blocks(QuantFormat f) { return f == QuantFormat::Q4_K || f == QuantFormat::Q5_K || f == QuantFormat::Q6_K; }

// linear takes up to this many rows of x through the int8 matrix-vector kernel (launches of up to 8 rows, each
// reading the weight once); more rows multiply the weight dequantised to x's dtype, a slice at a time.
inline constexpr int64_t kQuantGemvRows = 32;

// y [M, N] (contiguous, x's dtype) = x2 [M, K] (unit inner stride; f32, f16 or bf16) @ dequant(w)^T + bias [N].
// values: Q8_0 int8 [N, K], Q4_0 uint8 [N, K / 2], Q4_K / Q5_K / Q6_K uint8 [N, K / 256 x 144 / 176 / 210], unit
// inner stride; scales: f16 [N, K / 32] with unit inner stride (Q8_0, Q4_0), undefined for the super-blocks. Up to kQuantGemvRows rows x is
// quantised to int8 per block of 32 as the CPU does (the same codes and scales) and every block's dot product
// is an exact integer sum, so results differ from the CPU's only in how the f32 sums and scalings are ordered.
// Weights that are not 16-byte aligned (Q6_K: 2-byte), or whose rows are not contiguous, are copied to a fresh
// buffer first.
void linear_quantized(const Tensor& y, const Tensor& x2, QuantFormat f, const Tensor& values, const Tensor& scales,
                      const Tensor* bias);

// A stack of weights of one format for the grouped product: values [G x n, ...] and scales as above.
struct QuantStack {
  QuantFormat format;
  Tensor values, scales;
};

// One token's MoE block over experts in block formats (moe_forward(x, router, BlockExperts) on CUDA): x [1, H]
// (f32, f16 or bf16), the routing's weights [1, k] (x's dtype) and experts [1, k] (int32, on the device),
// gate_up [E x 2I, H] and down [E x H, I] stacks. x is quantised once, one grouped launch runs the k experts'
// gate_up rows (each block of the launch reads its expert's index after the dependent-launch wait), SiLU x up in
// x's dtype is quantised per row, a second grouped launch runs the down rows into f32, and the routing weights
// combine them. Only device work: a CUDA graph can capture it. Returns [1, H] in x's dtype.
Tensor moe_block_experts_one(const Tensor& x, const Tensor& weights, const Tensor& experts, const QuantStack& gate_up,
                             const QuantStack& down, int64_t num_experts);

// out [N, K] (contiguous f32, f16 or bf16) = the weight's values, computed as the CPU computes them (f32 out
// is the same bits), rounded once to out's dtype. Any strides and alignment.
void dequantize_quantized(QuantFormat f, const Tensor& values, const Tensor& scales, const Tensor& out);

// The values per slice of the dequantised weight on the many-rows path (default 2^25), process-wide: tests
// make it small to cover several slices.
void set_quant_slice_elements(int64_t n);
int64_t quant_slice_elements();

// Blocks per multiprocessor of the int8 matrix-vector launches (initially KILN_QGEMV_BLOCKS_PER_SM, for A/B
// runs), process-wide: with n > 0 at most n x the multiprocessors, each block looping over its row blocks with
// its next loads in flight while it computes (twice the registers); 0 (the default): one block per row block.
// The same bits either way.
void set_qgemv_blocks_per_sm(int64_t n);
int64_t qgemv_blocks_per_sm();

}  // namespace kiln::cuda
