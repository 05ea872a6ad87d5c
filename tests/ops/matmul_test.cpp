#include "test_util.h"

namespace kiln::test {
namespace {

// Reference product in double (complex: both parts) of a [..., n, k] x [..., k, m] after the caller
// broadcast them to equal batch shapes; returns a tensor of `out` dtype's values as f64/c64 for all_close.
Tensor reference_bmm(const Tensor& a3, const Tensor& b3, DType out) {
  const int64_t B = a3.size(0), n = a3.size(1), k = a3.size(2), m = b3.size(2);
  if (is_complex(out)) {
    auto va = a3.to_vector<Complex64>(), vb = b3.to_vector<Complex64>();
    std::vector<Complex64> vc(B * n * m);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double re = 0, im = 0;
          for (int64_t p = 0; p < k; ++p) {
            const auto x = va[(b * n + i) * k + p], y = vb[(b * k + p) * m + j];
            re += double(x.re) * y.re - double(x.im) * y.im;
            im += double(x.re) * y.im + double(x.im) * y.re;
          }
          vc[(b * n + i) * m + j] = Complex64(float(re), float(im));
        }
    return from_vector<Complex64>(vc, Shape{B, n, m});
  }
  auto va = a3.to_vector<double>(), vb = b3.to_vector<double>();
  std::vector<double> vc(B * n * m);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += va[(b * n + i) * k + p] * vb[(b * k + p) * m + j];
        vc[(b * n + i) * m + j] = s;
      }
  return from_vector<double>(vc, Shape{B, n, m});
}

// Tolerance for a k-term dot product. f32: BLAS sums in a different order (and with FMA) than the f64
// reference, so the error grows with k: about k * eps * sum|a||b|; with inputs in [-2, 2] and k <= 512 an
// rtol of 1.3e-6 alone fails on entries that nearly cancel, hence atol scaled by k. f16/bf16 round
// the output once (their torch.testing rtol) but the f32 accumulation adds the same k-scaled term.
Tolerance matmul_tolerance(DType t, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (t) {
    case DType::F32:
    case DType::C64: return {1.3e-6, 4.0 * kk * 1.2e-7 * 4.0};
    case DType::F16: return {1e-3, 1e-3 + kk * 1e-6};
    case DType::BF16: return {1.6e-2, 1e-2 + kk * 1e-6};
    case DType::F64: return {1e-7, 1e-12 * kk};
    default: return {0, 0};
  }
}

Tensor rand_t(const Shape& s, DType t) {
  if (is_integral(t, false)) return random_int_tensor(s, t, -100, 100);
  if (t == DType::C64) {
    auto re = random_tensor(s, DType::F32).to_vector<float>(), im = random_tensor(s, DType::F32).to_vector<float>();
    std::vector<Complex64> v;
    for (size_t i = 0; i < re.size(); ++i) v.emplace_back(re[i], im[i]);
    return from_vector<Complex64>(v, s);
  }
  return random_tensor(s, t);
}

TEST(Mm, MatchesDoubleReferenceForFloatDtypes) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::C64}) {
    for (auto [n, k, m] : {std::tuple{5, 7, 3}, std::tuple{1, 512, 33}, std::tuple{64, 130, 1}}) {
      Tensor a = rand_t({n, k}, t), b = rand_t({k, m}, t);
      Tensor c = mm(a, b);
      ASSERT_EQ(c.dtype(), t);
      Tensor ref = reference_bmm(a.unsqueeze(0), b.unsqueeze(0), t).squeeze(0);
      EXPECT_TRUE(all_close(c, ref, matmul_tolerance(t, k))) << dtype_name(t) << " " << n << "x" << k << "x" << m;
    }
  }
}

