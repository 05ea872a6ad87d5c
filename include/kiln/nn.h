// Neural-network ops that dominate LLM decode: linear, softmax, norms, rotary embeddings, activations,
// top-k and sampling. CPU reference implementations; the CUDA kernels are the decode-kernels work.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "kiln/ops.h"

namespace kiln {

// y = x @ weight^T + bias. x [..., K], weight [N, K], bias [N] (optional); f32/f16/bf16 (half types
// accumulate in f32); output [..., N] in x's dtype.
Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt);

// Along any dim, computed in f32 (f64 for f64 input); output dtype = `dtype` or x's. Rows of all -inf give
// NaN, as PyTorch's do.
Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

// x * rsqrt(mean(x^2, last dim) + eps) * weight, computed in f32, output in x's dtype. weight [D].
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
// residual += x (in residual's dtype), then returns rms_norm(residual, weight, eps): the pre-norm step of a
// transformer block in one pass.
Tensor add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& weight, double eps);

// gate_up [..., 2I] -> silu(gate_up[..., :I]) * gate_up[..., I:], computed in f32, output in the input dtype.
Tensor silu_and_mul(const Tensor& gate_up);
// silu_and_mul(linear(x, weight)) with weight [2I, K] (gate rows then up rows). On CUDA, one row of x takes
// one matrix-vector kernel with the activation in its epilogue, computed from the f32 sums (the product is
// not rounded to x's dtype first, so half-type results can differ from the composition by that rounding);
// everything else, and the CPU, is the composition.
Tensor linear_silu_and_mul(const Tensor& x, const Tensor& weight);

// Rotary position embedding with Hugging Face's half-split layout (rotate_half), applied in place.
// q [T, Hq, D], k [T, Hk, D], positions [T] (i32 or i64, on q's device). The first `rotary_dim` (even,
// default D) channels rotate: for j < rotary_dim/2, angle = positions[t] * inv_freq[j],
//   x[j]     <- x[j] * cos - x[j + r/2] * sin,   x[j + r/2] <- x[j + r/2] * cos + x[j] * sin
// computed in f32, times `attention_scaling` on cos and sin (YaRN; 1 otherwise).
void rope_(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, double attention_scaling = 1.0);
// inv_freq[j] = theta^(-2j / rotary_dim), j < rotary_dim / 2, f32 on `device` (unscaled RoPE).
Tensor rope_inv_freq(int64_t rotary_dim, double theta, Device device = kCPU);
// The common case: unscaled RoPE with base theta over all D channels.
void rope_(Tensor& q, Tensor& k, const Tensor& positions, double theta);

// The k largest values along the last dim and their i64 indices, sorted descending (ties: lower index
// first). 1 <= k <= 64 and k <= the dim's size.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k);

// Sampling parameters (temperature 0 means greedy; top_k 0 and top_p 1 and min_p 0 disable those filters).
struct SamplingParams {
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
};
// One token id per row of logits [B, V] (or [V]), as an i64 tensor [B] (or 0-d) on logits' device. Filters
// apply in the order temperature, top_k, top_p, min_p; the draw uses the generator's Philox stream, so a
// seed reproduces the same tokens.
Tensor sample(const Tensor& logits, const SamplingParams& params, Generator* gen = nullptr);
// The same stream with the Philox offset held in `offset` (one int64 on logits' device), read when the
// kernels run and incremented by one there. For a decode step captured in a CUDA graph: the overload above
// takes its offset on the host, so a replay would repeat the captured offset (the same draws every step);
// this one draws anew on every replay. (seed, offset value) gives the same tokens as a Generator would.
Tensor sample(const Tensor& logits, const SamplingParams& params, uint64_t seed, const Tensor& offset);
// The distribution sample() draws each row from, as f32 probabilities of logits' shape: the kept tokens'
// weights e_i (the definition in src/ops/sampling_math.h) over their sum, 0 elsewhere; temperature 0 puts 1 on
// the argmax. Computed on the CPU (CUDA logits are copied there; the result goes back to their device).
Tensor sampling_probs(const Tensor& logits, const SamplingParams& params);

