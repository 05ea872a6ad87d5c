// Scalar math callable from host and device code alike (KILN_HD): the CPU kernels and the CUDA kernels
// call these, so an op's definition exists once. Float and double overloads; reduced-precision types are
// computed in float by the callers (opmath_t).
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln::math {

#if defined(__CUDA_ARCH__)
#define KILN_M1(name, fn_f, fn_d)                        \
  KILN_HD float name(float x) { return ::fn_f(x); }     \
  KILN_HD double name(double x) { return ::fn_d(x); }
#define KILN_M2(name, fn_f, fn_d)                                  \
  KILN_HD float name(float x, float y) { return ::fn_f(x, y); }   \
  KILN_HD double name(double x, double y) { return ::fn_d(x, y); }
#else
#define KILN_M1(name, fn_f, fn_d)                          \
  KILN_HD float name(float x) { return std::fn_d(x); }    \
  KILN_HD double name(double x) { return std::fn_d(x); }
#define KILN_M2(name, fn_f, fn_d)                                    \
  KILN_HD float name(float x, float y) { return std::fn_d(x, y); }  \
  KILN_HD double name(double x, double y) { return std::fn_d(x, y); }
#endif

KILN_M1(exp, expf, exp)
KILN_M1(exp2, exp2f, exp2)
KILN_M1(expm1, expm1f, expm1)
KILN_M1(log, logf, log)
KILN_M1(log2, log2f, log2)
KILN_M1(log10, log10f, log10)
KILN_M1(log1p, log1pf, log1p)
KILN_M1(sqrt, sqrtf, sqrt)
KILN_M1(sin, sinf, sin)
KILN_M1(cos, cosf, cos)
KILN_M1(tan, tanf, tan)
KILN_M1(asin, asinf, asin)
KILN_M1(acos, acosf, acos)
KILN_M1(atan, atanf, atan)
KILN_M1(sinh, sinhf, sinh)
KILN_M1(cosh, coshf, cosh)
KILN_M1(tanh, tanhf, tanh)
KILN_M1(erf, erff, erf)
KILN_M1(floor, floorf, floor)
KILN_M1(ceil, ceilf, ceil)
KILN_M1(trunc, truncf, trunc)
KILN_M1(nearbyint, nearbyintf, nearbyint)  // round half to even (default rounding mode)
KILN_M1(fabs, fabsf, fabs)
KILN_M2(pow, powf, pow)
KILN_M2(fmod, fmodf, fmod)
KILN_M2(atan2, atan2f, atan2)
KILN_M2(copysign, copysignf, copysign)
KILN_M2(fmax, fmaxf, fmax)
KILN_M2(fmin, fminf, fmin)
#undef KILN_M1
#undef KILN_M2

template <class T>
KILN_HD bool isnan(T x) {
  return x != x;
}
template <class T>
KILN_HD bool isinf(T x) {
  return x == static_cast<T>(INFINITY) || x == -static_cast<T>(INFINITY);
}
template <class T>
KILN_HD bool isfinite(T x) {
  return !isnan(x) && !isinf(x);
}
KILN_HD bool signbit(float x) { return (f32_to_bits(x) >> 31) != 0; }
KILN_HD bool signbit(double x) {
#if defined(__CUDA_ARCH__)
  return (__double_as_longlong(x) >> 63) != 0;
#else
  return std::signbit(x);
#endif
}
KILN_HD float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrtf(x);
#else
  return 1.f / std::sqrt(x);
#endif
}
KILN_HD double rsqrt(double x) { return 1.0 / sqrt(x); }

}  // namespace kiln::math