TEST(Mm, NonContiguousOperands) {
  for (DType t : {DType::F32, DType::F64, DType::C64, DType::BF16, DType::I64}) {
    Tensor at = rand_t({9, 6}, t).t();                      // [6, 9] transposed: BLAS Trans
    Tensor bs = rand_t({9, 14}, t).slice(1, 1, 14, 3);      // [9, 5] inner stride 3: copied
    Tensor bt = rand_t({5, 9}, t).t();                      // [9, 5] transposed
    Tensor br = rand_t({12, 5}, t).slice(0, 0, 12, 1).narrow(0, 2, 9);  // row-major with offset
    for (const Tensor& b : {bs, bt, br}) {
      Tensor ref = reference_bmm(at.unsqueeze(0), b.unsqueeze(0), t).squeeze(0);
      Tensor c = mm(at, b);
      if (is_integral(t, false)) EXPECT_TRUE(equal(c, ref.to(t)));
      else EXPECT_TRUE(all_close(c, ref, matmul_tolerance(t, 9))) << dtype_name(t);
    }
  }
}

// One row (a decode step's linear layers) takes a matrix-vector product: a contiguous or strided row,
// b as stored [k, m] or as the transpose of [m, k] (a weight), with and without beta. 16-bit operands
// with a transposed weight are read in their own dtype (cpu::gemv_half); other layouts widen to f32.
TEST(Mm, OneRowMatchesReferenceForEveryLayout) {
  for (DType t : {DType::F32, DType::F64, DType::C64, DType::BF16, DType::F16}) {
    const int64_t k = 300, m = 70;
    const Tensor rows[] = {rand_t({1, k}, t), rand_t({k, 3}, t).narrow(1, 1, 1).t()};  // [1, k], strides (1, 3)
    const Tensor bs[] = {rand_t({k, m}, t), rand_t({m, k}, t).t(), rand_t({k, 2 * m}, t).slice(1, 0, 2 * m, 2)};
    for (const Tensor& a : rows)
      for (const Tensor& b : bs) {
        SCOPED_TRACE(str(dtype_name(t), " a strides ", a.stride(0), ",", a.stride(1), " b strides ", b.stride(0), ",",
                         b.stride(1)));
        const Tensor ref = reference_bmm(a.unsqueeze(0), b.unsqueeze(0), t).squeeze(0);
        EXPECT_TRUE(all_close(mm(a, b), ref, matmul_tolerance(t, k)));
        if (t == DType::C64) continue;
        // beta = 0 ignores a NaN input; beta = 0.5 scales it.
        EXPECT_TRUE(all_close(addmm(full({1, m}, NAN, t), a, b, 0, 1), ref, matmul_tolerance(t, k)));
        const Tensor in = rand_t({m}, t);
        auto vi = in.to_vector<double>(), vr = ref.to_vector<double>();
        std::vector<double> want(static_cast<size_t>(m));
        for (int64_t j = 0; j < m; ++j) want[j] = 0.5 * vi[j] + 2.0 * vr[j];
        EXPECT_TRUE(all_close(addmm(in, a, b, 0.5, 2.0), from_vector<double>(want, Shape{1, m}),
                              matmul_tolerance(t, 2 * k)));
      }
  }
}

TEST(Mm, IntegerProductsWrap) {
  for (DType t : {DType::I64, DType::I32, DType::U8, DType::I16}) {
    Tensor a = rand_t({4, 6}, t).t(), b = rand_t({4, 3}, t);
    // Reference mod 2^bits: the double sums are exact (|sum| < 2^53) and convert wraps as PyTorch does.
    Tensor ref = reference_bmm(a.unsqueeze(0), b.unsqueeze(0), t).squeeze(0).to(DType::I64).to(t);
    EXPECT_TRUE(equal(mm(a, b), ref)) << dtype_name(t);
  }
  Tensor big = full({1, 2}, INT64_MAX, DType::I64);
  EXPECT_EQ(mm(big, full({2, 1}, 2, DType::I64)).item<int64_t>(), int64_t(-4));  // 4 * (2^63-1) mod 2^64
}

TEST(Bmm, BatchesMatchReference) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::C64}) {
    for (int64_t B : {1, 7}) {
      Tensor a = rand_t({B, 8, 5}, t), b = rand_t({B, 6, 5}, t).transpose(1, 2);
      Tensor c = bmm(a, b);
      EXPECT_TRUE(all_close(c, reference_bmm(a, b, t), matmul_tolerance(t, 5))) << dtype_name(t);
    }
  }
  // Batch stride 0 (expanded) operand.
  Tensor a = rand_t({1, 3, 4}, DType::F32).expand({5, 3, 4}), b = rand_t({5, 4, 2}, DType::F32);
  EXPECT_TRUE(all_close(bmm(a, b), reference_bmm(a, b, DType::F32), matmul_tolerance(DType::F32, 4)));
}

