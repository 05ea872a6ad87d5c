// Comparisons (bool results), where, clamp and masked_fill_.
//
// Comparisons between integer operands compare exact mathematical values, also across signed and unsigned
// types and between an unsigned tensor and a negative Scalar (u32 4e9 > i32 -1, u64 2^63+1 > -1, u8 > -1
// are all true). PyTorch 2.11 refuses several of these mixes (uint16/32/64 promotion) or wraps the Scalar
// into the tensor's dtype (uint8 tensor > -1 is false there); kiln defines them exactly, as NumPy 2 does.
// Comparisons that involve a floating operand follow PyTorch's promotion (result_type).
#include <limits>

#include "core/copy.h"
#include "cpu/binary.h"
#include "ops/elementwise.h"

#if KILN_HAVE_CUDA
#include "cuda/binary.h"
#endif

namespace kiln {

namespace {

using fn::CmpOp;

Tensor run_compare(const char* op, CmpOp cmp, const Tensor& a, const Tensor& b, DType da, DType db) {
  check_same_device(op, {&a, &b});
  const Shape shape = broadcast_for(op, a.sizes(), b.sizes());
#if KILN_HAVE_CUDA
  if (a.is_cuda()) {
    Tensor out = empty(shape, DType::Bool, a.device());
    cuda::compare(cmp, out, a.to(da).expand(shape), b.to(db).expand(shape));
    return out;
  }
#else
  check_cpu_only(op, a);
#endif
  Tensor out = empty(shape, DType::Bool, a.device());
  cpu::compare(cmp, out, a.to(da).expand(shape), b.to(db).expand(shape));
  return out;
}

Tensor compare(const char* op, CmpOp cmp, const Tensor& a, const Tensor& b) {
  check_same_device(op, {&a, &b});
  const DType ta = a.dtype(), tb = b.dtype();
  if (is_integral(ta, true) && is_integral(tb, true)) {
    // promote_types gives an integer type holding both value ranges, except for u64 with a signed type:
    // that pair compares as (u64, i64) with an exact mixed-sign kernel.
    const DType p = promote_types(ta, tb);
    if (is_integral(p, true)) return run_compare(op, cmp, a, b, p, p);
    return run_compare(op, cmp, a, b, is_unsigned(ta) ? DType::U64 : DType::I64,
                       is_unsigned(tb) ? DType::U64 : DType::I64);
  }
  const DType p = result_type({a, b});
  return run_compare(op, cmp, a, b, p, p);
}

// Value range of an integer dtype as [lo, hi] (lo as int64, hi as uint64).
void int_range(DType t, int64_t& lo, uint64_t& hi) {
  switch (t) {
    case DType::Bool: lo = 0, hi = 1; return;
    case DType::U8: lo = 0, hi = UINT8_MAX; return;
    case DType::I8: lo = INT8_MIN, hi = INT8_MAX; return;
    case DType::I16: lo = INT16_MIN, hi = INT16_MAX; return;
    case DType::U16: lo = 0, hi = UINT16_MAX; return;
    case DType::I32: lo = INT32_MIN, hi = INT32_MAX; return;
    case DType::U32: lo = 0, hi = UINT32_MAX; return;
    case DType::I64: lo = INT64_MIN, hi = INT64_MAX; return;
    default: lo = 0, hi = UINT64_MAX; return;
  }
}

Tensor compare(const char* op, CmpOp cmp, const Tensor& a, const Scalar& b) {
  const DType ta = a.dtype();
  if (is_integral(ta, true) && b.is_integral()) {
    // Exact: a Scalar inside the tensor dtype's range compares in that dtype; outside it, every element is
    // on the same side of it.
    int64_t lo;
    uint64_t hi;
    int_range(ta, lo, hi);
    const bool neg = b.kind() == Scalar::Kind::Int && b.to_int64() < 0;
    const bool below = neg && b.to_int64() < lo;
    const bool above = !neg && b.to_uint64() > hi;
    if (below || above) {
#if !KILN_HAVE_CUDA
      check_cpu_only(op, a);
#endif
      // below: every element is greater than b; above: every element is less.
      bool v = false;
      switch (cmp) {
        case CmpOp::Eq: v = false; break;
        case CmpOp::Ne: v = true; break;
        case CmpOp::Lt:
        case CmpOp::Le: v = above; break;
        case CmpOp::Gt:
        case CmpOp::Ge: v = below; break;
      }
      return full(a.sizes(), v, DType::Bool, a.device());
    }
    return run_compare(op, cmp, a, scalar_operand(b, ta, a.device()), ta, ta);
  }
  const DType p = result_type({a}, {b});
  return run_compare(op, cmp, a, scalar_operand(b, p, a.device()), p, p);
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", CmpOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", CmpOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", CmpOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", CmpOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", CmpOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", CmpOp::Ge, a, b); }
Tensor eq(const Tensor& a, const Scalar& b) { return compare("eq", CmpOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Scalar& b) { return compare("ne", CmpOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Scalar& b) { return compare("lt", CmpOp::Lt, a, b); }
Tensor le(const Tensor& a, const Scalar& b) { return compare("le", CmpOp::Le, a, b); }
Tensor gt(const Tensor& a, const Scalar& b) { return compare("gt", CmpOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Scalar& b) { return compare("ge", CmpOp::Ge, a, b); }

// ---- where --------------------------------------------------------------------------------------------

namespace {
Tensor where_impl(const Tensor& cond, const Tensor& a, const Tensor& b, DType t) {
  check_same_device("where", {&cond, &a, &b});
  KILN_CHECK(cond.dtype() == DType::Bool, "where: expected condition to be a bool tensor, but got ", cond.meta());
  const Shape shape = broadcast_for("where", broadcast_for("where", cond.sizes(), a.sizes()), b.sizes());
#if KILN_HAVE_CUDA
  if (a.is_cuda()) {
    Tensor out = empty(shape, t, a.device());
    cuda::where(out, cond.expand(shape), a.to(t).expand(shape), b.to(t).expand(shape));
    return out;
  }
#else
  check_cpu_only("where", cond);
#endif
  Tensor out = empty(shape, t, a.device());
  cpu::where(out, cond.expand(shape), a.to(t).expand(shape), b.to(t).expand(shape));
  return out;
}
}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return where_impl(cond, a, b, result_type({a, b}));
}
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b) {
  const DType t = result_type({a}, {b});
  return where_impl(cond, a, scalar_operand(b, t, a.device()), t);
}

// ---- clamp --------------------------------------------------------------------------------------------
// min(max(x, lo), hi) with NaN propagating from x and from the bounds; lo > hi gives hi, as in PyTorch.

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  KILN_CHECK(min || max, "clamp: at least one of min or max must be given (input ", x.meta(), ")");
  std::vector<Scalar> bounds;
  if (min) bounds.push_back(*min);
  if (max) bounds.push_back(*max);
  const DType t = result_type({x}, bounds);
#if !KILN_HAVE_CUDA
  check_cpu_only("clamp", x);
#endif
  Tensor r = x.to(t);
  if (min) r = maximum(r, scalar_operand(*min, t, x.device()));
  if (max) r = minimum(r, scalar_operand(*max, t, x.device()));
  if (r.is_alias_of(x)) r = r.clone();  // never hand back the input itself
  return r;
}

Tensor clamp(const Tensor& x, const std::optional<Tensor>& min, const std::optional<Tensor>& max) {
  KILN_CHECK((min && min->defined()) || (max && max->defined()),
             "clamp: at least one of min or max must be given (input ", x.meta(), ")");
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  std::vector<Tensor> ts{x};
  if (has_min) ts.push_back(*min);
  if (has_max) ts.push_back(*max);
  for (const Tensor& t : ts) check_same_device("clamp", {&x, &t});
  const DType t = result_type(ts);
  Tensor r = x.to(t);
  if (has_min) r = maximum(r, min->to(t));
  if (has_max) r = minimum(r, max->to(t));
  return r;
}

Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max) {
  Tensor r = clamp(self, min, max);
  KILN_CHECK(can_cast(r.dtype(), self.dtype()), "clamp_: result type ", dtype_name(r.dtype()),
             " can't be cast to the desired output type ", dtype_name(self.dtype()), " (self ", self.meta(), ")");
  self.copy_(r);
  return self;
}

// ---- masked_fill_ -------------------------------------------------------------------------------------

Tensor& masked_fill_(Tensor& self, const Tensor& mask, const Scalar& value) {
  check_same_device("masked_fill_", {&self, &mask});
  KILN_CHECK(mask.dtype() == DType::Bool, "masked_fill_: only bool masks are supported, but got mask ",
             mask.meta());
  const Shape shape = broadcast_for("masked_fill_", self.sizes(), mask.sizes());
  KILN_CHECK(shape == self.sizes(), "masked_fill_: mask ", mask.meta(), " does not broadcast to self ",
             self.meta(), " (broadcast shape ", shape, ")");
  // The value converted on the host (a CPU 0-d tensor), as the CPU kernel converts it.
  const Tensor v = scalar_operand(value, self.dtype(), kCPU);
  note_write(self);
#if KILN_HAVE_CUDA
  if (self.is_cuda()) {
    cuda::masked_fill(self, mask.expand(shape), v.data_ptr());
    return self;
  }
#else
  check_cpu_only("masked_fill_", self);
#endif
  cpu::masked_fill(self, mask.expand(shape), v);
  return self;
}

}  // namespace kiln
