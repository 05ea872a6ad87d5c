// CUDA reduction launchers (namespace kiln::cuda), the counterparts of src/cpu/reduce.h with the same
// contracts: the op layer (src/ops/reduce.cpp) checks arguments and allocates `out` on x's device,
// contiguous with the shape of x's kept dims and the result dtype; `reduced[d]` marks the dims of x to
// reduce. Every launcher is asynchronous on the current stream of x's device and never synchronises
// (graph-capturable).
#pragma once

#include <vector>

#include "kiln/tensor.h"

namespace kiln::cuda {

// out: x's dtype for floats; i64 for bool and integers (u64 for u64).
void sum_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void prod_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
// Floating x; out has x's dtype.
void mean_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void var_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double correction,
                bool take_sqrt);
void norm_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double p);
void logsumexp_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
// out has x's dtype (no reduced dim may be empty).
void amax_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void amin_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
// Along one dim; values may be undefined (argmax/argmin); indices is i64.
void max_with_index_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim,
                           bool is_max);
// out: bool (u8 for u8 input, as PyTorch).
void all_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void any_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);

}  // namespace kiln::cuda
