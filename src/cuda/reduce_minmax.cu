// CUDA launchers of the comparison reductions: amax/amin, max/min along a dim with indices
// (argmax/argmin), all/any (the kernels: src/cuda/kernels/reduce.cuh; the math: src/ops/reduce_functors.h,
// shared with the CPU: NaN wins, ties go to the smallest index whatever order partials combine in).
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/reduce.h"
#include "cuda/reduce_launch.cuh"
#include "ops/reduce_functors.h"

namespace kiln::cuda {

namespace {

constexpr DTypeSet kOrderedTypes = kFloatTypes | kIntTypes | kBoolType;

template <class T, class Acc>
struct ValueStore {
  T* out;
  __device__ void operator()(int64_t o, Acc a) const { out[o] = static_cast<T>(a); }
};

template <class T, class Acc>
struct ValueIndexStore {
  T* values;  // null for argmax/argmin
  int64_t* indices;
  __device__ void operator()(int64_t o, const Acc& a) const {
    if (values) values[o] = static_cast<T>(a.v);
    indices[o] = a.i;
  }
};

// bool and u8 outputs are both one byte holding 0 or 1.
struct LogicalStore {
  uint8_t* out;
  __device__ void operator()(int64_t o, bool a) const { out[o] = a ? 1 : 0; }
};

template <template <class> class Op>
void extreme(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, const char* name) {
  const ReducePlan plan = plan_reduce(x, reduced);
  visit_dtypes<kOrderedTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_reduce<T>(plan, Op<T>{}, ValueStore<T, typename Op<T>::acc_t>{static_cast<T*>(out.data_ptr())}, name);
  });
}

template <bool IsAll>
void logical(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = plan_reduce(x, reduced);
  const char* name = IsAll ? "all" : "any";
  visit_dtypes<kAllTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_reduce<T>(plan, reduce::LogicalOp<T, IsAll>{}, LogicalStore{static_cast<uint8_t*>(out.data_ptr())}, name);
  });
}

}  // namespace

void amax_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  extreme<reduce::MaxOp>(out, x, reduced, "amax");
}

void amin_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  extreme<reduce::MinOp>(out, x, reduced, "amin");
}

void max_with_index_kernel(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim,
                           bool is_max) {
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), false);
  if (x.dim() > 0) reduced[static_cast<size_t>(dim)] = true;
  // One reduced dim: the plan's reduced index is the position along it.
  const ReducePlan plan = plan_reduce(x, reduced);
  int64_t* idx = static_cast<int64_t*>(indices.data_ptr());
  const char* name = is_max ? "max" : "min";
  visit_dtypes<kOrderedTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* v = values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr;
    auto go = [&](auto op) {
      using Acc = typename decltype(op)::acc_t;
      launch_reduce<T>(plan, op, ValueIndexStore<T, Acc>{v, idx}, name);
    };
    if (is_max) go(reduce::ArgExtremeOp<T, true>{});
    else go(reduce::ArgExtremeOp<T, false>{});
  });
}

void all_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  logical<true>(out, x, reduced);
}

void any_kernel(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  logical<false>(out, x, reduced);
}

}  // namespace kiln::cuda
