#include "kiln/nn.h"
#include "ops/linear_check.h"
#include "test_util.h"

namespace kiln {
namespace {

// Reference in double: y[m, n] = sum_k x[m, k] w[n, k] + b[n].
Tensor linear_ref(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  const int64_t k = x.size(-1), n = w.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const auto xv = x.contiguous().to_vector<double>(), wv = w.contiguous().to_vector<double>();
  const std::vector<double> bv = b ? b->to_vector<double>() : std::vector<double>(n, 0.0);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bv[j];
      for (int64_t t = 0; t < k; ++t) s += xv[i * k + t] * wv[j * k + t];
      y[i * n + j] = s;
    }
  Shape shape = x.sizes();
  shape.back() = n;
  return from_vector<double>(y, shape);
}

TEST(Linear, MatchesDoubleReferenceWithAndWithoutBias) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const Shape& xs : {Shape{1, 96}, Shape{4, 96}, Shape{2, 3, 96}, Shape{96}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(xs));
      const Tensor x = test::random_tensor(xs, dt, -1, 1), w = test::random_tensor({33, 96}, dt, -1, 1);
      const Tensor b = test::random_tensor({33}, dt, -1, 1);
      // 96-term dot products: the f32 result differs from the double sum by accumulation order, a few ulp of
      // the magnitudes involved (|x w| <= 1), hence the absolute term.
      const test::Tolerance tol = dt == DType::F32 ? test::Tolerance{1e-5, 1e-5} : test::default_tolerance(dt);
      for (bool with_bias : {false, true}) {
        const std::optional<Tensor> bias = with_bias ? std::optional<Tensor>(b) : std::nullopt;
        const Tensor y = linear(x, w, bias);
        ASSERT_EQ(y.dtype(), dt);
        EXPECT_TRUE(test::all_close(y, linear_ref(x, w, bias).to(dt), tol));
      }
    }
  }
}

// Long rows: the f32 accumulation of the CPU path stays within the K-dependent bound of linear_close (which
// the CUDA tests use against this CPU result), and on small integers (every sum exact in f32) it is exact.
TEST(Linear, LongRowsMatchDoubleWithinTheAccumulationBound) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t k : {1000, 4097, 14336})
      for (int64_t m : {1, 3, 5, 16, 17, 40}) {  // the 16-bit paths: in place up to 16 rows, then sgemm
        SCOPED_TRACE(str(dtype_name(dt), " K=", k, " M=", m));
        const Tensor x = test::random_tensor({m, k}, dt, -1, 1), w = test::random_tensor({24, k}, dt, -1, 1);
        const Tensor b = test::random_tensor({24}, dt, -1, 1);
        EXPECT_TRUE(test::linear_close(linear(x, w, b), linear_ref(x, w, b), test::linear_abs_scale(x, w, b), dt, k));
        const Tensor xi = test::random_int_tensor({m, k}, DType::I64, -3, 3).to(dt);
        const Tensor wi = test::random_int_tensor({24, k}, DType::I64, -3, 3).to(dt);
        const Tensor bi = test::random_int_tensor({24}, DType::I64, -8, 8).to(dt);
        EXPECT_TRUE(test::equal(linear(xi, wi, bi), linear_ref(xi, wi, bi).to(dt)));
      }
}

// A 16-bit weight wider than one 16 MB f32 slice of the sgemm path (three slices here), and inputs whose rows
// are not contiguous (widened as a whole instead).
TEST(Linear, HalfWeightAcrossSlicesAndStridedInput) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t k = 14336, n = 700;
    const Tensor w = test::random_tensor({n, k}, dt, -1, 1), b = test::random_tensor({n}, dt, -1, 1);
    const Tensor x = test::random_tensor({20, k}, dt, -1, 1);
    EXPECT_TRUE(test::linear_close(linear(x, w, b), linear_ref(x, w, b), test::linear_abs_scale(x, w, b), dt, k));
    const Tensor xt = test::random_tensor({64, 6}, dt, -1, 1).t();  // [6, 64] with stride 6 along k
    const Tensor w2 = test::random_tensor({9, 64}, dt, -1, 1);
    EXPECT_TRUE(test::linear_close(linear(xt, w2), linear_ref(xt, w2, std::nullopt),
                                   test::linear_abs_scale(xt, w2, std::nullopt), dt, 64));
    // K = 0 on both paths (a weight's transposed layout): the bias alone.
    const Tensor b0 = test::random_tensor({5}, dt, -1, 1);
    for (int64_t m : {3, 20})
      EXPECT_TRUE(test::equal(addmm(b0, empty({m, 0}, dt), empty({5, 0}, dt).t()), b0.expand({m, 5}).contiguous()));
  }
}

