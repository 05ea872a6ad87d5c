#include "cpu/q8_dot.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/clones.h"
#include "kiln/scalar_types.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 headers build vectors from deliberately undefined ones, which -Wuninitialized flags.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define KILN_Q8_X86 1
#define KILN_Q8_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KILN_Q8_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif

namespace kiln::cpu {

namespace {

enum class WFormat { Q8, Q4 };

// One block: scale = max|x| / 127, q = round(x / scale) (half away from zero), as llama.cpp's reference.
// A block holding NaN or an infinity quantises to zeros with a NaN scale, so that products with it are NaN.
float quantize_block(const float* x, int8_t* q) {
  float amax = 0.f;
  bool finite = true;
  for (int i = 0; i < kQ8Block; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  if (!finite) {
    std::fill(q, q + kQ8Block, int8_t{0});
    return std::nanf("");
  }
  // A scale below the smallest normal float would overflow 1 / d: such a block reads as zeros.
  const float d = amax / 127.f, id = d >= std::numeric_limits<float>::min() ? 1.f / d : 0.f;
  // lround without the library call (it was 2.5% of a Q4_K decode): truncate, then step away from zero when the
  // exact remainder is at least one half. Equal to lround for |v| < 2^31 (here |v| <= 127.5).
  for (int i = 0; i < kQ8Block; ++i) {
    const float v = x[i] * id;
    const int t = static_cast<int>(v);
    const float f = v - static_cast<float>(t);
    q[i] = static_cast<int8_t>(t + (f >= 0.5f) - (f <= -0.5f));
  }
  return d;
}

// Block b of a weight row as 32 int8 values: Q8_0's as stored; Q4_0's 16 bytes unpacked (byte j holds value j
// in its low nibble and value j + 16 in its high one), minus 8.
template <WFormat F>
void unpack_block(const void* w, int64_t b, int8_t* out) {
  if constexpr (F == WFormat::Q8) {
    std::memcpy(out, static_cast<const int8_t*>(w) + b * kQ8Block, kQ8Block);
  } else {
    const uint8_t* p = static_cast<const uint8_t*>(w) + b * (kQ8Block / 2);
    for (int j = 0; j < kQ8Block / 2; ++j) {
      out[j] = static_cast<int8_t>((p[j] & 0x0F) - 8);
      out[j + kQ8Block / 2] = static_cast<int8_t>((p[j] >> 4) - 8);
    }
  }
}

template <WFormat F>
void dot_rows_scalar(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, int rows, const uint8_t* w,
                     int64_t wstride, const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo) {
  for (int64_t row = 0; row < nw; ++row, w += wstride, wd += nb, out += 1) {
    int8_t wb[kQ8Block];
    for (int r = 0; r < rows; ++r) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        unpack_block<F>(w, b, wb);
        int32_t s = 0;
        for (int i = 0; i < kQ8Block; ++i) s += int32_t{xq[r * ldq + b * kQ8Block + i]} * int32_t{wb[i]};
        acc += xd[r * ldd + b] * f16_bits_to_f32(wd[b]) * static_cast<float>(s);
      }
      out[r * ldo] = acc;
    }
  }
}

// Q4_K: the 6-bit scale and min of sub-block j from a super-block's 12 packed bytes (ggml's get_scale_min_k4).
inline void q4k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A super-block's d x s_j and dmin x m_j as f32.
inline void q4k_factors(const uint8_t* blk, float* dsc, float* dmn) {
  uint16_t dh, mh;
  std::memcpy(&dh, blk, 2);
  std::memcpy(&mh, blk + 2, 2);
  const float d = f16_bits_to_f32(dh), dmin = f16_bits_to_f32(mh);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    q4k_scale_min(j, blk + 4, sc, m);
    dsc[j] = d * static_cast<float>(sc);
    dmn[j] = dmin * static_cast<float>(m);
  }
}

// Sub-block j's 32 codes: the low (even j) or high (odd j) nibbles of the 32 bytes of its pair; Q5_K (the same
// super-block with 32 bytes qh before the codes, 176 bytes) adds bit j of qh[l] as the codes' fifth bit.
inline void q4k_codes(const uint8_t* blk, int j, uint8_t* out, bool q5 = false) {
  const uint8_t* q = blk + (q5 ? 48 : 16) + 32 * (j / 2);
  for (int l = 0; l < 32; ++l) out[l] = (j % 2 == 0) ? (q[l] & 0x0F) : (q[l] >> 4);
  if (q5)
    for (int l = 0; l < 32; ++l) out[l] = static_cast<uint8_t>(out[l] | (((blk[16 + l] >> j) & 1) << 4));
}

