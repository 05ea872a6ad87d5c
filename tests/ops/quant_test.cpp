// Q8_0, Q4_0 and Q4_K weights (kiln/nn.h: Q8Weight, Q4Weight, Q4KWeight): quantisation against the formats'
// definitions written here, dequantisation (Q4_K: against gguf-py's reading of a GGUF file), and linear on every
// instruction-set path against double-precision references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/q8_dot.h"
#include "kiln/gguf.h"
#include "kiln/io.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kblocks_random.h"
#include "test_util.h"

using namespace kiln;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor from(const std::vector<float>& v, Shape shape) {
  Tensor t = empty(shape, DType::F32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// The format's definition: per block of 32, d = max|x| / 127, q = round(x / d) half away from zero (x * (1 / d),
// as llama.cpp's reference), the scale stored as f16.
struct RefBlock {
  int8_t q[32];
  float d;  // f32 before the f16 rounding
};
RefBlock ref_quantize(const float* x) {
  RefBlock b;
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  b.d = amax / 127.f;
  const float id = b.d != 0.f ? 1.f / b.d : 0.f;
  for (int i = 0; i < 32; ++i) b.q[i] = static_cast<int8_t>(std::round(x[i] * id));
  return b;
}

const char* const kIsas[] = {"scalar", "avx2", "avx512-vnni"};

struct IsaScope {
  explicit IsaScope(const char* isa) { cpu::q8_limit_isa(isa); }
  ~IsaScope() { cpu::q8_limit_isa("avx512-vnni"); }
};

}  // namespace

TEST(Q8, QuantiseMatchesTheFormatAndDequantisesExactly) {
  const int64_t N = 7, K = 96;
  std::vector<float> w = random_values(N * K, 1, 3.f);
  // A block of zeros, a block with a single large value, values at the rounding midpoint.
  for (int i = 0; i < 32; ++i) w[static_cast<size_t>(32 + i)] = 0.f;
  w[static_cast<size_t>(K + 5)] = 1e4f;
  for (int i = 0; i < 32; ++i) w[static_cast<size_t>(2 * K + i)] = (i - 16) * 0.5f + (i == 31 ? 15.5f * 127 / 16 : 0.f);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor wt = from(w, {N, K}).to(dt);
    const Q8Weight q = quantize_q8_0(wt);
    ASSERT_EQ(q.values.dtype(), DType::I8);
    ASSERT_EQ(q.scales.dtype(), DType::F16);
    ASSERT_EQ(q.scales.sizes(), Shape({N, K / 32}));
    const Tensor wf = wt.to(DType::F32);
    const Tensor deq = dequantize_q8_0(q);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < K / 32; ++b) {
        const RefBlock r = ref_quantize(wf.data<float>() + n * K + b * 32);
        const uint16_t bits = static_cast<const uint16_t*>(q.scales.data_ptr())[n * (K / 32) + b];
        ASSERT_EQ(bits, f32_to_f16_bits(r.d)) << "row " << n << " block " << b;
        for (int i = 0; i < 32; ++i) {
          ASSERT_EQ(q.values.data<int8_t>()[n * K + b * 32 + i], r.q[i]) << "row " << n << " block " << b << " " << i;
          ASSERT_EQ(deq.data<float>()[n * K + b * 32 + i], f16_bits_to_f32(bits) * r.q[i]);
        }
      }
    // Each value within half a step of its block's scale (plus the scale's f16 rounding).
    const Tensor err = abs(sub(deq, wf));
    EXPECT_LT(amax(err).item<float>(), 1e4f / 127.f * 0.51f);
    EXPECT_EQ(dequantize_q8_0(q, DType::BF16).dtype(), DType::BF16);
  }
}

