// Per-element math of rms_norm, silu_and_mul and rotary embeddings, shared by the CPU kernels and (later)
// the CUDA kernels so both round at exactly the same points as Hugging Face's reference modules.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"
#include "ops/math.h"

namespace kiln::norm_math {

// 1 / sqrt(mean + eps) in the compute type C (f32, or f64 for f64 input): torch's mean is sum / D, then
// rsqrt as 1 / sqrt.
template <class C>
KILN_HD C rms_inv(C sum_sq, int64_t d, double eps) {
  const C var = sum_sq / static_cast<C>(d);
  return static_cast<C>(1) / math::sqrt(var + static_cast<C>(eps));
}

// One output element of Qwen3RMSNorm / LlamaRMSNorm: the normalised value is cast to the input dtype X
// first, then multiplied by the weight in the promoted dtype P of (weight, x) (its arithmetic in
// opmath_t<P>), and the product stored in X.
template <class X, class P, class C>
KILN_HD X rms_apply(X x, C inv, P w) {
  using A = opmath_t<P>;
  const X hidden = convert<X>(convert<C>(x) * inv);
  const P prod = convert<P>(convert<A>(hidden) * convert<A>(w));
  return convert<X>(prod);
}

// silu(g) * u in C, stored in T.
template <class T, class C>
KILN_HD T silu_mul(T g, T u) {
  const C gc = convert<C>(g), uc = convert<C>(u);
  return convert<T>(gc / (static_cast<C>(1) + math::exp(-gc)) * uc);
}

// Hugging Face's default inverse frequency: 1 / theta ** (float(2j) / rotary_dim), all in f32.
KILN_HD float rope_inv_freq(int64_t j, int64_t rotary_dim, double theta) {
  const float e = static_cast<float>(2 * j) / static_cast<float>(rotary_dim);
  return 1.0f / math::pow(static_cast<float>(theta), e);
}

// cos/sin of positions.float() * inv_freq (f32, as HF's rotary embedding), times attention_scaling.
KILN_HD void rope_cos_sin(float pos, float inv_freq, float scaling, float& c, float& s) {
  const float angle = pos * inv_freq;
  c = math::cos(angle) * scaling;
  s = math::sin(angle) * scaling;
}

// Rotates the pair (x[j], x[j + r/2]) in place: q*cos + rotate_half(q)*sin, in opmath_t<T> (f64 for f64).
template <class T>
KILN_HD void rope_pair(T& lo, T& hi, float c, float s) {
  using C = opmath_t<T>;
  const C a = convert<C>(lo), b = convert<C>(hi);
  const C cc = static_cast<C>(c), sc = static_cast<C>(s);
  lo = convert<T>(a * cc - b * sc);
  hi = convert<T>(b * cc + a * sc);
}

}  // namespace kiln::norm_math
