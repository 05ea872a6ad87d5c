// CUDA launchers of comparisons, where and masked_fill (shared functors of ops/binary_functors.h).
//
// Instantiation count: Gt and Ge run as Lt and Le with the operands swapped (a > b is b < a exactly, NaN
// included), and a mixed (uint64, int64) Eq/Ne as (int64, uint64); where and masked_fill move bits, so
// they are instantiated per element size, not per dtype.
#include <cstring>

#include "core/dispatch.h"
#include "cuda/binary.h"
#include "cuda/elementwise.h"
#include "cuda/kernels/binary.cuh"

namespace kiln::cuda {

namespace {

using fn::CmpOp;

template <CmpOp Op>
void compare_as(const Tensor& out, const Tensor& a, const Tensor& b) {
  const fn::CompareFn<Op> f;
  // Mixed signedness arrives only as (int64, uint64) or (uint64, int64).
  if (a.dtype() == DType::I64 && b.dtype() == DType::U64) {
    launch_elementwise<bool, int64_t, uint64_t>(out, {&a, &b}, f, "comparison");
    return;
  }
  if (a.dtype() == DType::U64 && b.dtype() == DType::I64) {
    if constexpr (Op == CmpOp::Eq || Op == CmpOp::Ne) {
      launch_elementwise<bool, int64_t, uint64_t>(out, {&b, &a}, f, "comparison");
    } else {
      launch_elementwise<bool, uint64_t, int64_t>(out, {&a, &b}, f, "comparison");
    }
    return;
  }
  KILN_CHECK(a.dtype() == b.dtype(), "compare: operand dtypes differ (", a.meta(), ", ", b.meta(), ")");
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(a.dtype(), "comparison", [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_elementwise<bool, S, S>(out, {&a, &b}, WidenCompare<S, fn::CompareFn<Op>>{f}, "comparison");
  });
}

DType bits_dtype(size_t itemsize) {
  switch (itemsize) {
    case 1: return DType::U8;
    case 2: return DType::U16;
    case 4: return DType::U32;
    default: return DType::U64;
  }
}

constexpr DTypeSet kBitsTypes = dset(DType::U8, DType::U16, DType::U32, DType::U64);

}  // namespace

void compare(CmpOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (op) {
    case CmpOp::Eq: return compare_as<CmpOp::Eq>(out, a, b);
    case CmpOp::Ne: return compare_as<CmpOp::Ne>(out, a, b);
    case CmpOp::Lt: return compare_as<CmpOp::Lt>(out, a, b);
    case CmpOp::Le: return compare_as<CmpOp::Le>(out, a, b);
    case CmpOp::Gt: return compare_as<CmpOp::Lt>(out, b, a);
    case CmpOp::Ge: return compare_as<CmpOp::Le>(out, b, a);
  }
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  KILN_CHECK(out.itemsize() <= 8 && a.itemsize() == out.itemsize() && b.itemsize() == out.itemsize(),
             "where: unsupported element sizes (", out.meta(), ", ", a.meta(), ", ", b.meta(), ")");
  const DType bits = bits_dtype(out.itemsize());
  const Tensor o = out.view_as_dtype(bits), x = a.view_as_dtype(bits), y = b.view_as_dtype(bits);
  visit_dtypes<kBitsTypes>(bits, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<T, bool, T, T>(o, {&cond, &x, &y}, SelectBits<T>{}, "where");
  });
}

void masked_fill(const Tensor& self, const Tensor& mask, const void* value) {
  if (self.numel() == 0) return;
  KILN_CHECK(self.itemsize() <= 8, "masked_fill: unsupported element size of ", self.meta());
  const DType bits = bits_dtype(self.itemsize());
  const Tensor s = self.view_as_dtype(bits);
  visit_dtypes<kBitsTypes>(bits, "masked_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, value, sizeof(T));
    launch_elementwise<T, bool, T>(s, {&mask, &s}, MaskedFillBits<T>{v}, "masked_fill");
  });
}

}  // namespace kiln::cuda
