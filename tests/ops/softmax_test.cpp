// softmax / log_softmax against a direct double-precision reference; edge rows against values printed by
// PyTorch 2.11.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/nn.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const DType kFloats[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

// Reference: the plain formula in double along `dim` of x's values (row-major), as a f64 tensor.
Tensor reference(const Tensor& x, int64_t dim, bool log) {
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> out(v.size());
  if (x.dim() == 0) return from_vector<double>({log ? 0.0 : 1.0}, Shape{});
  if (dim < 0) dim += x.dim();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t n = x.size(dim);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return static_cast<size_t>((o * n + k) * inner + i); };
      double m = -kInf;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, v[at(k)]);
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += std::exp(v[at(k)] - m);
      for (int64_t k = 0; k < n; ++k)
        out[at(k)] = log ? v[at(k)] - m - std::log(s) : std::exp(v[at(k)] - m) / s;
    }
  return from_vector<double>(out, x.sizes());
}

void check_both(const Tensor& x, int64_t dim) {
  SCOPED_TRACE(x.meta() + " dim " + std::to_string(dim));
  const Tensor y = softmax(x, dim), ly = log_softmax(x, dim);
  EXPECT_EQ(y.dtype(), x.dtype());
  EXPECT_EQ(ly.dtype(), x.dtype());
  EXPECT_TRUE(all_close(y, reference(x, dim, false)));
  EXPECT_TRUE(all_close(ly, reference(x, dim, true)));
}

TEST(Softmax, MatchesReferenceForEveryDtypeAndDim) {
  for (DType t : kFloats)
    for (int64_t dim : {0, 1, 2, -1, -2, -3}) check_both(random_tensor({3, 5, 7}, t, -6, 6), dim);
}

TEST(Softmax, KnownValuesFromTorch) {
  // torch.softmax(torch.tensor([1., 2., 3.]), 0) and log_softmax.
  const Tensor x = from_vector<float>({1, 2, 3});
  EXPECT_TRUE(all_close(softmax(x, 0), from_vector<float>({0.09003057330846786f, 0.2447284758090973f,
                                                             0.6652409434318542f})));
  EXPECT_TRUE(all_close(log_softmax(x, 0), from_vector<float>({-2.4076058864593506f, -1.4076058864593506f,
                                                                 -0.40760594606399536f})));
  // float16 input: computed in f32, rounded once to f16 (torch gives exactly these).
  EXPECT_TRUE(equal(softmax(x.to(DType::F16), 0),
                    from_vector<float>({0.09002685546875f, 0.2447509765625f, 0.6650390625f}).to(DType::F16)));
  // torch's f16 log_softmax gives -0.407470703125 for the last; we round the exact -0.40760594 once, to
  // the nearer -0.40771484375 (torch rounds an intermediate to f16): equal within f16's tolerance.
  EXPECT_TRUE(all_close(log_softmax(x.to(DType::F16), 0),
                        from_vector<float>({-2.408203125f, -1.4072265625f, -0.407470703125f}).to(DType::F16)));
  EXPECT_TRUE(equal(softmax(x.to(DType::BF16), 0),
                    from_vector<float>({0.08984375f, 0.2451171875f, 0.6640625f}).to(DType::BF16)));
}

TEST(Softmax, LongRows) {
  for (DType t : kFloats) {
    check_both(random_tensor({1, 128256}, t, -10, 10), -1);
    check_both(random_tensor({4, 151936}, t, -10, 10), 1);
  }
  // Softmax outputs of a long row are ~1e-5, inside atol: check them relative to their size too (rtol of
  // f32 times 4 for the rounding of x - max over a range of 20 and of the f32 sum of 128256 terms).
  const Tensor x = random_tensor({1, 128256}, DType::F32, -10, 10);
  EXPECT_TRUE(all_close(softmax(x, 1), reference(x, 1, false), Tolerance{5e-6, 0}));
}

TEST(Softmax, ManyShortRows) {
  for (DType t : kFloats) {
    check_both(random_tensor({64, 32000}, t, -10, 10), -1);
    check_both(random_tensor({1000, 7}, t), 1);
    check_both(random_tensor({1000, 7}, t), 0);  // non-last dim with a large inner extent
  }
}