// More than 16 rows of bf16 (oneDNN's matmul where the build and the CPU have it, else widened weights and sgemm):
// a linear layer on a batch of sequences (the weight shared), with and without bias, and batched products with a
// scale or an accumulated input (the forms oneDNN does not take fall back), all against double.
TEST(Linear, HalfProductsOfManyRowsOnEveryPath) {
  const DType dt = DType::BF16;
  const Tensor w = test::random_tensor({48, 200}, dt, -1, 1), b = test::random_tensor({48}, dt, -1, 1);
  const Tensor x = test::random_tensor({3, 37, 200}, dt, -1, 1);
  for (const auto& bias : {std::optional<Tensor>(), std::optional<Tensor>(b)})
    EXPECT_TRUE(test::linear_close(linear(x, w, bias), linear_ref(x, w, bias), test::linear_abs_scale(x, w, bias), dt, 200));
  const Tensor a = test::random_tensor({4, 33, 72}, dt, -1, 1), m = test::random_tensor({4, 72, 24}, dt, -1, 1);
  const Tensor ref = matmul(a.to(DType::F64), m.to(DType::F64));
  auto close = [&](const Tensor& got, const Tensor& want) {
    return test::all_close(got.to(DType::F64), want, test::Tolerance{1.6e-2, 2e-2});
  };
  EXPECT_TRUE(close(bmm(a, m), ref));
  EXPECT_TRUE(close(bmm(a, m.transpose(1, 2).contiguous().transpose(1, 2)), ref));  // a weight's layout
  const Tensor a2 = a.select(0, 0), m2 = m.select(0, 0).transpose(0, 1).contiguous().t(), ref2 = ref.select(0, 0);
  const Tensor c = test::random_tensor({33, 24}, dt, -1, 1);
  EXPECT_TRUE(close(addmm(c, a2, m2), add(c.to(DType::F64), ref2)));
  EXPECT_TRUE(close(addmm(c, a2, m2, 0.5, 2.0), add(mul(c.to(DType::F64), Scalar(0.5)), mul(ref2, Scalar(2.0)))));
}

// Every K around the 8-wide F16C steps (the tails), 1 to 7 rows (the 4-row blocks and their remainders), and
// f16's extremes (subnormals, the largest finite) widened exactly.
TEST(Linear, HalfWeightsAtEveryTailAndRowCount) {
  for (DType dt : {DType::F16, DType::BF16}) {
    for (int64_t k : {1, 7, 8, 9, 15, 16, 17, 33, 257}) {
      for (int64_t m : {1, 2, 3, 4, 5, 7}) {
        SCOPED_TRACE(str(dtype_name(dt), " k ", k, " m ", m));
        const Tensor w = test::random_tensor({13, k}, dt, -1, 1), x = test::random_tensor({m, k}, dt, -1, 1);
        EXPECT_TRUE(test::linear_close(linear(x, w), linear_ref(x, w, std::nullopt),
                                       test::linear_abs_scale(x, w, std::nullopt), dt, k));
      }
    }
  }
  // f16's subnormals and smallest normal as weights against ones: the widening keeps each exactly (an f32 sum
  // of exact values, one rounding to f16 at the end, here exact too).
  const double sub = std::ldexp(1.0, -24);
  const Tensor ws = from_vector<double>({sub, 1023 * sub, std::ldexp(1.0, -14), sub}).to(DType::F16).reshape({1, 4});
  EXPECT_EQ(linear(ones({1, 4}, DType::F16), ws).to(DType::F64).item<double>(),
            static_cast<double>(Half(static_cast<float>(2 * sub + 1023 * sub + std::ldexp(1.0, -14)))));
}

