// Comparing linear results that accumulate in f32 in different orders (the CPU's BLAS, the CUDA kernels, an
// exact double reference).
#pragma once

#include <cmath>
#include <optional>

#include "kiln/nn.h"
#include "test_util.h"

namespace kiln::test {

// |x| @ |w|^T + |b| in f64 on the CPU, shaped like linear's output: the magnitude every rounding error of
// output (m, n) is proportional to.
inline Tensor linear_abs_scale(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  auto a = [](const Tensor& t) { return abs(t.to(kCPU).to(DType::F64)); };
  return linear(a(x), a(w), b ? std::optional<Tensor>(a(*b)) : std::nullopt);
}

// out and ref are linear results over k terms (any dtypes, same shape). Each was summed in f32 (or exactly)
// in some order; for inputs of random sign the error of such a sum is a random walk of k roundings of at
// most 2^-24 of a partial sum, each partial sum bounded by `scale`, so it stays below
// sqrt(k) * 2^-24 * scale with a wide margin; 4x covers two such sums (out and ref) and the bias add. The
// rounding of each f32 result to the output dtype adds at most one ulp of that dtype at the result
// (2^-p relative, p = mantissa bits: 7 for bf16, 10 for f16, 23 for f32), plus its subnormal spacing.
// A wrong term (a missed or repeated element of K) is far larger than the accumulation part for f32; for the
// half types it can hide inside one output ulp, which is why the kernels are also checked bit for bit on
// integer data (every sum exact in f32).
//
// `rounds_before_bias`: cuBLAS's bias epilogue (and addmm's beta term) in f16/bf16 rounds the product to the
// output dtype before the bias is added, so under cancellation the result can be off by one output-dtype ulp
// of |x . w| rather than of the result: that term is added for those paths.
inline ::testing::AssertionResult linear_close(const Tensor& out, const Tensor& ref, const Tensor& scale, DType dt,
                                               int64_t k, bool rounds_before_bias = false) {
  if (out.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << "shape " << shape_str(out.sizes()) << " != expected "
                                         << shape_str(ref.sizes());
  const double rel = dt == DType::BF16 ? 0x1p-7 : dt == DType::F16 ? 0x1p-10 : 0x1p-23;
  const double tiny = dt == DType::F16 ? 0x1p-24 : 1e-30;
  const double acc = 4.0 * std::sqrt(static_cast<double>(k) + 1.0) * 0x1p-24;
  const auto o = out.to(kCPU).to_vector<double>(), r = ref.to(kCPU).to_vector<double>();
  const auto s = scale.to_vector<double>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < o.size(); ++i) {
    const double tol = rel * std::fabs(r[i]) + acc * s[i] + tiny + (rounds_before_bias ? rel * s[i] : 0.0);
    if (!(std::fabs(o[i] - r[i]) <= tol)) {  // NaN fails
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const size_t f = static_cast<size_t>(first);
  return ::testing::AssertionFailure() << bad << " of " << o.size() << " elements differ; first at flat index "
                                       << first << ": got " << o[f] << ", expected " << r[f] << " (tolerance "
                                       << rel * std::fabs(r[f]) + acc * s[f] + tiny << ", k = " << k << ")";
}

}  // namespace kiln::test
