#include <algorithm>
#include <cstring>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/clones.h"
#include "cpu/loops.h"

namespace kiln::cpu {

void copy_cast(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  // f16 -> f32, both contiguous (logits, activations read back): the F16C widening of cpu/clones.h, in chunks
  // over the threads (the generic loop converts one element at a time).
  if (dst.dtype() == DType::F32 && src.dtype() == DType::F16 && dst.is_contiguous() && src.is_contiguous()) {
    const int64_t n = dst.numel(), chunk = 1 << 14;
    const Half* in = static_cast<const Half*>(src.data_ptr());
    float* out = static_cast<float*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
    for (int64_t i = 0; i < n; i += chunk) simd_widen(in + i, std::min(chunk, n - i), out + i);
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
