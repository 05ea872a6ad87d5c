// bincount's counting pass (kiln/nn.h) on the CPU and CUDA: counts[x[i]] += w[i] (or 1), for x int32/int64
// (all values in [0, counts.numel()), checked by the caller), counts int64 / f32 / f64 zeroed by the caller,
// weights (when given) contiguous in the counts' dtype.
#pragma once

#include <optional>

#include "kiln/tensor.h"

namespace kiln::cpu {
void bincount(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts);
}  // namespace kiln::cpu
#if KILN_HAVE_CUDA
namespace kiln::cuda {
void bincount(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts);
}  // namespace kiln::cuda
#endif
