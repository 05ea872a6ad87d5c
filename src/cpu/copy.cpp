#include <cstring>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/loops.h"

namespace kiln::cpu {

void copy_cast(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  visit_dtype(dst.dtype(), "copy", [&](auto out_tag) {
    using Out = typename decltype(out_tag)::type;
    visit_dtype(src.dtype(), "copy", [&](auto in_tag) {
      using In = typename decltype(in_tag)::type;
      unary_kernel<Out, In>(dst, src, [](In v) { return convert<Out>(v); });
    });
  });
}

}  // namespace kiln::cpu
