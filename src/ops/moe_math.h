// Scalar steps of the MoE block shared by the CPU loop (src/cpu/moe.cpp) and the CUDA kernels
// (src/cuda/kernels/grouped_mm.cuh, moe_route.cuh), so both backends define the layer once.
#pragma once

#include "ops/math.h"

namespace kiln::moe_math {

// The expert MLP's activation: silu(gate) * up, in f32 (the caller rounds the result to x's dtype).
KILN_HD float silu_mul(float gate, float up) { return gate / (1.0f + math::exp(-gate)) * up; }

}  // namespace kiln::moe_math
