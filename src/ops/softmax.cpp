// softmax / log_softmax: argument checks and dtype rules (as PyTorch); the row math is in
// src/ops/softmax_math.h, the CPU loops in src/cpu/softmax.cpp, the CUDA launchers in src/cuda/softmax.cu.
#include "core/dispatch.h"
#include "cpu/softmax.h"
#include "kiln/nn.h"
#if KILN_HAVE_CUDA
#include "cuda/softmax.h"
#endif

namespace kiln {
namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, std::optional<DType> dtype, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  KILN_CHECK(x.defined(), op, ": input is an undefined tensor");
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
  // The CUDA kernels read f16/bf16 and write f32 directly: the widening is exact, so this is the same
  // function as converting first, without the extra pass.
  const bool fused_widen = x.is_cuda() && dtype && *dtype == DType::F32 &&
                           (x.dtype() == DType::F16 || x.dtype() == DType::BF16);
  const Tensor xin = dtype && !fused_widen ? x.to(*dtype) : x;
  Tensor out = empty(x.sizes(), dtype.value_or(x.dtype()), x.device());
  if (out.numel() == 0) return out;
  // A 0-d tensor is a single row of one element.
  const Tensor o = x.dim() == 0 ? out.view({1}) : out;
  const Tensor i = x.dim() == 0 ? xin.view({1}) : xin;
  const int64_t rd = x.dim() == 0 ? 0 : d;
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::softmax(o, i, rd, log);
    return out;
  }
#endif
  cpu::softmax(o, i, rd, log);
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
