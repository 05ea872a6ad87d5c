#include "cpu/fp8_dot.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "cpu/clones.h"
#include "kiln/scalar_types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KILN_FP8_X86 1
#define KILN_AVX2_FMA_F16C __attribute__((target("avx2,fma,f16c")))
#endif

namespace kiln::cpu {

namespace {

std::atomic<bool> simd_enabled{true};

inline float code_to_f32(uint8_t c, bool e5m2) { return e5m2 ? e5m2_bits_to_f32(c) : e4m3_bits_to_f32(c); }

void dot_rows_scalar(const float* x, int64_t ldx, int rows, const uint8_t* w, int64_t n, bool e5m2, float* out) {
  for (int r = 0; r < rows; ++r) out[r] = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float wv = code_to_f32(w[i], e5m2);
    for (int r = 0; r < rows; ++r) out[r] += x[r * ldx + i] * wv;
  }
}

void blocks_scalar(const float* x, int64_t ldx, int rows, const uint8_t* w, const float* scales, int64_t K,
                   int64_t bk, bool e5m2, float* out) {
  float part[4];
  for (int r = 0; r < rows; ++r) out[r] = 0.f;
  for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += bk) {
    dot_rows_scalar(x + k0, ldx, rows, w + k0, std::min(bk, K - k0), e5m2, part);
    for (int r = 0; r < rows; ++r) out[r] += part[r] * scales[b];
  }
}

#if KILN_FP8_X86
// Lanes of b holding the e4m3fn NaN code (0x7F or 0xFF).
KILN_AVX2_FMA_F16C inline __m128i e4m3_nan_lanes(__m128i b) {
  const __m128i m = _mm_set1_epi8(0x7F);
  return _mm_cmpeq_epi8(_mm_and_si128(b, m), m);
}

KILN_AVX2_FMA_F16C inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 16 codes as two vectors of 8 f32 values, e4m3fn ones scaled by 2^-8 (its codes sign-extended to 16 bits and
// shifted into f16's layout read as value x 2^-8, subnormals included; the callers multiply by 256, exactly),
// e5m2 ones exact (the top byte of an f16). Three integer steps and the converter per 16 codes. The e4m3fn NaN
// code (S.1111.111) reads as +-1.875 here: the callers look for it separately.
template <bool E5>
KILN_AVX2_FMA_F16C inline void widen16(__m128i c, __m256& lo, __m256& hi) {
  __m256i h;
  if constexpr (E5) {
    h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(c), 8);
  } else {
    const __m256i layout = _mm256_set1_epi16(static_cast<short>(0xBF80));  // sign, then exponent and mantissa
    h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(c), 7), layout);
  }
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// 16 codes from w + i into accumulators a and a + 1 of every row, and the NaN watch (e4m3fn).
template <int R, int A, bool E5>
KILN_AVX2_FMA_F16C inline void block_step(const float* x, int64_t ldx, const uint8_t* w, int64_t i, int a,
                                          __m256 (&acc)[R][A], __m128i& max_u, __m128i& max_s) {
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
  if constexpr (!E5) {
    max_u = _mm_max_epu8(max_u, c);
    max_s = _mm_max_epi8(max_s, c);
  }
  __m256 lo, hi;
  widen16<E5>(c, lo, hi);
  for (int r = 0; r < R; ++r) {
    acc[r][a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i), lo, acc[r][a]);
    acc[r][a + 1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i + 8), hi, acc[r][a + 1]);
  }
}

