// CUDA launchers of var/std (Welford triples merged with Chan's formula), norm and logsumexp (the
// kernels: src/cuda/kernels/reduce.cuh; the math: src/ops/reduce_functors.h, shared with the CPU).
#include <cmath>

#include "core/dispatch.h"
#include "cuda/reduce.h"
#include "cuda/reduce_launch.cuh"
#include "ops/reduce_functors.h"

namespace kiln::cuda {

namespace {

template <class T>
struct VarStore {
  T* out;
  double correction;
  bool take_sqrt;
  __device__ void operator()(int64_t o, const reduce::WelfordAcc& a) const {
    const double v = reduce::welford_var(a, correction);
    out[o] = convert<T>(take_sqrt ? math::sqrt(v) : v);
  }
};

template <class T, class Op>
struct NormStore {
  T* out;
  Op op;
  __device__ void operator()(int64_t o, typename Op::acc_t a) const { out[o] = convert<T>(op.project(a)); }
};

template <class T>
struct LseStore {
  T* out;
  __device__ void operator()(int64_t o, const reduce::LseAcc& a) const { out[o] = convert<T>(reduce::lse_value(a)); }
};

template <class T, reduce::NormKind K>
void run_norm(const ReducePlan& plan, const Tensor& out, double p) {
  reduce::NormOp<T, K, reduce::device_sum_acc_t<T>> op;
  op.p = p;
  launch_reduce<T>(plan, op, NormStore<T, decltype(op)>{static_cast<T*>(out.data_ptr()), op}, "norm");
}

}  // namespace

void var_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double correction,
                bool take_sqrt) {
  const ReducePlan plan = plan_reduce(x, reduced);
  const char* name = take_sqrt ? "std" : "var";
  visit_dtypes<kFloatTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_reduce<T>(plan, reduce::WelfordOp<T>{}, VarStore<T>{static_cast<T*>(out.data_ptr()), correction, take_sqrt},
                     name);
  });
}

void norm_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, double p) {
  const ReducePlan plan = plan_reduce(x, reduced);
  using reduce::NormKind;
  visit_dtypes<kFloatTypes>(x.dtype(), "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p == 0.0) run_norm<T, NormKind::Zero>(plan, out, p);
    else if (p == 1.0) run_norm<T, NormKind::One>(plan, out, p);
    else if (p == 2.0) run_norm<T, NormKind::Two>(plan, out, p);
    else if (std::isinf(p) && p > 0) run_norm<T, NormKind::Inf>(plan, out, p);
    else if (std::isinf(p)) run_norm<T, NormKind::NegInf>(plan, out, p);
    else run_norm<T, NormKind::P>(plan, out, p);
  });
}

void logsumexp_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = plan_reduce(x, reduced);
  visit_dtypes<kFloatTypes>(x.dtype(), "logsumexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_reduce<T>(plan, reduce::LogSumExpOp<T>{}, LseStore<T>{static_cast<T*>(out.data_ptr())}, "logsumexp");
  });
}

}  // namespace kiln::cuda