// ---------------------------------------------------------------------------------------------------------
// Attention (src/ops/attention.cpp; docs/attention.md)

// PyTorch's F.scaled_dot_product_attention without dropout. q [..., Hq, Lq, D], k [..., Hk, Lkv, D],
// v [..., Hv, Lkv, Dv] -> [..., Hq, Lq, Dv] in q's dtype (f16/bf16/f32, and f64 on the CPU), computed with
// f32 accumulation (f64 on the CPU reference). The dims before the last two broadcast between q, k and v
// (q [1, 1, 64] with k [2, 1, 1, 64] works). enable_gqa: Hk and Hv divide Hq and query head h reads
// key head h / (Hq / Hk) (repeat_interleave, without a copy). attn_mask: bool (true = attend) or float
// (added to the scaled scores; f32 or q's dtype), broadcasting to [..., Hq, Lq, Lkv]. is_causal: query i
// attends keys j <= i (the top-left aligned tril, also when Lq != Lkv, as PyTorch); is_causal with a mask
// is an error. scale defaults to 1 / sqrt(D). A row with no key to attend (fully masked, or Lkv = 0) gives
// 0, as PyTorch 2.11's CPU paths do (_safe_softmax in the math path, the zero-sum guard in the flash path).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& attn_mask = std::nullopt, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt, bool enable_gqa = false);

// Decode attention over a KV cache. q [B, Hq, Lq, D] (Lq new tokens per sequence, any strides), k_cache
// [B, Hkv, Lmax, D], v_cache [B, Hkv, Lmax, Dv] (Hq a multiple of Hkv), lengths i32 [B] on q's device: the
// number of valid cache positions of each sequence, the Lq new tokens included (append first). Query t of
// sequence b sits at position lengths[b] - Lq + t and attends the cache positions up to and including its
// own (bottom-right aligned causal). Returns [B, Hq, Lq, Dv] in q's dtype. The lengths are read on the
// device, so a captured graph stays valid as they grow; a length outside [0, Lmax] raises kiln::Error at the
// next synchronisation (CUDA; the CPU throws at once) and that sequence's output is 0.
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                        std::optional<double> scale = std::nullopt);

// Writes k_new [B, Hkv, T, D] and v_new [B, Hkv, T, Dv] into the caches at positions [p, p + T) of each
// sequence, p = positions[b] (i32 [B] on the caches' device, read on the device). A sequence whose range
// falls outside [0, Lmax] is skipped and raises kiln::Error at the next synchronisation (CUDA; the CPU throws
// before writing anything). New values are converted to the caches' dtype.
void kv_cache_append_(Tensor& k_cache, Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                      const Tensor& positions);

// Paged KV caches (kiln serve): K and V pools of fixed-size blocks that many sequences share. k_pool
// [NB, S, Hkv, D] and v_pool [NB, S, Hkv, Dv] (contiguous; S = the block size); position p of sequence b lives
// in row p % S of block block_table[b, p / S], whose slot is block * S + p % S.

// Writes k_new [T, Hkv, D] and v_new [T, Hkv, Dv] to the pools at slots (i32 [T] on the pools' device, read on
// the device): row t to slot slots[t]. A slot outside [0, NB * S) is skipped and raises kiln::Error at the next
// synchronisation (CUDA; the CPU throws before writing anything). New values are converted to the pools'
// dtype.
void paged_kv_append_(Tensor& k_pool, Tensor& v_pool, const Tensor& k_new, const Tensor& v_new, const Tensor& slots);

