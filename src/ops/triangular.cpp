// triu / tril: the upper or lower triangle of the last two dims (entries j - i >= diagonal, resp. <=), the
// rest zero, as torch.triu / torch.tril; composed from a mask so that both backends run it.
#include "kiln/ops.h"

namespace kiln {

namespace {
Tensor triangle(const Tensor& x, int64_t diagonal, bool upper, const char* op) {
  KILN_CHECK(x.dim() >= 2, op, ": expected at least 2 dims, got ", x.meta());
  const Tensor rows = arange(x.size(-2), DType::I64, x.device()).unsqueeze(-1);
  const Tensor cols = arange(x.size(-1), DType::I64, x.device()).unsqueeze(0);
  const Tensor offset = sub(cols, rows);
  const Tensor keep = upper ? ge(offset, Scalar(diagonal)) : le(offset, Scalar(diagonal));
  return where(keep, x, x.dtype() == DType::Bool ? Scalar(false) : Scalar(0));
}
}  // namespace

Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true, "triu"); }
Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false, "tril"); }

}  // namespace kiln
