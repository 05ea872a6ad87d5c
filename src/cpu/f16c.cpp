// The F16C kernels declared in cpu/clones.h: f16 rows widened eight at a time (AVX2 + FMA + F16C), chosen at
// run time by have_f16c(). Part of kiln_core, since the core's copies convert f16 with them.
#include "cpu/clones.h"

#if KILN_F16C_KERNELS
#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>

namespace kiln::cpu {

int64_t weight_prefetch_distance() {
  static const int64_t d = [] {
    const char* v = std::getenv("KILN_PREFETCH");
    return v != nullptr ? std::max<int64_t>(0, std::atoll(v)) : int64_t{2048};
  }();
  return d;
}

bool have_f16c() {
  static const bool yes = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): Clang's __builtin_cpu_supports does not know "f16c". The avx2 check
    // includes the operating system's saving of the YMM registers.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
}

namespace {
__attribute__((target("avx2,fma,f16c"))) inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// Eight 16-bit values widened to f32: f16 through F16C, bf16 by a shift into the high half.
template <bool BF>
__attribute__((target("avx2,fma,f16c"))) inline __m256 widen8(const uint16_t* w) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  if constexpr (BF) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else return _mm256_cvtph_ps(h);
}

template <bool BF>
__attribute__((target("avx2,fma,f16c"))) inline float widen1(uint16_t w) {
  if constexpr (BF) {
    const uint32_t u = static_cast<uint32_t>(w) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  } else {
    return _cvtsh_ss(w);
  }
}

// U independent accumulators per row (4 for one row, 2 for two, 1 beyond): one FMA chain per register would
// wait on the FMA latency instead of memory.
template <bool BF, int R>
__attribute__((target("avx2,fma,f16c"))) void dot_rows(const float* x, int64_t ldx, const uint16_t* w, int64_t n,
                                                      float* out) {
  constexpr int U = R == 1 ? 4 : R == 2 ? 2 : 1;
  __m256 acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 * U <= n; i += 8 * U) {
    for (int u = 0; u < U; ++u) {
      const __m256 v = widen8<BF>(w + i + 8 * u);
      for (int r = 0; r < R; ++r) acc[r][u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i + 8 * u), v, acc[r][u]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = widen8<BF>(w + i);
    for (int r = 0; r < R; ++r) acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i), v, acc[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    __m256 t = acc[r][0];
    for (int u = 1; u < U; ++u) t = _mm256_add_ps(t, acc[r][u]);
    out[r] = hsum(t);
  }
  for (; i < n; ++i) {
    const float v = widen1<BF>(w[i]);
    for (int r = 0; r < R; ++r) out[r] += x[r * ldx + i] * v;
  }
}

template <bool BF>
void dot_rows_any(int rows, const float* x, int64_t ldx, const uint16_t* w, int64_t n, float* out) {
  switch (rows) {
    case 1: return dot_rows<BF, 1>(x, ldx, w, n, out);
    case 2: return dot_rows<BF, 2>(x, ldx, w, n, out);
    case 3: return dot_rows<BF, 3>(x, ldx, w, n, out);
    default: return dot_rows<BF, 4>(x, ldx, w, n, out);
  }
}
}  // namespace

__attribute__((target("avx2,fma,f16c"))) void f16c_widen(const uint16_t* w, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(w[i]);
}

__attribute__((target("avx2,fma,f16c"))) void f16c_narrow(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__attribute__((target("avx2,fma,f16c"))) double f16c_dot_f64(const double* x, const uint16_t* w, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    a0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + i), _mm256_cvtps_pd(_mm256_castps256_ps128(v)), a0);
    a1 = _mm256_fmadd_pd(_mm256_loadu_pd(x + i + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), a1);
  }
  const __m256d a = _mm256_add_pd(a0, a1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  for (; i < n; ++i) s += x[i] * static_cast<double>(_cvtsh_ss(w[i]));
  return s;
}

__attribute__((target("avx2,fma,f16c"))) void f16c_axpy_f64(double* acc, double p, const uint16_t* v, int64_t n) {
  const __m256d pp = _mm256_set1_pd(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_pd(acc + i, _mm256_fmadd_pd(pp, _mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_loadu_pd(acc + i)));
    _mm256_storeu_pd(acc + i + 4,
                     _mm256_fmadd_pd(pp, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)), _mm256_loadu_pd(acc + i + 4)));
  }
  for (; i < n; ++i) acc[i] += p * static_cast<double>(_cvtsh_ss(v[i]));
}