// Q6_K: 32-value block b (0..7) of a super-block: its half n = b / 4 (128 values each: 64 bytes of low nibbles,
// 32 of high bit pairs, 8 scales) and quarter q = b % 4, which picks the low or high nibble of ql[l] or
// ql[l + 32] and bit pair q of qh[l]; its first 16 values take scale 2q of the half, the last 16 scale 2q + 1
// (ggml's dequantize_row_q6_K). Codes 0..63; value = d x scale x (code - 32).
inline void q6k_codes(const uint8_t* blk, int b, uint8_t* out) {
  const int n = b / 4, q = b % 4;
  const uint8_t* ql = blk + 64 * n + (q % 2 == 1 ? 32 : 0);
  const uint8_t* qh = blk + 128 + 32 * n;
  for (int l = 0; l < 32; ++l) {
    const int lo = q < 2 ? (ql[l] & 0x0F) : (ql[l] >> 4);
    out[l] = static_cast<uint8_t>(lo | (((qh[l] >> (2 * q)) & 3) << 4));
  }
}
inline const int8_t* q6k_scales(const uint8_t* blk, int b) {
  return reinterpret_cast<const int8_t*>(blk + 192 + 8 * (b / 4) + 2 * (b % 4));
}
inline float q6k_d(const uint8_t* blk) {
  uint16_t h;
  std::memcpy(&h, blk + 208, 2);
  return f16_bits_to_f32(h);
}

// Per activation block b: its integer sum I_b = s_lo (x . (c - 32) over the first 16) + s_hi (over the last 16),
// exact; the row's result is the sum over blocks of (d x xd[b]) x I_b.
void q6k_dot_rows_scalar(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, int rows, const uint8_t* w,
                         int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  for (int64_t row = 0; row < nw; ++row, w += nsb * kQ6KBytes, out += 1) {
    for (int r = 0; r < rows; ++r) {
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        const uint8_t* blk = w + s * kQ6KBytes;
        const float d = q6k_d(blk);
        for (int b = 0; b < 8; ++b) {
          uint8_t c[32];
          q6k_codes(blk, b, c);
          const int8_t* sc = q6k_scales(blk, b);
          const int8_t* x = xq + r * ldq + s * kQ6KBlock + b * kQ8Block;
          int32_t lo = 0, hi = 0;
          for (int l = 0; l < 16; ++l) lo += (int32_t{c[l]} - 32) * int32_t{x[l]};
          for (int l = 16; l < 32; ++l) hi += (int32_t{c[l]} - 32) * int32_t{x[l]};
          acc += (d * xd[r * ldd + s * 8 + b]) * static_cast<float>(sc[0] * lo + sc[1] * hi);
        }
      }
      out[r * ldo] = acc;
    }
  }
}

void q4k_dot_rows_scalar(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                         const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo, bool q5) {
  const int64_t bytes = q5 ? kQ5KBytes : kQ4KBytes;
  for (int64_t row = 0; row < nw; ++row, w += nsb * bytes, out += 1) {
    for (int r = 0; r < rows; ++r) {
      float acc = 0.f, mins = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        const uint8_t* blk = w + s * bytes;
        float dsc[8], dmn[8];
        q4k_factors(blk, dsc, dmn);
        for (int j = 0; j < 8; ++j) {
          uint8_t c[32];
          q4k_codes(blk, j, c, q5);
          const int64_t b = s * 8 + j;
          int32_t isum = 0;
          for (int l = 0; l < 32; ++l) isum += int32_t{c[l]} * int32_t{xq[r * ldq + b * kQ8Block + l]};
          acc += xd[r * ldd + b] * dsc[j] * static_cast<float>(isum);
          mins += dmn[j] * xs[r * ldd + b];
        }
      }
      out[r * ldo] = acc - mins;
    }
  }
}

#if KILN_Q8_X86
KILN_Q8_AVX2 inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// |x| (unsigned) times w with x's sign (signed), pairs summed to int16 (at most 2 x 128 x 127, no saturation)
// and to int32 lanes. Eight blocks per step: their lane sums are folded into one vector's eight lanes (a tree of
// vphaddd), converted once and multiplied by the eight blocks' xd x wd at once; a remainder of fewer than eight
// blocks is converted and scaled block by block.
KILN_Q8_AVX2 inline __m256i q8_lanes(__m256i wv, __m256i xv) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv)),
                           _mm256_set1_epi16(1));
}

template <int R>
KILN_Q8_AVX2 void dot_rows_avx2(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, const int8_t* w,
                                int64_t wstride, const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo) {
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += wstride, wd += nb, out += 1) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    prefetch_weights(wd, nb * 2, ahead);
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
      prefetch_weights(w + b * kQ8Block, 8 * kQ8Block, ahead);
      __m256i e[R], g[R], t[R];
      for (int c = 0; c < 4; ++c) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b + 2 * c) * kQ8Block));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b + 2 * c + 1) * kQ8Block));
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq + r * ldq + (b + 2 * c) * kQ8Block;
          const __m256i h = _mm256_hadd_epi32(q8_lanes(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))),
                                              q8_lanes(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kQ8Block))));
          if (c == 0 || c == 2) t[r] = h;
          else if (c == 1) e[r] = _mm256_hadd_epi32(t[r], h);
          else g[r] = _mm256_hadd_epi32(t[r], h);
        }
      }
      const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wd + b)));
      for (int r = 0; r < R; ++r) {
        // e: lanes 0-3 blocks b..b+3 over their first 16 values, lanes 4-7 over the last 16; g: b+4..b+7.
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(e[r], g[r], 0x20),
                                              _mm256_permute2x128_si256(e[r], g[r], 0x31));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_loadu_ps(xd + r * ldd + b), ws), acc[r]);
      }
    }
    for (; b < nb; ++b) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * kQ8Block));
      const float ws = _cvtsh_ss(wd[b]);
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * ldq + b * kQ8Block));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_lanes(wv, xv)), _mm256_set1_ps(xd[r * ldd + b] * ws), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * ldo] = hsum256(acc[r]);
  }
}