// Dequantised Q8_0 quantises back to the same bytes (how a Q8_0 GGUF file's layers load as Q8_0).
// The activations' quantisation rounds half away from zero, as lround: exact halves of both signs (a block
// whose largest magnitude is 127 has scale 1), the floats next to them, and random blocks.
TEST(Q8, ActivationQuantisationRoundsAsLround) {
  std::vector<float> x;
  for (int k = -126; k <= 126; ++k) {
    const float h = static_cast<float>(k) + (k < 0 ? -0.5f : 0.5f);
    x.insert(x.end(), {h, std::nextafter(h, 0.f), std::nextafter(h, 1000.f * h)});
  }
  while (x.size() % 31 != 0) x.push_back(0.25f);
  std::vector<float> blocks;  // each block: 127 first, then 31 of the values above
  for (size_t i = 0; i < x.size(); i += 31) {
    blocks.push_back(127.f);
    blocks.insert(blocks.end(), x.begin() + static_cast<std::ptrdiff_t>(i), x.begin() + static_cast<std::ptrdiff_t>(i + 31));
  }
  std::mt19937 gen(static_cast<unsigned>(test::rng()()));
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 32 * 64; ++i) blocks.push_back(nd(gen));
  const int64_t K = static_cast<int64_t>(blocks.size());
  std::vector<int8_t> q(blocks.size());
  std::vector<float> d(blocks.size() / 32);
  cpu::q8_quantize_row(blocks.data(), K, q.data(), d.data());
  int bad = 0;
  for (int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(blocks[static_cast<size_t>(b * 32 + i)]));
    const float id = 1.f / (amax / 127.f);
    ASSERT_EQ(d[static_cast<size_t>(b)], amax / 127.f);
    for (int i = 0; i < 32; ++i) {
      const float v = blocks[static_cast<size_t>(b * 32 + i)] * id;
      if (q[static_cast<size_t>(b * 32 + i)] != static_cast<int8_t>(std::lround(v)) && ++bad <= 10)
        ADD_FAILURE() << "block " << b << ": " << v << " -> " << int(q[static_cast<size_t>(b * 32 + i)]);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Q8, RequantisingTheDequantisedWeightIsLossless) {
  const Q8Weight q = quantize_q8_0(from(random_values(16 * 256, 21, 0.1f), {16, 256}));
  const Q8Weight r = quantize_q8_0(dequantize_q8_0(q));
  EXPECT_TRUE(test::equal(r.values, q.values));
  EXPECT_TRUE(test::equal(r.scales, q.scales));
}

// linear(x, W) against double-precision references: where cpu::q8_dot_takes the row count (any count on the
// AVX2 and AVX-512 paths, up to 16 rows on the scalar one), x quantised per block as the Q8_0 format defines,
// times the dequantised weight (only the f32 sums' order differs); otherwise x as it is. Every
// instruction-set path this CPU has, odd block counts (the 512-bit kernels' tails), 1 to 70 rows, 70 weight
// rows, with and without bias, f32 and bf16 activations.
template <class W, class Quantize, class Dequantize>
void check_linear_paths(Quantize quantize, Dequantize dequantize,
                        // 352: 11 blocks (the 8-block step, then a pair, then the tail)
                        std::vector<int64_t> Ks = {32, 96, 352, 1024}) {
  const int64_t N = 70;  // more than one 64-row chunk of a kernel call
  for (int64_t K : Ks) {
    const std::vector<float> w = random_values(N * K, 2 + K, 0.05f);
    const W q = quantize(from(w, {N, K}));
    const Tensor wd = dequantize(q);
    const std::vector<float> bias = random_values(N, 3);
    for (const char* isa : kIsas) {
      IsaScope scope(isa);
      for (int64_t M : {1, 2, 3, 4, 5, 16, 17, 40, 70})  // 70: two tiles of 64 activation rows
        for (bool with_bias : {false, true})
          for (DType dt : {DType::F32, DType::BF16}) {
            const Tensor x = from(random_values(M * K, 4 + M), {M, K}).to(dt);
            const std::optional<Tensor> b = with_bias ? std::optional<Tensor>(from(bias, {N}).to(dt)) : std::nullopt;
            const Tensor y = linear(x, q, b).to(DType::F32);
            ASSERT_EQ(y.sizes(), Shape({M, N}));
            const Tensor xf = x.to(DType::F32);
            for (int64_t m = 0; m < M; ++m) {
              std::vector<double> xr(static_cast<size_t>(K));
              for (int64_t bk = 0; bk < K / 32; ++bk) {
                const float* src = xf.data<float>() + m * K + bk * 32;
                const RefBlock r = ref_quantize(src);
                for (int i = 0; i < 32; ++i)
                  xr[static_cast<size_t>(bk * 32 + i)] = cpu::q8_dot_takes(M) ? double(r.d) * r.q[i] : double(src[i]);
              }
              for (int64_t n = 0; n < N; ++n) {
                double ref = with_bias ? double(b->to(DType::F32).data<float>()[n]) : 0.0, mag = 0.0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = xr[static_cast<size_t>(k)] * double(wd.data<float>()[n * K + k]);
                  ref += p;
                  mag += std::fabs(p);
                }
                const double tol = (dt == DType::BF16 ? 8e-3 : 2e-6) * (mag + std::fabs(ref)) + 1e-6;
                ASSERT_NEAR(y.data<float>()[m * N + n], ref, tol)
                    << isa << " K " << K << " M " << M << " n " << n << " bias " << with_bias << " " << dtype_name(dt);
              }
            }
          }
    }
  }
}

