// The per-element and per-row definitions of topk and sample, shared by the CPU reference and the CUDA
// kernels (src/cuda/kernels/sampling.cuh) so that both backends give the same results for the same seed.
//
// ---- topk ordering ---------------------------------------------------------------------------------------
// Element (a, ia) comes before (b, ib) when a > b, or a == b and ia < ib. NaN counts as larger than every
// number (PyTorch's rule) and NaNs tie with each other. Half types compare in float (exact).
//
// ---- sample(logits, params, gen): the definition ---------------------------------------------------------
// One (seed, offset) per call: offset = gen->next_offset() (the default generator's under its lock). For
// row r of logits [B, V] (logits converted to f32, l_i):
//   u = (w0 >> 8) * 2^-24 in [0, 1), where (w0, ..) = philox4x32_10(counter = {lo32(r), hi32(r),
//       lo32(offset), hi32(offset)}, key = {lo32(seed), hi32(seed)})      (= philox_element(seed, offset, r))
//   temperature == 0: the token is argmax_i l_i (first index on ties, NaN counts as largest); u is unused.
//   otherwise (all arithmetic in f32):
//     m = max_i l_i; it must be finite and no l_i NaN (else an error: the distribution is undefined).
//     e_i = exp((l_i - m) / T)  (quotient f32, exp in double rounded to f32: sample_weight; e_max = 1)
//     order tokens by (e_i descending, i ascending)                      (topk's order)
//     top_k  (top_k > 0 and < V): keep the first top_k tokens in that order.
//     top_p  (top_p < 1): in fixed point (topp_fixed: e * 2^40 truncated, sums exact in 64 bits, so both
//            backends and any summation order agree), S = sum of the kept e; keep the smallest prefix of
//            that order whose running sum c_n satisfies c_n >= topp_target(S, top_p); at least one token.
//     min_p  (min_p > 0): drop kept tokens with e_i < min_p (= min_p * e_max, e_max = 1 is always kept).
//     draw:  W = sum of the kept e_i in ascending index order; t = u * W; the token is the first kept i (in
//            ascending index order) whose running sum exceeds t (strictly); if rounding leaves none, the last
//            kept i with e_i > 0.
// The draw's sums are f32. The CPU adds sequentially; a parallel reduction on the GPU may round differently in
// the last bits, which changes a draw only when u falls within rounding distance of a CDF step. (top_p's sums
// were once f32 too: the CPU's sequential f32 S over thousands of tokens lost the tiny ones, about 1e-5
// relative, and a row whose boundary fell within that moved a token in or out of the kept set.)
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "kiln/scalar_types.h"

namespace kiln {

// The value topk compares: integers as themselves, floating types in float (double for f64).
template <class T>
KILN_HD auto topk_key(T v) {
  if constexpr (std::is_integral_v<T>) return v;
  else if constexpr (std::is_same_v<T, double>) return v;
  else return convert<float>(v);
}

template <class K>
KILN_HD bool topk_is_nan(K v) {
  if constexpr (std::is_integral_v<K>) return false;
  else return v != v;
}

// True when (a, ia) comes before (b, ib) in topk's order.
template <class K>
KILN_HD bool topk_before(K a, int64_t ia, K b, int64_t ib) {
  const bool na = topk_is_nan(a), nb = topk_is_nan(b);
  if (na || nb) return na && (!nb || ia < ib);
  if (a != b) return a > b;
  return ia < ib;
}

// The uniform number of row `row` of a sample() call with (seed, offset).
KILN_HD float sample_uniform(uint64_t seed, uint64_t offset, uint64_t row) {
  return philox_uniform_float(philox_element(seed, offset, row), 24);
}

// Unnormalised probability of a logit: exp((l - m) / T) with m the row's maximum. The quotient is f32 (IEEE
// on both backends); the exponential is taken in double and rounded once to f32, so that the CPU's libm
// and CUDA's exp agree on e for all but ~2^-28 of the elements (CUDA's expf differs from glibc's expf by up
// to 2 ulp, which would move top_k/top_p/min_p boundaries between the backends far more often).
KILN_HD float sample_weight(float logit, float row_max, float temperature) {
  const float x = (logit - row_max) / temperature;
#if defined(__CUDA_ARCH__)
  return static_cast<float>(::exp(static_cast<double>(x)));
#else
  return static_cast<float>(std::exp(static_cast<double>(x)));
#endif
}

// top_p's fixed point: e (0 <= e <= 1) times 2^40, truncated. V < 2^23 values keep any sum below 2^63.
constexpr double kTopPFixedScale = 1099511627776.0;
KILN_HD uint64_t topp_fixed(float e) { return static_cast<uint64_t>(static_cast<double>(e) * kTopPFixedScale); }
// The prefix sum top_p asks for, given the fixed-point total s of the candidates: f32(top_p * f32(s)) in
// fixed point, at least 1 and at most s.
KILN_HD uint64_t topp_target(uint64_t s, float top_p) {
  const float s_f = static_cast<float>(static_cast<double>(s) / kTopPFixedScale);
  const float target_f = top_p * s_f;
  const uint64_t t = static_cast<uint64_t>(static_cast<double>(target_f) * kTopPFixedScale);
  return t < 1 ? 1 : (t > s ? s : t);
}

// The key that orders e (>= 0, never NaN) for the radix searches of the CUDA sampler: larger key = larger e.
KILN_HD uint32_t sample_key(float e) { return f32_to_bits(e) | 0x80000000u; }
KILN_HD float sample_key_value(uint32_t key) { return f32_from_bits(key & 0x7FFFFFFFu); }

}  // namespace kiln