// Two blocks per 64-byte step (lanes 0-7 the first block's int32 partial sums, 8-15 the second's), vpdpbusd
// on |x| and w with x's sign; an odd last block takes the 256-bit form.
template <int R>
KILN_Q8_VNNI void dot_rows_vnni(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, const int8_t* w,
                                int64_t wstride, const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo) {
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += wstride, wd += nb, out += 1) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    prefetch_weights(wd, nb * 2, ahead);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      prefetch_weights(w + b * kQ8Block, 2 * kQ8Block, ahead);
      const __m512i wv = _mm512_loadu_si512(w + b * kQ8Block);
      const float w0 = _cvtsh_ss(wd[b]), w1 = _cvtsh_ss(wd[b + 1]);
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_loadu_si512(xq + r * ldq + b * kQ8Block);
        const __mmask64 neg = _mm512_movepi8_mask(xv);
        const __m512i sw = _mm512_mask_sub_epi8(wv, neg, _mm512_setzero_si512(), wv);
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xv), sw));
        const float* d = xd + r * ldd + b;
        const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[0] * w0)), _mm256_set1_ps(d[1] * w1), 1);
        acc[r] = _mm512_fmadd_ps(p, s, acc[r]);
      }
    }
    __m256 tail[R];
    for (int r = 0; r < R; ++r) tail[r] = _mm256_setzero_ps();
    if (b < nb) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * kQ8Block));
      const float w0 = _cvtsh_ss(wd[b]);
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * ldq + b * kQ8Block));
        const __mmask32 neg = _mm256_movepi8_mask(xv);
        const __m256i sw = _mm256_mask_sub_epi8(wv, neg, _mm256_setzero_si256(), wv);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(xv), sw));
        tail[r] = _mm256_mul_ps(p, _mm256_set1_ps(xd[r * ldd + b] * w0));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 lo = _mm512_castps512_ps256(acc[r]), hi = _mm512_extractf32x8_ps(acc[r], 1);
      out[r * ldo] = hsum256(_mm256_add_ps(_mm256_add_ps(lo, hi), tail[r]));
    }
  }
}

// Q4_0: the codes (0..15) as unsigned bytes against x (signed), so no sign juggling: sum (code - 8) x =
// sum code x - 8 sum x. The second term enters the integer sums themselves: each 32-bit lane of a dot product
// sums 4 consecutive bytes, and its accumulator starts at xn = -8 x (the sum of those 4 bytes of x), one int32
// per 4 activations computed once per row (q4_row_corrections). A block's 16 bytes unpack to
// [low nibbles | high nibbles], its codes 0..15 and 16..31 in order.

// Blocks b, b + 1: their 32 bytes -> [b lo | b hi | b+1 lo | b+1 hi] (64 codes).
KILN_Q8_VNNI inline __m512i q4_codes512(const uint8_t* w, int64_t b) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * (kQ8Block / 2)));
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m512i lo = _mm512_castsi256_si512(_mm256_and_si256(v, m));
  const __m512i hi = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(v, 4), m));
  return _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
}
// Block b: its 16 bytes -> [lo | hi] (32 codes).
KILN_Q8_AVX2 inline __m256i q4_codes256(const uint8_t* w, int64_t b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + b * (kQ8Block / 2)));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