TEST(Q8, LinearMatchesReferencesOnEveryPath) {
  check_linear_paths<Q8Weight>([](const Tensor& w) { return quantize_q8_0(w); },
                               [](const Q8Weight& q) { return dequantize_q8_0(q); });
}

TEST(Q8, LinearIsCloseToTheUnquantisedProduct) {
  const int64_t N = 64, K = 512;
  const Tensor w = from(random_values(N * K, 9, 0.05f), {N, K}), x = from(random_values(3 * K, 10), {3, K});
  const Tensor y = linear(x, quantize_q8_0(w)), ref = linear(x, w);
  // Two int8 roundings of |relative| <= 1/254 each per element: a few parts in a thousand of the row's scale.
  const float scale = amax(abs(ref)).item<float>();
  EXPECT_LT(amax(abs(sub(y, ref))).item<float>(), 0.02f * scale);
  EXPECT_GT(amax(abs(sub(y, ref))).item<float>(), 0.f);  // quantised, not the float product
}

TEST(Q8, NonFiniteActivationsGiveNan) {
  const int64_t N = 4, K = 64;
  const Q8Weight q = quantize_q8_0(from(random_values(N * K, 11), {N, K}));
  std::vector<float> xv = random_values(K, 12);
  xv[40] = std::nanf("");
  const Tensor y = linear(from(xv, {1, K}), q);
  for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(y.data<float>()[n]));
  for (const char* isa : kIsas) {  // Q4_0 too, on every path
    IsaScope scope(isa);
    const Tensor y4 = linear(from(xv, {1, K}), quantize_q4_0(from(random_values(N * K, 11), {N, K})));
    for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(y4.data<float>()[n])) << isa;
  }
}

TEST(Q8, BadArgumentsAreErrors) {
  const Tensor w = from(random_values(4 * 64, 13), {4, 64});
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q8_0(from(random_values(4 * 40, 14), {4, 40})); }, {"multiple of the block size"}));
  std::vector<float> bad = random_values(4 * 64, 15);
  bad[7] = INFINITY;
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q8_0(from(bad, {4, 64})); }, {"NaN or infinite"}));
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q8_0(w.to(DType::I32)); }, {"f32/f16/bf16"}));
  const Q8Weight q = quantize_q8_0(w);
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(2 * 32, 16), {2, 32}), q); }, {"expects 64"}));
  EXPECT_TRUE(test::throws_error(
      [&] { (void)linear(from(random_values(64, 17), {1, 64}), q, from(random_values(3, 18), {3})); }, {"bias must be [4]"}));
  Q8Weight wrong = q;
  wrong.scales = q.scales.to(DType::F32);
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(64, 19), {1, 64}), wrong); }, {"scales must be f16"}));
  wrong = q;
  wrong.values = q.values.to(DType::I32);
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q8_0(wrong); }, {"values must be int8"}));
}

// ---- Q4_0 ----

namespace {
// The format's definition (llama.cpp's reference): per block of 32, the value of largest magnitude m (the first
// such), d = m / -8, code = min(15, trunc(x / d + 8.5)) with x / d as x * (1 / d), value = (code - 8) x f16(d).
struct RefBlock4 {
  uint8_t code[32];
  float d;
};
RefBlock4 ref_quantize4(const float* x) {
  RefBlock4 b;
  float amax = 0.f, m = 0.f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), m = x[i];
  b.d = m / -8.f;
  const float id = b.d != 0.f ? 1.f / b.d : 0.f;
  for (int i = 0; i < 32; ++i) b.code[i] = static_cast<uint8_t>(std::min(15, static_cast<int>(x[i] * id + 8.5f)));
  return b;
}
}  // namespace

