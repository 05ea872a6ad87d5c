// CUDA unary elementwise ops: argument checks shared by every op, dispatch to the file that instantiates
// the op's kernels (src/cuda/unary_*.cu), and frexp (two outputs, its own kernel).
#include "cuda/unary_impl.h"

namespace kiln::cuda {

namespace unary_impl {

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Square: return "square";
    case UnaryOp::Sign: return "sign";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Exp2: return "exp2";
    case UnaryOp::Expm1: return "expm1";
    case UnaryOp::Log: return "log";
    case UnaryOp::Log2: return "log2";
    case UnaryOp::Log10: return "log10";
    case UnaryOp::Log1p: return "log1p";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Sin: return "sin";
    case UnaryOp::Cos: return "cos";
    case UnaryOp::Tan: return "tan";
    case UnaryOp::Asin: return "asin";
    case UnaryOp::Acos: return "acos";
    case UnaryOp::Atan: return "atan";
    case UnaryOp::Sinh: return "sinh";
    case UnaryOp::Cosh: return "cosh";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Erf: return "erf";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::GeluErf: return "gelu";
    case UnaryOp::GeluTanh: return "gelu";
    case UnaryOp::Floor: return "floor";
    case UnaryOp::Ceil: return "ceil";
    case UnaryOp::Trunc: return "trunc";
    case UnaryOp::Round: return "round";
    case UnaryOp::RoundDecimals: return "round";
    case UnaryOp::Signbit: return "signbit";
    case UnaryOp::IsNan: return "isnan";
    case UnaryOp::IsInf: return "isinf";
    case UnaryOp::IsFinite: return "isfinite";
    case UnaryOp::LogicalNot: return "logical_not";
    case UnaryOp::BitwiseNot: return "bitwise_not";
  }
  return "unary";
}

void no_kernel(UnaryOp op, const Tensor& in) {
  if (in.dtype() == DType::C64) throw Error(str(op_name(op), ": complex64 is not supported on CUDA (input ", in.meta(), ")"));
  throw Error(str(op_name(op), ": internal error: no CUDA kernel for ", in.meta(),
                  " (the op layer should have rejected or converted this dtype)"));
}

}  // namespace unary_impl

namespace {

bool is_predicate(UnaryOp op) {
  return op == UnaryOp::Signbit || op == UnaryOp::IsNan || op == UnaryOp::IsInf || op == UnaryOp::IsFinite ||
         op == UnaryOp::LogicalNot;
}

// The kernels reinterpret out's memory as the result type, so a wrong out dtype or shape would write out of
// bounds: refuse it (the op layer never passes one).
DType expected_out_dtype(UnaryOp op, DType in) {
  if (is_predicate(op)) return DType::Bool;
  if (op == UnaryOp::Abs && in == DType::C64) return DType::F32;
  return in;
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& in, int64_t decimals) {
  const char* name = unary_impl::op_name(op);
  KILN_CHECK(out.is_cuda(), name, ": out ", out.meta(), " is not a CUDA tensor (input ", in.meta(), ")");
  check_same_device(name, out.device(), in);
  KILN_CHECK(out.sizes() == in.sizes(), name, ": out ", out.meta(), " must have the input's shape (input ",
             in.meta(), ")");
  const DType want = expected_out_dtype(op, in.dtype());
  KILN_CHECK(out.dtype() == want, name, ": out ", out.meta(), " must be ", dtype_name(want), " for input ",
             in.meta());
  if (out.numel() == 0) return;
  if (in.dtype() == DType::C64) return unary_impl::complex(op, out, in);
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Abs:
    case UnaryOp::Square:
    case UnaryOp::Sign:
    case UnaryOp::Relu:
    case UnaryOp::BitwiseNot:
    case UnaryOp::Signbit:
    case UnaryOp::IsNan:
    case UnaryOp::IsInf:
    case UnaryOp::IsFinite:
    case UnaryOp::LogicalNot: return unary_impl::exact(op, out, in);
    case UnaryOp::Exp:
    case UnaryOp::Exp2:
    case UnaryOp::Expm1:
    case UnaryOp::Log:
    case UnaryOp::Log2:
    case UnaryOp::Log10:
    case UnaryOp::Log1p:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Reciprocal:
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Trunc:
    case UnaryOp::Round:
    case UnaryOp::RoundDecimals: return unary_impl::exp_log(op, out, in, decimals);
    default: return unary_impl::trig(op, out, in);
  }
}

void frexp(const Tensor& mantissa, const Tensor& exponent, const Tensor& in) {
  KILN_CHECK(in.is_cuda(), "frexp: input ", in.meta(), " is not a CUDA tensor");
  check_same_device("frexp", in.device(), mantissa);
  check_same_device("frexp", in.device(), exponent);
  KILN_CHECK(mantissa.sizes() == in.sizes() && exponent.sizes() == in.sizes() && mantissa.dtype() == in.dtype() &&
                 exponent.dtype() == DType::I32,
             "frexp: outputs ", mantissa.meta(), " and ", exponent.meta(), " must have the shape of ", in.meta(),
             ", the mantissa its dtype and the exponent int32");
  visit_dtypes<kFloatTypes>(in.dtype(), "frexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = in.numel();
    if (n == 0) return;
    DeviceGuard guard(in.device());
    const cudaStream_t s = stream_of(in.device());
    const int threads = 256;
    // One strided kernel serves every layout: contiguous operands merge into a single dim, so the offset
    // arithmetic is one division per element (frexp is not worth a vectorised two-output path).
    const std::array<const Tensor*, 3> ops{&mantissa, &exponent, &in};
    auto launch = [&](auto idx) {
      using I = decltype(idx);
      const auto oc = detail::make_offset_calc<3, I>(mantissa, ops, "frexp");
      frexp_strided<I, T><<<grid_for(n, threads, in.device().index), threads, 0, s>>>(
          static_cast<I>(n), oc, static_cast<T*>(mantissa.data_ptr()), static_cast<int32_t*>(exponent.data_ptr()),
          static_cast<const T*>(in.data_ptr()));
    };
    if (detail::fits_32bit<3>(ops)) launch(uint32_t{});
    else launch(int64_t{});
    check_launch("frexp");
  });
}

}  // namespace kiln::cuda