template <int R>
KILN_Q8_VNNI void dot_rows_q4_vnni(const int8_t* xq, int64_t ldq, const float* xd, const int32_t* xn, int64_t ldd,
                                   const uint8_t* w, int64_t wstride, const uint16_t* wd, int64_t nb, int64_t nw,
                                   float* out, int64_t ldo) {
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += wstride, wd += nb, out += 1) {
    __m512 acc[R];
    __m256 tail[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), tail[r] = _mm256_setzero_ps();
    const int64_t ldn = ldq / 4;
    int64_t b = 0;
    // Eight blocks a step: their eight scales dx dw in one vector, each pair's spread over its 16 lanes by a
    // permute (no scalar conversions or broadcasts per block).
    const __m512i spread[4] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                               _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                               _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
                               _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
    prefetch_weights(wd, nb * 2, ahead);
    for (; b + 8 <= nb; b += 8) {
      prefetch_weights(w + b * (kQ8Block / 2), 8 * (kQ8Block / 2), ahead);
      __m512i cv[4];
      for (int j = 0; j < 4; ++j) cv[j] = q4_codes512(w, b + 2 * j);
      const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wd + b)));
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(ws, _mm256_loadu_ps(xd + r * ldd + b)));
        for (int j = 0; j < 4; ++j) {
          const int64_t bj = b + 2 * j;
          const __m512i xv = _mm512_loadu_si512(xq + r * ldq + bj * kQ8Block);
          const __m512i n = _mm512_loadu_si512(xn + r * ldn + bj * (kQ8Block / 4));
          const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(n, cv[j], xv));
          acc[r] = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(spread[j], s), acc[r]);
        }
      }
    }
    for (; b + 2 <= nb; b += 2) {
      const __m512i cv = q4_codes512(w, b);
      const float w0 = _cvtsh_ss(wd[b]), w1 = _cvtsh_ss(wd[b + 1]);
      for (int r = 0; r < R; ++r) {
        const __m512i xv = _mm512_loadu_si512(xq + r * ldq + b * kQ8Block);
        const __m512i n = _mm512_loadu_si512(xn + r * ldn + b * (kQ8Block / 4));
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(n, cv, xv));
        const float* d = xd + r * ldd + b;
        const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[0] * w0)), _mm256_set1_ps(d[1] * w1), 1);
        acc[r] = _mm512_fmadd_ps(p, s, acc[r]);
      }
    }
    if (b < nb) {
      const __m256i cv = q4_codes256(w, b);
      const float w0 = _cvtsh_ss(wd[b]);
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * ldq + b * kQ8Block));
        const __m256i n = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xn + r * ldn + b * (kQ8Block / 4)));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(n, cv, xv));
        tail[r] = _mm256_mul_ps(p, _mm256_set1_ps(xd[r * ldd + b] * w0));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 lo = _mm512_castps512_ps256(acc[r]), hi = _mm512_extractf32x8_ps(acc[r], 1);
      out[r * ldo] = hsum256(_mm256_add_ps(_mm256_add_ps(lo, hi), tail[r]));
    }
  }
}

// AVX2: vpmaddubsw on the unsigned codes and signed x (pairs at most 2 x 15 x 127: no saturation), vpmaddwd
// to 32-bit lanes of 4 bytes, plus xn.
template <int R>
KILN_Q8_AVX2 void dot_rows_q4_avx2(const int8_t* xq, int64_t ldq, const float* xd, const int32_t* xn, int64_t ldd,
                                   const uint8_t* w, int64_t wstride, const uint16_t* wd, int64_t nb, int64_t nw,
                                   float* out, int64_t ldo) {
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += wstride, wd += nb, out += 1) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t ldn = ldq / 4;
    prefetch_weights(wd, nb * 2, ahead);
    for (int64_t b = 0; b < nb; ++b) {
      if (b % 4 == 0) prefetch_weights(w + b * (kQ8Block / 2), 64, ahead);
      const __m256i cv = q4_codes256(w, b);
      const float ws = _cvtsh_ss(wd[b]);
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * ldq + b * kQ8Block));
        const __m256i n = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xn + r * ldn + b * (kQ8Block / 4)));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(cv, xv), ones), n));
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(xd[r * ldd + b] * ws), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * ldo] = hsum256(acc[r]);
  }
}

// q4k_factors with vector instructions: the 12 packed bytes unpacked into eight 6-bit scales and mins at once
// (ggml's kmask shuffle of four 32-bit words), each times d or dmin in f32 (the same products, so the same bits).
KILN_Q8_AVX2 inline void q4k_factors_avx2(const uint8_t* blk, __m256& vsc, __m256& vmn) {
  uint16_t dh, mh;
  std::memcpy(&dh, blk, 2);
  std::memcpy(&mh, blk + 2, 2);
  uint32_t u[4];
  std::memcpy(u, blk + 4, 12);
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);  // mins 4..7
  const uint32_t m03 = u[1] & k1;                          // mins 0..3
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);          // scales 4..7
  u[2] = m03;
  u[0] &= k1;  // scales 0..3
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  vsc = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
  vmn = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(mh)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))));
}

// Sub-blocks 2c and 2c + 1 of a Q4_K (Q5 false) or Q5_K super-block: the low and high nibbles of their 32
// bytes, Q5_K's with bits 2c and 2c + 1 of qh[l] as 16.
template <bool Q5>
KILN_Q8_AVX2 inline void k_pair_codes(const uint8_t* blk, int c, __m256i& lo, __m256i& hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (Q5 ? 48 : 16) + 32 * c));
  lo = _mm256_and_si256(v, m4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  if constexpr (Q5) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
  }
}