TEST(Q4, QuantiseMatchesTheFormatAndDequantisesExactly) {
  const int64_t N = 5, K = 96;
  std::vector<float> w = random_values(N * K, 31, 2.f);
  for (int i = 0; i < 32; ++i) w[static_cast<size_t>(32 + i)] = 0.f;  // a block of zeros
  w[static_cast<size_t>(K + 3)] = -50.f;                              // a block with a large negative value
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor wt = from(w, {N, K}).to(dt);
    const Q4Weight q = quantize_q4_0(wt);
    ASSERT_EQ(q.values.dtype(), DType::U8);
    ASSERT_EQ(q.values.sizes(), Shape({N, K / 2}));
    ASSERT_EQ(q.scales.sizes(), Shape({N, K / 32}));
    const Tensor wf = wt.to(DType::F32);
    const Tensor deq = dequantize_q4_0(q);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < K / 32; ++b) {
        const RefBlock4 r = ref_quantize4(wf.data<float>() + n * K + b * 32);
        const uint16_t bits = static_cast<const uint16_t*>(q.scales.data_ptr())[n * (K / 32) + b];
        ASSERT_EQ(bits, f32_to_f16_bits(r.d)) << "row " << n << " block " << b;
        const uint8_t* bytes = q.values.data<uint8_t>() + n * (K / 2) + b * 16;
        for (int j = 0; j < 16; ++j) {
          ASSERT_EQ(bytes[j] & 0x0F, r.code[j]) << "row " << n << " block " << b << " " << j;
          ASSERT_EQ(bytes[j] >> 4, r.code[j + 16]) << "row " << n << " block " << b << " " << j + 16;
        }
        for (int i = 0; i < 32; ++i)
          ASSERT_EQ(deq.data<float>()[n * K + b * 32 + i], f16_bits_to_f32(bits) * (r.code[i] - 8));
      }
    // Each value within half a step of its block's scale (the largest block's step is 50 / 8).
    EXPECT_LT(amax(abs(sub(deq, wf))).item<float>(), 50.f / 8 * 0.51f);
  }
}

TEST(Q4, RequantisingTheDequantisedWeightIsLossless) {
  const Q4Weight q = quantize_q4_0(from(random_values(16 * 256, 32, 0.1f), {16, 256}));
  const Q4Weight r = quantize_q4_0(dequantize_q4_0(q));
  EXPECT_TRUE(test::equal(r.values, q.values));
  EXPECT_TRUE(test::equal(r.scales, q.scales));
}

TEST(Q4, LinearMatchesReferencesOnEveryPath) {
  check_linear_paths<Q4Weight>([](const Tensor& w) { return quantize_q4_0(w); },
                               [](const Q4Weight& q) { return dequantize_q4_0(q); });
}

TEST(Q4, LinearIsCloseToTheUnquantisedProduct) {
  const int64_t N = 64, K = 512;
  const Tensor w = from(random_values(N * K, 33, 0.05f), {N, K}), x = from(random_values(3 * K, 34), {3, K});
  const Tensor y = linear(x, quantize_q4_0(w)), ref = linear(x, w);
  // 4-bit weights: a step of max|w| / 8 per block, errors of a few percent of the row's scale.
  const float scale = amax(abs(ref)).item<float>();
  EXPECT_LT(amax(abs(sub(y, ref))).item<float>(), 0.15f * scale);
  EXPECT_GT(amax(abs(sub(y, ref))).item<float>(), 0.f);
}

TEST(Q4, BadArgumentsAreErrors) {
  const Q4Weight q = quantize_q4_0(from(random_values(4 * 64, 35), {4, 64}));
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(2 * 32, 36), {2, 32}), q); }, {"linear(q4_0)", "expects 64"}));
  Q4Weight wrong = q;
  wrong.values = q.values.to(DType::I8);
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q4_0(wrong); }, {"values must be uint8"}));
  wrong = q;
  wrong.scales = q.scales.narrow(1, 0, 1);
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(64, 37), {1, 64}), wrong); }, {"scales must be f16 [4, 2]"}));
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q4_0(from(random_values(4 * 40, 38), {4, 40})); }, {"multiple of the block size"}));
}

