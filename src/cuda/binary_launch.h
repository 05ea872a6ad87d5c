// Host-side dispatch helpers shared by the binary launchers (src/cuda/binary*.cu). Include from .cu only.
#pragma once

#include "core/dispatch.h"
#include "cuda/binary.h"
#include "cuda/elementwise.h"
#include "cuda/kernels/binary.cuh"

namespace kiln::cuda::detail {

inline constexpr DTypeSet kArith = kFloatTypes | kIntTypes | kBoolType;
inline constexpr DTypeSet kNumeric = kFloatTypes | kIntTypes;
inline constexpr DTypeSet kBitwise = kIntTypes | kBoolType;

template <class S, class F>
void run_binary(const Tensor& out, const Tensor& a, const Tensor& b, F f, const char* name) {
  launch_elementwise<S, S, S>(out, {&a, &b}, WidenBinary<S, F>{f}, name);
}

// Runs Fn<opmath_t<S>> for the storage dtype S of out, instantiated only for the dtypes in Allowed.
template <DTypeSet Allowed, template <class> class Fn>
void dispatch_binary(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtypes<Allowed>(out.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    run_binary<S>(out, a, b, Fn<opmath_t<S>>{}, name);
  });
}

}  // namespace kiln::cuda::detail
