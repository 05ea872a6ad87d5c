// linear: y = x @ weight^T + bias. Checks here; the CPU composes the matrix-product ops (OpenBLAS, bias through
// addmm's beta); CUDA picks a path per shape (src/cuda/linear.cu: the matrix-vector kernel for decode,
// cuBLASLt with the bias epilogue, or the matrix-product ops).
#include "kiln/nn.h"
#if KILN_HAVE_CUDA
#include "cuda/linear.h"
#endif

namespace kiln {

Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  KILN_CHECK(x.dim() >= 1, "linear: input must have at least 1 dim, got ", x.meta());
  KILN_CHECK(weight.dim() == 2, "linear: weight must be [N, K], got ", weight.meta());
  const int64_t k = x.size(-1), n = weight.size(0);
  KILN_CHECK(weight.size(1) == k, "linear: input ", x.meta(), " has K = ", k, " but weight ", weight.meta(),
             " expects K = ", weight.size(1));
  KILN_CHECK(x.dtype() == weight.dtype(), "linear: input ", x.meta(), " and weight ", weight.meta(),
             " must have the same dtype");
  KILN_CHECK(x.device() == weight.device(), "linear: input ", x.meta(), " and weight ", weight.meta(),
             " are on different devices");
  if (bias) {
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == n, "linear: bias must be [", n, "], got ", bias->meta());
    KILN_CHECK(bias->dtype() == x.dtype() && bias->device() == x.device(), "linear: bias ", bias->meta(),
               " must match the input ", x.meta(), " in dtype and device");
  }
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::linear(x, weight, bias);
#endif
  Shape out_shape = x.sizes();
  out_shape.back() = n;
  const Tensor x2 = x.reshape({-1, k});
  const Tensor y = bias ? addmm(*bias, x2, weight.t()) : mm(x2, weight.t());
  return y.view(out_shape);
}

Tensor linear_silu_and_mul(const Tensor& x, const Tensor& weight) {
  KILN_CHECK(weight.dim() == 2 && weight.size(0) % 2 == 0, "linear_silu_and_mul: weight must be [2N, K] (gate rows ",
             "then up rows), got ", weight.meta());
#if KILN_HAVE_CUDA
  if (x.is_cuda() && x.dim() >= 1 && x.numel() == x.size(-1) && x.dtype() == weight.dtype() &&
      x.device() == weight.device() && weight.size(1) == x.size(-1)) {
    Shape out_shape = x.sizes();
    out_shape.back() = weight.size(0) / 2;
    const Tensor x2 = x.reshape({1, x.size(-1)});
    Tensor y = empty({1, weight.size(0) / 2}, x.dtype(), x.device());
    if (cuda::linear_silu_mul_gemv(y, x2, weight)) return y.view(out_shape);
  }
#endif
  return silu_and_mul(linear(x, weight));
}

}  // namespace kiln
