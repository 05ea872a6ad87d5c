// Scalar storage types and the conversions between every pair of kiln dtypes.
//
// One definition serves the CPU and CUDA backends (KILN_HD marks functions callable from both), so the two
// produce the same bits. The conversions follow PyTorch 2.11 on x86-64 bit for bit, which is not always what
// a vendor header or the C++ standard would do; tests/core/conversion_test.cpp checks them against a table
// written by PyTorch (tests/data/conversions.json). Where PyTorch's CPU and CUDA backends disagree (NaN
// payloads, float->int overflow) kiln follows the CPU.
#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HD inline
#define KILN_HOST_DEVICE
#endif

namespace kiln {

KILN_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

KILN_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

KILN_HD bool f32_isnan(float f) { return (f32_to_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- IEEE binary16 -------------------------------------------------------------------------------------

KILN_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  // inf; NaN keeps its payload and becomes quiet (x86's vcvtph2ps, which PyTorch's vectorised CPU cast uses).
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13));
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24 is exact in f32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return f32_from_bits(sign | f32_to_bits(mag));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even; overflow goes to inf; NaN keeps the top payload bits and becomes quiet (what x86's
// F16C conversion, and so PyTorch's CPU backend, does).
KILN_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t w = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000u);
  const uint32_t a = w & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): add 0.5 (2^-1) so the FPU does the rounding at the 2^-24 position.
    const float r = f32_from_bits(a) + 0.5f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(f32_to_bits(r) - 0x3F000000u));
  }
  const uint32_t mant_odd = (a >> 13) & 1u;
  uint32_t v = a + 0xC8000FFFu + mant_odd;  // rebias exponent (15 - 127) << 23, rounding bias
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(v >> 13));
}

// ---- bfloat16 --------------------------------------------------------------------------------------------

KILN_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// Round to nearest even. NaN becomes 0xFFFF whatever its sign: PyTorch's vectorised CPU cast does this.
KILN_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f32_to_bits(f);
  if (f32_isnan(f)) return 0xFFFFu;
  const uint32_t bias = ((u >> 16) & 1u) + 0x7FFFu;
  return static_cast<uint16_t>((u + bias) >> 16);
}

// ---- float8 ----------------------------------------------------------------------------------------------

KILN_HD float e4m3_bits_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t mant = v & 0x7u;
  // The only NaN (no infinity); PyTorch decodes it as the f32 NaN 0x7FF00000 (with the sign).
  if (exp == 0xF && mant == 0x7) return f32_from_bits(sign | 0x7FF00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
    return f32_from_bits(sign | f32_to_bits(mag));
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
}

// PyTorch's rule: |x| >= 480 (and inf, NaN) becomes NaN (0x7F with the sign); 464 < |x| < 480 too, by
// rounding to the NaN code; |x| <= 464 rounds to nearest even, so 464 gives 448 (0x7E).
KILN_HD uint8_t f32_to_e4m3_bits(float f) {
  uint32_t a = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((a >> 24) & 0x80u);
  a &= 0x7FFFFFFFu;
  uint8_t r;
  if (a >= 0x43F00000u) {
    r = 0x7F;
  } else if (a < (121u << 23)) {
    const uint32_t denorm = 141u << 23;
    const uint32_t t = f32_to_bits(f32_from_bits(a) + f32_from_bits(denorm));
    r = static_cast<uint8_t>(t - denorm);
  } else {
    const uint32_t mant_odd = (a >> 20) & 1u;
    a += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd;
    r = static_cast<uint8_t>(a >> 20);
  }
  return static_cast<uint8_t>(r | sign);
}

KILN_HD float e5m2_bits_to_f32(uint8_t v) { return f16_bits_to_f32(static_cast<uint16_t>(v) << 8); }

