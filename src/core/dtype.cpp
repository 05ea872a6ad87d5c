#include "kiln/dtype.h"

#include <string>

#include "core/dispatch.h"
#include "kiln/error.h"

namespace kiln {

namespace {
struct DTypeInfo {
  const char* name;
  const char* short_name;
  size_t size;
};
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"bool", "bool", 1},   {"uint8", "u8", 1},     {"int8", "i8", 1},      {"int16", "i16", 2},
    {"uint16", "u16", 2},  {"int32", "i32", 4},    {"uint32", "u32", 4},   {"int64", "i64", 8},
    {"uint64", "u64", 8},  {"float16", "f16", 2},  {"bfloat16", "bf16", 2}, {"float32", "f32", 4},
    {"float64", "f64", 8}, {"complex64", "c64", 8}, {"float8_e4m3fn", "f8e4m3", 1},
    {"float8_e5m2", "f8e5m2", 1},
};
const DTypeInfo& info(DType t) {
  const auto i = static_cast<unsigned>(t);
  KILN_CHECK(i < kNumDTypes, "invalid dtype value ", i);
  return kInfo[i];
}
}  // namespace

const char* dtype_name(DType t) { return info(t).name; }
size_t itemsize(DType t) { return info(t).size; }

DType parse_dtype(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == kInfo[i].name || name == kInfo[i].short_name) return static_cast<DType>(i);
  }
  struct Alias {
    const char* name;
    DType t;
  };
  static constexpr Alias kAliases[] = {
      {"half", DType::F16},        {"float", DType::F32},         {"double", DType::F64},
      {"int", DType::I32},         {"long", DType::I64},          {"short", DType::I16},
      {"fp8_e4m3", DType::F8E4M3}, {"fp8_e5m2", DType::F8E5M2},   {"e4m3", DType::F8E4M3},
      {"e5m2", DType::F8E5M2},     {"float8_e4m3", DType::F8E4M3}, {"cfloat", DType::C64},
  };
  for (const auto& a : kAliases)
    if (name == a.name) return a.t;
  throw Error(str("unknown dtype '", std::string(name),
                  "'; expected one of bool, uint8, int8, int16, uint16, int32, uint32, int64, uint64, float16, "
                  "bfloat16, float32, float64, complex64, float8_e4m3fn, float8_e5m2"));
}

bool is_float8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }
bool is_floating(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64 || is_float8(t);
}
bool is_complex(DType t) { return t == DType::C64; }
bool is_unsigned(DType t) {
  return t == DType::Bool || t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64;
}
bool is_integral(DType t, bool include_bool) {
  if (t == DType::Bool) return include_bool;
  return !is_floating(t) && !is_complex(t);
}

namespace {
int int_bits(DType t) { return static_cast<int>(itemsize(t)) * 8; }
DType signed_int_of_bits(int bits) {
  switch (bits) {
    case 8: return DType::I8;
    case 16: return DType::I16;
    case 32: return DType::I32;
    default: return DType::I64;
  }
}
DType unsigned_int_of_bits(int bits) {
  switch (bits) {
    case 8: return DType::U8;
    case 16: return DType::U16;
    case 32: return DType::U32;
    default: return DType::U64;
  }
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_float8(a) || is_float8(b))
    throw Error(str("promote_types: float8 types do not promote with other types (", dtype_name(a), " and ",
                    dtype_name(b), "); convert one operand explicitly"));
  if (is_complex(a) || is_complex(b)) {
    const DType other = is_complex(a) ? b : a;
    KILN_CHECK(other != DType::F64, "promote_types: complex64 with float64 would need complex128, which kiln ",
               "does not support");
    return DType::C64;
  }
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16)) return DType::F32;
    return itemsize(a) >= itemsize(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integers.
  const bool ua = is_unsigned(a), ub = is_unsigned(b);
  if (ua == ub) {
    const int bits = std::max(int_bits(a), int_bits(b));
    return ua ? unsigned_int_of_bits(bits) : signed_int_of_bits(bits);
  }
  const int ubits = ua ? int_bits(a) : int_bits(b);
  const int sbits = ua ? int_bits(b) : int_bits(a);
  if (sbits > ubits) return signed_int_of_bits(sbits);
  if (ubits == 64) return DType::F64;  // NumPy's rule: no integer type holds both u64 and i64
  return signed_int_of_bits(ubits * 2);
}

[[noreturn]] void throw_unsupported_dtype(const char* op, DType t, const char* supported) {
  throw Error(str(op, ": dtype ", dtype_name(t), " is not supported; supported: ", supported));
}

const char* dtype_set_str(DTypeSet s) {
  // Built once per distinct set; the strings live for the program.
  static thread_local std::string buf;
  buf.clear();
  for (int i = 0; i < kNumDTypes; ++i) {
    if (s & (1u << i)) {
      if (!buf.empty()) buf += ", ";
      buf += kInfo[i].name;
    }
  }
  return buf.c_str();
}

}  // namespace kiln
