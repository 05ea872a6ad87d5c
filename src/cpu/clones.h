// KILN_SIMD_CLONES before a hot loop's function builds it twice on x86-64: for the baseline the build
// targets (no -march: SSE2) and for x86-64-v3 (AVX2, FMA, F16C), the dynamic loader picking one for the
// machine (GCC's target_clones). Elsewhere it is empty: Clang (14 and later) refuses target_clones on function
// templates, so a Clang build keeps the baseline loops (its f16 paths still take the F16C kernels below).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/scalar_types.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_SIMD_CLONES
#endif

namespace kiln::cpu {

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_F16C_KERNELS 1
// f16 weights on x86-64 with F16C (every AVX2 CPU): eight halves widened per instruction. GCC does not
// vectorise the f16 -> f32 conversion in the loops below (neither kiln's Half nor _Float16), which left f16
// weights several times slower than bf16. Defined in cpu/f16c.cpp.
bool have_f16c();
void f16c_dot_rows(int rows, const float* x, int64_t ldx, const uint16_t* w, int64_t n, float* out);
// The same for bf16 w (AVX2 + FMA; several accumulators per row, so that no single FMA chain bounds it).
void bf16_dot_rows(int rows, const float* x, int64_t ldx, const uint16_t* w, int64_t n, float* out);
void f16c_widen(const uint16_t* w, int64_t n, float* out);
void f16c_narrow(const float* x, int64_t n, uint16_t* out);  // round to nearest even, as kiln's Half(float)
double f16c_dot_f64(const double* x, const uint16_t* w, int64_t n);
void f16c_axpy_f64(double* acc, double p, const uint16_t* v, int64_t n);  // acc += p v
// c[i, j] = alpha sum_p a[i, p] w[j, p] (+ beta c[i, j]; beta 0: c is not read) for i < m, j0 <= j < j1: a f32
// rows (stride lda), w 16-bit rows (f16, or bf16 when bf16; stride ldw), c f32 (stride ldc). The products of
// two or more rows with 16-bit weights: each weight widened in registers, no f32 copy of it.
void half_gemm_nt(bool bf16, int64_t m, int64_t k, const float* a, int64_t lda, const uint16_t* w, int64_t ldw,
                  int64_t j0, int64_t j1, float* c, int64_t ldc, float alpha, float beta);

// The block formats' weight kernels (cpu/q8_dot.cpp) read each weight once, in order, and ask for the cache
// lines this many bytes ahead of what they read: the hardware prefetchers alone left some CPUs' one-row
// products far below the memory's rate (on 2 cores of a Xeon with AMX, qwen3-0.6b decodes 27.5 tok/s in Q4_K
// and 27.9 in Q8_0 without, 41.5 and 32.3 with; the 16-bit kernels, which do little per byte, gain nothing
// there). KILN_PREFETCH=N sets it (0: none); 2048 otherwise. Defined in cpu/f16c.cpp.
int64_t weight_prefetch_distance();
// The 64-byte lines of [p, p + bytes) shifted `ahead` bytes on, into the L1 cache.
inline void prefetch_weights(const void* p, int64_t bytes, int64_t ahead) {
  if (ahead == 0) return;
  const char* c = static_cast<const char*>(p) + ahead;
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}
#endif

// x . w over n elements, w widened to Acc (f32 or f64) element by element; the sum is reassociated across
// SIMD lanes.
template <class Acc, class S>
KILN_SIMD_CLONES Acc simd_dot(const Acc* __restrict x, const S* __restrict w, int64_t n) {
#if KILN_F16C_KERNELS
  if constexpr (std::is_same_v<S, Half>) {
    if (have_f16c()) {
      if constexpr (std::is_same_v<Acc, double>) return f16c_dot_f64(x, reinterpret_cast<const uint16_t*>(w), n);
      if constexpr (std::is_same_v<Acc, float>) {
        float out;
        f16c_dot_rows(1, x, n, reinterpret_cast<const uint16_t*>(w), n, &out);
        return out;
      }
    }
  }
  if constexpr (std::is_same_v<S, BFloat16> && std::is_same_v<Acc, float>) {
    if (have_f16c()) {
      float out;
      bf16_dot_rows(1, x, n, reinterpret_cast<const uint16_t*>(w), n, &out);
      return out;
    }
  }
#endif
  Acc s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * static_cast<Acc>(w[i]);
  return s;
}

// out[i] = w[i] widened to f32, for i < n.
template <class S>
KILN_SIMD_CLONES void simd_widen(const S* __restrict w, int64_t n, float* __restrict out) {
#if KILN_F16C_KERNELS
  if constexpr (std::is_same_v<S, Half>)
    if (have_f16c()) return f16c_widen(reinterpret_cast<const uint16_t*>(w), n, out);
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(w[i]);
}

// out[i] = x[i] rounded to S (S(float): round to nearest even), for i < n.
template <class S>
KILN_SIMD_CLONES void simd_narrow(const float* __restrict x, int64_t n, S* __restrict out) {
#if KILN_F16C_KERNELS
  if constexpr (std::is_same_v<S, Half>)
    if (have_f16c()) return f16c_narrow(x, n, reinterpret_cast<uint16_t*>(out));
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<S>(x[i]);
}

// The same for R (1..4) rows of x (x + r * ldx) against one w: each w[i] widened once for all rows.
template <int R, class S>
KILN_SIMD_CLONES void simd_dot_rows(const float* __restrict x, int64_t ldx, const S* __restrict w, int64_t n,
                                    float* out) {
#if KILN_F16C_KERNELS
  if constexpr (std::is_same_v<S, Half>)
    if (have_f16c()) return f16c_dot_rows(R, x, ldx, reinterpret_cast<const uint16_t*>(w), n, out);
  if constexpr (std::is_same_v<S, BFloat16>)
    if (have_f16c()) return bf16_dot_rows(R, x, ldx, reinterpret_cast<const uint16_t*>(w), n, out);
#endif
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const float* x1 = x + (R > 1 ? ldx : 0);
  const float* x2 = x + (R > 2 ? 2 * ldx : 0);
  const float* x3 = x + (R > 3 ? 3 * ldx : 0);
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(w[i]);
    s0 += x[i] * v;
    if constexpr (R > 1) s1 += x1[i] * v;
    if constexpr (R > 2) s2 += x2[i] * v;
    if constexpr (R > 3) s3 += x3[i] * v;
  }
  out[0] = s0;
  if constexpr (R > 1) out[1] = s1;
  if constexpr (R > 2) out[2] = s2;
  if constexpr (R > 3) out[3] = s3;
}

}  // namespace kiln::cpu