// decode_attention over paged caches: q [B, Hq, Lq, D], block_table i32 [B, W], lengths i32 [B] with
// lengths[b] <= W * S, both on q's device and read there (graph-capturable). Equal to decode_attention with
// sequence b's cache made of the blocks block_table[b, 0..W) in order. Every entry of block_table must be a
// block of the pools (0 for entries a sequence does not use); an entry outside [0, NB) raises kiln::Error at
// once (CPU) or at the next synchronisation (CUDA). CUDA reads the blocks in place where the register decode
// kernel applies (f16/bf16, D = Dv in {64, 128}, Hq / Hkv x Lq <= 8, S a power of two >= 16); any other case
// gathers each sequence's blocks into a temporary cache first.
Tensor paged_decode_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_table,
                              const Tensor& lengths, std::optional<double> scale = std::nullopt);

// The attention prologue of one layer in one op (one launch on CUDA), equal to the composition
//   qn = rms_norm(q, q_norm, eps); kn = rms_norm(k, k_norm, eps);     (skipped for an undefined norm: Llama)
//   rope_(qn, kn, positions, inv_freq, attention_scaling);
//   kv_cache_append_(k_cache, v_cache, kn as [1, Hk, T, D], v as [1, Hk, T, Dv], at);  q <- qn
// with its roundings (each norm rounds to its input's dtype, rope computes in f32 from that and rounds again,
// the cache stores the result converted to its dtype). q [T, Hq, D] is overwritten with the normalised and
// rotated queries; k [T, Hk, D] and v [T, Hk, Dv] are only read (the normalised, rotated keys exist only in
// k_cache[0, :, at + t]); any strides, typically views of one fused qkv buffer. q_norm / k_norm: float [D] or
// undefined. positions [T] i32/i64, inv_freq [rotary_dim / 2] (rotary_dim <= D), as rope_. k_cache
// [1, Hk, Lmax, D], v_cache [1, Hk, Lmax, Dv], written at slots at + t; at: i32 [1] on the device, the slot of
// token 0, read on the device (graph-capturable). An `at` outside [0, Lmax - T] writes neither cache and raises
// kiln::Error at the next synchronisation (CUDA; q is still updated) or at once, before anything is written
// (CPU). q, k and v must not share memory with the caches; q overlapping k or v is allowed (such a call runs
// the composition, which reads every input before q is written). CUDA runs one kernel when q, k, v and the
// caches share one dtype (f16, bf16, f32), D and Dv <= 256 and each norm weight is in that dtype or f32 (after
// promote_types with q's, as rms_norm); any other case runs the composition.
void qk_norm_rope_append_(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                          double eps, const Tensor& positions, const Tensor& inv_freq, double attention_scaling,
                          Tensor& k_cache, Tensor& v_cache, const Tensor& at);

}  // namespace kiln

// ---- Mixture of experts ------------------------------------------------------------------------------------
namespace kiln {

// Grouped matrix product with PyTorch's F.grouped_mm / torch._grouped_mm semantics (f32/f16/bf16, f32
// accumulation; out dtype = `out_dtype` (the input's or f32) or the input's):
//   2d x 3d: a [M, K], b [G, K, N], offs [G]: rows [offs[g-1], offs[g]) of a use b[g]      -> [M, N]
//   3d x 2d: a [G, M, K], b [K, N], offs [G]: columns [offs[g-1], offs[g]) use a[g]       -> [M, N]
//   2d x 2d: a [M, K], b [K, N], offs [G]: the K range [offs[g-1], offs[g]) forms group g  -> [G, M, N]
//   3d x 3d: a [G, M, K], b [G, K, N], no offs                                             -> [G, M, N]
// offs: int32 on the inputs' device, cumulative ends (offs[-1] may be less than the grouped dim; rows /
// columns past it are written as 0, where PyTorch leaves them undefined). Offsets that decrease or exceed
// the grouped dim are an error: on the CPU thrown at once; on CUDA (the host never reads them) recorded on
// the device and raised at the next synchronisation, with no out-of-bounds access.
Tensor grouped_mm(const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs = std::nullopt,
                  std::optional<DType> out_dtype = std::nullopt);

// The Qwen3-MoE router: logits = x @ router_weight^T (x's dtype), probabilities = softmax in f32, the
// top_k experts per token (ties: lower index), optionally renormalised to sum 1, weights cast to x's dtype.
struct MoeRouting {
  Tensor weights;  // [T, top_k], x's dtype
  Tensor experts;  // [T, top_k], i32
};
MoeRouting moe_route(const Tensor& x, const Tensor& router_weight, int64_t top_k, bool norm_topk_prob);

// The sparse MoE block of Qwen3-MoE: x [T, H], router_weight [E, H], experts_gate_up [E, 2I, H] (gate rows
// then up rows, as checkpoints' per-expert gate_proj / up_proj stack), experts_down [E, H, I]:
//   out[t] = sum over the top_k experts e of t: weight(t, e) * down_e(silu(gate_e x_t) * up_e x_t)
// The per-expert products accumulate in f32 and round once to x's dtype (Hugging Face adds expert by
// expert in x's dtype, so bf16 results differ from it by that rounding).
Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Tensor& experts_gate_up,
                   const Tensor& experts_down, int64_t top_k, bool norm_topk_prob);

