// cross_entropy with class-index targets over the rows of contiguous logits on CUDA (src/cuda/loss.cu), for
// src/ops/functional.cpp. Only in KILN_HAVE_CUDA builds.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// For each row r of x [N, C] (contiguous; f16, bf16, f32 or f64) and its target t = target[r] (int32 or int64,
// contiguous [N]), with lse = log sum_c exp(x[r, c]) and class weights w [C] (f32, f64 for f64 input; undefined:
// all 1) summing to *w_total ([1], given with w):
//   nll[r] = w[t] (lse - x[r, t]),  wsum[r] = w[t],  smooth[r] = sum_c w[c] (lse - x[r, c]),
// all 0 where t == ignore_index. Outputs [N] in w's dtype. A target outside [0, C) that is not ignore_index
// contributes 0 and is raised at the next synchronisation (OpId::CrossEntropy). One block per row, one read.
void cross_entropy_rows(const Tensor& x, const Tensor& target, const Tensor& w, const Tensor& w_total,
                        int64_t ignore_index, Tensor& nll, Tensor& wsum, Tensor& smooth);

}  // namespace kiln::cuda
