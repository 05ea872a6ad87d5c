// CPU softmax / log_softmax. x is viewed as [outer, n, inner] (the reduced dim has size n); a "row" is the
// n elements at one (outer, inner) position, stride `inner` apart. Each row is loaded once into a buffer
// of the compute type (f32, f64 for f64), then reduced in fixed-size chunks whose partial max / sum are
// folded in chunk order: the result is bit-identical whether a long row is split across threads or not.
#include "cpu/softmax.h"

#include <cmath>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/dispatch.h"
#include "ops/softmax_math.h"

namespace kiln::cpu {
namespace {

namespace sm = softmax_math;

constexpr int64_t kChunk = 4096;          // elements per partial result (fixed, so results never depend on threads)
constexpr int64_t kLanes = 16;            // independent accumulators: vectorisable, and less rounding than one
constexpr int64_t kParallelWork = 32768;  // below this many elements threads cost more than they save

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Sum of f(i) for i < n with kLanes accumulators combined pairwise.
template <class A, class F>
A lane_sum(int64_t n, F f) {
  A acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += f(i);
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

template <class T, bool Log>
struct Row {
  using A = opmath_t<T>;
  const T* x;
  T* y;
  int64_t n, stride;  // x and y share the layout

  int64_t lo(int64_t c) const { return c * kChunk; }
  int64_t hi(int64_t c) const { return std::min(n, (c + 1) * kChunk); }

  // buf[i] = x[i] in A; partial[c] = the chunk's max.
  void load_max(int64_t c, A* buf, A* partial) const {
    A m = -std::numeric_limits<A>::infinity();
    if (stride == 1) {
      for (int64_t i = lo(c); i < hi(c); ++i) buf[i] = convert<A>(x[i]);
    } else {
      for (int64_t i = lo(c); i < hi(c); ++i) buf[i] = convert<A>(x[i * stride]);
    }
    for (int64_t i = lo(c); i < hi(c); ++i) m = sm::max_nan(m, buf[i]);
    partial[c] = m;
  }
  // partial[c] = the chunk's sum of exp(x - max); softmax keeps the exps in buf for the last pass.
  void exp_sum(int64_t c, A* buf, A max, A* partial) const {
    A* b = buf + lo(c);
    if constexpr (Log) {
      partial[c] = lane_sum<A>(hi(c) - lo(c), [&](int64_t i) { return sm::exp_shifted(b[i], max); });
    } else {
      partial[c] = lane_sum<A>(hi(c) - lo(c), [&](int64_t i) { return b[i] = sm::exp_shifted(b[i], max); });
    }
  }
  // y from buf; `k` is 1/sum's stand-in: the sum (softmax) or log(sum) (log_softmax).
  void write(int64_t c, const A* buf, A max, A k) const {
    for (int64_t i = lo(c); i < hi(c); ++i) {
      A v;
      if constexpr (Log) v = sm::log_softmax_value(buf[i], max, k);
      else v = sm::softmax_from_exp(buf[i], k);
      y[i * stride] = convert<T>(v);
    }
  }
  static A fold_max(const A* partial, int64_t nch) {
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t c = 0; c < nch; ++c) m = sm::max_nan(m, partial[c]);
    return m;
  }
  static A fold_sum(const A* partial, int64_t nch) {
    A s = 0;
    for (int64_t c = 0; c < nch; ++c) s += partial[c];
    return Log ? math::log(s) : s;
  }
  void run_serial(int64_t nch, A* buf, A* partial) const {
    for (int64_t c = 0; c < nch; ++c) load_max(c, buf, partial);
    const A m = fold_max(partial, nch);
    for (int64_t c = 0; c < nch; ++c) exp_sum(c, buf, m, partial);
    const A k = fold_sum(partial, nch);
    for (int64_t c = 0; c < nch; ++c) write(c, buf, m, k);
  }
};

template <class T, bool Log>
void run(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  using A = opmath_t<T>;
  const int64_t nrows = outer * inner, nch = (n + kChunk - 1) / kChunk;
  const bool big = nrows * n >= kParallelWork;
  auto row = [&](int64_t r) {
    const int64_t off = (r / inner) * n * inner + r % inner;
    return Row<T, Log>{x + off, y + off, n, inner};
  };
  if (big && nch >= 2 && nrows < max_threads()) {
    // Few long rows (e.g. one [1, 128256] logits row): the threads share each row's chunks.
    std::vector<A> buf(static_cast<size_t>(n)), partial(static_cast<size_t>(nch));
    for (int64_t r = 0; r < nrows; ++r) {
      const Row<T, Log> k = row(r);
      A m = 0, s = 0;
#pragma omp parallel
      {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nch; ++c) k.load_max(c, buf.data(), partial.data());
#pragma omp single
        m = Row<T, Log>::fold_max(partial.data(), nch);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nch; ++c) k.exp_sum(c, buf.data(), m, partial.data());
#pragma omp single
        s = Row<T, Log>::fold_sum(partial.data(), nch);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nch; ++c) k.write(c, buf.data(), m, s);
      }
    }
    return;
  }
#pragma omp parallel if (big && nrows > 1)
  {
    std::vector<A> buf(static_cast<size_t>(n)), partial(static_cast<size_t>(nch));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < nrows; ++r) row(r).run_serial(nch, buf.data(), partial.data());
  }
}

}  // namespace

void softmax(const Tensor& out, const Tensor& x, int64_t dim, bool log) {
  if (out.numel() == 0) return;
  const Tensor xc = x.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t n = x.size(dim);
  visit_dtypes<kFloatTypes>(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = xc.data<const T>();
    T* yp = out.data<T>();
    if (log) run<T, true>(xp, yp, outer, n, inner);
    else run<T, false>(xp, yp, outer, n, inner);
  });
}

}  // namespace kiln::cpu