// The same over K in blocks of bk with one scale each: out[r] = sum over blocks of scale(block) x (the block's
// dot product); the blocks' vector sums are scaled and added in registers, one horizontal sum per row. An
// e4m3fn NaN code (0x7F or 0xFF) is caught by running unsigned and signed byte maxima (0xFF and 0x7F are the
// only codes that reach them).
template <int R, bool E5>
KILN_AVX2_FMA_F16C void dot_rows_blocks_avx2(const float* x, int64_t ldx, const uint8_t* w, const float* scales,
                                             int64_t K, int64_t bk, float* out) {
  constexpr int A = R <= 2 ? 4 : 2;  // accumulators per row (16 ymm registers)
  const float unit = E5 ? 1.f : 256.f;
  __m256 total[R];
  float tail[R];
  for (int r = 0; r < R; ++r) {
    total[r] = _mm256_setzero_ps();
    tail[r] = 0.f;
  }
  __m128i max_u = _mm_setzero_si128(), max_s = _mm_set1_epi8(-128);
  for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += bk) {
    const int64_t k1 = std::min(K, k0 + bk);
    __m256 acc[R][A];
    for (int r = 0; r < R; ++r)
      for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
    int64_t i = k0;
    if constexpr (A == 4)
      for (; i + 32 <= k1; i += 32) {
        block_step<R, A, E5>(x, ldx, w, i, 0, acc, max_u, max_s);
        block_step<R, A, E5>(x, ldx, w, i + 16, 2, acc, max_u, max_s);
      }
    for (; i + 16 <= k1; i += 16) block_step<R, A, E5>(x, ldx, w, i, 0, acc, max_u, max_s);
    const float scale = scales[b];
    const __m256 sc = _mm256_set1_ps(scale), u = _mm256_set1_ps(unit);
    for (int r = 0; r < R; ++r) {
      __m256 v = _mm256_add_ps(acc[r][0], acc[r][1]);
      if constexpr (A == 4) v = _mm256_add_ps(v, _mm256_add_ps(acc[r][2], acc[r][3]));
      total[r] = _mm256_fmadd_ps(_mm256_mul_ps(v, u), sc, total[r]);
    }
    if (i < k1) {
      float part[R] = {};
      for (; i < k1; ++i) {
        const float wv = code_to_f32(w[i], E5);
        for (int r = 0; r < R; ++r) part[r] += x[r * ldx + i] * wv;
      }
      for (int r = 0; r < R; ++r) tail[r] += part[r] * scale;
    }
  }
  const bool any_nan = !E5 && (_mm_movemask_epi8(_mm_cmpeq_epi8(max_u, _mm_set1_epi8(-1))) != 0 ||
                               _mm_movemask_epi8(_mm_cmpeq_epi8(max_s, _mm_set1_epi8(0x7F))) != 0);
  for (int r = 0; r < R; ++r) out[r] = any_nan ? std::numeric_limits<float>::quiet_NaN() : hsum(total[r]) + tail[r];
}

template <bool E5>
KILN_AVX2_FMA_F16C void dequantize_avx2(const uint8_t* w, int64_t n, float scale, float* out) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
    if (!E5 && _mm_movemask_epi8(e4m3_nan_lanes(b)) != 0) {
      for (int j = 0; j < 16; ++j) out[i + j] = e4m3_bits_to_f32(w[i + j]) * scale;
      continue;
    }
    __m256 lo, hi;
    widen16<E5>(b, lo, hi);
    if constexpr (!E5) {  // exact: the codes' values
      lo = _mm256_mul_ps(lo, _mm256_set1_ps(256.f));
      hi = _mm256_mul_ps(hi, _mm256_set1_ps(256.f));
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(lo, sc));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(hi, sc));
  }
  for (; i < n; ++i) out[i] = code_to_f32(w[i], E5) * scale;
}

bool detect_simd() { return have_f16c(); }
#endif

template <bool E5>
void dot_rows_blocks_dispatch(const float* x, int64_t ldx, int rows, const uint8_t* w, const float* scales,
                              int64_t K, int64_t bk, float* out) {
#if KILN_FP8_X86
  switch (rows) {
    case 1: dot_rows_blocks_avx2<1, E5>(x, ldx, w, scales, K, bk, out); return;
    case 2: dot_rows_blocks_avx2<2, E5>(x, ldx, w, scales, K, bk, out); return;
    case 3: dot_rows_blocks_avx2<3, E5>(x, ldx, w, scales, K, bk, out); return;
    case 4: dot_rows_blocks_avx2<4, E5>(x, ldx, w, scales, K, bk, out); return;
    default: break;
  }
#endif
  blocks_scalar(x, ldx, rows, w, scales, K, bk, E5, out);
}

}  // namespace

bool fp8_simd_available() {
#if KILN_FP8_X86
  static const bool ok = detect_simd();
  return ok && simd_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void fp8_set_simd_enabled(bool enabled) { simd_enabled.store(enabled, std::memory_order_relaxed); }
bool fp8_simd_enabled() { return simd_enabled.load(std::memory_order_relaxed); }

void fp8_dot_rows_scaled(const float* x, int64_t ldx, int rows, const uint8_t* w, const float* scales, int64_t K,
                         int64_t bk, bool e5m2, float* out) {
  if (!fp8_simd_available()) {
    blocks_scalar(x, ldx, rows, w, scales, K, bk, e5m2, out);
    return;
  }
  if (e5m2) dot_rows_blocks_dispatch<true>(x, ldx, rows, w, scales, K, bk, out);
  else dot_rows_blocks_dispatch<false>(x, ldx, rows, w, scales, K, bk, out);
}

void fp8_dequantize_row(const uint8_t* w, int64_t n, bool e5m2, float scale, float* out) {
#if KILN_FP8_X86
  if (fp8_simd_available()) {
    if (e5m2) dequantize_avx2<true>(w, n, scale, out);
    else dequantize_avx2<false>(w, n, scale, out);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = code_to_f32(w[i], e5m2) * scale;
}

}  // namespace kiln::cpu