namespace {
// Q4_K's definition: per super-block, d and dmin (f16) and eight 6-bit (scale, min) pairs; value =
// d scale_j q - dmin min_j, sub-block j's codes in the low (even j) or high (odd j) nibbles of bytes 16 +
// 32 (j / 2) ..
double ref_q4k_value(const uint8_t* blk, int i) {
  const int j = i / 32, l = i % 32;
  const uint8_t* sc = blk + 4;
  int s, m;
  if (j < 4) {
    s = sc[j] & 63;
    m = sc[j + 4] & 63;
  } else {
    s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  const uint8_t byte = blk[16 + 32 * (j / 2) + l];
  const int q = j % 2 == 0 ? byte & 15 : byte >> 4;
  uint16_t dh, mh;
  std::memcpy(&dh, blk, 2);
  std::memcpy(&mh, blk + 2, 2);
  return double(f16_bits_to_f32(dh)) * s * q - double(f16_bits_to_f32(mh)) * m;
}
}  // namespace

// GGUF's Q4_K bytes (tests/data/gguf/types.gguf, whose values gguf-py read into types.ref.safetensors) are a
// Q4KWeight as they are: dequantise_q4_k gives those values.
TEST(Q4K, GgufBlocksDequantiseAsGgufPyReadsThem) {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/gguf/";
  const GgufFile f = GgufFile::open(dir + "types.gguf");
  const Tensor raw = f.raw("t.q4_k");
  ASSERT_EQ(raw.sizes(), Shape({2, 144}));
  const Tensor ref = SafetensorsFile::open(dir + "types.ref.safetensors").get("t.q4_k").to(DType::F32);
  EXPECT_TRUE(test::equal(dequantize_q4_k(Q4KWeight{raw}), ref.reshape({2, 256})));
  EXPECT_TRUE(test::equal(dequantize_q4_k(Q4KWeight{raw}, DType::BF16), ref.reshape({2, 256}).to(DType::BF16)));
}

TEST(Q4K, QuantiseGivesTheFormatAndStaysClose) {
  const int64_t N = 6, K = 512;
  std::vector<float> w = random_values(N * K, 41, 0.5f);
  for (int i = 0; i < 256; ++i) w[static_cast<size_t>(K + i)] = 0.f;               // a super-block of zeros
  for (int i = 0; i < 32; ++i) w[static_cast<size_t>(2 * K + i)] = 3.f + 0.01f * i;  // a positive sub-block
  w[static_cast<size_t>(3 * K + 7)] = -40.f;                                          // one large value
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor wt = from(w, {N, K}).to(dt), wf = wt.to(DType::F32);
    const Q4KWeight q = quantize_q4_k(wt);
    ASSERT_EQ(q.blocks.dtype(), DType::U8);
    ASSERT_EQ(q.blocks.sizes(), Shape({N, K / 256 * 144}));
    const Tensor deq = dequantize_q4_k(q);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const uint8_t* blk = q.blocks.data<uint8_t>() + n * (K / 256 * 144) + sb * 144;
        double max_err = 0, amax = 0;
        for (int i = 0; i < 256; ++i) {
          const double v = ref_q4k_value(blk, i), x = wf.data<float>()[n * K + sb * 256 + i];
          ASSERT_NEAR(deq.data<float>()[n * K + sb * 256 + i], v, 1e-5 * std::fabs(v) + 1e-6);
          max_err = std::max(max_err, std::fabs(v - x));
          amax = std::max(amax, std::fabs(x));
        }
        // 15 steps per sub-block, scales and mins at 6 bits: within a fifth of the super-block's largest |x|
        // (the block holding -40 is the widest).
        EXPECT_LE(max_err, 0.2 * amax + 1e-6) << "row " << n << " super-block " << sb;
      }
    // The zero super-block is exactly zero. A sub-block of positive values has min 0 (the format's mins only
    // subtract), so its 15 steps span [0, 3.31]: each value within about half a step (0.11) of its own.
    for (int i = 0; i < 256; ++i) EXPECT_EQ(deq.data<float>()[K + i], 0.f);
    for (int i = 0; i < 32; ++i) EXPECT_NEAR(deq.data<float>()[2 * K + i], 3.f + 0.01f * i, 0.13f);
  }
  // Typical weights: the root-mean-square error is a small fraction of the weights' (4.5 bits).
  const Tensor g = from(random_values(64 * 1024, 42, 0.02f), {64, 1024});
  const Tensor e = sub(dequantize_q4_k(quantize_q4_k(g)), g);
  const double rms_e = std::sqrt(mean(mul(e, e)).item<double>()), rms = std::sqrt(mean(mul(g, g)).item<double>());
  EXPECT_LT(rms_e, 0.1 * rms);
  EXPECT_GT(rms_e, 0.0);
}

