// The per-element rule of dropout and alpha_dropout, shared by the CPU and CUDA kernels (KILN_HD): element i
// is kept when the f32 uniform draw of the generator's stream (core/philox.h: u = (w0 >> 8) * 2^-24 for
// (seed, offset, i)) is >= p (compared in f32, as rand(...) >= p), and becomes x * ka + kb, else `drop`:
// dropout ka = 1 / (1 - p), kb = 0, drop = 0; alpha_dropout ka = a, kb = b, drop = a * alpha' + b. C is the
// compute type: f32 for f16/bf16/f32 inputs, f64 for f64. (The CUDA kernel is built with --fmad=false, so the
// product and the sum round as on the CPU.)
#pragma once

#include "core/philox.h"

namespace kiln {

template <class C>
struct DropoutRule {
  uint64_t seed, offset;
  float p;
  C ka, kb, drop;
  KILN_HD bool keep(uint64_t i) const { return philox_uniform_float(philox_element(seed, offset, i), 24) >= p; }
  KILN_HD C operator()(C x, uint64_t i) const {
    if (!keep(i)) return drop;
    const C scaled = x * ka;
    return scaled + kb;
  }
};

}  // namespace kiln
