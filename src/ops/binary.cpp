// Binary arithmetic ops: argument checks, type promotion (result_type), output allocation, in-place and
// out= forms, operators. Kernels: src/cpu/binary.cpp; per-element math: ops/binary_functors.h.
#include "core/copy.h"
#include "cpu/binary.h"
#include "ops/elementwise.h"

#if KILN_HAVE_CUDA
#include "cuda/binary.h"
#endif

namespace kiln {

namespace {

using cpu::BinaryOp;

bool is_int_division(BinaryOp op) {
  return op == BinaryOp::DivTrunc || op == BinaryOp::DivFloor || op == BinaryOp::Fmod ||
         op == BinaryOp::Remainder;
}

// An operand that shares memory with the destination is safe only when it is the very same view (each
// element is read before it is written); anything else is computed into a temporary first.
bool safe_to_write_into(const Tensor& dst, const Tensor& src) {
  if (!src.is_alias_of(dst)) return true;
  return src.data_ptr() == dst.data_ptr() && src.strides() == dst.strides() && src.sizes() == dst.sizes();
}

// The destination of an in-place (inplace = true) or out= op. In place, self keeps its shape; out= is
// replaced by a fresh tensor of the result's shape when its shape differs.
void prepare_dst(const char* op, Tensor& dst, const Shape& shape, DType result, bool inplace) {
  KILN_CHECK(can_cast(result, dst.dtype()), op, ": result type ", dtype_name(result),
             " can't be cast to the desired output type ", dtype_name(dst.dtype()), " (output ", dst.meta(), ")");
  if (dst.sizes() != shape) {
    KILN_CHECK(!inplace, op, ": output with shape ", dst.sizes(), " doesn't match the broadcast shape ", shape);
    dst = empty(shape, dst.dtype(), dst.device());
  }
  for (int64_t d = 0; d < dst.dim(); ++d)
    KILN_CHECK(dst.strides()[d] != 0 || dst.sizes()[d] <= 1, op, ": unsupported operation: more than one element "
               "of the written-to tensor ", dst.meta(), " refers to a single memory location (an expanded view)");
  note_write(dst);
}

// The kernel of out's device.
void binary_on_device(BinaryOp kind, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::binary(kind, out, a, b, alpha);
    return;
  }
#endif
  cpu::binary(kind, out, a, b, alpha);
}

// The common path of every binary op: a and b converted to `compute`, the result of dtype `result` (compute,
// or bool for the logical ops), written into *dst when given.
Tensor run_binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b, DType compute, DType result,
                  const Scalar& alpha = 1, Tensor* dst = nullptr, bool inplace = false) {
  if (dst) check_same_device(op, {dst, &a, &b});
  else check_same_device(op, {&a, &b});
  const Shape shape = broadcast_for(op, a.sizes(), b.sizes());
  if (dst) prepare_dst(op, *dst, shape, result, inplace);
#if !KILN_HAVE_CUDA
  check_cpu_only(op, a);
#endif
  Tensor ac = a.to(compute), bc = b.to(compute);
  // On CUDA the kernel reports a zero divisor itself (raised at the next synchronisation): scanning the
  // divisor here would read device memory on the host.
  if (a.is_cpu() && is_int_division(kind) && is_integral(compute, true))
    KILN_CHECK(!cpu::any_zero(bc), op, ": ZeroDivisionError (integer division by zero; divisor ", b.meta(), ")");
  ac = ac.expand(shape);
  bc = bc.expand(shape);
  if (dst && dst->dtype() == result && safe_to_write_into(*dst, ac) && safe_to_write_into(*dst, bc)) {
    binary_on_device(kind, *dst, ac, bc, alpha);
    return *dst;
  }
  Tensor out = empty(shape, result, a.device());
  binary_on_device(kind, out, ac, bc, alpha);
  if (dst) {
    dst->copy_(out);
    return *dst;
  }
  return out;
}

Tensor run_same(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b) {
  const DType t = result_type({a, b});
  return run_binary(op, kind, a, b, t, t);
}

// As run_same, for a Scalar second operand (a wrapped number).
Tensor run_same(const char* op, BinaryOp kind, const Tensor& a, const Scalar& b) {
  const DType t = result_type({a}, {b});
  return run_binary(op, kind, a, scalar_operand(b, t, a.device()), t, t);
}

// Integers and bool divide in the default float dtype.
DType true_div_dtype(DType t) { return is_integral(t, true) ? kDefaultFloat : t; }

void check_alpha(const char* op, DType result, const Scalar& alpha) {
  KILN_CHECK(!(alpha.kind() == Scalar::Kind::Bool && result != DType::Bool), op,
             ": boolean alpha only supported for boolean results (result dtype ", dtype_name(result), ")");
  KILN_CHECK(!(alpha.is_floating() && is_integral(result, true)), op, ": for integral input tensors (result dtype ",
             dtype_name(result), "), argument alpha must not be a floating point number (got ", alpha.str(), ")");
  KILN_CHECK(alpha.kind() != Scalar::Kind::Complex || is_complex(result), op,
             ": complex alpha needs a complex result");
}

