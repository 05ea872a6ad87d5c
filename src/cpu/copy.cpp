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
  if (dst.is_contiguous() && src.is_contiguous()) {
    const int64_t n = dst.numel(), chunk = 1 << 14;
    const auto chunks = [&](auto&& f) {
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
      for (int64_t i = 0; i < n; i += chunk) f(i, std::min(chunk, n - i));
    };
    const DType d = dst.dtype(), s = src.dtype();
    if (d == DType::F32 && (s == DType::F16 || s == DType::BF16)) {
      float* out = static_cast<float*>(dst.data_ptr());
      if (s == DType::F16) chunks([&](int64_t i, int64_t len) { simd_widen(static_cast<const Half*>(src.data_ptr()) + i, len, out + i); });
      else chunks([&](int64_t i, int64_t len) { simd_widen(static_cast<const BFloat16*>(src.data_ptr()) + i, len, out + i); });
      return;
    }
    if (s == DType::F32 && (d == DType::F16 || d == DType::BF16)) {
      const float* in = static_cast<const float*>(src.data_ptr());
      if (d == DType::F16) chunks([&](int64_t i, int64_t len) { simd_narrow(in + i, len, static_cast<Half*>(dst.data_ptr()) + i); });
      else chunks([&](int64_t i, int64_t len) { simd_narrow(in + i, len, static_cast<BFloat16*>(dst.data_ptr()) + i); });
      return;
    }
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