// Q4_K, VNNI: each 32 bytes of codes are a pair of sub-blocks, [low nibbles | high nibbles] in one 512-bit
// vector against 64 activations (the codes are unsigned: no correction), the pair's two d s_j x xd spread over
// their 8 lanes each; the mins go to a separate sum, dmin m_j x xs[b], eight sub-blocks at once.
template <int R, bool Q5>
KILN_Q8_VNNI void q4k_dot_rows_vnni(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd,
                                    const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  constexpr int64_t kBytes = Q5 ? kQ5KBytes : kQ4KBytes;
  const __m512i spread[4] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                             _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                             _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
                             _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += nsb * kBytes, out += 1) {
    __m512 acc[R];
    __m256 mins[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* blk = w + s * kBytes;
      prefetch_weights(blk, kBytes, ahead);
      __m256 vsc, vmn;
      q4k_factors_avx2(blk, vsc, vmn);
      __m512i cv[4];
      for (int c = 0; c < 4; ++c) {
        __m256i lo, hi;
        k_pair_codes<Q5>(blk, c, lo, hi);
        cv[c] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      }
      for (int r = 0; r < R; ++r) {
        const float* d = xd + r * ldd + s * 8;
        const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(vsc, _mm256_loadu_ps(d)));
        mins[r] = _mm256_fmadd_ps(vmn, _mm256_loadu_ps(xs + r * ldd + s * 8), mins[r]);
        for (int c = 0; c < 4; ++c) {
          const __m512i xv = _mm512_loadu_si512(xq + r * ldq + s * kQ4KBlock + 64 * c);
          const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), cv[c], xv));
          acc[r] = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(spread[c], sc), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 lo = _mm512_castps512_ps256(acc[r]), hi = _mm512_extractf32x8_ps(acc[r], 1);
      out[r * ldo] = hsum256(_mm256_add_ps(lo, hi)) - hsum256(mins[r]);
    }
  }
}

// Q4_K, AVX2: vpmaddubsw on the unsigned codes and signed x, vpmaddwd to 32-bit lanes; a block's eight
// sub-block sums are folded into one vector's eight lanes (a tree of vphaddd), converted once and multiplied by
// the eight factors d s_j x xd at once: one FMA a block rather than a chain of eight, which would bind the
// kernel below the memory's rate.
// Q5_K (Q5 true): the same with bit j of qh[l] as the fifth bit of sub-block j's codes (codes <= 31: the
// pairs of vpmaddubsw stay within int16).
template <int R, bool Q5>
KILN_Q8_AVX2 void q4k_dot_rows_avx2(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd,
                                    const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  constexpr int64_t kBytes = Q5 ? kQ5KBytes : kQ4KBytes;
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += nsb * kBytes, out += 1) {
    __m256 acc[R], mins[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* blk = w + s * kBytes;
      prefetch_weights(blk, kBytes, ahead);
      const int8_t* x = xq + s * kQ4KBlock;
      __m256i pair[R][4];  // pair[r][c]: sub-blocks 2c and 2c + 1, lanes summed two by two
      for (int c = 0; c < 4; ++c) {
        __m256i lo, hi;
        k_pair_codes<Q5>(blk, c, lo, hi);
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = x + r * ldq + 2 * c * kQ8Block;
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + kQ8Block));
          pair[r][c] = _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones),
                                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones));
        }
      }
      __m256 vsc, vmn;
      q4k_factors_avx2(blk, vsc, vmn);
      for (int r = 0; r < R; ++r) {
        // Lanes 0-3 of e: sub-blocks 0-3 over their first 16 codes, lanes 4-7 over the last 16; g for 4-7.
        const __m256i e = _mm256_hadd_epi32(pair[r][0], pair[r][1]), g = _mm256_hadd_epi32(pair[r][2], pair[r][3]);
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(e, g, 0x20), _mm256_permute2x128_si256(e, g, 0x31));
        const __m256 f = _mm256_mul_ps(vsc, _mm256_loadu_ps(xd + r * ldd + s * 8));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), f, acc[r]);
        mins[r] = _mm256_fmadd_ps(vmn, _mm256_loadu_ps(xs + r * ldd + s * 8), mins[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * ldo] = hsum256(acc[r]) - hsum256(mins[r]);
  }
}

