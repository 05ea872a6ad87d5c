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
  // f32 <-> f16 / bf16, both contiguous (activations, logits, linear outputs): whole chunks converted with F16C /
  // vectorised loops (cpu/clones.h) over the threads; the generic loop converts one element at a time. The
  // values are the same (round to nearest even, as Half(float) and BFloat16(float)).
  const auto half16 = [](DType t) { return t == DType::F16 || t == DType::BF16; };
  if (dst.is_contiguous() && src.is_contiguous() &&
      ((dst.dtype() == DType::F32 && half16(src.dtype())) || (src.dtype() == DType::F32 && half16(dst.dtype())))) {
    const DType h = dst.dtype() == DType::F32 ? src.dtype() : dst.dtype();
    visit_dtypes<dset(DType::F16, DType::BF16)>(h, "copy", [&](auto tag) {
      using H = typename decltype(tag)::type;
      const int64_t n = dst.numel(), chunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
      for (int64_t i = 0; i < n; i += chunk) {
        const int64_t len = std::min(chunk, n - i);
        if (dst.dtype() == DType::F32) simd_widen(src.data<const H>() + i, len, dst.data<float>() + i);
        else simd_narrow(src.data<const float>() + i, len, dst.data<H>() + i);
      }
    });
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
