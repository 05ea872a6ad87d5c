// Random numbers: the Philox4x32-10 core against Random123's known-answer vectors, determinism, thread
// independence, statistics, dtypes and errors.
#include <omp.h>

#include "core/philox.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::throws_error;

// Random123 kat_vectors, "philox4x32 10" lines: counter (4 words), key (2 words) -> 4 words.
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const auto& k : kats) {
    const PhiloxOut o = philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(o.w[j], k.out[j]) << "word " << j;
  }
}

TEST(Philox, ElementCounterLayout) {
  // Element i, offset and seed land in the documented counter/key words.
  const uint64_t seed = 0x0123456789ABCDEFull, offset = 0xFEDCBA9876543210ull, i = 0x1122334455667788ull;
  const PhiloxOut a = philox_element(seed, offset, i);
  const PhiloxOut b = philox4x32_10(0x55667788u, 0x11223344u, 0x76543210u, 0xFEDCBA98u, 0x89ABCDEFu, 0x01234567u);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(a.w[j], b.w[j]);
}

TEST(Rand, SameSeedSameNumbersAndOffsetsAdvance) {
  Generator g1(42), g2(42);
  const Tensor a = rand({1000}, DType::F32, kCPU, &g1);
  const Tensor b = rand({1000}, DType::F32, kCPU, &g2);
  EXPECT_TRUE(test::equal(a, b));
  EXPECT_EQ(g1.offset(), 1u);
  const Tensor c = rand({1000}, DType::F32, kCPU, &g1);  // offset 1
  EXPECT_FALSE(test::equal(a, c));
  Generator g3(43);
  EXPECT_FALSE(test::equal(a, rand({1000}, DType::F32, kCPU, &g3)));
  // manual_seed on the default generator restarts its stream.
  manual_seed(7);
  const Tensor d = randn({64});
  manual_seed(7);
  EXPECT_TRUE(test::equal(d, randn({64})));
  EXPECT_EQ(default_generator().offset(), 1u);
}

TEST(Rand, ValuesFollowTheDocumentedStream) {
  Generator g(123);
  g.set_offset(5);
  const auto f = rand({300}, DType::F32, kCPU, &g).to_vector<float>();
  g.set_offset(5);
  const auto d = rand({300}, DType::F64, kCPU, &g).to_vector<double>();
  g.set_offset(5);
  const auto n = randn({300}, DType::F64, kCPU, &g).to_vector<double>();
  g.set_offset(5);
  const auto r = randint(-10, 1000, {300}, DType::I64, kCPU, &g).to_vector<int64_t>();
  for (uint64_t i = 0; i < 300; ++i) {
    const PhiloxOut o = philox_element(123, 5, i);
    EXPECT_EQ(f[i], static_cast<float>(o.w[0] >> 8) * 0x1p-24f);
    EXPECT_EQ(d[i], static_cast<double>((static_cast<uint64_t>(o.w[0]) << 21) ^ (o.w[1] >> 11)) * 0x1p-53);
    const double u1 = (o.w[0] + 1.0) * 0x1p-32, u2 = o.w[1] * 0x1p-32;
    EXPECT_EQ(n[i], std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    EXPECT_EQ(r[i], -10 + static_cast<int64_t>((o.w[0] | static_cast<uint64_t>(o.w[1]) << 32) % 1010));
  }
}

TEST(Rand, IndependentOfThreadCount) {
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> outs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Generator g(99);
    std::vector<double> all;
    for (const Tensor& t : {rand({100000}, DType::F32, kCPU, &g), randn({70001}, DType::F64, kCPU, &g),
                            randint(0, 1 << 20, {50000}, DType::I64, kCPU, &g)})
      for (double x : t.to_vector<double>()) all.push_back(x);
    outs.push_back(all);
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(outs[0] == outs[1]);
  EXPECT_TRUE(outs[0] == outs[2]);
}

// Mean and variance of n samples, in double.
std::pair<double, double> moments(const Tensor& t) {
  const auto v = t.to_vector<double>();
  double m = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return {m, s / static_cast<double>(v.size() - 1)};
}

TEST(Rand, UniformStatistics) {
  const int64_t n = 1000000;
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor t = rand({n}, dt);
    const auto [m, v] = moments(t);
    // mean 1/2 with standard error sqrt(1/12 / n) ~ 2.9e-4; 6 standard errors. bf16 keeps 8 bits, which
    // biases the mean by -2^-9 (values are multiples of 2^-8 in [0, 1 - 2^-8]); f16 by -2^-12.
    const double bias = dt == DType::BF16 ? -0x1p-9 : dt == DType::F16 ? -0x1p-12 : 0.0;
    EXPECT_NEAR(m, 0.5 + bias, 6 * std::sqrt(1.0 / 12 / n));
    EXPECT_NEAR(v, 1.0 / 12, 0.01 / 12 + (dt == DType::BF16 ? 1e-4 : 0));
    const auto vals = t.to_vector<double>();
    EXPECT_GE(*std::min_element(vals.begin(), vals.end()), 0.0);
    EXPECT_LT(*std::max_element(vals.begin(), vals.end()), 1.0);
  }
  Tensor u = empty({n}, DType::F64);
  uniform_(u, -3.0, 5.0);
  const auto [m, v] = moments(u);
  EXPECT_NEAR(m, 1.0, 6 * std::sqrt(64.0 / 12 / n));
  EXPECT_NEAR(v, 64.0 / 12, 0.05 * 64 / 12);
}

