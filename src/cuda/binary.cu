// CUDA launchers of the arithmetic binary ops: a dtype dispatch around the shared functors of
// ops/binary_functors.h (the same ones the CPU kernels run). Division-like ops and pow live in
// binary_division.cu, bitwise/shift/logical ops in binary_bitwise.cu (one file would compile too slowly).
#include "cuda/binary_launch.h"

namespace kiln::cuda {

namespace {

using cpu::BinaryOp;


}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  using namespace detail;
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::Add:
      visit_dtypes<kArith | kComplexTypes>(out.dtype(), "add", [&](auto tag) {
        using S = typename decltype(tag)::type;
        using M = opmath_t<S>;
        run_binary<S>(out, a, b, fn::AddFn<M>{fn::scalar_as<M>(alpha)}, "add");
      });
      return;
    case BinaryOp::Mul: return dispatch_binary<kArith | kComplexTypes, fn::MulFn>("mul", out, a, b);
    case BinaryOp::Div: return dispatch_binary<kFloatTypes | kComplexTypes, fn::DivFn>("div", out, a, b);
    case BinaryOp::Maximum: return dispatch_binary<kArith, fn::MaximumFn>("maximum", out, a, b);
    case BinaryOp::Minimum: return dispatch_binary<kArith, fn::MinimumFn>("minimum", out, a, b);
    case BinaryOp::Atan2: return dispatch_binary<kFloatTypes, fn::Atan2Fn>("atan2", out, a, b);
    case BinaryOp::Heaviside: return dispatch_binary<kArith, fn::HeavisideFn>("heaviside", out, a, b);
    case BinaryOp::DivTrunc:
    case BinaryOp::DivFloor:
    case BinaryOp::Pow:
    case BinaryOp::Fmod:
    case BinaryOp::Remainder: return detail::binary_division(op, out, a, b);
    case BinaryOp::BitAnd:
    case BinaryOp::BitOr:
    case BinaryOp::BitXor:
    case BinaryOp::ShiftLeft:
    case BinaryOp::ShiftRight:
    case BinaryOp::LogicalAnd:
    case BinaryOp::LogicalOr:
    case BinaryOp::LogicalXor: return detail::binary_bitwise(op, out, a, b);
  }
}

}  // namespace kiln::cuda