// FP8 experts as block-quantised checkpoints store them: gate_up [E, 2I, H] and down [E, H, I] float8_e4m3fn,
// with f32 scales per block_n x block_k block of each expert's [rows, K] matrix: gate_up_scales
// [E, ceil(2I / block_n), ceil(H / block_k)], down_scales [E, ceil(H / block_n), ceil(I / block_k)]
// (real weight = value x scale, the checkpoints' weight_scale_inv).
struct Fp8Experts {
  Tensor gate_up, gate_up_scales, down, down_scales;
  int64_t block_n = 128, block_k = 128;
};
// moe_forward over FP8 experts; x f32/f16/bf16. On CUDA, decode shapes (a few rows per expert, f16/bf16 x)
// dequantise the weights in registers (value x scale in f32, exact) and read one byte per weight; other
// shapes, and the CPU, compute with the experts dequantised to f32 (the CPU reference: x and the result
// round through f32 there) or, on CUDA, to x's dtype.
Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Fp8Experts& experts, int64_t top_k,
                   bool norm_topk_prob);
// The experts' real values: {gate_up, down} in `dtype` (value x scale computed in f32, rounded once).
std::pair<Tensor, Tensor> dequantize_fp8_experts(const Fp8Experts& experts, DType dtype);

// ---- FP8 -----------------------------------------------------------------------------------------------------

// How FP8 values are scaled. A scale is the factor that turns stored values back into real ones
// (real = fp8 * scale, PyTorch's scale_a / scale_b and the checkpoints' weight_scale_inv).
enum class ScaleRecipe {
  TensorWise,  // one scale for the whole tensor
  RowWise,     // one scale per row of a, per column of b (per output channel of a weight)
  BlockWise,   // per 1 x block of a (activations) and per block x block of b (weights)
};
const char* scale_recipe_name(ScaleRecipe r);

struct Fp8Tensor {
  Tensor values;  // float8_e4m3fn (or e5m2)
  Tensor scales;  // f32
};
// Quantises x [M, K] (f32/f16/bf16): scale = amax / fp8_max over each group (TensorWise: all; RowWise: a
// row, scales [M, 1]; BlockWise: 1 x block for `activation` = true (scales [M, ceil(K/block)]), else
// block x block (scales [ceil(M/block), ceil(K/block)])), values = round(x / scale) saturated to the fp8
// range. A group of zeros gets scale 1; a NaN or inf in a group makes that group's scale NaN.
Fp8Tensor quantize_fp8(const Tensor& x, ScaleRecipe recipe, DType fp8_dtype = DType::F8E4M3, bool activation = true,
                       int64_t block = 128);
// Real values of a quantised tensor, in `dtype`.
Tensor dequantize_fp8(const Fp8Tensor& q, ScaleRecipe recipe, DType dtype = DType::F32, bool activation = true,
                      int64_t block = 128);

