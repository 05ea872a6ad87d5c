// CUDA launchers of the bitwise, shift and logical binary ops (shared functors of ops/binary_functors.h).
#include "cuda/binary_launch.h"

namespace kiln::cuda::detail {

void binary_bitwise(cpu::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  using cpu::BinaryOp;
  switch (op) {
    case BinaryOp::BitAnd: return dispatch_binary<kBitwise, fn::BitAndFn>("bitwise_and", out, a, b);
    case BinaryOp::BitOr: return dispatch_binary<kBitwise, fn::BitOrFn>("bitwise_or", out, a, b);
    case BinaryOp::BitXor: return dispatch_binary<kBitwise, fn::BitXorFn>("bitwise_xor", out, a, b);
    case BinaryOp::ShiftLeft: return dispatch_binary<kIntTypes, fn::ShiftLeftFn>("bitwise_left_shift", out, a, b);
    case BinaryOp::ShiftRight:
      return dispatch_binary<kIntTypes, fn::ShiftRightFn>("bitwise_right_shift", out, a, b);
    case BinaryOp::LogicalAnd:
      return launch_elementwise<bool, bool, bool>(out, {&a, &b}, fn::LogicalAndFn{}, "logical_and");
    case BinaryOp::LogicalOr:
      return launch_elementwise<bool, bool, bool>(out, {&a, &b}, fn::LogicalOrFn{}, "logical_or");
    case BinaryOp::LogicalXor:
      return launch_elementwise<bool, bool, bool>(out, {&a, &b}, fn::LogicalXorFn{}, "logical_xor");
    default: throw Error(str("cuda::binary_bitwise: unexpected op ", static_cast<int>(op)));
  }
}

}  // namespace kiln::cuda::detail
