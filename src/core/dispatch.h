// The one place where a runtime dtype becomes a C++ type: visit_* call a generic lambda with a TypeTag.
//   visit_dtype(t, "op", [&](auto tag) { using T = typename decltype(tag)::type; ... });
// The restricted visitors instantiate the lambda only for the dtypes an op supports, which keeps the
// build small, and throw a kiln::Error naming the op and the dtype for the rest.
#pragma once

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

template <class T>
struct TypeTag {
  using type = T;
};

[[noreturn]] void throw_unsupported_dtype(const char* op, DType t, const char* supported);

// Which dtypes a visitor accepts, as a bit set over DType values.
using DTypeSet = uint32_t;
constexpr DTypeSet dset(DType t) { return 1u << static_cast<unsigned>(t); }
template <class... D>
constexpr DTypeSet dset(DType t, D... rest) { return dset(t) | dset(rest...); }

inline constexpr DTypeSet kFloatTypes = dset(DType::F16, DType::BF16, DType::F32, DType::F64);
inline constexpr DTypeSet kIntTypes = dset(DType::U8, DType::I8, DType::I16, DType::U16, DType::I32, DType::U32,
                                           DType::I64, DType::U64);
inline constexpr DTypeSet kFloat8Types = dset(DType::F8E4M3, DType::F8E5M2);
inline constexpr DTypeSet kBoolType = dset(DType::Bool);
inline constexpr DTypeSet kComplexTypes = dset(DType::C64);
inline constexpr DTypeSet kAllTypes = kFloatTypes | kIntTypes | kFloat8Types | kBoolType | kComplexTypes;

const char* dtype_set_str(DTypeSet s);

template <DTypeSet Allowed, class F>
decltype(auto) visit_dtypes(DType t, const char* op, F&& f) {
#define KILN_VISIT_CASE(D, T)                                    \
  case DType::D:                                                 \
    if constexpr ((Allowed & dset(DType::D)) != 0) return f(TypeTag<T>{}); \
    break;
  switch (t) {
    KILN_VISIT_CASE(Bool, bool)
    KILN_VISIT_CASE(U8, uint8_t)
    KILN_VISIT_CASE(I8, int8_t)
    KILN_VISIT_CASE(I16, int16_t)
    KILN_VISIT_CASE(U16, uint16_t)
    KILN_VISIT_CASE(I32, int32_t)
    KILN_VISIT_CASE(U32, uint32_t)
    KILN_VISIT_CASE(I64, int64_t)
    KILN_VISIT_CASE(U64, uint64_t)
    KILN_VISIT_CASE(F16, Half)
    KILN_VISIT_CASE(BF16, BFloat16)
    KILN_VISIT_CASE(F32, float)
    KILN_VISIT_CASE(F64, double)
    KILN_VISIT_CASE(C64, Complex64)
    KILN_VISIT_CASE(F8E4M3, Float8_e4m3fn)
    KILN_VISIT_CASE(F8E5M2, Float8_e5m2)
  }
#undef KILN_VISIT_CASE
  throw_unsupported_dtype(op, t, dtype_set_str(Allowed));
}

template <class F>
decltype(auto) visit_dtype(DType t, const char* op, F&& f) {
  return visit_dtypes<kAllTypes>(t, op, static_cast<F&&>(f));
}

}  // namespace kiln