// out = (a * scale_a) @ (b * scale_b) + bias, as torch._scaled_mm: a [M, K] and b [K, N] float8 (any
// strides; a weight W [N, K] is passed as W.t()), f32 accumulation, out f32/f16/bf16. Scales f32:
//   TensorWise: scale_a and scale_b one element each;
//   RowWise:    scale_a [M, 1], scale_b [1, N];
//   BlockWise:  scale_a [M, ceil(K/128)] (1 x 128), scale_b [ceil(K/128), ceil(N/128)] (128 x 128).
Tensor scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b, ScaleRecipe recipe,
                 const std::optional<Tensor>& bias = std::nullopt, DType out_dtype = DType::BF16);

// A linear layer's FP8 weight [N, K] with its scales: TensorWise (one), RowWise ([N] or [N, 1]) or
// BlockWise ([ceil(N/block_n), ceil(K/block_k)], the checkpoints' weight_scale_inv).
struct Fp8Weight {
  Tensor values;
  Tensor scales;
  ScaleRecipe recipe = ScaleRecipe::BlockWise;
  int64_t block_n = 128, block_k = 128;
};
// y = x @ dequant(w)^T + bias, x [..., K] f32/f16/bf16, output in x's dtype, f32 accumulation. The
// activations are not quantised: the weight is dequantised on the fly (exact: fp8 x f32 scale).
Tensor linear(const Tensor& x, const Fp8Weight& w, const std::optional<Tensor>& bias = std::nullopt);

// A linear layer's weight [N, K] in llama.cpp's Q8_0 format: blocks of 32 values along K, each block int8 values
// with one f16 scale (value = scale x q; scale = max|w| / 127 over the block, q = round(w / scale)), kept as
// two tensors: values int8 [N, K] in [-127, 127] (quantize_q8_0 never writes -128; the CPU's dot products assume
// it) and scales f16 [N, K / 32]. K must be a multiple of 32. docs/quantization.md.
struct Q8Weight {
  Tensor values;
  Tensor scales;
};
// Quantises a float weight [N, K] (f32/f16/bf16, finite) on its device.
Q8Weight quantize_q8_0(const Tensor& w);
// The weight's values x scales [N, K] in `dtype` (f32 exact).
Tensor dequantize_q8_0(const Q8Weight& w, DType dtype = DType::F32);
// y = x @ dequant(w)^T + bias, x [..., K] f32/f16/bf16, output in x's dtype. On the CPU the rows of x are
// quantised to Q8_0 themselves (per block of 32) for int8 dot products, as llama.cpp's, with AVX2 or AVX-512
// VNNI for any number of rows; without them up to 16 rows, and more rows multiply the weight dequantised to x's
// dtype, a slice at a time, with the dense product. On CUDA the split is at 32 rows: x quantised per block of
// 32 (the CPU's codes and scales) for an int8 matrix-vector kernel that reads the weight once per 8 rows; more
// rows multiply slices dequantised on the device.
Tensor linear(const Tensor& x, const Q8Weight& w, const std::optional<Tensor>& bias = std::nullopt);

// A linear layer's weight [N, K] in llama.cpp's Q4_0 format: blocks of 32 values along K, each 32 4-bit codes
// with one f16 scale (value = (code - 8) x scale; the value of largest magnitude in the block maps to code 0,
// scale = it / -8), kept as values uint8 [N, K / 2] (a block's 16 bytes hold codes j and j + 16 in the low and
// high nibble of byte j, GGUF's byte order) and scales f16 [N, K / 32]. K must be a multiple of 32.
struct Q4Weight {
  Tensor values;
  Tensor scales;
};
Q4Weight quantize_q4_0(const Tensor& w);
Tensor dequantize_q4_0(const Q4Weight& w, DType dtype = DType::F32);
// As linear(x, Q8Weight): on the CPU int8 dot products against the codes unpacked in registers (AVX2 / AVX-512
// VNNI; the rows split as for Q8_0); CUDA as for Q8_0.
Tensor linear(const Tensor& x, const Q4Weight& w, const std::optional<Tensor>& bias = std::nullopt);

