// Device-side adapters that turn the shared per-element functors (src/ops/binary_functors.h) into the
// storage-type callables the elementwise kernels (kernels/elementwise.cuh) apply. No math lives here: the
// functors are the same definitions the CPU backend runs, so both backends compute one function.
#pragma once

#include "cuda/device_error.h"
#include "kiln/scalar_types.h"
#include "ops/binary_functors.h"

namespace kiln::cuda {

// Storage S in, storage S out; the functor F computes in opmath_t<S> (float for f16/bf16, which therefore
// round once, at the store, exactly as the CPU kernels do).
template <class S, class F>
struct WidenBinary {
  F f;
  __device__ __forceinline__ S operator()(S x, S y) const {
    using M = opmath_t<S>;
    return static_cast<S>(f(static_cast<M>(x), static_cast<M>(y)));
  }
};

// A comparison of two storage values in opmath_t (bool out).
template <class S, class F>
struct WidenCompare {
  F f;
  __device__ __forceinline__ bool operator()(S x, S y) const {
    using M = opmath_t<S>;
    return f(static_cast<M>(x), static_cast<M>(y));
  }
};

// Integer division / remainder with a zero-divisor report: the CPU raises before any kernel runs (it scans
// the divisor on the host); on the GPU that scan would need a host sync, so the kernel records the error
// in the device error record instead and it is raised at the next synchronisation. The functor itself
// already returns 0 for a zero divisor, so the element stays defined.
template <class T, class F>
struct ZeroDivisorCheck {
  F f;
  DeviceErrorRecord* rec;
  OpId op;
  __device__ __forceinline__ T operator()(T x, T y) const {
    if (y == T(0)) report_device_error(rec, DeviceErrorCode::DivisionByZero, op, 0, 0);
    return f(x, y);
  }
};

// where: pure bit movement (instantiated per element size, not per dtype).
template <class Bits>
struct SelectBits {
  __device__ __forceinline__ Bits operator()(bool c, Bits x, Bits y) const { return c ? x : y; }
};

// masked_fill: self is both input and output (the same view: each element is read, then written by the
// same thread).
template <class Bits>
struct MaskedFillBits {
  Bits value;
  __device__ __forceinline__ Bits operator()(bool m, Bits x) const { return m ? value : x; }
};

}  // namespace kiln::cuda
