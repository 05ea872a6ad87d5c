// CPU reference of attention (namespace kiln::cpu). The op layer (src/ops/attention.cpp) checks the
// arguments, expands the operands to the output's batch shape and describes them in an attention_math::Layout.
#pragma once

#include "kiln/tensor.h"
#include "ops/attention_math.h"

namespace kiln::cpu {

// out [outer..., H, Lq, Dv] contiguous in q's dtype. q, k, v (one dtype: f16, bf16, f32 or f64) and mask
// (bool, f32 or f64; may be undefined) are views whose data_ptr() is element 0 of the layout; lengths
// (i32 [outer], values already checked to lie in [0, Lkv]) is undefined unless L.has_lengths. Scores,
// softmax and the weighted sum are computed in f64.
void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
               const Tensor& lengths, const attention_math::Layout& L, double scale);

}  // namespace kiln::cpu