// Round to nearest even; |x| >= 61440 becomes inf (0x7C), NaN becomes 0x7F (with the sign).
KILN_HD uint8_t f32_to_e5m2_bits(float f) {
  uint32_t a = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((a >> 24) & 0x80u);
  a &= 0x7FFFFFFFu;
  uint8_t r;
  if (a >= (143u << 23)) {
    r = a > 0x7F800000u ? 0x7F : 0x7C;
  } else if (a < (113u << 23)) {
    const uint32_t denorm = 134u << 23;
    const uint32_t t = f32_to_bits(f32_from_bits(a) + f32_from_bits(denorm));
    r = static_cast<uint8_t>(t - denorm);
  } else {
    const uint32_t mant_odd = (a >> 21) & 1u;
    a += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFFu + mant_odd;
    r = static_cast<uint8_t>(a >> 21);
  }
  return static_cast<uint8_t>(r | sign);
}

// ---- storage types ---------------------------------------------------------------------------------------

struct FromBits {};

struct Half {
  uint16_t x;
  Half() = default;
  KILN_HD constexpr Half(uint16_t bits, FromBits) : x(bits) {}
  KILN_HD explicit Half(float f) : x(f32_to_f16_bits(f)) {}
  KILN_HD operator float() const { return f16_bits_to_f32(x); }
};

struct BFloat16 {
  uint16_t x;
  BFloat16() = default;
  KILN_HD constexpr BFloat16(uint16_t bits, FromBits) : x(bits) {}
  KILN_HD explicit BFloat16(float f) : x(f32_to_bf16_bits(f)) {}
  KILN_HD operator float() const { return bf16_bits_to_f32(x); }
};

struct Float8_e4m3fn {
  uint8_t x;
  Float8_e4m3fn() = default;
  KILN_HD constexpr Float8_e4m3fn(uint8_t bits, FromBits) : x(bits) {}
  KILN_HD explicit Float8_e4m3fn(float f) : x(f32_to_e4m3_bits(f)) {}
  KILN_HD operator float() const { return e4m3_bits_to_f32(x); }
};

struct Float8_e5m2 {
  uint8_t x;
  Float8_e5m2() = default;
  KILN_HD constexpr Float8_e5m2(uint8_t bits, FromBits) : x(bits) {}
  KILN_HD explicit Float8_e5m2(float f) : x(f32_to_e5m2_bits(f)) {}
  KILN_HD operator float() const { return e5m2_bits_to_f32(x); }
};

// complex64: two floats, layout-compatible with std::complex<float> and cuComplex.
struct alignas(8) Complex64 {
  float re, im;
  Complex64() = default;
  KILN_HD constexpr Complex64(float r, float i = 0.f) : re(r), im(i) {}
};

// complex64 arithmetic (c10::complex's definitions: Smith's algorithm for division avoids overflow in
// |b|^2 for large operands).
KILN_HD Complex64 operator+(Complex64 a, Complex64 b) { return {a.re + b.re, a.im + b.im}; }
KILN_HD Complex64 operator-(Complex64 a, Complex64 b) { return {a.re - b.re, a.im - b.im}; }
KILN_HD Complex64 operator-(Complex64 a) { return {-a.re, -a.im}; }
KILN_HD Complex64 operator*(Complex64 a, Complex64 b) {
  return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}
KILN_HD Complex64 operator/(Complex64 a, Complex64 b) {
  const float abs_re = b.re < 0 ? -b.re : b.re, abs_im = b.im < 0 ? -b.im : b.im;
  if (abs_re >= abs_im) {
    if (abs_re == 0.f && abs_im == 0.f) return {a.re / abs_re, a.im / abs_im};  // inf/nan as IEEE gives
    const float r = b.im / b.re, d = b.re + b.im * r;
    return {(a.re + a.im * r) / d, (a.im - a.re * r) / d};
  }
  const float r = b.re / b.im, d = b.im + b.re * r;
  return {(a.re * r + a.im) / d, (a.im * r - a.re) / d};
}
KILN_HD bool operator==(Complex64 a, Complex64 b) { return a.re == b.re && a.im == b.im; }
KILN_HD bool operator!=(Complex64 a, Complex64 b) { return !(a == b); }

template <class T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> ||
                                           std::is_same_v<T, Float8_e4m3fn> || std::is_same_v<T, Float8_e5m2>;

