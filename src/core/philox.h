// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the mapping from
// its output words to kiln's random values. KILN_HD: the CPU and CUDA backends share this definition, so a
// seed gives the same numbers on both.
//
// ---- The kiln random stream (copied into docs/architecture.md) ------------------------------------------
// A Generator holds (seed, offset); every random op call takes the current offset and advances it by one.
// For a call with (seed, offset), element i of the output (its row-major index over the output's logical
// shape, whatever the strides) is a function of (seed, offset, i) only:
//   (w0, w1, w2, w3) = philox4x32_10(counter = {lo32(i), hi32(i), lo32(offset), hi32(offset)},
//                                    key     = {lo32(seed), hi32(seed)})
// and the value is
//   rand / uniform_, f32:      u = (w0 >> 8) * 2^-24                          in [0, 1), 24 bits
//                    f16:      u = (w0 >> 21) * 2^-11                         11 bits (f16's precision)
//                    bf16:     u = (w0 >> 24) * 2^-8                          8 bits (bf16's precision)
//                    f64:      u = ((u64(w0) << 21) ^ (w1 >> 11)) * 2^-53     53 bits
//     then x = u * (to - from) + from, computed in float (double for f64) and stored in the output dtype.
//     (f16/bf16 take only as many bits as they hold so that u itself converts exactly and rand() stays
//     below 1.0; with 24 bits, u = 1 - 2^-24 would round up to 1.0 in f16/bf16. PyTorch's CPU generator
//     does the same.)
//   randn / normal_: Box-Muller in double precision,
//     u1 = (w0 + 1) * 2^-32 in (0, 1],  u2 = w1 * 2^-32 in [0, 1),
//     z = sqrt(-2 ln u1) * cos(2 pi u2),  x = mean + std * z  (in double), rounded to the output dtype.
//     Working in double makes a float result (almost always) independent of the libm that computes log/cos,
//     so CPU and CUDA agree bit for bit for f32/f16/bf16 outputs.
//   randint [low, high): x = low + (u64(w0) | u64(w1) << 32) % (high - low), converted to the output dtype.
//     The modulo has a bias of at most range / 2^64 (negligible below 2^40 or so); PyTorch does the same.
// Words w2 and w3 are unused: one Philox call per element keeps element i independent of how the output is
// split among threads or CUDA blocks.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln {

struct PhiloxOut {
  uint32_t w[4];
};

KILN_HD void philox_mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  lo = static_cast<uint32_t>(p);
  hi = static_cast<uint32_t>(p >> 32);
#endif
}

// Random123's philox4x32 with 10 rounds.
KILN_HD PhiloxOut philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo32(kM0, c0, hi0, lo0);
    philox_mulhilo32(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// The four words for element `i` of a call with (seed, offset).
KILN_HD PhiloxOut philox_element(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox4x32_10(static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(offset),
                       static_cast<uint32_t>(offset >> 32), static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
}

// Uniform in [0, 1) with `bits` (<= 32) random bits from w0.
KILN_HD float philox_uniform_float(const PhiloxOut& o, int bits) {
  return static_cast<float>(o.w[0] >> (32 - bits)) * (1.0f / static_cast<float>(1u << bits));  // exact
}

KILN_HD double philox_uniform_double(const PhiloxOut& o) {
  const uint64_t x = (static_cast<uint64_t>(o.w[0]) << 21) ^ (o.w[1] >> 11);
  return static_cast<double>(x) * 1.1102230246251565404e-16;  // 2^-53
}

KILN_HD double philox_normal(const PhiloxOut& o) {
  const double u1 = (static_cast<double>(o.w[0]) + 1.0) * 2.3283064365386962890625e-10;  // (0, 1]
  const double u2 = static_cast<double>(o.w[1]) * 2.3283064365386962890625e-10;          // [0, 1)
  // Both backends evaluate the same double expression (no cospi on CUDA: it would round differently).
#if defined(__CUDA_ARCH__)
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925286766559 * u2);
#else
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925286766559 * u2);
#endif
}

KILN_HD uint64_t philox_u64(const PhiloxOut& o) {
  return static_cast<uint64_t>(o.w[0]) | (static_cast<uint64_t>(o.w[1]) << 32);
}

}  // namespace kiln
