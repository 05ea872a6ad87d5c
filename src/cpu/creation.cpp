// CPU kernels for arange, linspace, logspace and eye. Each element is computed from its index alone
// (ops/range.h), so the parallel split cannot change the values.
#include "cpu/creation.h"

#include "core/dispatch.h"
#include "ops/range.h"

namespace kiln::cpu {

namespace {
template <class T, class F>
void fill_indexed(Tensor& out, F f) {
  T* p = out.data<T>();
  const int64_t n = out.numel();
  if (n >= 32768) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = f(i);
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] = f(i);
  }
}

constexpr DTypeSet kRangeTypes = kFloatTypes | kIntTypes;
}  // namespace

void arange_fill(Tensor& out, const Scalar& start, const Scalar& step) {
  visit_dtypes<kRangeTypes>(out.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ArangeOp<T> op = make_arange_op<T>(start, step, out.numel());
    fill_indexed<T>(out, op);
  });
}

void linspace_fill(Tensor& out, double start, double end) {
  visit_dtypes<kRangeTypes>(out.dtype(), "linspace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_indexed<T>(out, make_linspace_op<T>(start, end, out.numel()));
  });
}

void logspace_fill(Tensor& out, double start, double end, double base) {
  visit_dtypes<kRangeTypes>(out.dtype(), "logspace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    LogspaceOp<T> op{make_linspace_op<T>(start, end, out.numel()), base};
    fill_indexed<T>(out, op);
  });
}

void eye_fill(Tensor& out) {
  visit_dtypes<kAllTypes>(out.dtype(), "eye", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    const int64_t n = out.size(0), m = out.size(1);
    const T one = convert<T>(1);
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = one;
  });
}

}  // namespace kiln::cpu