// Q6_K, AVX2: per half super-block, the 6-bit codes of its four 32-value blocks from ql and qh by masks and
// shifts; vpmaddubsw of codes and x, vpmaddwd with the block's two scales (the low 128-bit lane holds its first
// 16 values; one byte shuffle of the half's scales picks them), the eight blocks' lane sums folded into one
// vector (vphaddd). The -32 offset enters once per super-block: 32 x the scales times the activations' sums
// per 16 values (xg), one vpmaddwd giving each block's correction in the folded order. Converted once and
// scaled by d x xd.
template <int R>
KILN_Q8_AVX2 void q6k_dot_rows_avx2(const int8_t* xq, int64_t ldq, const float* xd, const int16_t* xg, int64_t ldd,
                                    const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i h1 = _mm256_set1_epi8(0x03), h2 = _mm256_set1_epi8(0x0C), h3 = _mm256_set1_epi8(0x30),
                h4 = _mm256_set1_epi8(static_cast<char>(0xC0));
  // pick[q]: i16 scale 2q of a half in the low lane, 2q + 1 in the high lane, from [s0..s7 | s0..s7].
  __m256i pick[4];
  for (int q = 0; q < 4; ++q) {
    const char lo0 = static_cast<char>(4 * q), lo1 = static_cast<char>(4 * q + 1);
    const char hi0 = static_cast<char>(4 * q + 2), hi1 = static_cast<char>(4 * q + 3);
    pick[q] = _mm256_setr_epi8(lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1,
                               hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1);
  }
  const int64_t ldg = ldq / 16;
  const int64_t ahead = weight_prefetch_distance();
  for (int64_t row = 0; row < nw; ++row, w += nsb * kQ6KBytes, out += 1) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* blk = w + s * kQ6KBytes;
      prefetch_weights(blk, kQ6KBytes, ahead);
      const int8_t* x = xq + s * kQ6KBlock;
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      __m256i pair[R][4], t[R];
      for (int n = 0; n < 2; ++n) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * n));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * n + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * n));
        const __m256i codes[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, h1), 4)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, h2), 2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, h3)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_srli_epi16(_mm256_and_si256(qh, h4), 2))};
        // The half's eight scales as i16 in both 128-bit lanes.
        const __m128i half = n == 0 ? _mm256_castsi256_si128(sc16) : _mm256_extracti128_si256(sc16, 1);
        const __m256i sh = _mm256_set_m128i(half, half);
        for (int q = 0; q < 4; ++q) {
          const int b = 4 * n + q;
          const __m256i scv = _mm256_shuffle_epi8(sh, pick[q]);
          for (int r = 0; r < R; ++r) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * ldq + b * kQ8Block));
            const __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(codes[q], xv), scv);
            if (b % 2 == 0) t[r] = v;
            else pair[r][b / 2] = _mm256_hadd_epi32(t[r], v);
          }
        }
      }
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(static_cast<unsigned short>(blk[208] | (blk[209] << 8))));
      for (int r = 0; r < R; ++r) {
        const __m256i e = _mm256_hadd_epi32(pair[r][0], pair[r][1]), g = _mm256_hadd_epi32(pair[r][2], pair[r][3]);
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(e, g, 0x20), _mm256_permute2x128_si256(e, g, 0x31));
        // Block b's sum s_2b x (sum of its first 16 x) + s_2b+1 x (last 16), times 32.
        const __m256i gs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + r * ldg + s * 16));
        const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, gs), 5);
        const __m256 f = _mm256_mul_ps(d, _mm256_loadu_ps(xd + r * ldd + s * 8));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums, corr)), f, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * ldo] = hsum256(acc[r]);
  }
}

enum class Isa { Scalar, Avx2, Vnni };
Isa detect() {
  const bool avx2 = have_f16c();
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return Isa::Vnni;
  return avx2 ? Isa::Avx2 : Isa::Scalar;
}
std::atomic<int> limit{static_cast<int>(Isa::Vnni)};  // q8_limit_isa
Isa isa() {
  static const Isa i = detect();
  return static_cast<Isa>(std::min(static_cast<int>(i), limit.load(std::memory_order_relaxed)));
}
#endif

}  // namespace

void q8_quantize_row(const float* x, int64_t K, int8_t* q, float* d) {
  for (int64_t b = 0; b < K / kQ8Block; ++b) d[b] = quantize_block(x + b * kQ8Block, q + b * kQ8Block);
}

void q8_quantize_weight_row(const float* x, int64_t K, int8_t* q, uint16_t* d) {
  for (int64_t b = 0; b < K / kQ8Block; ++b) d[b] = f32_to_f16_bits(quantize_block(x + b * kQ8Block, q + b * kQ8Block));
}

namespace {
// The SIMD kernels are compiled for 1 to 4 rows: calls kernel(integral_constant<int, rows>).
template <class K>
bool with_rows(int rows, K kernel) {
  switch (rows) {
    case 1: kernel(std::integral_constant<int, 1>{}); return true;
    case 2: kernel(std::integral_constant<int, 2>{}); return true;
    case 3: kernel(std::integral_constant<int, 3>{}); return true;
    case 4: kernel(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}
}  // namespace

void q8_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, int rows, const int8_t* w,
                 const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo) {
  const int64_t ws = nb * kQ8Block;
#if KILN_Q8_X86
  const Isa i = isa();
  if (i == Isa::Vnni && with_rows(rows, [&](auto r) {
        dot_rows_vnni<decltype(r)::value>(xq, ldq, xd, ldd, w, ws, wd, nb, nw, out, ldo);
      }))
    return;
  if (i == Isa::Avx2 && with_rows(rows, [&](auto r) {
        dot_rows_avx2<decltype(r)::value>(xq, ldq, xd, ldd, w, ws, wd, nb, nw, out, ldo);
      }))
    return;
#endif
  dot_rows_scalar<WFormat::Q8>(xq, ldq, xd, ldd, rows, reinterpret_cast<const uint8_t*>(w), ws, wd, nb, nw, out, ldo);
}

void q4_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const int32_t* xn, int64_t ldd, int rows,
                 const uint8_t* w, const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo) {
  const int64_t ws = nb * kQ8Block / 2;
#if KILN_Q8_X86
  const Isa i = isa();
  if (i == Isa::Vnni && with_rows(rows, [&](auto r) {
        dot_rows_q4_vnni<decltype(r)::value>(xq, ldq, xd, xn, ldd, w, ws, wd, nb, nw, out, ldo);
      }))
    return;
  if (i == Isa::Avx2 && with_rows(rows, [&](auto r) {
        dot_rows_q4_avx2<decltype(r)::value>(xq, ldq, xd, xn, ldd, w, ws, wd, nb, nw, out, ldo);
      }))
    return;
#else
  (void)xn;
#endif
  dot_rows_scalar<WFormat::Q4>(xq, ldq, xd, ldd, rows, w, ws, wd, nb, nw, out, ldo);
}

