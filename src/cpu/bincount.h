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
// The counting pass and the range in one read: range (int64 [2], zeroed by the caller) receives -min(0, min x)
// and max(0, max x), and counts (zeroed, of bincount_one_pass_bins(dtype) entries) the counts of the values
// below its length. When the largest value fits, counts is the whole result and no second pass is needed.
void bincount_one_pass(const Tensor& x, const std::optional<Tensor>& weights, Tensor& range, Tensor& counts);
int64_t bincount_one_pass_bins(DType counts);
}  // namespace kiln::cuda
#endif
