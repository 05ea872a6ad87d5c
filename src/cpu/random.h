// CPU random kernels; `out` is contiguous. Stream definition: core/philox.h.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cpu {
void uniform_fill(Tensor& out, double from, double to, uint64_t seed, uint64_t offset);
void normal_fill(Tensor& out, double mean, double std, uint64_t seed, uint64_t offset);
// out[i] = low + (64 random bits) % range, range >= 1.
void randint_fill(Tensor& out, int64_t low, uint64_t range, uint64_t seed, uint64_t offset);
// out = dropout of x (both contiguous, one float dtype) in one pass: ops/dropout_math.h's rule with these
// constants (in f64 for f64, else f32).
void dropout_apply(Tensor& out, const Tensor& x, double p, double ka, double kb, double drop, uint64_t seed,
                   uint64_t offset);
}  // namespace kiln::cpu
