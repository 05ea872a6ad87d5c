// Creation ops: arange, linspace, logspace, eye (and the existing empty/zeros/full), compared with values
// PyTorch 2.11 (CPU) produced for the same calls.
#include <cstring>
#include <functional>

#include "test_util.h"

namespace kiln {
namespace {

using test::equal;
using test::throws_error;


struct TorchCase {
  const char* name;
  std::function<Tensor()> make;
  DType dtype;
  std::vector<uint64_t> expected;  // float bits; integers as two's complement in the dtype's width
};

// Generated with torch 2.11.0 (CPU, AVX512 capability) by the expressions in each case; floats as bits.
const std::vector<TorchCase>& torch_cases() {
  static const std::vector<TorchCase> cases = {
#include "creation_torch_cases.inc"
  };
  return cases;
}

TEST(RangeFactories, MatchTorchBitForBit) {
  for (const auto& c : torch_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor t = c.make();
    ASSERT_EQ(t.dtype(), c.dtype);
    ASSERT_EQ(t.dim(), 1);
    ASSERT_EQ(t.numel(), static_cast<int64_t>(c.expected.size()));
    std::vector<uint64_t> want = c.expected;
    const size_t sz = itemsize(c.dtype);
    if (sz < 8)
      for (auto& w : want) w &= (uint64_t{1} << (8 * sz)) - 1;  // negative integers were written as values
    const auto got = test::raw_bits(t);
    const std::string name = c.name;
    if (name == "LinspaceF16" || name == "LinspaceBF16") {
      // Known deviation: PyTorch's f16/bf16 linspace kernel rounds differently from kiln's per-element
      // float formula by up to a few ulps in the interior (endpoints are exact): compare values.
      std::vector<uint16_t> wb(want.begin(), want.end());
      Tensor w = from_vector<uint16_t>(wb).view_as_dtype(c.dtype);
      EXPECT_TRUE(test::all_close(t, w, test::Tolerance{c.dtype == DType::F16 ? 4e-3 : 2e-2, 1e-2}));
      EXPECT_EQ(got.front(), want.front());
      EXPECT_EQ(got.back(), want.back());
      continue;
    }
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
  }
}

TEST(Arange, DefaultDtypes) {
  EXPECT_EQ(arange(5).dtype(), DType::I64);
  EXPECT_EQ(arange(5.0).dtype(), DType::F32);
  EXPECT_EQ(arange(0, 5, 1).dtype(), DType::I64);
  EXPECT_EQ(arange(0, 5, 0.5).dtype(), DType::F32);
  EXPECT_EQ(arange(0.0, 5, 1).dtype(), DType::F32);
  EXPECT_TRUE(equal(arange(4), from_vector<int64_t>({0, 1, 2, 3})));
  EXPECT_TRUE(equal(arange(10, 0, -3), from_vector<int64_t>({10, 7, 4, 1})));
}

TEST(Arange, LengthIsCeilOfDoubleQuotient) {
  // Reference: ceil((end - start) / step) in double, with the reference loop written here.
  const double cases[][3] = {{0, 1, 0.1}, {0, 1, 0.3}, {1, 2.5, 0.5}, {-1, 1, 0.25}, {0, 10, 3},
                             {5, -5, -1.5}, {0, 0.3, 0.1}, {0, 1e-3, 1e-4}};
  for (auto& c : cases) {
    const Tensor t = arange(c[0], c[1], c[2]);
    EXPECT_EQ(t.numel(), static_cast<int64_t>(std::ceil((c[1] - c[0]) / c[2]))) << c[0] << " " << c[1] << " " << c[2];
    const Tensor d = arange(c[0], c[1], c[2], DType::F64);
    const auto v = d.to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], c[0] + c[2] * static_cast<double>(i), 1e-12);
  }
  EXPECT_EQ(arange(0, 0, 1).numel(), 0);
  EXPECT_EQ(arange(3.0, 3.0, -1).numel(), 0);
  // Integer output: length from the int64 formula on truncated values (0.5 -> 0), as PyTorch.
  EXPECT_EQ(arange(0.5, 5.0, 1, DType::I64).numel(), 5);
}

TEST(Arange, LongRangeIsIndependentOfThreads) {
  const int64_t n = 100003;
  const Tensor a = arange(0, n, 1, DType::F32);
  ASSERT_EQ(a.numel(), n);
  const auto v = a.to_vector<float>();
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(v[static_cast<size_t>(i)], static_cast<float>(i));
  const Tensor b = arange(-7, 3 * n, 3, DType::I32);
  const auto w = b.to_vector<int32_t>();
  for (size_t i = 0; i < w.size(); i += 1013) EXPECT_EQ(w[i], -7 + 3 * static_cast<int32_t>(i));
}