TEST(Randn, NormalStatisticsAndMeanStd) {
  const int64_t n = 1000000;
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto [m, v] = moments(randn({n}, dt));
    EXPECT_NEAR(m, 0.0, 6 * std::sqrt(1.0 / n));
    EXPECT_NEAR(v, 1.0, 6 * std::sqrt(2.0 / n) + (dt == DType::BF16 ? 5e-3 : 0));
  }
  Tensor t = empty({n}, DType::F32);
  normal_(t, 3.0, 0.5);
  const auto [m, v] = moments(t);
  EXPECT_NEAR(m, 3.0, 6 * 0.5 / std::sqrt(n));
  EXPECT_NEAR(v, 0.25, 6 * 0.25 * std::sqrt(2.0 / n));
  // std 0 gives exactly the mean.
  Tensor z = empty({100}, DType::F64);
  normal_(z, -1.5, 0.0);
  EXPECT_TRUE(test::equal(z, full({100}, -1.5, DType::F64)));
}

TEST(Randint, CoversRangeAndNeverHigh) {
  const Tensor t = randint(-3, 4, {200000});
  EXPECT_EQ(t.dtype(), DType::I64);
  std::vector<int64_t> counts(7, 0);
  for (int64_t x : t.to_vector<int64_t>()) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++counts[static_cast<size_t>(x + 3)];
  }
  // Each count ~ 200000/7 = 28571 with sd ~ 156.
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c), 200000.0 / 7, 6 * 156);
  const auto u8 = randint(250, 256, {5000}, DType::U8).to_vector<uint8_t>();
  EXPECT_EQ(*std::max_element(u8.begin(), u8.end()), 255);
  EXPECT_EQ(*std::min_element(u8.begin(), u8.end()), 250);
  const auto f = randint(0, 10, {1000}, DType::F32).to_vector<float>();
  for (float x : f) EXPECT_EQ(x, std::floor(x));
  const auto big = randint(INT64_MIN, INT64_MAX, {1000}).to_vector<int64_t>();  // range 2^64 - 1
  EXPECT_TRUE(std::any_of(big.begin(), big.end(), [](int64_t x) { return x < 0; }));
  const auto b = randint(0, 2, {1000}, DType::Bool).to(DType::I64).to_vector<int64_t>();
  EXPECT_TRUE(std::count(b.begin(), b.end(), 1) > 400 && std::count(b.begin(), b.end(), 1) < 600);
}

TEST(Random, NonContiguousFillsFollowLogicalOrder) {
  Generator g1(5), g2(5);
  Tensor base = empty({40, 30}, DType::F32);
  Tensor tv = base.t();  // [30, 40], transposed view
  uniform_(tv, 0.0, 1.0, &g1);
  const Tensor ref = rand({30, 40}, DType::F32, kCPU, &g2);
  EXPECT_TRUE(test::equal(tv.contiguous(), ref));
  EXPECT_EQ(rand({0, 3}).numel(), 0);
  EXPECT_EQ(randn({}).dim(), 0);
}

TEST(Random, InvalidCallsThrow) {
  EXPECT_TRUE(throws_error([] { randint(5, 5, {3}); }, {"randint", "low=5", "high=5"}));
  EXPECT_TRUE(throws_error([] { randint(7, 2, {3}); }, {"randint"}));
  EXPECT_TRUE(throws_error([] { randint(0, 300, {3}, DType::U8); }, {"randint", "uint8", "out of bounds"}));
  EXPECT_TRUE(throws_error([] { randint(-1, 3, {3}, DType::U64); }, {"randint", "uint64"}));
  EXPECT_TRUE(throws_error([] { randint(0, 3, {3}, DType::C64); }, {"randint", "complex64"}));
  EXPECT_TRUE(throws_error([] { rand({3}, DType::I64); }, {"rand", "int64", "not supported"}));
  EXPECT_TRUE(throws_error([] { randn({3}, DType::F8E4M3); }, {"randn", "float8_e4m3fn"}));
  Tensor i = zeros({3}, DType::I32);
  EXPECT_TRUE(throws_error([&] { uniform_(i); }, {"uniform_", "int32"}));
  Tensor f = zeros({3});
  EXPECT_TRUE(throws_error([&] { uniform_(f, 2.0, 1.0); }, {"uniform_", "from=2", "to=1"}));
  EXPECT_TRUE(throws_error([&] { normal_(f, 0.0, -1.0); }, {"normal_", "std", "-1"}));
  // Without a usable GPU the op names itself and CUDA (tests/cuda/index_test.cpp covers the GPU path).
  if (!cuda_available())
    EXPECT_TRUE(throws_error([] { rand({3}, DType::F32, cuda_device(0)); }, {"rand", "CUDA"}));
}

}  // namespace
}  // namespace kiln
