// Unary elementwise ops: dtype rules (as PyTorch), output allocation, in-place and out= forms. The
// per-element math is in src/ops/unary_functors.h, the CPU loops in src/cpu/unary.cpp.
#include <string>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/unary.h"
#include "kiln/ops.h"

#if KILN_HAVE_CUDA
#include "cuda/unary.h"
#endif

namespace kiln {
namespace {

using cpu::UnaryOp;

// How the result dtype follows from the input dtype.
enum class Rule {
  Same,         // the input's dtype
  FloatForInt,  // bool and integers compute in, and return, the default float dtype
  Abs,          // complex64 -> float32, else the input's
  Square,       // bool -> int64 (PyTorch computes pow(x, 2)), else the input's
  IntIdentity,  // floor/ceil/trunc/round: integers come back unchanged, floats round
  Bool,         // predicates
};

struct OpDesc {
  UnaryOp op;
  const char* name;
  DTypeSet supported;
  Rule rule;
};

constexpr DTypeSet kReal = kFloatTypes | kIntTypes | kBoolType;
constexpr DTypeSet kNumeric = kFloatTypes | kIntTypes;  // no bool

constexpr OpDesc kNeg{UnaryOp::Neg, "neg", kNumeric | kComplexTypes, Rule::Same};
constexpr OpDesc kAbs{UnaryOp::Abs, "abs", kNumeric | kComplexTypes, Rule::Abs};
constexpr OpDesc kSquare{UnaryOp::Square, "square", kReal | kComplexTypes, Rule::Square};
constexpr OpDesc kSign{UnaryOp::Sign, "sign", kReal, Rule::Same};
constexpr OpDesc kRelu{UnaryOp::Relu, "relu", kNumeric, Rule::Same};
constexpr OpDesc kExp{UnaryOp::Exp, "exp", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kExp2{UnaryOp::Exp2, "exp2", kReal, Rule::FloatForInt};
constexpr OpDesc kExpm1{UnaryOp::Expm1, "expm1", kReal, Rule::FloatForInt};
constexpr OpDesc kLog{UnaryOp::Log, "log", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kLog2{UnaryOp::Log2, "log2", kReal, Rule::FloatForInt};
constexpr OpDesc kLog10{UnaryOp::Log10, "log10", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kLog1p{UnaryOp::Log1p, "log1p", kReal, Rule::FloatForInt};
constexpr OpDesc kSqrt{UnaryOp::Sqrt, "sqrt", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kRsqrt{UnaryOp::Rsqrt, "rsqrt", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kReciprocal{UnaryOp::Reciprocal, "reciprocal", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kSin{UnaryOp::Sin, "sin", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kCos{UnaryOp::Cos, "cos", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kTan{UnaryOp::Tan, "tan", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kAsin{UnaryOp::Asin, "asin", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kAcos{UnaryOp::Acos, "acos", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kAtan{UnaryOp::Atan, "atan", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kSinh{UnaryOp::Sinh, "sinh", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kCosh{UnaryOp::Cosh, "cosh", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kTanh{UnaryOp::Tanh, "tanh", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kSigmoid{UnaryOp::Sigmoid, "sigmoid", kReal | kComplexTypes, Rule::FloatForInt};
constexpr OpDesc kErf{UnaryOp::Erf, "erf", kReal, Rule::FloatForInt};
// PyTorch has no integer kernels for silu and gelu (it does not promote them): neither does kiln.
constexpr OpDesc kSilu{UnaryOp::Silu, "silu", kFloatTypes, Rule::Same};
constexpr OpDesc kGeluErf{UnaryOp::GeluErf, "gelu", kFloatTypes, Rule::Same};
constexpr OpDesc kGeluTanh{UnaryOp::GeluTanh, "gelu", kFloatTypes, Rule::Same};
constexpr OpDesc kFloor{UnaryOp::Floor, "floor", kNumeric, Rule::IntIdentity};
constexpr OpDesc kCeil{UnaryOp::Ceil, "ceil", kNumeric, Rule::IntIdentity};
constexpr OpDesc kTrunc{UnaryOp::Trunc, "trunc", kNumeric, Rule::IntIdentity};
constexpr OpDesc kRound{UnaryOp::Round, "round", kNumeric, Rule::IntIdentity};
constexpr OpDesc kRoundDecimals{UnaryOp::RoundDecimals, "round", kFloatTypes, Rule::Same};
constexpr OpDesc kSignbit{UnaryOp::Signbit, "signbit", kReal, Rule::Bool};
constexpr OpDesc kIsNan{UnaryOp::IsNan, "isnan", kReal | kComplexTypes, Rule::Bool};
constexpr OpDesc kIsInf{UnaryOp::IsInf, "isinf", kReal | kComplexTypes, Rule::Bool};
constexpr OpDesc kIsFinite{UnaryOp::IsFinite, "isfinite", kReal | kComplexTypes, Rule::Bool};
constexpr OpDesc kLogicalNot{UnaryOp::LogicalNot, "logical_not", kReal | kComplexTypes, Rule::Bool};
constexpr OpDesc kBitwiseNot{UnaryOp::BitwiseNot, "bitwise_not", kIntTypes | kBoolType, Rule::Same};

// Both backends take every op here; a build without the CUDA backend says so for a CUDA tensor.
void check_backend(const Tensor& x, const std::string& name) {
#if !KILN_HAVE_CUDA
  KILN_CHECK(!x.is_cuda(), name, ": no CUDA implementation yet (input ", x.meta(), ")");
#else
  (void)x;
  (void)name;
#endif
}

// The kernels of out's device: out and in live on one device (the op allocated out there).
void run_unary(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals = 0) {
#if KILN_HAVE_CUDA
  if (out.is_cuda()) return cuda::unary(op, out, in, decimals);
#endif
  cpu::unary(op, out, in, decimals);
}

// Throws for dtypes the op does not support, with what would be valid.
void check_dtype(const OpDesc& d, DType t, const std::string& name) {
  KILN_CHECK(!is_float8(t), name, ": ", dtype_name(t),
             " inputs are not supported (as in PyTorch); convert first, e.g. x.to(DType::F32)");
  if (d.op == UnaryOp::Neg && t == DType::Bool)
    throw Error(str(name, ": negation of a bool tensor is not supported; use logical_not (or bitwise_not) "
                          "to invert a mask"));
  if ((d.supported & dset(t)) == 0)
    throw Error(str(name, ": dtype ", dtype_name(t), " is not supported; supported: ",
                    dtype_set_str(d.supported)));
}

DType result_dtype(const OpDesc& d, DType t) {
  switch (d.rule) {
    case Rule::FloatForInt: return is_integral(t, true) ? kDefaultFloat : t;
    case Rule::Abs: return t == DType::C64 ? DType::F32 : t;
    case Rule::Square: return t == DType::Bool ? DType::I64 : t;
    case Rule::Bool: return DType::Bool;
    default: return t;
  }
}

// The dtype the kernel reads: the result's for converted inputs (int -> f32, bool -> i64), else x's.
DType compute_dtype(const OpDesc& d, DType t) {
  if (d.rule == Rule::FloatForInt || d.rule == Rule::Square) return result_dtype(d, t);
  return t;
}

Tensor apply(const OpDesc& d, const Tensor& x, int64_t decimals = 0) {
  check_backend(x, d.name);
  check_dtype(d, x.dtype(), d.name);
  if (d.rule == Rule::IntIdentity && is_integral(x.dtype(), false)) return x.clone();
  const Tensor in = x.to(compute_dtype(d, x.dtype()));
  Tensor out = empty(x.sizes(), result_dtype(d, x.dtype()), x.device());
  run_unary(d.op, out, in, decimals);
  return out;
}

// A written-to tensor must not have two elements at one address (an expanded dim), as in PyTorch.
void check_no_internal_overlap(const Tensor& t, const std::string& name) {
  for (int64_t i = 0; i < t.dim(); ++i)
    KILN_CHECK(!(t.strides()[i] == 0 && t.sizes()[i] > 1), name, ": more than one element of the written-to "
               "tensor ", t.meta(), " (strides ", t.strides(), ") refers to a single memory location; clone() it "
               "first");
}

Tensor& apply_(const OpDesc& d, Tensor& x) {
  const std::string name = std::string(d.name) + "_";
  check_backend(x, name);
  check_dtype(d, x.dtype(), name);
  const DType rt = result_dtype(d, x.dtype());
  KILN_CHECK(rt == x.dtype(), name, ": result type ", dtype_name(rt), " can't be cast to the desired output type ",
             dtype_name(x.dtype()), " (self is ", x.meta(), "); use the out-of-place ", d.name, " instead");
  check_no_internal_overlap(x, name);
  if (d.rule == Rule::IntIdentity && is_integral(x.dtype(), false)) return x;
  note_write(x);
  run_unary(d.op, x, x);
  return x;
}

// PyTorch's canCast: no complex into a real type, no floating into an integer, nothing but bool into bool.
bool can_cast(DType from, DType to) {
  if (is_complex(from) && !is_complex(to)) return false;
  if (is_floating(from) && is_integral(to, true)) return false;
  if (from != DType::Bool && to == DType::Bool) return false;
  return true;
}

}  // namespace

Tensor neg(const Tensor& x) { return apply(kNeg, x); }
Tensor abs(const Tensor& x) { return apply(kAbs, x); }
Tensor exp(const Tensor& x) { return apply(kExp, x); }
Tensor exp2(const Tensor& x) { return apply(kExp2, x); }
Tensor expm1(const Tensor& x) { return apply(kExpm1, x); }
Tensor log(const Tensor& x) { return apply(kLog, x); }
Tensor log2(const Tensor& x) { return apply(kLog2, x); }
Tensor log10(const Tensor& x) { return apply(kLog10, x); }
Tensor log1p(const Tensor& x) { return apply(kLog1p, x); }
Tensor sqrt(const Tensor& x) { return apply(kSqrt, x); }
Tensor rsqrt(const Tensor& x) { return apply(kRsqrt, x); }
Tensor reciprocal(const Tensor& x) { return apply(kReciprocal, x); }
Tensor square(const Tensor& x) { return apply(kSquare, x); }
Tensor sin(const Tensor& x) { return apply(kSin, x); }
Tensor cos(const Tensor& x) { return apply(kCos, x); }
Tensor tan(const Tensor& x) { return apply(kTan, x); }
Tensor asin(const Tensor& x) { return apply(kAsin, x); }
Tensor acos(const Tensor& x) { return apply(kAcos, x); }
Tensor atan(const Tensor& x) { return apply(kAtan, x); }
Tensor sinh(const Tensor& x) { return apply(kSinh, x); }
Tensor cosh(const Tensor& x) { return apply(kCosh, x); }
Tensor tanh(const Tensor& x) { return apply(kTanh, x); }
Tensor sigmoid(const Tensor& x) { return apply(kSigmoid, x); }
Tensor silu(const Tensor& x) { return apply(kSilu, x); }
Tensor relu(const Tensor& x) { return apply(kRelu, x); }
Tensor erf(const Tensor& x) { return apply(kErf, x); }
Tensor floor(const Tensor& x) { return apply(kFloor, x); }
Tensor ceil(const Tensor& x) { return apply(kCeil, x); }
Tensor trunc(const Tensor& x) { return apply(kTrunc, x); }
Tensor sign(const Tensor& x) { return apply(kSign, x); }
Tensor signbit(const Tensor& x) { return apply(kSignbit, x); }
Tensor isnan(const Tensor& x) { return apply(kIsNan, x); }
Tensor isinf(const Tensor& x) { return apply(kIsInf, x); }
Tensor isfinite(const Tensor& x) { return apply(kIsFinite, x); }
Tensor logical_not(const Tensor& x) { return apply(kLogicalNot, x); }
Tensor bitwise_not(const Tensor& x) { return apply(kBitwiseNot, x); }

Tensor gelu(const Tensor& x, std::string_view approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
             std::string(approximate), "\"");
  return apply(approximate == "tanh" ? kGeluTanh : kGeluErf, x);
}

Tensor round(const Tensor& x, int64_t decimals) {
  if (decimals == 0) return apply(kRound, x);
  if (is_integral(x.dtype(), true))
    throw Error(str("round: decimals=", decimals, " needs a floating input (f16, bf16, f32, f64); got ", x.meta(),
                    " (PyTorch has no integer kernel for it either)"));
  return apply(kRoundDecimals, x, decimals);
}

std::pair<Tensor, Tensor> frexp(const Tensor& x) {
  check_backend(x, "frexp");
  KILN_CHECK((kFloatTypes & dset(x.dtype())) != 0, "frexp: only floating-point inputs are supported (",
             dtype_set_str(kFloatTypes), "), got ", x.meta(),
             is_float8(x.dtype()) ? "; convert float8 first, e.g. x.to(DType::F32)" : "");
  Tensor mantissa = empty(x.sizes(), x.dtype(), x.device());
  Tensor exponent = empty(x.sizes(), DType::I32, x.device());
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::frexp(mantissa, exponent, x);
    return {mantissa, exponent};
  }
#endif
  cpu::frexp(mantissa, exponent, x);
  return {mantissa, exponent};
}

Tensor& neg_(Tensor& x) { return apply_(kNeg, x); }
Tensor& abs_(Tensor& x) { return apply_(kAbs, x); }
Tensor& exp_(Tensor& x) { return apply_(kExp, x); }
Tensor& log_(Tensor& x) { return apply_(kLog, x); }
Tensor& sqrt_(Tensor& x) { return apply_(kSqrt, x); }
Tensor& rsqrt_(Tensor& x) { return apply_(kRsqrt, x); }
Tensor& sigmoid_(Tensor& x) { return apply_(kSigmoid, x); }
Tensor& silu_(Tensor& x) { return apply_(kSilu, x); }
Tensor& relu_(Tensor& x) { return apply_(kRelu, x); }
Tensor& tanh_(Tensor& x) { return apply_(kTanh, x); }
Tensor& floor_(Tensor& x) { return apply_(kFloor, x); }
Tensor& ceil_(Tensor& x) { return apply_(kCeil, x); }
Tensor& round_(Tensor& x) { return apply_(kRound, x); }

Tensor& exp_out(Tensor& out, const Tensor& x) {
  KILN_CHECK(out.defined(), "exp_out: out is an undefined tensor");
  check_backend(x, "exp_out");
  check_backend(out, "exp_out");
  KILN_CHECK(out.device() == x.device(), "exp_out: out ", out.meta(), " and x ", x.meta(),
             " must be on the same device");
  check_dtype(kExp, x.dtype(), "exp_out");
  const DType rt = result_dtype(kExp, x.dtype());
  KILN_CHECK(can_cast(rt, out.dtype()), "exp_out: result type ", dtype_name(rt),
             " can't be cast to the desired output type ", dtype_name(out.dtype()), " (x is ", x.meta(), ", out is ",
             out.meta(), ")");
  if (out.sizes() != x.sizes()) {
    // Resizing gives out new storage; another tensor sharing the old storage (a view, or the base of one)
    // would silently stop seeing the results, so that case is an error rather than a surprise.
    KILN_CHECK(out.storage().use_count() == 1, "exp_out: out ", out.meta(), " has shape ", out.sizes(),
               " but the result has shape ", x.sizes(), ", and out shares its storage with another tensor "
               "(a view) so it cannot be resized");
    out = empty(x.sizes(), out.dtype(), out.device());
  }
  check_no_internal_overlap(out, "exp_out");
  note_write(out);
  const Tensor in = x.to(compute_dtype(kExp, x.dtype()));
  // Write straight into out unless a cast is needed or out overlaps the input at other positions.
  const bool same_layout = in.data_ptr() == out.data_ptr() && in.strides() == out.strides();
  if (out.dtype() == rt && (!out.is_alias_of(in) || same_layout)) {
    run_unary(UnaryOp::Exp, out, in);
  } else {
    Tensor tmp = empty(x.sizes(), rt, x.device());
    run_unary(UnaryOp::Exp, tmp, in);
    out.copy_(tmp);
  }
  return out;
}

}  // namespace kiln