Scalar negated(const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Float: return Scalar(-s.to_double());
    case Scalar::Kind::Complex: {
      const Complex64 c = s.to_complex();
      return Scalar(Complex64(-c.re, -c.im));
    }
    // Modular negation: exact for int64 and what unsigned dtypes compute anyway.
    default: return Scalar(static_cast<long long>(0ull - s.to_uint64()));
  }
}

void check_sub(DType a, DType b) {
  KILN_CHECK(!(a == DType::Bool && b == DType::Bool),
             "sub: subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
             "`logical_xor()` operator instead.");
  KILN_CHECK(a != DType::Bool && b != DType::Bool,
             "sub: subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
             "invert a mask, use the `~` or `logical_not()` operator instead.");
}

BinaryOp rounding_op(const char* op, std::optional<std::string_view> mode) {
  if (!mode) return BinaryOp::Div;
  if (*mode == "trunc") return BinaryOp::DivTrunc;
  if (*mode == "floor") return BinaryOp::DivFloor;
  throw Error(str(op, ": expected rounding_mode to be one of none, \"trunc\" or \"floor\", but got \"",
                  std::string(*mode), "\""));
}

Tensor div_impl(const Tensor& a, const Tensor& b, DType t, BinaryOp kind, Tensor* dst = nullptr,
                bool inplace = false, const char* op = "div") {
  const DType compute = kind == BinaryOp::Div ? true_div_dtype(t) : t;
  return run_binary(op, kind, a, b, compute, compute, 1, dst, inplace);
}

}  // namespace

// ---- add / sub / mul / div ----------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  const DType t = result_type({a, b});
  check_alpha("add", t, alpha);
  return run_binary("add", BinaryOp::Add, a, b, t, t, alpha);
}
Tensor add(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  const DType t = result_type({a}, {b});
  check_alpha("add", t, alpha);
  return run_binary("add", BinaryOp::Add, a, scalar_operand(b, t, a.device()), t, t, alpha);
}
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  check_sub(a.dtype(), b.dtype());
  const DType t = result_type({a, b});
  check_alpha("sub", t, alpha);
  return run_binary("sub", BinaryOp::Add, a, b, t, t, negated(alpha));
}
Tensor sub(const Tensor& a, const Scalar& b, const Scalar& alpha) {
  check_sub(a.dtype(), b.kind() == Scalar::Kind::Bool ? DType::Bool : DType::I64);
  const DType t = result_type({a}, {b});
  check_alpha("sub", t, alpha);
  return run_binary("sub", BinaryOp::Add, a, scalar_operand(b, t, a.device()), t, t, negated(alpha));
}
Tensor mul(const Tensor& a, const Tensor& b) { return run_same("mul", BinaryOp::Mul, a, b); }
Tensor mul(const Tensor& a, const Scalar& b) { return run_same("mul", BinaryOp::Mul, a, b); }

Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode) {
  const BinaryOp kind = rounding_op("div", rounding_mode);
  return div_impl(a, b, result_type({a, b}), kind);
}
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode) {
  const BinaryOp kind = rounding_op("div", rounding_mode);
  const DType t = result_type({a}, {b});
  const DType compute = kind == BinaryOp::Div ? true_div_dtype(t) : t;
  return div_impl(a, scalar_operand(b, compute, a.device()), t, kind);
}

// ---- pow, maximum/minimum, fmod/remainder, atan2, heaviside ---------------------------------------------