// The type arithmetic is done in: float for the reduced-precision floats, the type itself otherwise.
template <class T>
struct OpMath {
  using type = T;
};
template <> struct OpMath<Half> { using type = float; };
template <> struct OpMath<BFloat16> { using type = float; };
template <> struct OpMath<Float8_e4m3fn> { using type = float; };
template <> struct OpMath<Float8_e5m2> { using type = float; };
template <class T>
using opmath_t = typename OpMath<T>::type;

// ---- conversions -----------------------------------------------------------------------------------------

// float -> integer as x86-64 (and PyTorch's CPU backend) does it, without undefined behaviour: NaN and values
// outside int64 become INT64_MIN ("integer indefinite"), and narrower types take the low bits of the 64-bit
// result, except int32, which x86 converts directly (out of range: INT32_MIN), and the 8- and 16-bit types,
// which PyTorch converts through int32 (so 3e9 -> int16 is 0, the low bits of INT32_MIN).
KILN_HD int64_t float_to_i64_x86(double v) {
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return INT64_MIN;
  return static_cast<int64_t>(v);
}
KILN_HD int32_t float_to_i32_x86(double v) {
  if (!(v > -2147483649.0 && v < 2147483648.0)) return INT32_MIN;
  return static_cast<int32_t>(v);
}
KILN_HD uint64_t float_to_u64_x86(double v) {
  // gcc converts values >= 2^63 by subtracting 2^63 first; below that it is a signed conversion.
  // PyTorch 2.11's CPU cast gives 0 at and above 2^64 (inf included).
  if (v >= 18446744073709551616.0) return 0;
  if (v >= 9223372036854775808.0)
    return static_cast<uint64_t>(static_cast<int64_t>(v - 9223372036854775808.0)) ^ 0x8000000000000000ull;
  return static_cast<uint64_t>(float_to_i64_x86(v));
}
// PyTorch's CPU float -> uint32: non-negative values take the low 32 bits of the int64 conversion (so
// 2^32 and above give the low bits, 1e20 and inf give 0), negative values and NaN go through int32.
KILN_HD uint32_t float_to_u32_x86(double v) {
  if (v >= 0) return static_cast<uint32_t>(float_to_i64_x86(v));
  return static_cast<uint32_t>(float_to_i32_x86(v));
}

template <class T>
inline constexpr bool is_complex_v = std::is_same_v<T, Complex64>;

// The value of any kiln scalar as double (complex: the real part).
template <class T>
KILN_HD double to_double(T v) {
  if constexpr (std::is_same_v<T, Complex64>) return v.re;
  else if constexpr (is_reduced_float_v<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

// convert<To>(from): the PyTorch conversion between any two kiln scalar types.
template <class To, class From>
KILN_HD To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    if constexpr (std::is_same_v<From, Complex64>) return v.re != 0.f || v.im != 0.f;
    else return to_double(v) != 0.0;
  } else if constexpr (std::is_same_v<To, Complex64>) {
    if constexpr (std::is_same_v<From, Complex64>) return v;
    else return Complex64(convert<float>(v), 0.f);
  } else if constexpr (std::is_same_v<From, Complex64>) {
    return convert<To>(v.re);  // discards the imaginary part, as PyTorch does (with a warning)
  } else if constexpr (is_reduced_float_v<To>) {
    // Every source goes through float first, as PyTorch does (so f64 -> f16 rounds twice).
    return To(convert<float>(v));
  } else if constexpr (is_reduced_float_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_floating_point_v<From>) {
    // float/double -> integer
    if constexpr (std::is_same_v<To, int32_t>) return float_to_i32_x86(static_cast<double>(v));
    else if constexpr (sizeof(To) < 4) return static_cast<To>(float_to_i32_x86(static_cast<double>(v)));
    else if constexpr (std::is_same_v<To, uint64_t>) return float_to_u64_x86(static_cast<double>(v));
    else if constexpr (std::is_same_v<To, uint32_t>) return float_to_u32_x86(static_cast<double>(v));
    else return static_cast<To>(float_to_i64_x86(static_cast<double>(v)));
  } else {
    return static_cast<To>(v);  // integer -> integer: two's complement wrap (well defined in C++20)
  }
}

}  // namespace kiln