// A linear layer's weight [N, K] in llama.cpp's Q4_K format, its bytes as GGUF stores them: blocks of 256
// values along K, each 144 bytes: f16 d, f16 dmin, 12 bytes packing the 6-bit scale s_j and min m_j of its
// eight sub-blocks of 32, and 128 bytes of 4-bit codes q (each 32 bytes hold a pair of sub-blocks: sub-block
// 2c in the low nibbles, 2c + 1 in the high ones); value = d s_j q - dmin m_j. Kept as blocks uint8
// [N, K / 256 x 144]. K must be a multiple of 256. 4.5 bits a weight.
struct Q4KWeight {
  Tensor blocks;
};
// llama.cpp's reference quantiser (quantize_row_q4_K_ref): per sub-block a weighted least-squares search of
// scale and min over 20 candidate grids, then d and dmin so that the largest scale and min take 63.
Q4KWeight quantize_q4_k(const Tensor& w);
Tensor dequantize_q4_k(const Q4KWeight& w, DType dtype = DType::F32);
// As linear(x, Q8Weight): on the CPU int8 dot products of x quantised per block of 32 against the codes (the
// mins through each block's sum of x; the rows split as for Q8_0). CUDA as for Q8_0.
Tensor linear(const Tensor& x, const Q4KWeight& w, const std::optional<Tensor>& bias = std::nullopt);

// A linear layer's weight [N, K] in llama.cpp's Q5_K format (GGUF's Q5_K_M files), its bytes as GGUF stores
// them: Q4_K's super-block (f16 d and dmin, 12 bytes of 6-bit scales and mins) with 32 bytes of fifth bits
// (qh) before the 128 bytes of 4-bit codes, 176 bytes per 256 values; sub-block j's codes gain bit j of qh[l]
// (codes 0..31), value = d s_j q - dmin m_j. Kept as blocks uint8 [N, K / 256 x 176]; 5.5 bits a weight. Read
// from GGUF files (no quantiser here).
struct Q5KWeight {
  Tensor blocks;
};
Tensor dequantize_q5_k(const Q5KWeight& w, DType dtype = DType::F32);
// As linear(x, Q4KWeight) (the fifth bits joined to the codes in registers), on the CPU and CUDA.
Tensor linear(const Tensor& x, const Q5KWeight& w, const std::optional<Tensor>& bias = std::nullopt);

// A linear layer's weight [N, K] in llama.cpp's Q6_K format (GGUF files keep output layers and some projections
// of their 4-bit models in it), its bytes as GGUF stores them: blocks of 256 values along K, each 210 bytes:
// 128 bytes of low 4 bits, 64 bytes of high 2-bit pairs, 16 int8 scales (one per 16 values) and an f16 d;
// value = d x scale x (code - 32), codes 0..63. Kept as blocks uint8 [N, K / 256 x 210]; 6.56 bits a weight.
// Read from GGUF files (no quantiser here).
struct Q6KWeight {
  Tensor blocks;
};
Tensor dequantize_q6_k(const Q6KWeight& w, DType dtype = DType::F32);
// As linear(x, Q8Weight): int8 dot products of x quantised per block of 32 against the codes unpacked in
// registers (AVX2 on the CPU, dp4a on CUDA), the -32 offset and each block's two scales applied in integers.
Tensor linear(const Tensor& x, const Q6KWeight& w, const std::optional<Tensor>& bias = std::nullopt);

// A weight in any of the block formats above.
using BlockWeight = std::variant<Q8Weight, Q4Weight, Q4KWeight, Q5KWeight, Q6KWeight>;
Tensor linear(const Tensor& x, const BlockWeight& w, const std::optional<Tensor>& bias = std::nullopt);
// Rows [start, start + length) of the weight: views of its tensors.
BlockWeight narrow_rows(const BlockWeight& w, int64_t start, int64_t length);
int64_t out_features(const BlockWeight& w);
int64_t in_features(const BlockWeight& w);
Tensor dequantize(const BlockWeight& w, DType dtype = DType::F32);
// The format's name: "q8_0", "q4_0", "q4_k", "q5_k" or "q6_k".
const char* format_name(const BlockWeight& w);

