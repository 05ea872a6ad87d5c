// Neural-network ops that dominate LLM decode: linear, softmax, norms, rotary embeddings, activations,
// top-k and sampling. CPU reference implementations; the CUDA kernels are the decode-kernels work.
#pragma once

#include <optional>
#include <utility>

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

}  // namespace kiln