TEST(Matmul, BroadcastBatchDims) {
  Tensor a = rand_t({2, 1, 3, 4}, DType::F32), b = rand_t({5, 4, 2}, DType::F32);
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.sizes(), (Shape{2, 5, 3, 2}));
  Tensor a3 = a.expand({2, 5, 3, 4}).reshape({10, 3, 4}), b3 = b.expand({2, 5, 4, 2}).reshape({10, 4, 2});
  EXPECT_TRUE(all_close(c.reshape({10, 3, 2}), reference_bmm(a3, b3, DType::F32), matmul_tolerance(DType::F32, 4)));
  // [..., n, k] x [k, m] folds batch into rows, also for a non-contiguous a.
  Tensor x = rand_t({3, 4, 6}, DType::F64).transpose(0, 1);  // [4, 3, 6]
  Tensor w = rand_t({6, 2}, DType::F64);
  Tensor y = matmul(x, w);
  ASSERT_EQ(y.sizes(), (Shape{4, 3, 2}));
  EXPECT_TRUE(all_close(y.reshape({1, 12, 2}), reference_bmm(x.reshape({1, 12, 6}), w.unsqueeze(0), DType::F64)));
  // [k, m] on the left of a batch: b broadcasts a.
  Tensor l = rand_t({3, 4}, DType::F32), r = rand_t({2, 4, 5}, DType::F32);
  EXPECT_TRUE(all_close(matmul(l, r), reference_bmm(l.expand({2, 3, 4}), r, DType::F32), matmul_tolerance(DType::F32, 4)));
}

TEST(Matmul, OneDimensionalOperands) {
  Tensor v = rand_t({7}, DType::F64), w = rand_t({7}, DType::F64);
  Tensor d = matmul(v, w);
  EXPECT_EQ(d.dim(), 0);
  double s = 0;
  auto vv = v.to_vector<double>(), vw = w.to_vector<double>();
  for (int i = 0; i < 7; ++i) s += vv[i] * vw[i];
  EXPECT_NEAR(d.item<double>(), s, 1e-12);
  Tensor M = rand_t({2, 3, 7}, DType::F64);
  Tensor mv = matmul(M, v);
  ASSERT_EQ(mv.sizes(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(mv, reference_bmm(M, v.reshape({1, 7, 1}).expand({2, 7, 1}), DType::F64).reshape({2, 3})));
  Tensor N = rand_t({7, 4}, DType::F64);
  Tensor vm = matmul(v, N);
  ASSERT_EQ(vm.sizes(), (Shape{4}));
  EXPECT_TRUE(all_close(vm, reference_bmm(v.reshape({1, 1, 7}), N.unsqueeze(0), DType::F64).reshape({4})));
  EXPECT_EQ(matmul(v, rand_t({3, 7, 2}, DType::F64)).sizes(), (Shape{3, 2}));
}

TEST(Matmul, ZeroSize) {
  Tensor c = mm(rand_t({3, 0}, DType::F32), rand_t({0, 4}, DType::F32));
  EXPECT_TRUE(equal(c, zeros({3, 4})));  // k = 0 gives zeros
  EXPECT_EQ(mm(rand_t({0, 5}, DType::F32), rand_t({5, 4}, DType::F32)).sizes(), (Shape{0, 4}));
  EXPECT_EQ(matmul(rand_t({2, 0, 3}, DType::F64), rand_t({3, 4}, DType::F64)).sizes(), (Shape{2, 0, 4}));
  EXPECT_TRUE(equal(matmul(rand_t({2, 3, 0}, DType::I64), rand_t({0, 4}, DType::I64)), zeros({2, 3, 4}, DType::I64)));
  EXPECT_EQ(bmm(rand_t({0, 3, 2}, DType::F16), rand_t({0, 2, 4}, DType::F16)).sizes(), (Shape{0, 3, 4}));
  Tensor in = full({3, 4}, 2.0, DType::F32);
  EXPECT_TRUE(equal(addmm(in, rand_t({3, 0}, DType::F32), rand_t({0, 4}, DType::F32), 0.5), full({3, 4}, 1.0, DType::F32)));
}

TEST(Addmm, BroadcastInputAndScalars) {
  for (DType t : {DType::F32, DType::F64, DType::BF16}) {
    Tensor a = rand_t({4, 6}, t), b = rand_t({5, 6}, t).t();
    Tensor in = rand_t({5}, t);  // row vector broadcast over [4, 5]
    Tensor c = addmm(in, a, b, 0.5, -2.0);
    auto ab = reference_bmm(a.unsqueeze(0), b.unsqueeze(0), t).squeeze(0).to_vector<double>();
    auto vi = in.to_vector<double>();
    std::vector<double> ref(20);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 5; ++j) ref[i * 5 + j] = 0.5 * vi[j] - 2.0 * ab[i * 5 + j];
    EXPECT_TRUE(all_close(c, from_vector<double>(ref, Shape{4, 5}), matmul_tolerance(t, 12))) << dtype_name(t);
  }
  Tensor ai = rand_t({2, 3}, DType::I32), bi = rand_t({3, 2}, DType::I32);
  Tensor ci = addmm(ones({2, 1}, DType::I32), ai, bi, 3, 2);
  auto ab = reference_bmm(ai.unsqueeze(0), bi.unsqueeze(0), DType::I32).to_vector<double>();
  auto vc = ci.to_vector<double>();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(vc[i], 3 + 2 * ab[i]);
}