// MoE experts in block formats, stacked along N as GGUF's expert tensors are: gate_up [E x 2I, H] (expert e's
// gate rows, then its up rows, from row e x 2I) and down [E x H, I] (expert e's from row e x H); the two may be
// in different formats.
struct BlockExperts {
  BlockWeight gate_up, down;
  int64_t num_experts = 0;
};
// moe_forward over block-format experts; x f32/f16/bf16 [T, H]. The router's top-k picks each token's experts;
// each expert hit runs once, as linear(x, its block rows) (the CPU's int8 dot products on x quantised per block of
// 32) on the rows of the tokens routed to it: gate_up, SiLU x up rounded to x's dtype, down; each token's expert
// outputs gathered, weighted and summed in f32, rounded once to x's dtype. The routing is read back to the
// host for the grouping (on CUDA a synchronisation, which a graph capture refuses), except on CUDA for one token:
// two grouped int8 matrix-vector launches on the blocks (x and SiLU x up quantised as the CPU quantises them)
// read each expert's index on the device, so a graph can capture the block.
Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const BlockExperts& experts, int64_t top_k,
                   bool norm_topk_prob);

}  // namespace kiln

// ---- torch.nn.functional: normalisation, dropout, embedding, losses, padding, counting -----------------------
// Composed from kiln's elementwise, reduction and indexing ops (so they run on every backend those do);
// half-precision inputs compute in f32 and round once to their dtype.
namespace kiln {

// (x - mean) / sqrt(var + eps) over the trailing dims `normalized_shape`, then * weight + bias (each optional,
// of that shape).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
// x [N, C, *]: statistics over each group of C / num_groups channels and the spatial dims; weight, bias [C].
Tensor group_norm(const Tensor& x, int64_t num_groups, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
// x [N, C, *]. training: statistics of this batch (over N and the spatial dims; biased variance to
// normalise), and running_mean / running_var (when given) become (1 - momentum) * running + momentum * batch
// statistic (the unbiased variance), in place. Otherwise the running statistics normalise (both required).
Tensor batch_norm(const Tensor& x, const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                  const std::optional<Tensor>& weight = std::nullopt, const std::optional<Tensor>& bias = std::nullopt,
                  bool training = false, double momentum = 0.1, double eps = 1e-5);
// x [N, C, *]: statistics over the spatial dims of each sample and channel (use_input_stats), updating the
// running statistics (averaged over N) when given; otherwise normalised by the running statistics.
Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& running_mean = std::nullopt,
                     const std::optional<Tensor>& running_var = std::nullopt,
                     const std::optional<Tensor>& weight = std::nullopt, const std::optional<Tensor>& bias = std::nullopt,
                     bool use_input_stats = true, double momentum = 0.1, double eps = 1e-5);

// Each element zeroed with probability p, the rest scaled by 1 / (1 - p); the mask comes from the generator's
// Philox stream (the same seed gives the same mask on every device). p = 0 or training = false returns x
// itself; p = 1 gives zeros.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
Tensor& dropout_(Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);
// SELU's dropout: dropped elements take SELU's negative saturation value, then an affine map keeps the mean
// and variance.
Tensor alpha_dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);

// Rows of weight [V, D] at the integer indices: indices.shape + [D].
Tensor embedding(const Tensor& indices, const Tensor& weight);

// Losses; reduction "mean", "sum" or "none".
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean", double beta = 1.0);
// input [N, C] or [N, C, d...] (or [C]) of log-probabilities, target [N, d...] class indices (int64/int32);
// ignore_index targets add nothing and, with "mean", do not count; weight [C] scales each class (and "mean"
// divides by the summed weights of the counted targets).
Tensor nll_loss(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight = std::nullopt,
                int64_t ignore_index = -100, std::string_view reduction = "mean");