// Two or more rows with 16-bit weights (the many-row product, cpu/f16c.cpp: tiles of 4 x 3 over the rows of x
// and of w, k in steps of 8, x taken in blocks of rows when k is long): every remainder of rows (mod 4), of
// weight rows (mod 3, and the 48-row blocks the threads share), of k (mod 8), x in several row blocks, with a
// bias, and with alpha / beta on an accumulated input that beta 0 must not read (NaN). Above 16 rows bf16 goes to
// oneDNN where the CPU multiplies bf16 natively; on AMX oneDNN takes the weight rows up to a multiple of 64 and
// the tiles the rest (49: none to oneDNN; 98 and 130: both).
TEST(Linear, HalfWeightsOfManyRowsAtEveryTile) {
  for (DType dt : {DType::F16, DType::BF16}) {
    for (int64_t k : {1, 7, 8, 9, 33, 257, 4100}) {
      for (int64_t m : {2, 5, 17, 18, 19, 20, 37}) {
        for (int64_t n : {1, 2, 4, 5, 49, 98, 130}) {
          if (k == 4100 && n < 49) continue;  // the long rows once per weight-row remainder are enough
          SCOPED_TRACE(str(dtype_name(dt), " k ", k, " m ", m, " n ", n));
          const Tensor w = test::random_tensor({n, k}, dt, -1, 1), x = test::random_tensor({m, k}, dt, -1, 1);
          const Tensor b = test::random_tensor({n}, dt, -1, 1);
          EXPECT_TRUE(test::linear_close(linear(x, w, b), linear_ref(x, w, b), test::linear_abs_scale(x, w, b), dt, k));
          const Tensor ref = matmul(x.to(DType::F64), w.to(DType::F64).t());
          const Tensor c = test::random_tensor({m, n}, dt, -1, 1);
          // One rounding of the result to dt (relative), the f32 sums' error (absolute, growing with k).
          const test::Tolerance tol{dt == DType::F16 ? 2e-3 : 1.6e-2, 1e-3 * std::sqrt(static_cast<double>(k))};
          EXPECT_TRUE(test::all_close(addmm(c, x, w.t(), 0.5, 2.0).to(DType::F64),
                                      add(mul(c.to(DType::F64), Scalar(0.5)), mul(ref, Scalar(2.0))), tol));
          EXPECT_TRUE(test::all_close(addmm(full({m, n}, NAN, dt), x, w.t(), 0, 1).to(DType::F64), ref, tol));
        }
      }
    }
    // A batch of products whose weights are transposed views (each batch's columns split as above).
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::random_tensor({3, 21, 100}, dt, -1, 1), w = test::random_tensor({3, 130, 100}, dt, -1, 1);
    const Tensor ref = matmul(x.to(DType::F64), w.to(DType::F64).transpose(1, 2));
    EXPECT_TRUE(test::all_close(matmul(x, w.transpose(1, 2)).to(DType::F64), ref,
                                test::Tolerance{dt == DType::F16 ? 2e-3 : 1.6e-2, 1e-2}));
  }
}

TEST(Linear, TransposedInputAndZeroRows) {
  const Tensor xt = test::random_tensor({40, 5}, DType::F32).t();  // [5, 40], not contiguous
  const Tensor w = test::random_tensor({7, 40}, DType::F32);
  EXPECT_TRUE(test::all_close(linear(xt, w), linear_ref(xt, w, std::nullopt).to(DType::F32),
                              test::Tolerance{1e-5, 1e-5}));
  EXPECT_EQ(linear(empty({0, 40}), w).sizes(), (Shape{0, 7}));
}

TEST(Linear, InvalidCallsNameTheShapes) {
  const Tensor x = zeros({2, 8}), w = zeros({4, 8});
  EXPECT_TRUE(test::throws_error([&] { linear(x, zeros({4, 9})); }, {"linear", "K = 8", "[4, 9]"}));
  EXPECT_TRUE(test::throws_error([&] { linear(x, w, zeros({5})); }, {"linear", "bias must be [4]"}));
  EXPECT_TRUE(test::throws_error([&] { linear(x, w.to(DType::BF16)); }, {"linear", "same dtype"}));
  EXPECT_TRUE(test::throws_error([&] { linear(x, zeros({8})); }, {"linear", "weight must be [N, K]"}));
}

TEST(Linear, CudaMatchesCpu) {
  KILN_REQUIRE_CUDA();
  const Tensor x = test::random_tensor({4, 256}, DType::BF16), w = test::random_tensor({64, 256}, DType::BF16);
  const Tensor b = test::random_tensor({64}, DType::BF16);
  const Device gpu = cuda_device(0);
  // Both sides accumulate in f32 but in different orders; one bf16 ulp of the result covers it.
  EXPECT_TRUE(test::all_close(linear(x.to(gpu), w.to(gpu), b.to(gpu)).to(kCPU), linear(x, w, b),
                              test::Tolerance{1.6e-2, 1e-2}));
}

TEST(LinearSiluAndMul, IsTheCompositionOnTheCpu) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = test::random_tensor({3, 24}, dt, -1, 1), w = test::random_tensor({10, 24}, dt, -0.5, 0.5);
    EXPECT_TRUE(test::equal(linear_silu_and_mul(x, w), silu_and_mul(linear(x, w))));
    EXPECT_EQ(linear_silu_and_mul(x, w).sizes(), (Shape{3, 5}));
  }
  EXPECT_TRUE(test::throws_error([] { (void)linear_silu_and_mul(test::random_tensor({1, 8}, DType::F32),
                                                                  test::random_tensor({5, 8}, DType::F32)); },
                                 {"linear_silu_and_mul", "[2N, K]"}));
  EXPECT_TRUE(test::throws_error([] { (void)linear_silu_and_mul(test::random_tensor({1, 8}, DType::F32),
                                                                  test::random_tensor({6, 9}, DType::F32)); },
                                 {"linear"}));
}

}  // namespace
}  // namespace kiln