TEST(Addmm, BetaZeroIgnoresNaNInInput) {
  Tensor in = full({2, 2}, NAN, DType::F32);
  Tensor a = rand_t({2, 3}, DType::F32), b = rand_t({3, 2}, DType::F32);
  Tensor c = addmm(in, a, b, 0, 1);
  EXPECT_TRUE(all_close(c, reference_bmm(a.unsqueeze(0), b.unsqueeze(0), DType::F32).squeeze(0), matmul_tolerance(DType::F32, 3)));
  Tensor h = addmm(full({2}, NAN, DType::F16), a.to(DType::F16), b.to(DType::F16), 0, 1);
  EXPECT_FALSE(std::isnan(h.to_vector<double>()[0]));
}

TEST(Matmul, InvalidCallsNameShapesAndDtypes) {
  EXPECT_TRUE(throws_error([] { mm(zeros({2, 3}), zeros({2, 3})); }, {"mm", "[2, 3]", "3 != 2"}));
  EXPECT_TRUE(throws_error([] { mm(zeros({2, 3}), zeros({3, 2}, DType::F64)); }, {"same dtype", "float32", "float64"}));
  EXPECT_TRUE(throws_error([] { mm(zeros({2}), zeros({2, 2})); }, {"mm", "2-d"}));
  EXPECT_TRUE(throws_error([] { bmm(zeros({2, 2, 3}), zeros({3, 3, 2})); }, {"bmm", "[2, 2, 3]", "[3, 3, 2]"}));
  EXPECT_TRUE(throws_error([] { matmul(zeros({2, 3, 4}), zeros({3, 5, 2})); }, {"matmul", "[2, 3, 4]", "[3, 5, 2]"}));
  EXPECT_TRUE(throws_error([] { matmul(zeros({3, 4}), zeros({3})); }, {"matmul", "4 != 3"}));
  EXPECT_TRUE(throws_error([] { matmul(scalar_tensor(1.0), zeros({3})); }, {"matmul", "1 dim"}));
  EXPECT_TRUE(throws_error([] { matmul(zeros({2, 3, 4}), zeros({5, 4, 2})); }, {"matmul", "[2, 3, 4]", "broadcast"}));
  EXPECT_TRUE(throws_error([] { mm(zeros({2, 2}, DType::Bool), zeros({2, 2}, DType::Bool)); }, {"mm", "bool"}));
  EXPECT_TRUE(throws_error([] { addmm(zeros({3, 3}), zeros({2, 3}), zeros({3, 2})); }, {"addmm", "[3, 3]", "[2, 2]"}));
}

}  // namespace
}  // namespace kiln::test