TEST(Arange, InvalidCallsThrow) {
  EXPECT_TRUE(throws_error([] { arange(0, 1, 0); }, {"arange", "step must be nonzero"}));
  EXPECT_TRUE(throws_error([] { arange(0, 10, 0.5, DType::I32); }, {"arange", "step must be nonzero"}));
  EXPECT_TRUE(throws_error([] { arange(0, -1, 1); }, {"arange", "inconsistent with step sign"}));
  EXPECT_TRUE(throws_error([] { arange(0.0, 1.0, -0.1); }, {"arange", "inconsistent with step sign"}));
  EXPECT_TRUE(throws_error([] { arange(0.0, INFINITY, 1.0); }, {"arange", "unsupported range"}));
  EXPECT_TRUE(throws_error([] { arange(NAN, 1.0, 1.0); }, {"arange", "unsupported range"}));
  EXPECT_TRUE(throws_error([] { arange(0.0, 1e30, 1e-30); }, {"arange", "invalid size"}));
  // Within int64 but far beyond any memory: an error, not an allocation attempt.
  EXPECT_TRUE(throws_error([] { arange(0.0, 1e18, 1.0); }, {"arange", "too large"}));
  EXPECT_TRUE(throws_error([] { arange(0, 10, 1, DType::Bool); }, {"arange", "bool", "not supported"}));
  // Without a usable GPU the op names itself and CUDA (tests/cuda/index_test.cpp covers the GPU path).
  if (!cuda_available())
    EXPECT_TRUE(throws_error([] { arange(0, 10, 1, DType::F32, cuda_device(0)); }, {"arange", "CUDA"}));
}

TEST(Linspace, EndpointsAreExactAndSymmetric) {
  for (int64_t steps : {2, 3, 7, 10, 33, 100, 1001}) {
    for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
      const double s = -3.3, e = 7.1;
      const Tensor t = linspace(s, e, steps, dt);
      const auto v = t.to_vector<double>();
      EXPECT_EQ(v.front(), Tensor(scalar_tensor(s, dt)).item<double>());
      EXPECT_EQ(v.back(), Tensor(scalar_tensor(e, dt)).item<double>());
      // Against the exact value, within the dtype's tolerance plus one step of rounding in the step itself.
      const auto tol = test::default_tolerance(dt);
      for (int64_t i = 0; i < steps; ++i) {
        const double ref = s + (e - s) * static_cast<double>(i) / static_cast<double>(steps - 1);
        EXPECT_NEAR(v[static_cast<size_t>(i)], ref, 4 * (tol.atol + tol.rtol * 10.0)) << i << " of " << steps;
      }
    }
  }
}

TEST(Linspace, SmallAndEmpty) {
  EXPECT_EQ(linspace(0, 1, 0).numel(), 0);
  const Tensor one = linspace(2.5, 7.0, 1);
  ASSERT_EQ(one.numel(), 1);
  EXPECT_EQ(one.to_vector<float>()[0], 2.5f);
  EXPECT_TRUE(equal(linspace(3, 3, 4, DType::I64), from_vector<int64_t>({3, 3, 3, 3})));
  EXPECT_TRUE(equal(linspace(0, 1, 2, DType::F64), from_vector<double>({0.0, 1.0})));
}

TEST(Linspace, InvalidCallsThrow) {
  EXPECT_TRUE(throws_error([] { linspace(0, 1, -1); }, {"linspace", "non-negative", "-1"}));
  EXPECT_TRUE(throws_error([] { linspace(-2.7, 9.9, 6, DType::U8); }, {"linspace", "uint8", "overflow"}));
  EXPECT_TRUE(throws_error([] { linspace(0, 1, 5, DType::C64); }, {"linspace", "complex64", "not supported"}));
  EXPECT_TRUE(throws_error([] { logspace(0, 1, -3); }, {"logspace", "non-negative"}));
  EXPECT_TRUE(throws_error([] { logspace(0, 1, 3, 10.0, DType::F8E4M3); }, {"logspace", "float8_e4m3fn"}));
}

TEST(Logspace, IsBasePowLinspace) {
  for (double base : {2.0, 10.0, 0.5, 3.0}) {
    const Tensor t = logspace(-1.5, 2.5, 17, base, DType::F64);
    const auto v = t.to_vector<double>();
    for (int i = 0; i < 17; ++i) EXPECT_NEAR(v[i], std::pow(base, -1.5 + 0.25 * i), 1e-12 * v[i]);
  }
  EXPECT_TRUE(equal(logspace(0, 6, 7, 2.0, DType::I32), from_vector<int32_t>({1, 2, 4, 8, 16, 32, 64})));
}

TEST(Eye, SquareRectangularAndEmpty) {
  for (DType dt : {DType::F32, DType::I64, DType::Bool, DType::BF16, DType::C64, DType::F8E5M2}) {
    for (auto [n, m] : {std::pair<int64_t, int64_t>{3, 3}, {2, 5}, {5, 2}, {0, 4}, {1, 1}}) {
      const Tensor t = eye(n, m, dt);
      ASSERT_EQ(t.sizes(), (Shape{n, m}));
      ASSERT_EQ(t.dtype(), dt);
      const auto v = t.to(DType::F64).to_vector<double>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) EXPECT_EQ(v[static_cast<size_t>(i * m + j)], i == j ? 1.0 : 0.0);
    }
  }
  EXPECT_EQ(eye(4).sizes(), (Shape{4, 4}));
  EXPECT_TRUE(throws_error([] { eye(-1); }, {"eye", "n must be greater or equal to 0", "-1"}));
  EXPECT_TRUE(throws_error([] { eye(2, -3); }, {"eye", "m must be", "-3"}));
}

}  // namespace
}  // namespace kiln
