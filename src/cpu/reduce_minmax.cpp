// CPU kernels of the comparison reductions: amax/amin, max/min with indices (argmax/argmin), all/any.
#include <type_traits>

#include "core/dispatch.h"
#include "cpu/reduce.h"
#include "cpu/reduce_kernel.h"
#include "ops/reduce_functors.h"

namespace kiln::cpu {

namespace {

constexpr DTypeSet kOrderedTypes = kFloatTypes | kIntTypes | kBoolType;

template <template <class> class Op>
void extreme(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, const char* name) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  visit_dtypes<kOrderedTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    run_reduce(plan, static_cast<const T*>(x.data_ptr()), Op<T>{},
               [&](int64_t i, typename Op<T>::acc_t a) { o[i] = static_cast<T>(a); });
  });
}

template <bool IsAll>
void logical(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  const ReducePlan plan = make_reduce_plan(x, reduced);
  const char* name = IsAll ? "all" : "any";
  visit_dtypes<kAllTypes>(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.data_ptr());
    if (out.dtype() == DType::U8) {
      uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
      run_reduce(plan, in, reduce::LogicalOp<T, IsAll>{}, [&](int64_t i, bool a) { o[i] = a ? 1 : 0; });
    } else {
      bool* o = static_cast<bool*>(out.data_ptr());
      run_reduce(plan, in, reduce::LogicalOp<T, IsAll>{}, [&](int64_t i, bool a) { o[i] = a; });
    }
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
  // One reduced dim: the plan's linear reduced index is the position along it.
  const ReducePlan plan = make_reduce_plan(x, reduced);
  int64_t* idx = static_cast<int64_t*>(indices.data_ptr());
  visit_dtypes<kOrderedTypes>(x.dtype(), is_max ? "max" : "min", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.data_ptr());
    T* v = values.defined() ? static_cast<T*>(values.data_ptr()) : nullptr;
    auto go = [&](auto op) {
      run_reduce(plan, in, op, [&](int64_t i, typename decltype(op)::acc_t a) {
        if (v) v[i] = static_cast<T>(a.v);
        idx[i] = a.i;
      });
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

}  // namespace kiln::cpu