TEST(Q4K, LinearMatchesReferencesOnEveryPath) {
  check_linear_paths<Q4KWeight>([](const Tensor& w) { return quantize_q4_k(w); },
                                [](const Q4KWeight& q) { return dequantize_q4_k(q); }, {256, 768, 2816});
}

TEST(Q4K, BadArgumentsAreErrors) {
  const Q4KWeight q = quantize_q4_k(from(random_values(4 * 256, 43), {4, 256}));
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(2 * 512, 44), {2, 512}), q); },
                                 {"linear(q4_k)", "expects 256"}));
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q4_k(Q4KWeight{q.blocks.narrow(1, 0, 100)}); },
                                 {"blocks must be uint8 [N, K / 256 x 144]"}));
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q4_k(Q4KWeight{q.blocks.to(DType::I8)}); }, {"blocks must be uint8"}));
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q4_k(from(random_values(4 * 96, 45), {4, 96})); },
                                 {"multiple of the super-block size 256"}));
  std::vector<float> bad = random_values(256, 46);
  bad[5] = NAN;
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_q4_k(from(bad, {1, 256})); }, {"NaN or infinite"}));
}


// ---- Q6_K ------------------------------------------------------------------------------------------------

namespace {
// Value i (0..255) of a Q6_K super-block from the format's definition (GGUF, ggml's block_q6_K): halves of 128
// values; in a half, value r = 32 q + l takes the low (q = 0, 1) or high (q = 2, 3) nibble of ql[l + 32 (q % 2)],
// the bit pair q of qh[l], and the scale of its 16 values, sc[2 q + l / 16].
double ref_q6k_value(const uint8_t* blk, int i) {
  const int n = i / 128, r = i % 128, q = r / 32, l = r % 32;
  const uint8_t* ql = blk + 64 * n;
  const uint8_t* qh = blk + 128 + 32 * n;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n);
  const int low = q < 2 ? (ql[l + 32 * (q % 2)] & 0x0F) : (ql[l + 32 * (q % 2)] >> 4);
  const int code = low | (((qh[l] >> (2 * q)) & 3) << 4);
  uint16_t dh;
  std::memcpy(&dh, blk + 208, 2);
  return double(f16_bits_to_f32(dh)) * sc[2 * q + l / 16] * (code - 32);
}

}  // namespace

// GGUF's Q6_K bytes (types.gguf, read by gguf-py into types.ref.safetensors) are a Q6KWeight as they are.
TEST(Q6K, GgufBlocksDequantiseAsGgufPyReadsThem) {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/gguf/";
  const GgufFile f = GgufFile::open(dir + "types.gguf");
  const Tensor raw = f.raw("t.q6_k");
  ASSERT_EQ(raw.sizes(), Shape({3, 210}));
  const Tensor ref = SafetensorsFile::open(dir + "types.ref.safetensors").get("t.q6_k").to(DType::F32);
  EXPECT_TRUE(test::equal(dequantize_q6_k(Q6KWeight{raw}), ref.reshape({3, 256})));
  EXPECT_TRUE(test::equal(dequantize_q6_k(Q6KWeight{raw}, DType::BF16), ref.reshape({3, 256}).to(DType::BF16)));
}

// Every value of N x 3 random super-blocks of `bytes` bytes against the format's transcription ref(block, i).
template <class W, class Random, class Deq, class Ref>
void check_dequantisation(Random random, Deq dequantize, Ref ref, int64_t bytes, uint64_t seed) {
  const int64_t N = 5, K = 768;
  const W q = random(N, K, seed);
  const Tensor deq = dequantize(q);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t sb = 0; sb < K / 256; ++sb) {
      const uint8_t* blk = q.blocks.template data<uint8_t>() + n * (K / 256 * bytes) + sb * bytes;
      for (int i = 0; i < 256; ++i) {
        const double v = ref(blk, i);
        ASSERT_NEAR(deq.template data<float>()[n * K + sb * 256 + i], v, 1e-6 * std::fabs(v) + 1e-9)
            << "row " << n << " super-block " << sb << " value " << i;
      }
    }
}

