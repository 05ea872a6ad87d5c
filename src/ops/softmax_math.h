// Per-element and combine steps of softmax / log_softmax, shared by the CPU kernels and (later) the CUDA
// kernels so both backends define the op once. A = the compute type (float, or double for f64 input).
//
// A row is reduced in two passes over x: m = max(x) (NaN-propagating), s = sum(exp(x - m)); then
//   softmax     y = exp(x - m) / s
//   log_softmax y = x - m - log(s)
// These plain formulas already give PyTorch's edge cases: a row with +inf has m = inf and exp(inf - inf)
// = NaN, so s and every output is NaN; a row of all -inf has m = -inf and the same NaN; a NaN anywhere
// makes s NaN; -inf entries of a finite row give 0 (softmax) and -inf (log_softmax).
#pragma once

#include "ops/math.h"

namespace kiln::softmax_math {

// Max that lets a NaN win from either side, so a combine of partial maxima in any order gives the same.
template <class A>
KILN_HD A max_nan(A a, A b) {
  return (a > b || a != a) ? a : b;
}

template <class A>
KILN_HD A exp_shifted(A x, A max) {
  return math::exp(x - max);
}

// softmax from the already computed exp(x - max) and the row's sum of those.
template <class A>
KILN_HD A softmax_from_exp(A e, A sum) {
  return e / sum;
}

template <class A>
KILN_HD A log_softmax_value(A x, A max, A log_sum) {
  return x - max - log_sum;
}

}  // namespace kiln::softmax_math
