// The per-element rule of dropout and alpha_dropout, shared by the CPU and CUDA kernels (KILN_HD). The draws of
// elements 4g .. 4g + 3 are the four words of one Philox block, philox4x32_10 at counter (g, offset) (core/philox.h):
// element i is kept when its word, as an f32 uniform u = (w >> 8) * 2^-24, is >= p (compared in f32), and becomes
// x * ka + kb, else `drop`: dropout ka = 1 / (1 - p), kb = 0, drop = 0; alpha_dropout ka = a, kb = b,
// drop = a * alpha' + b. (A mask needs one word per element, not a block: one block per four elements is a
// quarter of the Philox work, which bounds the kernel otherwise.) C is the compute type: f32 for f16/bf16/f32
// inputs, f64 for f64. (The CUDA kernel is built with --fmad=false, so the product and the sum round as on the
// CPU.)
#pragma once

#include "core/philox.h"

namespace kiln {

template <class C>
struct DropoutRule {
  uint64_t seed, offset;
  float p;
  C ka, kb, drop;
  // The Philox block of elements 4g .. 4g + 3.
  KILN_HD PhiloxOut block(uint64_t g) const { return philox_element(seed, offset, g); }
  // Element 4g + j of block o: kept or not, and its value.
  KILN_HD C apply(C x, const PhiloxOut& o, int j) const {
    if (static_cast<float>(o.w[j] >> 8) * (1.0f / 16777216.0f) < p) return drop;
    const C scaled = x * ka;
    return scaled + kb;
  }
};

}  // namespace kiln