Tensor pow(const Tensor& a, const Tensor& b) { return run_same("pow", BinaryOp::Pow, a, b); }
Tensor pow(const Tensor& a, const Scalar& b) {
  KILN_CHECK(!(is_integral(a.dtype(), true) && b.is_integral() && b.kind() == Scalar::Kind::Int && b.to_int64() < 0),
             "pow: integers to negative integer powers are not allowed (", a.meta(), " ** ", b.str(), ")");
  return run_same("pow", BinaryOp::Pow, a, b);
}
Tensor pow(const Scalar& a, const Tensor& b) {
  const DType t = result_type({b}, {a});
  return run_binary("pow", BinaryOp::Pow, scalar_operand(a, t, b.device()), b, t, t);
}
Tensor maximum(const Tensor& a, const Tensor& b) { return run_same("maximum", BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return run_same("minimum", BinaryOp::Minimum, a, b); }
Tensor fmod(const Tensor& a, const Tensor& b) { return run_same("fmod", BinaryOp::Fmod, a, b); }
Tensor fmod(const Tensor& a, const Scalar& b) { return run_same("fmod", BinaryOp::Fmod, a, b); }
Tensor remainder(const Tensor& a, const Tensor& b) { return run_same("remainder", BinaryOp::Remainder, a, b); }
Tensor remainder(const Tensor& a, const Scalar& b) { return run_same("remainder", BinaryOp::Remainder, a, b); }
Tensor atan2(const Tensor& a, const Tensor& b) {
  const DType t = true_div_dtype(result_type({a, b}));
  return run_binary("atan2", BinaryOp::Atan2, a, b, t, t);
}
Tensor heaviside(const Tensor& x, const Tensor& values) {
  // As in PyTorch, which does not promote here.
  KILN_CHECK(x.dtype() == values.dtype(), "heaviside: input and values must have the same dtype, got ",
             x.meta(), " and ", values.meta());
  return run_same("heaviside", BinaryOp::Heaviside, x, values);
}

// ---- bitwise and logical ------------------------------------------------------------------------------

Tensor bitwise_and(const Tensor& a, const Tensor& b) { return run_same("bitwise_and", BinaryOp::BitAnd, a, b); }
Tensor bitwise_or(const Tensor& a, const Tensor& b) { return run_same("bitwise_or", BinaryOp::BitOr, a, b); }
Tensor bitwise_xor(const Tensor& a, const Tensor& b) { return run_same("bitwise_xor", BinaryOp::BitXor, a, b); }
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b) {
  return run_same("bitwise_left_shift", BinaryOp::ShiftLeft, a, b);
}
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b) {
  return run_same("bitwise_right_shift", BinaryOp::ShiftRight, a, b);
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return run_binary("logical_and", BinaryOp::LogicalAnd, a, b, DType::Bool, DType::Bool);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return run_binary("logical_or", BinaryOp::LogicalOr, a, b, DType::Bool, DType::Bool);
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return run_binary("logical_xor", BinaryOp::LogicalXor, a, b, DType::Bool, DType::Bool);
}

// ---- in place and out= --------------------------------------------------------------------------------

Tensor& add_(Tensor& self, const Tensor& other, const Scalar& alpha) {
  const DType t = result_type({self, other});
  check_alpha("add_", t, alpha);
  run_binary("add_", BinaryOp::Add, self, other, t, t, alpha, &self, true);
  return self;
}
Tensor& add_(Tensor& self, const Scalar& other, const Scalar& alpha) {
  const DType t = result_type({self}, {other});
  check_alpha("add_", t, alpha);
  run_binary("add_", BinaryOp::Add, self, scalar_operand(other, t, self.device()), t, t, alpha, &self, true);
  return self;
}
Tensor& sub_(Tensor& self, const Tensor& other, const Scalar& alpha) {
  check_sub(self.dtype(), other.dtype());
  const DType t = result_type({self, other});
  check_alpha("sub_", t, alpha);
  run_binary("sub_", BinaryOp::Add, self, other, t, t, negated(alpha), &self, true);
  return self;
}
Tensor& mul_(Tensor& self, const Tensor& other) {
  const DType t = result_type({self, other});
  run_binary("mul_", BinaryOp::Mul, self, other, t, t, 1, &self, true);
  return self;
}
Tensor& mul_(Tensor& self, const Scalar& other) {
  const DType t = result_type({self}, {other});
  run_binary("mul_", BinaryOp::Mul, self, scalar_operand(other, t, self.device()), t, t, 1, &self, true);
  return self;
}
Tensor& div_(Tensor& self, const Tensor& other) {
  div_impl(self, other, result_type({self, other}), BinaryOp::Div, &self, true, "div_");
  return self;
}
Tensor& div_(Tensor& self, const Scalar& other) {
  const DType t = true_div_dtype(result_type({self}, {other}));
  div_impl(self, scalar_operand(other, t, self.device()), t, BinaryOp::Div, &self, true, "div_");
  return self;
}
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  const DType t = result_type({a, b});
  check_alpha("add_out", t, alpha);
  run_binary("add_out", BinaryOp::Add, a, b, t, t, alpha, &out, false);
  return out;
}
Tensor& sub_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  check_sub(a.dtype(), b.dtype());
  const DType t = result_type({a, b});
  check_alpha("sub_out", t, alpha);
  run_binary("sub_out", BinaryOp::Add, a, b, t, t, negated(alpha), &out, false);
  return out;
}
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b) {
  const DType t = result_type({a, b});
  run_binary("mul_out", BinaryOp::Mul, a, b, t, t, 1, &out, false);
  return out;
}
Tensor& div_out(Tensor& out, const Tensor& a, const Tensor& b) {
  div_impl(a, b, result_type({a, b}), BinaryOp::Div, &out, false, "div_out");
  return out;
}

// ---- operators ----------------------------------------------------------------------------------------

Tensor operator-(const Tensor& a) {
  KILN_CHECK(a.dtype() != DType::Bool, "neg: negation, the `-` operator, on a bool tensor is not supported. If "
             "you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  // Multiplying by -1 negates exactly (also -0.0 and, modularly, unsigned and integer minimums).
  return mul(a, Scalar(-1));
}
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }

}  // namespace kiln