namespace {
// One RM x RN tile of c = alpha a w^T (+ beta c): RM rows of a against RN rows of w, each a dot product over k
// in eight f32 lanes (RM x RN accumulators: 12 of the 16 YMM registers at 4 x 3), summed across the lanes at
// the end. Each w vector is widened once for the RM rows, each a vector loaded once for the RN rows.
template <bool BF, int RM, int RN>
__attribute__((target("avx2,fma,f16c"))) void gemm_tile(int64_t k, const float* a, int64_t lda, const uint16_t* w,
                                                       int64_t ldw, float* c, int64_t ldc, float alpha,
                                                       float beta) {
  __m256 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 wv[RN];
    for (int j = 0; j < RN; ++j) wv[j] = widen8<BF>(w + j * ldw + p);
    for (int i = 0; i < RM; ++i) {
      const __m256 av = _mm256_loadu_ps(a + i * lda + p);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_fmadd_ps(av, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t q = p; q < k; ++q) s += a[i * lda + q] * widen1<BF>(w[j * ldw + q]);
      float& out = c[i * ldc + j];
      out = beta == 0.f ? alpha * s : beta * out + alpha * s;  // beta 0: c is not read (BLAS's rule)
    }
}

using GemmTile = void (*)(int64_t, const float*, int64_t, const uint16_t*, int64_t, float*, int64_t, float, float);
template <bool BF, int RM>
constexpr GemmTile tile_for(int rn) {
  return rn == 1 ? gemm_tile<BF, RM, 1> : rn == 2 ? gemm_tile<BF, RM, 2> : gemm_tile<BF, RM, 3>;
}
template <bool BF>
GemmTile tile_for(int rm, int rn) {
  switch (rm) {
    case 1: return tile_for<BF, 1>(rn);
    case 2: return tile_for<BF, 2>(rn);
    case 3: return tile_for<BF, 3>(rn);
    default: return tile_for<BF, 4>(rn);
  }
}

template <bool BF>
void half_gemm_nt_impl(int64_t m, int64_t k, const float* a, int64_t lda, const uint16_t* w, int64_t ldw,
                       int64_t j0, int64_t j1, float* c, int64_t ldc, float alpha, float beta) {
  // Rows of a per pass: at most 256 KB of them, so that they stay in the L2 cache while every group of three
  // w rows (in L1) meets them.
  const int64_t mb = std::clamp<int64_t>((int64_t{256} << 10) / (4 * std::max<int64_t>(k, 1)) / 4 * 4, 4, std::max<int64_t>(m, 1));
  for (int64_t i0 = 0; i0 < m; i0 += mb) {
    const int64_t i1 = std::min(m, i0 + mb);
    for (int64_t j = j0; j < j1; j += 3) {
      const int rn = static_cast<int>(std::min<int64_t>(3, j1 - j));
      for (int64_t i = i0; i < i1; i += 4) {
        const int rm = static_cast<int>(std::min<int64_t>(4, i1 - i));
        tile_for<BF>(rm, rn)(k, a + i * lda, lda, w + j * ldw, ldw, c + i * ldc + j, ldc, alpha, beta);
      }
    }
  }
}
}  // namespace

void half_gemm_nt(bool bf16, int64_t m, int64_t k, const float* a, int64_t lda, const uint16_t* w, int64_t ldw,
                  int64_t j0, int64_t j1, float* c, int64_t ldc, float alpha, float beta) {
  if (bf16) half_gemm_nt_impl<true>(m, k, a, lda, w, ldw, j0, j1, c, ldc, alpha, beta);
  else half_gemm_nt_impl<false>(m, k, a, lda, w, ldw, j0, j1, c, ldc, alpha, beta);
}

void f16c_dot_rows(int rows, const float* x, int64_t ldx, const uint16_t* w, int64_t n, float* out) {
  dot_rows_any<false>(rows, x, ldx, w, n, out);
}

void bf16_dot_rows(int rows, const float* x, int64_t ldx, const uint16_t* w, int64_t n, float* out) {
  dot_rows_any<true>(rows, x, ldx, w, n, out);
}

}  // namespace kiln::cpu
#endif