// log_softmax over dim 1 then nll_loss, with class-index targets (integer) or class-probability targets
// (floating, input's shape); label_smoothing mixes in the uniform distribution as torch does.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight = std::nullopt,
                     int64_t ignore_index = -100, std::string_view reduction = "mean", double label_smoothing = 0.0);

// Pads the trailing dims: pad = {left of the last dim, right of it, left of the one before, ...} (negative
// values crop). mode "constant" (value), "reflect" (the edge not repeated; each pad smaller than its dim),
// "replicate" (the edge repeated) or "circular" (wraps; each pad at most its dim); those three pad at most
// the last 3 dims.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, std::string_view mode = "constant", double value = 0.0);

// ---- Convolution, pooling, resampling (torch.nn.functional's conv / pool / interpolate) ---------------------------
// Spatial arguments take one value per spatial dim, or one value for all. Input [N, C, *spatial] or unbatched
// [C, *spatial]; f32, f16, bf16 (f32 accumulation), f64.

// Padding of a convolution: per dim, or "same" (stride 1; the extra one on the right, as torch) or "valid".
using ConvPadding = std::variant<Shape, std::string>;
// weight [C_out, C_in / groups, *kernel] with 1 to 3 kernel dims (conv1d/2d/3d by the weight's rank).
Tensor conv(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
            const Shape& stride = {1}, const ConvPadding& padding = Shape{0}, const Shape& dilation = {1},
            int64_t groups = 1);
// weight [C_in, C_out / groups, *kernel]; output size (in - 1) stride - 2 padding + dilation (k - 1) +
// output_padding + 1.
Tensor conv_transpose(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
                      const Shape& stride = {1}, const Shape& padding = {0}, const Shape& output_padding = {0},
                      int64_t groups = 1, const Shape& dilation = {1});
// Max / average over windows of `spatial_dims` (1 to 3) trailing dims; stride defaults to the kernel. Padding
// is at most half the kernel; max pads with -inf, avg with zeros (count_include_pad counts them).
Tensor max_pool(const Tensor& input, int64_t spatial_dims, const Shape& kernel, const std::optional<Shape>& stride = std::nullopt,
                const Shape& padding = {0}, const Shape& dilation = {1}, bool ceil_mode = false);
Tensor avg_pool(const Tensor& input, int64_t spatial_dims, const Shape& kernel, const std::optional<Shape>& stride = std::nullopt,
                const Shape& padding = {0}, bool ceil_mode = false, bool count_include_pad = true,
                std::optional<int64_t> divisor_override = std::nullopt);
// Output cell i averages input [floor(i in / out), ceil((i + 1) in / out)) along each of the output_size's dims.
Tensor adaptive_avg_pool(const Tensor& input, const Shape& output_size);
// Resizes the spatial dims to `size` (or floor(in * scale_factor)): "nearest" (torch's: floor(out * in / out
// ratio)), "linear" / "bilinear" / "trilinear" (half-pixel centres, or align_corners).
Tensor interpolate(const Tensor& input, const std::optional<Shape>& size,
                   const std::optional<std::vector<double>>& scale_factor = std::nullopt,
                   std::string_view mode = "nearest", std::optional<bool> align_corners = std::nullopt);

// Counts of each value of a 1-d non-negative integer tensor (or the summed weights): length max(x) + 1, at
// least minlength. int64 without weights; float32 weights give float32, other weights float64.
Tensor bincount(const Tensor& x, const std::optional<Tensor>& weights = std::nullopt, int64_t minlength = 0);
// A histogram of `bins` equal bins over [min, max] (the data's range when min == max); values outside are
// not counted. Output in x's (floating) dtype.
Tensor histc(const Tensor& x, int64_t bins = 100, double min = 0, double max = 0);

}  // namespace kiln