TEST(Softmax, LongRowSplitAcrossThreadsIsBitwiseTheSameAsOneThread) {
  // A single row is split over threads; the same row inside a batch is done by one thread. The partial
  // results combine in a fixed order, so both give identical bits.
  const Tensor batch = random_tensor({8, 128256}, DType::F32, -10, 10);
  for (bool log : {false, true}) {
    const Tensor all = log ? log_softmax(batch, 1) : softmax(batch, 1);
    const Tensor one = log ? log_softmax(batch.narrow(0, 3, 1), 1) : softmax(batch.narrow(0, 3, 1), 1);
    EXPECT_EQ(raw_bits(one), raw_bits(all.narrow(0, 3, 1).contiguous()));
    EXPECT_EQ(raw_bits(one), raw_bits(log ? log_softmax(batch.narrow(0, 3, 1), 1)
                                          : softmax(batch.narrow(0, 3, 1), 1)));
  }
}

TEST(Softmax, NonContiguousInput) {
  for (DType t : kFloats) {
    const Tensor tr = random_tensor({6, 9}, t).t();  // [9, 6], strides (1, 9)
    check_both(tr, 0);
    check_both(tr, 1);
    check_both(random_tensor({5, 12}, t).slice(1, 1, 11, 3), 1);
    check_both(random_tensor({4, 3, 5}, t).permute({2, 0, 1}), 1);
    // Broadcast (stride 0) along the reduced dim: every entry equal, softmax 1/n.
    const Tensor e = random_tensor({1, 6}, t).expand({4, 6});
    check_both(e, 0);
    EXPECT_TRUE(all_close(softmax(e, 0), full({4, 6}, 0.25, t)));
  }
  // A long non-last dim (strided rows through the split path).
  check_both(random_tensor({40000, 2}, DType::F32, -10, 10), 0);
}

TEST(Softmax, EdgeRowsAsTorch) {
  // torch.softmax / log_softmax of these rows (PyTorch 2.11):
  //   [inf, 1]   -> [nan, nan]   [nan, nan]
  //   [-inf,-inf]-> [nan, nan]   [nan, nan]
  //   [nan, 1]   -> [nan, nan]   [nan, nan]
  //   [-inf, 0]  -> [0, 1]       [-inf, 0]
  //   [inf, inf] -> [nan, nan]   [nan, nan]
  //   [-inf, inf]-> [nan, nan]   [nan, nan]
  const double nan = NAN;
  const std::vector<double> in = {kInf, 1, -kInf, -kInf, nan, 1, -kInf, 0, kInf, kInf, -kInf, kInf};
  const std::vector<double> sm = {nan, nan, nan, nan, nan, nan, 0, 1, nan, nan, nan, nan};
  const std::vector<double> lsm = {nan, nan, nan, nan, nan, nan, -kInf, 0, nan, nan, nan, nan};
  for (DType t : kFloats) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = from_vector<double>(in, Shape{6, 2}).to(t);
    EXPECT_TRUE(equal(softmax(x, 1), from_vector<double>(sm, Shape{6, 2}).to(t)));
    EXPECT_TRUE(equal(log_softmax(x, 1), from_vector<double>(lsm, Shape{6, 2}).to(t)));
    // The same rows along dim 0 (columns of the transpose).
    EXPECT_TRUE(equal(softmax(x.t(), 0), from_vector<double>(sm, Shape{6, 2}).to(t).t()));
  }
  // A NaN or +inf inside a long (thread-split) row poisons the whole row; -inf entries give exact 0.
  for (double bad : {nan, kInf}) {
    Tensor x = random_tensor({2, 100000}, DType::F32);
    x.select(0, 0).narrow(0, 77777, 1).fill_(bad);
    x.select(0, 1).narrow(0, 5, 10).fill_(-kInf);
    for (bool log : {false, true}) {
      const auto v = (log ? log_softmax(x, 1) : softmax(x, 1)).to_vector<double>();
      int64_t nans = 0;
      for (int64_t i = 0; i < 100000; ++i) nans += std::isnan(v[i]);
      EXPECT_EQ(nans, 100000);
      for (int64_t i = 100005; i < 100015; ++i) EXPECT_EQ(v[i], log ? -kInf : 0.0);
      EXPECT_TRUE(all_close(log ? log_softmax(x.select(0, 1), 0) : softmax(x.select(0, 1), 0),
                            reference(x.select(0, 1), 0, log)));
    }
  }
}

