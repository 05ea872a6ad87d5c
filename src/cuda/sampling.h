// CUDA launchers of topk and sample (kernels: src/cuda/kernels/sampling.cuh; definitions shared with the CPU:
// src/ops/sampling_math.h). Inputs are contiguous rows of `n` (`vocab`) elements; outputs contiguous.
#pragma once

#include <cstdint>

#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// f32/f16/bf16, 1 <= k <= 64, k <= n < 2^31.
void topk(const Tensor& x, int64_t n, int64_t k, const Tensor& values, const Tensor& indices);

// One token per row into out (i64, contiguous). The Philox offset is `offset`, or, when offset_counter is
// set (an i64 in device memory), the counter's value when the kernels run, which they then increment: a
// graph replay re-reads it, whereas a host `offset` is frozen into the graph at capture.
// A row whose distribution is undefined gets token 0 and is reported through the device error record.
void sample(const Tensor& logits, int64_t vocab, const SamplingParams& params, uint64_t seed, uint64_t offset,
            int64_t* offset_counter, const Tensor& out);

}  // namespace kiln::cuda
