// layer_norm, group_norm and batch_norm on the CPU (cpu/moments.h): the statistics of every set from one read,
// in chunks spread over the OpenMP threads and merged by Chan's formula; then one pass that normalises.
#include "cpu/moments.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"

namespace kiln::cpu {

namespace {

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

// Elements per work item of the statistics: a chunk stays in L2 between its two passes.
constexpr int64_t kChunk = 1 << 15;

// Mean and sum of squared deviations of p[0, n), vectorised by the compiler (omp simd reductions). The sum is
// taken in double: 32K values of about 100 summed in f32 lose about 1e-5 of the mean, which is 3e-4 of a
// normalised output when the spread is 3. The deviations from this chunk's own mean (no cancellation) are summed
// in A.
template <class T, class A>
void chunk_moments(const T* p, int64_t n, double& mean, double& m2) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(static_cast<A>(p[i]));
  const double mean_d = s / static_cast<double>(n);
  const A mu = static_cast<A>(mean_d);
  A q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t i = 0; i < n; ++i) {
    const A d = static_cast<A>(p[i]) - mu;
    q += d * d;
  }
  // The deviations were taken from mu (mean_d rounded to A): m2 about mean_d differs by n (mu - mean_d)^2.
  mean = mean_d;
  m2 = static_cast<double>(q) - static_cast<double>(n) * (static_cast<double>(mu) - mean_d) * (static_cast<double>(mu) - mean_d);
}

void merge(double& n, double& mean, double& m2, double nb, double mean_b, double m2_b) {
  if (nb == 0) return;
  const double total = n + nb, delta = mean_b - mean, f = nb / total;
  mean += delta * f;
  m2 += m2_b + delta * delta * n * f;
  n = total;
}

template <class T>
T from_acc(typename AccOf<T>::type v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(v);
  else return static_cast<T>(v);
}

}  // namespace

void moments(const Tensor& x, int64_t sets, int64_t runs, int64_t len, int64_t set_stride, int64_t run_stride,
             Tensor& mean, Tensor& var) {
  if (sets == 0) return;
  visit_dtypes<kFloatTypes>(x.dtype(), "normalisation", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    const T* px = static_cast<const T*>(x.data_ptr());
    // Work items: (set, run, chunk of the run).
    const int64_t chunks = (len + kChunk - 1) / kChunk, items = sets * runs * chunks;
    std::vector<double> cm(static_cast<size_t>(items)), cq(static_cast<size_t>(items));
#pragma omp parallel for schedule(static) if (items > 1 && sets * runs * len > (1 << 16))
    for (int64_t it = 0; it < items; ++it) {
      const int64_t c = it % chunks, rj = it / chunks, j = rj % runs, r = rj / runs;
      const int64_t begin = c * kChunk, n = std::min(kChunk, len - begin);
      chunk_moments<T, A>(px + r * set_stride + j * run_stride + begin, n, cm[it], cq[it]);
    }
    A* pm = mean.data<A>();
    A* pv = var.data<A>();
    const int64_t total = runs * len;
    for (int64_t r = 0; r < sets; ++r) {
      double n = 0, mu = 0, m2 = 0;
      for (int64_t k = r * runs * chunks; k < (r + 1) * runs * chunks; ++k) {
        const int64_t c = k % chunks;
        merge(n, mu, m2, static_cast<double>(std::min(kChunk, len - c * kChunk)), cm[k], cq[k]);
      }
      pm[r] = static_cast<A>(mu);
      pv[r] = static_cast<A>(m2 / static_cast<double>(total));
    }
  });
}

namespace {

// The normalising passes' typed pointers: f(px, py, pw, pb, pmean, pvar), w and b null when undefined.
template <class F>
void with_norm_pointers(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                        Tensor& y, const char* op, F&& f) {
  visit_dtypes<kFloatTypes>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    f(static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), w.defined() ? w.data<A>() : nullptr,
      b.defined() ? b.data<A>() : nullptr, mean.data<A>(), var.data<A>());
  });
}

}  // namespace

void normalize_rows(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
                    Tensor& y) {
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  if (x.numel() == 0) return;
  with_norm_pointers(x, mean, var, w, b, y, "layer_norm", [&](const auto* px, auto* py, const auto* pw, const auto* pb,
                                                              const auto* pm, const auto* pv) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
    using A = std::remove_cv_t<std::remove_pointer_t<decltype(pm)>>;
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
      const A mu = pm[r], rstd = A(1) / std::sqrt(pv[r] + static_cast<A>(eps));
      const T* xr = px + r * d;
      T* yr = py + r * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) {
        A v = (static_cast<A>(xr[c]) - mu) * rstd;
        if (pw) v *= pw[c];
        if (pb) v += pb[c];
        yr[c] = from_acc<T>(v);
      }
    }
  });
}

void normalize_planes(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                      double eps, int64_t channels, int64_t stat_div, bool per_channel, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t planes = x.size(0) * channels, plane = x.numel() / planes;
  // Work items: (plane, chunk), so that a few large planes still spread over the threads.
  const int64_t chunks = (plane + kChunk - 1) / kChunk;
  with_norm_pointers(x, mean, var, w, b, y, "normalisation", [&](const auto* px, auto* py, const auto* pw,
                                                                 const auto* pb, const auto* pm, const auto* pv) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
    using A = std::remove_cv_t<std::remove_pointer_t<decltype(pm)>>;
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
    for (int64_t it = 0; it < planes * chunks; ++it) {
      const int64_t p = it / chunks, begin = (it % chunks) * kChunk, n = std::min(kChunk, plane - begin);
      const int64_t c = p % channels, s = per_channel ? c : p / stat_div;
      A scale = A(1) / std::sqrt(pv[s] + static_cast<A>(eps));
      if (pw) scale *= pw[c];
      const A shift = (pb ? pb[c] : A(0)) - pm[s] * scale;
      const T* xp = px + p * plane + begin;
      T* yp = py + p * plane + begin;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yp[i] = from_acc<T>(static_cast<A>(xp[i]) * scale + shift);
    }
  });
}

}  // namespace kiln::cpu
