// CPU kernels of the arithmetic reductions: sum, prod, mean, var/std, norm, logsumexp; and the plan that
// every reduction kernel traverses (cpu/reduce_kernel.h).
#include "cpu/reduce.h"

#include <cmath>

#include "core/dispatch.h"
#include "cpu/reduce_kernel.h"
#include "ops/reduce_functors.h"

namespace kiln::cpu {

namespace {

struct PlanDim {
  int64_t size, in, out;
};

// Orders dims outermost first by |input stride| (stable, so equal strides keep tensor order) and merges
// neighbours that are contiguous with each other in the input (and in the output, for kept dims).
std::vector<PlanDim> order_and_merge(std::vector<PlanDim> dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const PlanDim& a, const PlanDim& b) { return std::llabs(a.in) > std::llabs(b.in); });
  std::vector<PlanDim> merged;
  for (const PlanDim& d : dims) {
    if (!merged.empty() && merged.back().in == d.in * d.size && merged.back().out == d.out * d.size) {
      merged.back().size *= d.size;
      merged.back().in = d.in;
      merged.back().out = d.out;
    } else {
      merged.push_back(d);
    }
  }
  if (merged.empty()) merged.push_back({1, 0, 0});
  return merged;
}

}  // namespace

ReducePlan make_reduce_plan(const Tensor& x, const std::vector<bool>& reduced) {
  ReducePlan p;
  std::vector<PlanDim> kept, red;
  // Output strides: contiguous over the kept dims in tensor order.
  int64_t out_stride = 1;
  std::vector<int64_t> kout(static_cast<size_t>(x.dim()), 0);
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    if (reduced[static_cast<size_t>(d)]) continue;
    kout[static_cast<size_t>(d)] = out_stride;
    out_stride *= x.sizes()[static_cast<size_t>(d)];
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    const auto i = static_cast<size_t>(d);
    const int64_t n = x.sizes()[i];
    if (reduced[i]) p.red_numel *= n;
    else p.out_numel *= n;
    if (n == 1) continue;
    if (reduced[i]) red.push_back({n, x.strides()[i], 0});
    else kept.push_back({n, x.strides()[i], kout[i]});
  }
  for (const PlanDim& d : order_and_merge(kept)) {
    p.ksize.push_back(d.size);
    p.kin.push_back(d.in);
    p.kout.push_back(d.out);
  }
  for (const PlanDim& d : order_and_merge(red)) {
    p.rsize.push_back(d.size);
    p.rin.push_back(d.in);
  }
  p.columns = p.ksize.back() > 1 && std::llabs(p.kin.back()) < std::llabs(p.rin.back());
  return p;
}

namespace {

template <class T>
T* out_ptr(const Tensor& out) {
  return static_cast<T*>(out.data_ptr());
}

}  // namespace

void sum_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.data_ptr());
    if constexpr (std::is_integral_v<T>) {
      using Out = std::conditional_t<std::is_same_v<T, uint64_t>, uint64_t, int64_t>;
      Out* o = out_ptr<Out>(out);
      run_reduce(plan, in, reduce::SumOp<T>{}, [&](int64_t i, uint64_t a) { o[i] = static_cast<Out>(a); });
    } else {
      T* o = out_ptr<T>(out);
      run_reduce(plan, in, reduce::SumOp<T>{}, [&](int64_t i, double a) { o[i] = convert<T>(a); });
    }
  });
}

void prod_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(x.dtype(), "prod", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = typename reduce::ProdOp<T>::acc_t;
    const T* in = static_cast<const T*>(x.data_ptr());
    if constexpr (std::is_integral_v<T>) {
      using Out = std::conditional_t<std::is_same_v<T, uint64_t>, uint64_t, int64_t>;
      Out* o = out_ptr<Out>(out);
      run_reduce(plan, in, reduce::ProdOp<T>{}, [&](int64_t i, Acc a) { o[i] = static_cast<Out>(a); });
    } else {
      T* o = out_ptr<T>(out);
      run_reduce(plan, in, reduce::ProdOp<T>{}, [&](int64_t i, Acc a) { o[i] = convert<T>(a); });
    }
  });
}

void mean_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  // 0 / 0 gives the NaN PyTorch returns for an empty mean.
  const double n = static_cast<double>(plan.red_numel);
  visit_dtypes<kFloatTypes>(x.dtype(), "mean", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out_ptr<T>(out);
    run_reduce(plan, static_cast<const T*>(x.data_ptr()), reduce::SumOp<T>{},
               [&](int64_t i, double a) { o[i] = convert<T>(a / n); });
  });
}

void var_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double correction,
                bool take_sqrt) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  visit_dtypes<kFloatTypes>(x.dtype(), take_sqrt ? "std" : "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out_ptr<T>(out);
    run_reduce(plan, static_cast<const T*>(x.data_ptr()), reduce::WelfordOp<T>{},
               [&](int64_t i, const reduce::WelfordAcc& a) {
                 const double v = reduce::welford_var(a, correction);
                 o[i] = convert<T>(take_sqrt ? std::sqrt(v) : v);
               });
  });
}

namespace {
template <class T, reduce::NormKind K>
void run_norm(const ReducePlan& plan, const Tensor& out, const Tensor& x, double p) {
  reduce::NormOp<T, K> op;
  op.p = p;
  T* o = out_ptr<T>(out);
  run_reduce(plan, static_cast<const T*>(x.data_ptr()), op,
             [&](int64_t i, double a) { o[i] = convert<T>(op.project(a)); });
}
}  // namespace

void norm_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double p) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  using reduce::NormKind;
  visit_dtypes<kFloatTypes>(x.dtype(), "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p == 0.0) run_norm<T, NormKind::Zero>(plan, out, x, p);
    else if (p == 1.0) run_norm<T, NormKind::One>(plan, out, x, p);
    else if (p == 2.0) run_norm<T, NormKind::Two>(plan, out, x, p);
    else if (std::isinf(p) && p > 0) run_norm<T, NormKind::Inf>(plan, out, x, p);
    else if (std::isinf(p)) run_norm<T, NormKind::NegInf>(plan, out, x, p);
    else run_norm<T, NormKind::P>(plan, out, x, p);
  });
}

void logsumexp_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  visit_dtypes<kFloatTypes>(x.dtype(), "logsumexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out_ptr<T>(out);
    run_reduce(plan, static_cast<const T*>(x.data_ptr()), reduce::LogSumExpOp<T>{},
               [&](int64_t i, const reduce::LseAcc& a) { o[i] = convert<T>(reduce::lse_value(a)); });
  });
}

}  // namespace kiln::cpu
