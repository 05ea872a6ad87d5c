// CPU kernels of topk and sample; the definitions they follow are in ops/sampling_math.h.
#pragma once

#include <cstdint>

#include "kiln/nn.h"

namespace kiln::cpu {
// x contiguous, viewed as [rows, n]; values [rows, k] (x's dtype) and indices [rows, k] (i64), contiguous.
void topk(const Tensor& x, int64_t n, int64_t k, Tensor& values, Tensor& indices);
// logits contiguous [rows, V] f32/f16/bf16; out contiguous i64 [rows]. Throws for a row whose distribution
// is undefined (NaN, +inf or all -inf logits) when temperature > 0.
void sample(const Tensor& logits, int64_t vocab, const SamplingParams& params, uint64_t seed, uint64_t offset,
            Tensor& out);
// The distribution sample() draws each row from: out contiguous f32 [rows, V].
void sampling_probs(const Tensor& logits, int64_t vocab, const SamplingParams& params, Tensor& out);
}  // namespace kiln::cpu
