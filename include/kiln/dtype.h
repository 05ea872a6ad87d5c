// Element types, their properties, and PyTorch's type-promotion lattice.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/scalar_types.h"

namespace kiln {

enum class DType : uint8_t {
  Bool,
  U8,
  I8,
  I16,
  U16,
  I32,
  U32,
  I64,
  U64,
  F16,
  BF16,
  F32,
  F64,
  C64,
  F8E4M3,  // float8_e4m3fn
  F8E5M2,  // float8_e5m2
};
inline constexpr int kNumDTypes = 16;

// Short names as PyTorch prints them without the "torch." prefix: bool, uint8, ..., float8_e4m3fn.
const char* dtype_name(DType t);
// Parses the names above and the short forms u8, i32, f16, bf16, f32, c64, fp8_e4m3, ...
DType parse_dtype(std::string_view name);

size_t itemsize(DType t);
bool is_floating(DType t);     // f16 bf16 f32 f64 and the float8s
bool is_complex(DType t);
bool is_integral(DType t, bool include_bool);
bool is_unsigned(DType t);     // bool u8 u16 u32 u64
bool is_float8(DType t);

// The result dtype for an operation between two tensors of these dtypes (torch.promote_types), extended
// with NumPy's rules where PyTorch 2.11 refuses: mixing u16/u32/u64 with other integers promotes to the
// smallest signed type that holds both (u32 with i32 -> i64), and u64 with a signed type gives f64.
// Float8 types do not promote with anything but themselves (as in PyTorch): that throws kiln::Error.
DType promote_types(DType a, DType b);

// The default dtype of floating-point results and of creation ops without a dtype: f32.
inline constexpr DType kDefaultFloat = DType::F32;

// Maps a C++ type to its dtype, e.g. dtype_of<float>() == DType::F32.
template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::I16; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint32_t>() { return DType::U32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::U64; }
template <> constexpr DType dtype_of<Half>() { return DType::F16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<Complex64>() { return DType::C64; }
template <> constexpr DType dtype_of<Float8_e4m3fn>() { return DType::F8E4M3; }
template <> constexpr DType dtype_of<Float8_e5m2>() { return DType::F8E5M2; }

}  // namespace kiln