void q4_row_corrections(const int8_t* xq, int64_t K, int32_t* xn) {
  for (int64_t j = 0; j < K / 4; ++j)
    xn[j] = -8 * (int32_t{xq[4 * j]} + int32_t{xq[4 * j + 1]} + int32_t{xq[4 * j + 2]} + int32_t{xq[4 * j + 3]});
}

void q4_quantize_weight_row(const float* x, int64_t K, uint8_t* q, uint16_t* d) {
  // llama.cpp's reference: the value of largest magnitude (with its sign) maps to -8, scale = it / -8,
  // q = min(15, trunc(x / scale + 8.5)), value = (q - 8) x scale.
  for (int64_t b = 0; b < K / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.f, max = 0.f;
    for (int i = 0; i < kQ8Block; ++i)
      if (std::fabs(xb[i]) > amax) {
        amax = std::fabs(xb[i]);
        max = xb[i];
      }
    const float sd = max / -8.f, id = std::fabs(sd) >= std::numeric_limits<float>::min() ? 1.f / sd : 0.f;
    const uint16_t dh = f32_to_f16_bits(sd);
    d[b] = dh;
    uint8_t* qb = q + b * (kQ8Block / 2);
    auto code = [&](float v) { return static_cast<uint8_t>(std::min(15, static_cast<int>(v * id + 8.5f))); };
    for (int j = 0; j < kQ8Block / 2; ++j)
      qb[j] = static_cast<uint8_t>(code(xb[j]) | (code(xb[j + kQ8Block / 2]) << 4));
  }
}

void q4_unpack_row(const uint8_t* q, const uint16_t* d, int64_t K, float* out) {
  int8_t wb[kQ8Block];
  for (int64_t b = 0; b < K / kQ8Block; ++b) {
    unpack_block<WFormat::Q4>(q, b, wb);
    const float s = f16_bits_to_f32(d[b]);
    for (int i = 0; i < kQ8Block; ++i) out[b * kQ8Block + i] = s * wb[i];
  }
}

namespace {
template <bool Q5>
void k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
#if KILN_Q8_X86
  const Isa i = isa();
  if (i == Isa::Vnni && with_rows(rows, [&](auto r) {
        q4k_dot_rows_vnni<decltype(r)::value, Q5>(xq, ldq, xd, xs, ldd, w, nsb, nw, out, ldo);
      }))
    return;
  if (i == Isa::Avx2 && with_rows(rows, [&](auto r) {
        q4k_dot_rows_avx2<decltype(r)::value, Q5>(xq, ldq, xd, xs, ldd, w, nsb, nw, out, ldo);
      }))
    return;
#endif
  q4k_dot_rows_scalar(xq, ldq, xd, xs, ldd, rows, w, nsb, nw, out, ldo, Q5);
}
}  // namespace

void q4k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  k_dot_rows<false>(xq, ldq, xd, xs, ldd, rows, w, nsb, nw, out, ldo);
}

void q5k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
  k_dot_rows<true>(xq, ldq, xd, xs, ldd, rows, w, nsb, nw, out, ldo);
}

void q4k_row_sums(const int8_t* xq, const float* xd, int64_t K, float* xs) {
  for (int64_t b = 0; b < K / kQ8Block; ++b) {
    int32_t s = 0;
    for (int64_t i = 0; i < kQ8Block; ++i) s += xq[b * kQ8Block + i];
    xs[b] = xd[b] * static_cast<float>(s);
  }
}

namespace {
// Round to nearest, ties to even, as ggml's nearest_int: adding 1.5 x 2^23 leaves the rounded integer in the
// low mantissa bits (exact for |v| < 2^22; std::nearbyint beyond, where the callers clamp anyway). A library
// call to nearbyint per value cost most of the quantiser's time on x86-64's baseline (no SSE4.1 roundss).
inline int nearest(float v) {
  if (!(std::fabs(v) < 4194304.f)) return static_cast<int>(std::clamp(std::nearbyint(v), -2147483520.f, 2147483520.f));
  const float t = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &t, sizeof(i));
  return (i & 0x007FFFFF) - 0x00400000;
}

// ggml's make_qkx2_quants: codes L in [0, nmax] and a scale and min (returned as -min in the_min) minimising
// the weighted squared error, over the grids iscale = (nmax + rmin + rdelta i) / (max - min), i = 0..nstep.
float qkx2_quants(int n, int nmax, const float* x, const float* wt, uint8_t* L, float* the_min, uint8_t* Laux,
                  float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = wt[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += wt[i];
    sum_x += wt[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min), scale = 1 / iscale, best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best += wt[i] * diff * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += wt[i] * static_cast<float>(l);
      sum_l2 += wt[i] * static_cast<float>(l * l);
      sum_xl += wt[i] * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        err += wt[i] * diff * diff;
      }
      if (err < best) {
        std::copy(Laux, Laux + n, L);
        best = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}
}  // namespace

