// Device side of the unary elementwise ops: storage <-> compute-type wrappers around the shared KILN_HD
// functors (src/ops/unary_functors.h), complex64 math, and the two-output frexp kernel. The generic
// one-input kernels are those of src/cuda/kernels/elementwise.cuh.
#pragma once

#include <cuda/std/complex>

#include <cstdint>

#include "cuda/kernels/elementwise.cuh"
#include "kiln/scalar_types.h"
#include "ops/unary_functors.h"

namespace kiln::cuda {

// Loads In, computes f in In's opmath type (float for half types), stores as Out: the same conversions
// as the CPU's map() (src/cpu/unary.cpp), so exact ops give the same bits.
template <class Out, class In, class F>
struct Widen {
  F f;
  __device__ __forceinline__ Out operator()(In x) const { return convert<Out>(f(static_cast<opmath_t<In>>(x))); }
};

// ---- complex64 -------------------------------------------------------------------------------------------
// The CPU computes these with std::complex<float> (glibc); here cuda::std::complex<float>, except tanh/tan
// (below). Both follow the usual formulas, so results agree to a few ulp away from singularities.

using cfloat = ::cuda::std::complex<float>;

template <class F>
struct ComplexMap {
  F f;
  __device__ __forceinline__ Complex64 operator()(Complex64 v) const {
    const cfloat r = f(cfloat(v.re, v.im));
    return Complex64(r.real(), r.imag());
  }
};

template <class Out, class F>
struct ComplexTo {
  F f;
  __device__ __forceinline__ Out operator()(Complex64 v) const { return f(cfloat(v.re, v.im)); }
};

namespace cunary {

struct Neg { __device__ cfloat operator()(cfloat z) const { return -z; } };
struct Abs { __device__ float operator()(cfloat z) const { return ::cuda::std::abs(z); } };
struct Square { __device__ cfloat operator()(cfloat z) const { return z * z; } };
struct Reciprocal { __device__ cfloat operator()(cfloat z) const { return cfloat(1.f) / z; } };
struct Rsqrt { __device__ cfloat operator()(cfloat z) const { return cfloat(1.f) / ::cuda::std::sqrt(z); } };
struct Exp { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::exp(z); } };
struct Log { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::log(z); } };
struct Log10 { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::log10(z); } };
struct Sqrt { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::sqrt(z); } };
struct Sin { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::sin(z); } };
struct Cos { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::cos(z); } };
struct Asin { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::asin(z); } };
struct Acos { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::acos(z); } };
struct Atan { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::atan(z); } };
struct Sinh { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::sinh(z); } };
struct Cosh { __device__ cfloat operator()(cfloat z) const { return ::cuda::std::cosh(z); } };
struct Sigmoid {
  __device__ cfloat operator()(cfloat z) const { return cfloat(1.f) / (cfloat(1.f) + ::cuda::std::exp(-z)); }
};

// libcu++'s tanh divides by cosh(2x) + cos(2y), which cancels near the poles (x ~ 0, y ~ pi/2) and loses
// all accuracy there; Kahan's formula (as glibc's ctanhf) does not: with t = tan y, s = sinh x,
// tanh(x + iy) = (beta rho s + i t) / (1 + beta s^2), beta = 1 + t^2, rho = sqrt(1 + s^2).
__device__ __forceinline__ cfloat kahan_tanh(cfloat z) {
  const float x = z.real(), y = z.imag();
  if (!math::isfinite(x) || !math::isfinite(y)) return ::cuda::std::tanh(z);  // Annex G special values
  if (math::fabs(x) > 9.f) {
    // tanh(x) is +-1 in float; beta s^2 would overflow. Im = sin(2y) / (cosh(2x) + cos(2y)) ~ 2 sin(2y) e^-2|x|.
    const float e = math::exp(-2.f * math::fabs(x));
    return cfloat(math::copysign(1.f, x), 4.f * math::sin(y) * math::cos(y) * e);
  }
  const float t = math::tan(y), beta = 1.f + t * t, s = math::sinh(x), rho = math::sqrt(1.f + s * s);
  const float den = 1.f + beta * s * s;
  return cfloat(beta * rho * s / den, t / den);
}

struct Tanh { __device__ cfloat operator()(cfloat z) const { return kahan_tanh(z); } };
// tan z = -i tanh(iz).
struct Tan {
  __device__ cfloat operator()(cfloat z) const {
    const cfloat w = kahan_tanh(cfloat(-z.imag(), z.real()));
    return cfloat(w.imag(), -w.real());
  }
};

struct IsNan {
  __device__ bool operator()(cfloat z) const { return math::isnan(z.real()) || math::isnan(z.imag()); }
};
struct IsInf {
  __device__ bool operator()(cfloat z) const { return math::isinf(z.real()) || math::isinf(z.imag()); }
};
struct IsFinite {
  __device__ bool operator()(cfloat z) const { return math::isfinite(z.real()) && math::isfinite(z.imag()); }
};
struct LogicalNot {
  __device__ bool operator()(cfloat z) const { return z.real() == 0.f && z.imag() == 0.f; }
};

}  // namespace cunary

// ---- frexp -----------------------------------------------------------------------------------------------

// mantissa[i] (T), exponent[i] (int32) = frexp(in[i]) in T's opmath type; any strides (OffsetCalc operand
// 0 = mantissa, 1 = exponent, 2 = input). Grid-stride.
template <class IndexT, class T>
__global__ void frexp_strided(IndexT n, OffsetCalc<3, IndexT> oc, T* mantissa, int32_t* exponent, const T* in) {
  using C = opmath_t<T>;
  const IndexT stride = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    IndexT off[3];
    oc.get(i, off);
    int32_t e = 0;
    const C m = unary::Frexp{}(static_cast<C>(in[off[2]]), &e);
    mantissa[off[0]] = convert<T>(m);
    exponent[off[1]] = e;
  }
}

}  // namespace kiln::cuda
