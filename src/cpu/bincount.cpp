// bincount on the CPU: each thread counts a slice of the input into its own histogram, then the histograms
// are summed in thread order (so float sums do not depend on scheduling within a thread count).
#include "cpu/bincount.h"

#include <omp.h>

#include <vector>

namespace kiln::cpu {

namespace {

template <class I, class W>
void count(const I* x, const W* w, int64_t n, W* out, int64_t bins) {
  const int threads = (n >= 65536 && bins <= (int64_t{1} << 20)) ? omp_get_max_threads() : 1;
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) out[x[i]] += w ? w[i] : W(1);
    return;
  }
  std::vector<std::vector<W>> local(static_cast<size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::vector<W>& h = local[static_cast<size_t>(t)];
    h.assign(static_cast<size_t>(bins), W(0));
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    for (int64_t i = lo; i < hi; ++i) h[x[i]] += w ? w[i] : W(1);
  }
  for (const auto& h : local)
    if (!h.empty())
      for (int64_t b = 0; b < bins; ++b) out[b] += h[b];
}

template <class I>
void by_weight(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts) {
  const I* xi = x.data<I>();
  const int64_t n = x.numel(), bins = counts.numel();
  switch (counts.dtype()) {
    case DType::I64: return count<I, int64_t>(xi, nullptr, n, counts.data<int64_t>(), bins);
    case DType::F32: return count<I, float>(xi, weights->data<float>(), n, counts.data<float>(), bins);
    case DType::F64: return count<I, double>(xi, weights->data<double>(), n, counts.data<double>(), bins);
    default: throw Error(str("bincount: internal error: counts of dtype ", dtype_name(counts.dtype())));
  }
}

}  // namespace

void bincount(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts) {
  if (x.dtype() == DType::I32) by_weight<int32_t>(x, weights, counts);
  else by_weight<int64_t>(x, weights, counts);
}

}  // namespace kiln::cpu
