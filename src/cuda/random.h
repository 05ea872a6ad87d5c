// CUDA launchers of the random ops (kernels in cuda/kernels/random.cuh). They give the CPU's numbers for
// the same (seed, offset): see core/philox.h. uniform/normal write through t's strides (element i of the
// stream is element i of t in row-major order, as on the CPU); randint's out is contiguous.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::cuda {
void uniform_fill(const Tensor& t, double from, double to, uint64_t seed, uint64_t offset);
void normal_fill(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset);
void randint_fill(const Tensor& out, int64_t low, uint64_t range, uint64_t seed, uint64_t offset);
// cpu::dropout_apply's contract: out and x contiguous, one pass, the CPU's values for the same (seed, offset).
void dropout_apply(const Tensor& out, const Tensor& x, double p, double ka, double kb, double drop, uint64_t seed,
                   uint64_t offset);
}  // namespace kiln::cuda
