// KILN_SIMD_CLONES before a hot loop's function builds it twice on x86-64: for the baseline the build
// targets (no -march: SSE2) and for x86-64-v3 (AVX2, FMA, F16C), the dynamic loader picking one for the
// machine (GCC/Clang target_clones). Elsewhere it is empty.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_SIMD_CLONES
#endif

namespace kiln::cpu {

// x . w over n elements, w widened to Acc (f32 or f64) element by element; the sum is reassociated across
// SIMD lanes.
template <class Acc, class S>
KILN_SIMD_CLONES Acc simd_dot(const Acc* __restrict x, const S* __restrict w, int64_t n) {
  Acc s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * static_cast<Acc>(w[i]);
  return s;
}

}  // namespace kiln::cpu
