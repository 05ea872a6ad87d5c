// Random Q5_K and Q6_K weights (kiln has no quantiser for them: GGUF files bring them): super-blocks of random
// bytes, in which every code, scale and min is valid, with the f16 factors drawn in a range. Shared by the CPU
// tests (tests/ops/quant_test.cpp), the CUDA ones and the MoE references (tests/ops/moe_ref.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>

#include "kiln/nn.h"

namespace kiln::test {

// N x K / 256 Q6_K super-blocks (210 bytes), d in [d_lo, d_hi].
inline Q6KWeight random_q6k(int64_t N, int64_t K, uint64_t seed, float d_lo = 1e-3f, float d_hi = 3e-3f) {
  std::mt19937_64 rng(seed);
  Tensor blocks = empty({N, K / 256 * 210}, DType::U8);
  uint8_t* b = blocks.data<uint8_t>();
  for (int64_t i = 0; i < blocks.numel(); ++i) b[i] = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> d(d_lo, d_hi);
  for (int64_t i = 0; i < N * (K / 256); ++i) {
    const uint16_t h = f32_to_f16_bits(d(rng));
    std::memcpy(b + i * 210 + 208, &h, 2);
  }
  return {blocks};
}

// N x K / 256 Q5_K super-blocks (176 bytes), d in [d_lo, d_hi] and dmin in [0, d_hi / 3].
inline Q5KWeight random_q5k(int64_t N, int64_t K, uint64_t seed, float d_lo = 1e-3f, float d_hi = 3e-3f) {
  std::mt19937_64 rng(seed);
  Tensor blocks = empty({N, K / 256 * 176}, DType::U8);
  uint8_t* b = blocks.data<uint8_t>();
  for (int64_t i = 0; i < blocks.numel(); ++i) b[i] = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> d(d_lo, d_hi), dmin(0.f, d_hi / 3);
  for (int64_t i = 0; i < N * (K / 256); ++i) {
    const uint16_t h[2] = {f32_to_f16_bits(d(rng)), f32_to_f16_bits(dmin(rng))};
    std::memcpy(b + i * 176, h, 4);
  }
  return {blocks};
}

}  // namespace kiln::test