TEST(Q6K, DequantisationFollowsTheFormat) {
  check_dequantisation<Q6KWeight>([](int64_t n, int64_t k, uint64_t s) { return test::random_q6k(n, k, s); },
                                  [](const Q6KWeight& q) { return dequantize_q6_k(q); }, ref_q6k_value,
                                  210, 50);
}

TEST(Q6K, LinearMatchesReferencesOnEveryPath) {
  uint64_t seed = 60;
  check_linear_paths<Q6KWeight>([&](const Tensor& w) { return test::random_q6k(w.size(0), w.size(1), seed++); },
                                [](const Q6KWeight& q) { return dequantize_q6_k(q); }, {256, 768, 2816});
}

TEST(Q6K, BadArgumentsAreErrors) {
  const Q6KWeight q = test::random_q6k(4, 256, 61);
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(2 * 512, 62), {2, 512}), q); },
                                 {"linear(q6_k)", "expects 256"}));
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q6_k(Q6KWeight{q.blocks.narrow(1, 0, 100)}); },
                                 {"blocks must be uint8 [N, K / 256 x 210]"}));
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(256, 63), {1, 256}), Q6KWeight{q.blocks.to(DType::I8)}); },
                                 {"blocks must be uint8"}));
}

// ---- Q5_K ------------------------------------------------------------------------------------------------

namespace {
// Value i (0..255) of a Q5_K super-block from the format's definition (ggml's block_q5_K): f16 d and dmin, 12
// bytes of 6-bit scales and mins (Q4_K's packing), 32 bytes qh, 128 bytes of nibbles; sub-block j = i / 32 takes
// the low (even j) or high (odd j) nibble of qs[32 (j / 2) + l] and bit j of qh[l] as 16.
double ref_q5k_value(const uint8_t* blk, int i) {
  const int j = i / 32, l = i % 32;
  const uint8_t* sc = blk + 4;
  int s, m;
  if (j < 4) {
    s = sc[j] & 63;
    m = sc[j + 4] & 63;
  } else {
    s = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  const uint8_t byte = blk[48 + 32 * (j / 2) + l];
  const int q = ((j % 2 == 0) ? (byte & 0x0F) : (byte >> 4)) + (((blk[16 + l] >> j) & 1) ? 16 : 0);
  uint16_t dh, mh;
  std::memcpy(&dh, blk, 2);
  std::memcpy(&mh, blk + 2, 2);
  return double(f16_bits_to_f32(dh)) * s * q - double(f16_bits_to_f32(mh)) * m;
}

}  // namespace

TEST(Q5K, GgufBlocksDequantiseAsGgufPyReadsThem) {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/gguf/";
  const GgufFile f = GgufFile::open(dir + "types.gguf");
  const Tensor raw = f.raw("t.q5_k");
  ASSERT_EQ(raw.sizes(), Shape({2, 352}));
  const Tensor ref = SafetensorsFile::open(dir + "types.ref.safetensors").get("t.q5_k").to(DType::F32);
  EXPECT_TRUE(test::equal(dequantize_q5_k(Q5KWeight{raw}), ref.reshape({2, 512})));
}

TEST(Q5K, DequantisationFollowsTheFormat) {
  check_dequantisation<Q5KWeight>([](int64_t n, int64_t k, uint64_t s) { return test::random_q5k(n, k, s); },
                                  [](const Q5KWeight& q) { return dequantize_q5_k(q); }, ref_q5k_value,
                                  176, 70);
}

TEST(Q5K, LinearMatchesReferencesOnEveryPath) {
  uint64_t seed = 80;
  check_linear_paths<Q5KWeight>([&](const Tensor& w) { return test::random_q5k(w.size(0), w.size(1), seed++); },
                                [](const Q5KWeight& q) { return dequantize_q5_k(q); }, {256, 768, 2816});
}

TEST(Q5K, BadArgumentsAreErrors) {
  const Q5KWeight q = test::random_q5k(4, 256, 81);
  EXPECT_TRUE(test::throws_error([&] { (void)linear(from(random_values(2 * 512, 82), {2, 512}), q); },
                                 {"linear(q5_k)", "expects 256"}));
  EXPECT_TRUE(test::throws_error([&] { (void)dequantize_q5_k(Q5KWeight{q.blocks.narrow(1, 0, 100)}); },
                                 {"blocks must be uint8 [N, K / 256 x 176]"}));
}
