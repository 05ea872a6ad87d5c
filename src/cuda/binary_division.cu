// CUDA launchers of the division-like binary ops (trunc/floor division, fmod, remainder) and pow.
//
// Integer division by zero: the CPU op scans the divisor on the host and raises before computing; here the
// kernel records the error (device_error.h) and it is raised at the next synchronisation, so the op stays
// asynchronous and graph-capturable. The elements concerned are 0 (the functors' defined value).
#include "cuda/binary_launch.h"

namespace kiln::cuda::detail {

namespace {

template <template <class> class Fn>
void division(const char* name, OpId id, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtypes<kNumeric>(out.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    using M = opmath_t<S>;
    if constexpr (fn::is_int_v<M>) {
      // Fetched only for integer ops: the record is created on first use (a pinned allocation).
      DeviceErrorRecord* rec = device_error_record(out.device().index);
      run_binary<S>(out, a, b, ZeroDivisorCheck<M, Fn<M>>{Fn<M>{}, rec, id}, name);
    } else {
      run_binary<S>(out, a, b, Fn<M>{}, name);
    }
  });
}

}  // namespace

void binary_division(cpu::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  using cpu::BinaryOp;
  switch (op) {
    case BinaryOp::DivTrunc: return division<fn::DivTruncFn>("div", OpId::Div, out, a, b);
    case BinaryOp::DivFloor: return division<fn::DivFloorFn>("div", OpId::Div, out, a, b);
    case BinaryOp::Fmod: return division<fn::FmodFn>("fmod", OpId::Fmod, out, a, b);
    case BinaryOp::Remainder: return division<fn::RemainderFn>("remainder", OpId::Remainder, out, a, b);
    case BinaryOp::Pow: return dispatch_binary<kNumeric, fn::PowFn>("pow", out, a, b);
    default: throw Error(str("cuda::binary_division: unexpected op ", static_cast<int>(op)));
  }
}

}  // namespace kiln::cuda::detail
