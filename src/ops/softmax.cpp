// softmax / log_softmax: argument checks and dtype rules (as PyTorch); the row math is in
// src/ops/softmax_math.h, the CPU loops in src/cpu/softmax.cpp.
#include "core/dispatch.h"
#include "cpu/softmax.h"
#include "kiln/nn.h"

namespace kiln {
namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, std::optional<DType> dtype, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  KILN_CHECK(x.defined(), op, ": input is an undefined tensor");
  KILN_CHECK(!x.is_cuda(), op, ": no CUDA implementation yet (input ", x.meta(), ")");
  // As PyTorch: with dtype= the input is converted first (so integer input is fine then), and the op runs
  // in that dtype.
  if (dtype) {
    KILN_CHECK((dset(*dtype) & kFloatTypes) != 0, op, ": dtype= must be a floating type (",
               dtype_set_str(kFloatTypes), "), got ", dtype_name(*dtype), " (input ", x.meta(), ")");
  } else {
    KILN_CHECK((dset(x.dtype()) & kFloatTypes) != 0, op, ": input dtype ", dtype_name(x.dtype()),
               " is not supported (input ", x.meta(), "); supported: ", dtype_set_str(kFloatTypes),
               ", or pass dtype= to convert");
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const Tensor xin = dtype ? x.to(*dtype) : x;
  Tensor out = empty(x.sizes(), xin.dtype(), x.device());
  if (out.numel() == 0) return out;
  // A 0-d tensor is a single row of one element.
  if (x.dim() == 0) cpu::softmax(out.view({1}), xin.view({1}), 0, log);
  else cpu::softmax(out, xin, d, log);
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return softmax_impl(x, dim, dtype, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return softmax_impl(x, dim, dtype, true);
}

}  // namespace kiln
