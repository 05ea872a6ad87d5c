// Complex views and conj: view_as_real, real, imag are views (no copy); conj of a complex tensor is a new
// tensor with the imaginary parts negated, of a real tensor the tensor itself (torch.conj's result for real
// input).
#include "kiln/ops.h"

namespace kiln {

Tensor view_as_real(const Tensor& x) {
  KILN_CHECK(x.dtype() == DType::C64, "view_as_real: expected a complex64 tensor, got ", x.meta());
  Shape sizes = x.sizes(), strides = x.strides();
  for (auto& s : strides) s *= 2;
  sizes.push_back(2);
  strides.push_back(1);
  return Tensor(x.storage(), sizes, strides, x.storage_offset() * 2, DType::F32);
}

Tensor real(const Tensor& x) { return x.dtype() == DType::C64 ? view_as_real(x).select(-1, 0) : x; }

Tensor imag(const Tensor& x) {
  KILN_CHECK(x.dtype() == DType::C64, "imag: expected a complex tensor (a real tensor has no imaginary part), got ",
             x.meta());
  return view_as_real(x).select(-1, 1);
}

Tensor conj(const Tensor& x) {
  if (x.dtype() != DType::C64) return x;
  Tensor out = x.clone();
  Tensor im = view_as_real(out).select(-1, 1);
  mul_(im, Scalar(-1.0));
  return out;
}

}  // namespace kiln