TEST(Softmax, ZeroDimIsOneAndLogIsZero) {
  for (DType t : kFloats) {
    const Tensor x = scalar_tensor(3.5, t);
    for (int64_t dim : {0, -1}) {
      const Tensor y = softmax(x, dim), ly = log_softmax(x, dim);
      EXPECT_EQ(y.dim(), 0);
      EXPECT_TRUE(equal(y, scalar_tensor(1.0, t)));
      EXPECT_TRUE(equal(ly, scalar_tensor(0.0, t)));
    }
  }
  EXPECT_TRUE(throws_error([] { softmax(scalar_tensor(1.0), 1); }, {"softmax", "dim 1", "out of range"}));
}

TEST(Softmax, ZeroSizeInput) {
  for (const Shape& s : {Shape{0, 5}, Shape{5, 0}, Shape{2, 0, 3}}) {
    const Tensor x = zeros(s, DType::BF16);
    for (int64_t dim = 0; dim < static_cast<int64_t>(s.size()); ++dim) {
      const Tensor y = softmax(x, dim), ly = log_softmax(x, dim, DType::F64);
      EXPECT_EQ(y.sizes(), s);
      EXPECT_EQ(y.dtype(), DType::BF16);
      EXPECT_EQ(ly.sizes(), s);
      EXPECT_EQ(ly.dtype(), DType::F64);
    }
  }
}

TEST(Softmax, DtypeOptionConvertsInputFirst) {
  // As PyTorch: x.to(dtype) then the op in that dtype (f32 -> f16 rounds the input to f16 first).
  const Tensor x = random_tensor({7, 33}, DType::F32, -8, 8);
  for (DType t : kFloats) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor y = softmax(x, 1, t), ly = log_softmax(x, 0, t);
    EXPECT_EQ(y.dtype(), t);
    EXPECT_EQ(ly.dtype(), t);
    EXPECT_TRUE(all_close(y, reference(x.to(t), 1, false)));
    EXPECT_TRUE(all_close(ly, reference(x.to(t), 0, true)));
  }
  // Integer input is fine with a floating dtype=.
  const Tensor xi = random_int_tensor({4, 9}, DType::I64, -5, 5);
  const Tensor yi = softmax(xi, 1, DType::F32);
  EXPECT_EQ(yi.dtype(), DType::F32);
  EXPECT_TRUE(all_close(yi, reference(xi, 1, false)));
  // f64 input to f32 computes in f32 on the f32-rounded input.
  const Tensor xd = random_tensor({3, 1000}, DType::F64, -30, 30);
  EXPECT_TRUE(all_close(log_softmax(xd, 1, DType::F32), reference(xd.to(DType::F32), 1, true)));
}

TEST(Softmax, InvalidCallsNameTheProblem) {
  const Tensor xi = from_vector<int64_t>({1, 2});
  EXPECT_TRUE(throws_error([&] { softmax(xi, 0); }, {"softmax", "int64", "not supported", "float32", "dtype="}));
  EXPECT_TRUE(throws_error([&] { log_softmax(xi, 0); }, {"log_softmax", "int64", "not supported"}));
  EXPECT_TRUE(throws_error([&] { softmax(from_vector<float>({1, 2}).to(DType::C64), 0); },
                           {"softmax", "complex64", "not supported"}));
  EXPECT_TRUE(throws_error([&] { softmax(zeros({2}).to(DType::F8E4M3), 0); },
                           {"softmax", "float8_e4m3fn", "not supported"}));
  EXPECT_TRUE(throws_error([&] { softmax(zeros({2}), 0, DType::I64); },
                           {"softmax", "dtype=", "floating", "int64"}));
  EXPECT_TRUE(throws_error([&] { log_softmax(xi, 0, DType::Bool); }, {"log_softmax", "dtype=", "bool"}));
  EXPECT_TRUE(throws_error([&] { softmax(zeros({2, 3}), 2); }, {"softmax", "dim 2", "out of range", "-2..1"}));
  EXPECT_TRUE(throws_error([&] { log_softmax(zeros({2, 3}), -3); }, {"log_softmax", "dim -3", "out of range"}));
  EXPECT_TRUE(throws_error([&] { softmax(Tensor(), 0); }, {"softmax", "undefined"}));
}

}  // namespace
}  // namespace kiln::test
