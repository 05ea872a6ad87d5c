// CUDA launchers of sum, prod and mean (the kernels: src/cuda/kernels/reduce.cuh; the math:
// src/ops/reduce_functors.h, shared with the CPU).
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/reduce.h"
#include "cuda/reduce_launch.cuh"
#include "ops/reduce_functors.h"

namespace kiln::cuda {

namespace {

constexpr DTypeSet kSumTypes = kFloatTypes | kIntTypes | kBoolType;

// Integer sums and products are stored as i64 (u64 for u64) from the modular u64 accumulator.
template <class T>
using int_out_t = std::conditional_t<std::is_same_v<T, uint64_t>, uint64_t, int64_t>;

// Floats: out = acc / divisor in f64 (divisor 1 is exact for sum and prod; the element count for mean,
// dividing the way the CPU does), then PyTorch's conversion to T.
template <class T, class Acc>
struct FloatStore {
  T* out;
  double divisor;
  __device__ void operator()(int64_t o, Acc a) const {
    out[o] = convert<T>(static_cast<double>(a) / divisor);
  }
};

template <class T>
struct IntStore {
  int_out_t<T>* out;
  __device__ void operator()(int64_t o, uint64_t a) const { out[o] = static_cast<int_out_t<T>>(a); }
};

template <class Op, class T>
void run(const ReducePlan& plan, const Tensor& out, const Op& op, double divisor, const char* name) {
  if constexpr (std::is_integral_v<T>)
    launch_reduce<T>(plan, op, IntStore<T>{static_cast<int_out_t<T>*>(out.data_ptr())}, name);
  else
    launch_reduce<T>(plan, op, FloatStore<T, typename Op::acc_t>{static_cast<T*>(out.data_ptr()), divisor}, name);
}

}  // namespace

void sum_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = plan_reduce(x, reduced);
  visit_dtypes<kSumTypes>(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run<reduce::SumOp<T, reduce::device_sum_acc_t<T>>, T>(plan, out, {}, 1.0, "sum");
  });
}

void prod_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = plan_reduce(x, reduced);
  visit_dtypes<kSumTypes>(x.dtype(), "prod", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run<reduce::ProdOp<T>, T>(plan, out, {}, 1.0, "prod");
  });
}

void mean_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = plan_reduce(x, reduced);
  // An empty mean is 0 / 0 = NaN, as PyTorch's.
  const double n = static_cast<double>(plan.len);
  visit_dtypes<kFloatTypes>(x.dtype(), "mean", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run<reduce::SumOp<T, reduce::device_sum_acc_t<T>>, T>(plan, out, {}, n, "mean");
  });
}

}  // namespace kiln::cuda
