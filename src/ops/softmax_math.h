// Per-element and combine steps of softmax / log_softmax, shared by the CPU kernels and the CUDA kernels
// (src/cuda/kernels/softmax.cuh) so both backends define the op once. A = the compute type (float, or double for f64 input).
//
// A row is reduced in two passes over x: m = max(x) (NaN-propagating), s = sum(exp(x - m)); then
//   softmax     y = exp(x - m) / s
//   log_softmax y = x - m - log(s)
// These plain formulas already give PyTorch's edge cases: a row with +inf has m = inf and exp(inf - inf)
// = NaN, so s and every output is NaN; a row of all -inf has m = -inf and the same NaN; a NaN anywhere
// makes s NaN; -inf entries of a finite row give 0 (softmax) and -inf (log_softmax).
//
// A row split into parts (the CUDA kernels' threads, blocks and padded tails) is reduced part by part to
// (max, sum of exp(x - max)) pairs that `combine` merges. The merge gives the two-pass formula's edge cases
// exactly, given M = the combined max:
//   - M finite: a part whose max is -inf (all its elements -inf, or none, e.g. padding) contributes 0, as
//     its elements do in the two-pass sum; the others are rescaled by exp(max - M) <= 1 (exactly 1 when
//     max == M).
//   - M = NaN: every part with a max other than -inf gives NaN (exp(NaN)); the outputs are NaN anyway.
//   - M = +inf: the part holding the +inf already has sum NaN (exp(inf - inf)) and rescales to NaN.
//   - M = -inf (a row of all -inf): the sum is 0, and x - M = -inf - -inf = NaN makes every output NaN.
// So padding a part with -inf never changes a result, which lets kernels pad ragged tails with -inf.
// The same holds for the n-ary form, M = max_nan of all parts' maxima, S = sum of rescale_sum(sum_i, max_i,
// M): the kernels fold a block's pairs so (one exp per pair instead of one per tree level).
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

// The reduction of one part of a row: its max and the sum of exp(x - max) over its elements.
template <class A>
struct MaxSum {
  A max;
  A sum;
};

template <class A>
KILN_HD MaxSum<A> max_sum_identity() {
  return {static_cast<A>(-INFINITY), A(0)};
}

// A part's sum re-expressed relative to the (not smaller) combined max; a part whose max is -inf adds 0.
template <class A>
KILN_HD A rescale_sum(A sum, A part_max, A max) {
  return part_max == static_cast<A>(-INFINITY) ? A(0) : sum * math::exp(part_max - max);
}

template <class A>
KILN_HD MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = max_nan(a.max, b.max);
  return {m, rescale_sum(a.sum, a.max, m) + rescale_sum(b.sum, b.max, m)};
}

}  // namespace kiln::softmax_math
