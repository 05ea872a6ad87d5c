// CPU kernels of comparisons, where and masked_fill.
#include "core/dispatch.h"
#include "cpu/binary.h"
#include "cpu/loops.h"

namespace kiln::cpu {

namespace {

template <fn::CmpOp Op>
void compare_as(const Tensor& out, const Tensor& a, const Tensor& b) {
  const fn::CompareFn<Op> f;
  // Mixed signedness arrives only as (int64, uint64) or (uint64, int64).
  if (a.dtype() == DType::I64 && b.dtype() == DType::U64) {
    binary_kernel<bool, int64_t, uint64_t>(out, a, b, f);
    return;
  }
  if (a.dtype() == DType::U64 && b.dtype() == DType::I64) {
    binary_kernel<bool, uint64_t, int64_t>(out, a, b, f);
    return;
  }
  KILN_CHECK(a.dtype() == b.dtype(), "compare: operand dtypes differ (", a.meta(), ", ", b.meta(), ")");
  visit_dtypes<kFloatTypes | kIntTypes | kBoolType>(a.dtype(), "comparison", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using M = opmath_t<S>;
    binary_kernel<bool, S, S>(out, a, b, [f](S x, S y) { return f(static_cast<M>(x), static_cast<M>(y)); });
  });
}

}  // namespace

void compare(fn::CmpOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (op) {
    case fn::CmpOp::Eq: return compare_as<fn::CmpOp::Eq>(out, a, b);
    case fn::CmpOp::Ne: return compare_as<fn::CmpOp::Ne>(out, a, b);
    case fn::CmpOp::Lt: return compare_as<fn::CmpOp::Lt>(out, a, b);
    case fn::CmpOp::Le: return compare_as<fn::CmpOp::Le>(out, a, b);
    case fn::CmpOp::Gt: return compare_as<fn::CmpOp::Gt>(out, a, b);
    case fn::CmpOp::Ge: return compare_as<fn::CmpOp::Ge>(out, a, b);
  }
}

// Selection moves bits only, so it is instantiated per element size, not per dtype.
template <class Bits>
void where_bits(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  ternary_kernel<Bits, bool, Bits, Bits>(out, cond, a, b, [](bool c, Bits x, Bits y) { return c ? x : y; });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (out.itemsize()) {
    case 1: return where_bits<uint8_t>(out, cond, a, b);
    case 2: return where_bits<uint16_t>(out, cond, a, b);
    case 4: return where_bits<uint32_t>(out, cond, a, b);
    case 8: return where_bits<uint64_t>(out, cond, a, b);
    default: throw Error(str("where: unsupported element size ", out.itemsize()));
  }
}

template <class Bits>
void masked_fill_bits(const Tensor& self, const Tensor& mask, Bits v) {
  StridedLoop<2> loop(self.sizes(), {&self, &mask});
  loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
    for (int64_t i = 0; i < n; ++i)
      if (*reinterpret_cast<const bool*>(p[1] + i * s[1])) *reinterpret_cast<Bits*>(p[0] + i * s[0]) = v;
  });
}

void masked_fill(const Tensor& self, const Tensor& mask, const Tensor& value) {
  if (self.numel() == 0) return;
  switch (self.itemsize()) {
    case 1: return masked_fill_bits(self, mask, *static_cast<const uint8_t*>(value.data_ptr()));
    case 2: return masked_fill_bits(self, mask, *static_cast<const uint16_t*>(value.data_ptr()));
    case 4: return masked_fill_bits(self, mask, *static_cast<const uint32_t*>(value.data_ptr()));
    case 8: return masked_fill_bits(self, mask, *static_cast<const uint64_t*>(value.data_ptr()));
    default: throw Error(str("masked_fill_: unsupported element size ", self.itemsize()));
  }
}

}  // namespace kiln::cpu