void q4k_quantize_row(const float* x, int64_t K, uint8_t* out) {
  for (int64_t s = 0; s < K / kQ4KBlock; ++s, x += kQ4KBlock, out += kQ4KBytes) {
    uint8_t L[kQ4KBlock], Laux[32];
    float weights[32], scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t* sc = out + 4;
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = static_cast<uint8_t>(std::min(63, nearest(inv_scale * scales[j])));
      const uint8_t lm = static_cast<uint8_t>(std::min(63, nearest(inv_min * mins[j])));
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else {
        sc[j + 4] = static_cast<uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
        sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
    }
    const uint16_t dh = f32_to_f16_bits(max_scale / 63.f), mh = f32_to_f16_bits(max_min / 63.f);
    std::memcpy(out, &dh, 2);
    std::memcpy(out + 2, &mh, 2);
    for (int j = 0; j < 8; ++j) {
      int s6, m6;
      q4k_scale_min(j, sc, s6, m6);
      const float d = f16_bits_to_f32(dh) * static_cast<float>(s6);
      if (d == 0.f) continue;
      const float dm = f16_bits_to_f32(mh) * static_cast<float>(m6);
      for (int l = 0; l < 32; ++l) L[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest((x[32 * j + l] + dm) / d), 0, 15));
    }
    uint8_t* q = out + 16;
    for (int j = 0; j < kQ4KBlock; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

namespace {
void k_unpack_row(const uint8_t* w, int64_t K, float* out, bool q5) {
  const int64_t bytes = q5 ? kQ5KBytes : kQ4KBytes;
  for (int64_t s = 0; s < K / kQ4KBlock; ++s, w += bytes, out += kQ4KBlock) {
    float dsc[8], dmn[8];
    q4k_factors(w, dsc, dmn);
    for (int j = 0; j < 8; ++j) {
      uint8_t c[32];
      q4k_codes(w, j, c, q5);
      for (int l = 0; l < 32; ++l) out[32 * j + l] = dsc[j] * static_cast<float>(c[l]) - dmn[j];
    }
  }
}
}  // namespace

void q4k_unpack_row(const uint8_t* w, int64_t K, float* out) { k_unpack_row(w, K, out, false); }
void q5k_unpack_row(const uint8_t* w, int64_t K, float* out) { k_unpack_row(w, K, out, true); }

void q6k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const int16_t* xg, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo) {
#if KILN_Q8_X86
  if (isa() != Isa::Scalar && with_rows(rows, [&](auto r) {
        q6k_dot_rows_avx2<decltype(r)::value>(xq, ldq, xd, xg, ldd, w, nsb, nw, out, ldo);
      }))
    return;
#endif
  q6k_dot_rows_scalar(xq, ldq, xd, ldd, rows, w, nsb, nw, out, ldo);
}

void q6k_group_sums(const int8_t* xq, int64_t K, int16_t* xg) {
  for (int64_t g = 0; g < K / 16; ++g) {
    int32_t sum = 0;
    for (int i = 0; i < 16; ++i) sum += xq[g * 16 + i];
    xg[g] = static_cast<int16_t>(sum);
  }
}

void q6k_unpack_row(const uint8_t* w, int64_t K, float* out) {
  for (int64_t s = 0; s < K / kQ6KBlock; ++s, w += kQ6KBytes, out += kQ6KBlock) {
    const float d = q6k_d(w);
    for (int b = 0; b < 8; ++b) {
      uint8_t c[32];
      q6k_codes(w, b, c);
      const int8_t* sc = q6k_scales(w, b);
      // (d x scale) x q, as ggml's dequantize_row_q6_K multiplies.
      for (int l = 0; l < 32; ++l) out[32 * b + l] = d * static_cast<float>(sc[l / 16]) * static_cast<float>(int{c[l]} - 32);
    }
  }
}

bool q8_dot_takes(int64_t rows) {
#if KILN_Q8_X86
  if (isa() != Isa::Scalar) return true;
#endif
  return rows <= kQ8DotRows;
}

void q8_limit_isa(const char* name) {
#if KILN_Q8_X86
  const Isa i = std::strcmp(name, "scalar") == 0 ? Isa::Scalar : std::strcmp(name, "avx2") == 0 ? Isa::Avx2 : Isa::Vnni;
  limit.store(static_cast<int>(i), std::memory_order_relaxed);
#else
  (void)name;
#endif
}

const char* q8_isa() {
#if KILN_Q8_X86
  switch (isa()) {
    case Isa::Vnni: return "avx512-vnni";
    case Isa::Avx2: return "avx2";
    default: break;
  }
#endif
  return "scalar";
}

}  // namespace kiln::cpu
