// kiln::linalg on the CPU and CUDA: reconstructions and residuals (P L U = A, Q R = A, U S Vh = A, A X = B, A A+ A = A)
// at tolerances scaled by size, condition number and dtype, on fresh random matrices (real and complex, batched,
// strided, broadcast) and on hard input (singular, rank-deficient, ill-conditioned, zeros, non-finite, huge and
// tiny magnitudes, empty); and the error paths. The dtype suites run on every device; CUDA's own kernels
// (n <= 32) and cuSOLVER's paths are also compared with the CPU's factors.
#include "kiln/linalg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <limits>

#include "test_util.h"

namespace kiln {
namespace {

using namespace kiln::linalg;

const DType kDtypes[] = {DType::F32, DType::F64, DType::C64};

// A batch of vectors matching A's batch: A [..., n, n] -> [..., n].
Shape cat_shape_for_test(const Tensor& A, const Tensor& v) {
  Shape s(A.sizes().begin(), A.sizes().end() - 1);
  (void)v;
  return s;
}

// The device the dtype suites run on (set by the fixture): inputs are made there.
Device g_dev = kCPU;

double eps(DType t) { return t == DType::F64 ? 2.22e-16 : 1.19e-7; }

// Fresh random matrices; complex ones with random real and imaginary parts.
Tensor random_matrix(const Shape& shape, DType t, double lo = -1, double hi = 1) {
  if (t != DType::C64) return test::random_tensor(shape, t, lo, hi).to(g_dev);
  const Tensor re = test::random_tensor(shape, DType::F32, lo, hi), im = test::random_tensor(shape, DType::F32, lo, hi);
  Tensor z = empty(shape, DType::C64);
  view_as_real(z).select(-1, 0).copy_(re);
  view_as_real(z).select(-1, 1).copy_(im);
  return z.to(g_dev);
}

Tensor eye_like(int64_t n, DType t) { return eye(n, std::nullopt, t, g_dev); }

Tensor adjoint(const Tensor& x) { return conj(x).transpose(-2, -1); }

// ||x - y|| / max(||y||, tiny), in f64.
double rel_err(const Tensor& x, const Tensor& y) {
  const double num = vector_norm(sub(x.to(y.dtype()), y)).to(DType::F64).item<double>();
  const double den = vector_norm(y).to(DType::F64).item<double>();
  return num / std::max(den, 1e-300);
}

// A well-conditioned tolerance for a product of n-sized factors.
double tol(DType t, int64_t n) { return 30.0 * eps(t) * std::max<int64_t>(n, 1); }

class LinalgDtype : public ::testing::TestWithParam<std::tuple<DType, Device>> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam()).is_cuda()) KILN_REQUIRE_CUDA();
    g_dev = std::get<1>(GetParam());
  }
  void TearDown() override { g_dev = kCPU; }
};

TEST_P(LinalgDtype, LuReconstructsWithPivots) {
  const DType t = std::get<0>(GetParam());
  for (const Shape& s : {Shape{4, 4}, Shape{5, 3}, Shape{3, 5}, Shape{2, 3, 6, 6}, Shape{1, 1}, Shape{33, 33}}) {
    SCOPED_TRACE(shape_str(s));
    const Tensor A = random_matrix(s, t);
    PLU f = lu(A);
    EXPECT_LT(rel_err(matmul(matmul(f.P, f.L), f.U), A), tol(t, s.back()));
    LUFactor lf = lu_factor(A);
    EXPECT_EQ(lf.pivots.dtype(), DType::I32);
    const auto piv = lf.pivots.reshape({-1}).to_vector<int32_t>();
    for (int32_t p : piv) EXPECT_TRUE(p >= 1 && p <= s[s.size() - 2]) << p;
    // L unit lower, U upper.
    EXPECT_EQ(amax(abs(sub(f.L, tril(f.L)))).to(DType::F64).item<double>(), 0.0);
    EXPECT_EQ(amax(abs(sub(f.U, triu(f.U)))).to(DType::F64).item<double>(), 0.0);
  }
}

// LU with partial pivoting is backward stable: ||A X - B|| <= c n eps ||A|| ||X||, whatever A's condition (a
// residual relative to ||B|| alone would grow with it).
double backward_err(const Tensor& AX, const Tensor& A, const Tensor& X, const Tensor& B) {
  const double num = vector_norm(sub(AX, B)).to(DType::F64).item<double>();
  const double den = vector_norm(A).to(DType::F64).item<double>() * vector_norm(X).to(DType::F64).item<double>();
  return num / std::max(den, 1e-300);
}

TEST_P(LinalgDtype, SolvesAndInversesHaveSmallResiduals) {
  const DType t = std::get<0>(GetParam());
  for (int64_t n : {1, 2, 4, 16, 65}) {
    SCOPED_TRACE(n);
    const Tensor A = add(random_matrix({3, n, n}, t), mul(eye_like(n, t), Scalar(2.0)));
    const Tensor B = random_matrix({3, n, 4}, t), Br = random_matrix({3, 4, n}, t), v = random_matrix({3, n}, t);
    const Tensor I = eye_like(n, t).expand({3, n, n}).contiguous();
    Tensor X = solve(A, B);
    EXPECT_LT(backward_err(matmul(A, X), A, X, B), tol(t, n));
    X = solve(A, Br, /*left=*/false);
    EXPECT_LT(backward_err(matmul(X, A), A, X, Br), tol(t, n));
    X = solve(A, v);  // a batch of vectors
    EXPECT_LT(backward_err(matmul(A, X.unsqueeze(-1)).squeeze(-1), A, X, v), tol(t, n));
    X = inv(A);
    EXPECT_LT(backward_err(matmul(A, X), A, X, I), tol(t, n));
    LUFactor f = lu_factor(A);
    X = lu_solve(f.LU, f.pivots, B);
    EXPECT_LT(backward_err(matmul(A, X), A, X, B), tol(t, n));
    X = lu_solve(f.LU, f.pivots, B, true, true);
    EXPECT_LT(backward_err(matmul(adjoint(A), X), A, X, B), tol(t, n));
    X = lu_solve(f.LU, f.pivots, Br, false);
    EXPECT_LT(backward_err(matmul(X, A), A, X, Br), tol(t, n));
    X = lu_solve(f.LU, f.pivots, Br, false, true);
    EXPECT_LT(backward_err(matmul(X, adjoint(A)), A, X, Br), tol(t, n));
  }
}

TEST_P(LinalgDtype, TriangularSolvesEverySideAndTriangle) {
  const DType t = std::get<0>(GetParam());
  const int64_t n = 7;
  const Tensor M = add(random_matrix({2, n, n}, t), mul(eye_like(n, t), Scalar(4.0)));
  const Tensor B = random_matrix({2, n, 3}, t), Br = random_matrix({2, 3, n}, t);
  for (bool upper : {true, false}) {
    for (bool unit : {false, true}) {
      SCOPED_TRACE(str(upper, unit));
      Tensor T = upper ? triu(M) : tril(M);
      if (unit) T = add(upper ? triu(M, 1) : tril(M, -1), eye_like(n, t));
      // The other triangle is never read: garbage there must not matter.
      const Tensor noisy = add(T, upper ? tril(random_matrix({2, n, n}, t), -1) : triu(random_matrix({2, n, n}, t), 1));
      const Tensor A = unit ? add(noisy, mul(eye_like(n, t), Scalar(5.0))) : noisy;
      EXPECT_LT(rel_err(matmul(T, solve_triangular(A, B, upper, true, unit)), B), tol(t, n));
      EXPECT_LT(rel_err(matmul(solve_triangular(A, Br, upper, false, unit), T), Br), tol(t, n));
    }
  }
}

TEST_P(LinalgDtype, DeterminantsAgreeWithTheirDefinition) {
  const DType t = std::get<0>(GetParam());
  // Triangular: the product of the diagonal; a permutation flips the sign.
  const Tensor U = add(triu(random_matrix({5, 5}, t)), eye_like(5, t));
  std::complex<double> prod(1, 0);
  const Tensor d = U.to(DType::C64).cpu().contiguous();
  for (int i = 0; i < 5; ++i) {
    const Complex64 z = d.data<Complex64>()[i * 5 + i];
    prod *= std::complex<double>(z.re, z.im);
  }
  const Tensor got = det(U).to(DType::C64);
  const Complex64 g = got.item<Complex64>();
  EXPECT_NEAR(g.re, prod.real(), 1e-4 * std::abs(prod));
  EXPECT_NEAR(g.im, prod.imag(), 1e-4 * std::abs(prod));
  const Tensor swap = index_select(U, 0, from_vector<int64_t>({1, 0, 2, 3, 4}).to(g_dev));
  EXPECT_LT(rel_err(det(swap), neg(det(U))), 1e-5);
  // det(A B) = det(A) det(B); slogdet's sign times exp(logabsdet) is det.
  const Tensor A = random_matrix({3, 6, 6}, t), B = random_matrix({3, 6, 6}, t);
  EXPECT_LT(rel_err(det(matmul(A, B)), mul(det(A), det(B))), 1e-4);
  SlogDet s = slogdet(A);
  EXPECT_LT(rel_err(mul(s.sign, exp(s.logabsdet).to(t)), det(A)), 1e-5);
  // Singular: 0, sign 0, log -inf.
  const Tensor Z = zeros({3, 3}, t, g_dev);
  EXPECT_EQ(abs(det(Z)).to(DType::F64).item<double>(), 0.0);
  EXPECT_EQ(slogdet(Z).logabsdet.to(DType::F64).item<double>(), -std::numeric_limits<double>::infinity());
}

TEST_P(LinalgDtype, CholeskyOfPositiveDefiniteMatrices) {
  const DType t = std::get<0>(GetParam());
  for (int64_t n : {1, 3, 20}) {
    const Tensor M = random_matrix({2, n, n}, t);
    const Tensor A = add(matmul(M, adjoint(M)), mul(eye_like(n, t), Scalar(double(n))));
    const Tensor L = cholesky(A);
    EXPECT_LT(rel_err(matmul(L, adjoint(L)), A), tol(t, n));
    EXPECT_EQ(amax(abs(sub(L, tril(L)))).to(DType::F64).item<double>(), 0.0);
    const Tensor Up = cholesky(A, /*upper=*/true);
    EXPECT_LT(rel_err(matmul(adjoint(Up), Up), A), tol(t, n));
  }
  const Tensor bad = from_vector<double>({1, 0, 0, 0, -1, 0, 0, 0, 1}, Shape{3, 3}).to(g_dev, t);
  EXPECT_TRUE(test::throws_error([&] { cholesky(bad); }, {"not positive-definite", "order 2"}));
  CholeskyEx ex = cholesky_ex(stack({eye_like(3, t), bad}));
  EXPECT_EQ(ex.info.to_vector<int32_t>(), (std::vector<int32_t>{0, 2}));
}

TEST_P(LinalgDtype, QrInEveryMode) {
  const DType t = std::get<0>(GetParam());
  for (const Shape& s : {Shape{6, 4}, Shape{4, 6}, Shape{5, 5}, Shape{2, 65, 9}}) {
    SCOPED_TRACE(shape_str(s));
    const Tensor A = random_matrix(s, t);
    const int64_t m = s[s.size() - 2], n = s.back(), k = std::min(m, n);
    for (const char* mode : {"reduced", "complete"}) {
      QR f = qr(A, mode);
      const int64_t qc = std::string(mode) == "complete" ? m : k;
      EXPECT_EQ(f.Q.size(-1), qc);
      EXPECT_EQ(f.R.size(-2), qc);
      EXPECT_LT(rel_err(matmul(f.Q, f.R), A), tol(t, m));
      const Tensor QhQ = matmul(adjoint(f.Q), f.Q);
      EXPECT_LT(rel_err(QhQ, eye_like(qc, t).expand(QhQ.sizes()).contiguous()), tol(t, m));
      EXPECT_EQ(amax(abs(sub(f.R, triu(f.R)))).to(DType::F64).item<double>(), 0.0);
    }
    QR r = qr(A, "r");
    EXPECT_EQ(r.Q.numel(), 0);
    EXPECT_LT(rel_err(abs(r.R), abs(qr(A).R)), tol(t, m));
  }
}

TEST_P(LinalgDtype, SvdReconstructsAndOrdersSingularValues) {
  const DType t = std::get<0>(GetParam());
  for (const Shape& s : {Shape{6, 4}, Shape{4, 6}, Shape{3, 8, 8}, Shape{1, 1}, Shape{40, 3}}) {
    SCOPED_TRACE(shape_str(s));
    const Tensor A = random_matrix(s, t);
    for (bool full : {false, true}) {
      SVD f = svd(A, full);
      const int64_t m = s[s.size() - 2], n = s.back(), k = std::min(m, n);
      EXPECT_EQ(f.S.dtype(), t == DType::F64 ? DType::F64 : DType::F32);
      const Tensor Uk = f.U.narrow(-1, 0, k), Vhk = f.Vh.narrow(-2, 0, k);
      EXPECT_LT(rel_err(matmul(mul(Uk, f.S.unsqueeze(-2).to(t)), Vhk), A), tol(t, std::max(m, n)));
      const Tensor UhU = matmul(adjoint(f.U), f.U);
      EXPECT_LT(rel_err(UhU, eye_like(f.U.size(-1), t).expand(UhU.sizes()).contiguous()), tol(t, m));
      const auto sv = f.S.to(DType::F64).reshape({-1, k});
      for (int64_t b = 0; b < sv.size(0); ++b)
        for (int64_t i = 0; i + 1 < k; ++i) EXPECT_GE(sv[b][i].item<double>(), sv[b][i + 1].item<double>());
      EXPECT_LT(rel_err(svdvals(A), f.S), tol(t, k));
    }
  }
}

TEST_P(LinalgDtype, EighDiagonalisesHermitianMatrices) {
  const DType t = std::get<0>(GetParam());
  for (int64_t n : {1, 4, 30}) {
    const Tensor M = random_matrix({2, n, n}, t);
    const Tensor A = add(M, adjoint(M));
    for (const char* uplo : {"L", "U"}) {
      Eigh e = eigh(A, uplo);
      const Tensor V = e.eigenvectors;
      EXPECT_LT(rel_err(matmul(A, V), mul(V, e.eigenvalues.unsqueeze(-2).to(t))), tol(t, n));
      const auto w = e.eigenvalues.to(DType::F64).reshape({-1});
      for (int64_t i = 0; i + 1 < n; ++i) EXPECT_LE(w[i].item<double>(), w[i + 1].item<double>());
      EXPECT_LT(rel_err(eigvalsh(A, uplo), e.eigenvalues), tol(t, n));
    }
  }
}

TEST_P(LinalgDtype, PinvAndRankOfRankDeficientMatrices) {
  const DType t = std::get<0>(GetParam());
  // Rank 3 of a 6 x 5 matrix.
  const Tensor A = matmul(random_matrix({6, 3}, t), random_matrix({3, 5}, t));
  const Tensor P = pinv(A);
  EXPECT_EQ(P.sizes(), (Shape{5, 6}));
  EXPECT_LT(rel_err(matmul(matmul(A, P), A), A), 1e3 * eps(t));
  EXPECT_LT(rel_err(matmul(matmul(P, A), P), P), 1e3 * eps(t));
  EXPECT_EQ(matrix_rank(A).item<int64_t>(), 3);
  const Tensor H = matmul(A, adjoint(A));  // Hermitian, rank 3
  EXPECT_EQ(matrix_rank(H, std::nullopt, std::nullopt, true).item<int64_t>(), 3);
  EXPECT_LT(rel_err(matmul(matmul(H, pinv(H, std::nullopt, std::nullopt, true)), H), H), 1e4 * eps(t));
  EXPECT_EQ(matrix_rank(A, /*atol=*/1e30).item<int64_t>(), 0);
  // Invertible: pinv is the inverse.
  const Tensor B = add(random_matrix({4, 4}, t), mul(eye_like(4, t), Scalar(3.0)));
  EXPECT_LT(rel_err(pinv(B), inv(B)), tol(t, 4) * 10);
}

TEST_P(LinalgDtype, NormsAndConditionNumbers) {
  const DType t = std::get<0>(GetParam());
  const Tensor A = random_matrix({3, 5, 4}, t);
  const Tensor a = abs(A).to(DType::F64);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_LT(rel_err(matrix_norm(A, "fro"), sqrt(sum(mul(a, a), {-2, -1}))), 1e-5);
  EXPECT_LT(rel_err(matrix_norm(A, 1.0), amax(sum(a, {-2}), {-1})), 1e-5);
  EXPECT_LT(rel_err(matrix_norm(A, inf), amax(sum(a, {-1}), {-1})), 1e-5);
  EXPECT_LT(rel_err(matrix_norm(A, -inf), amin(sum(a, {-1}), {-1})), 1e-5);
  EXPECT_LT(rel_err(matrix_norm(A, 2.0), amax(svdvals(A), {-1})), 1e-5);
  EXPECT_LT(rel_err(matrix_norm(A, "nuc"), sum(svdvals(A), {-1})), 1e-5);
  EXPECT_EQ(matrix_norm(A, "fro", true).sizes(), (Shape{3, 1, 1}));
  EXPECT_LT(rel_err(vector_norm(A, 3.0, {-1}), pow(sum(pow(a, 3.0), {-1}), 1.0 / 3)), 1e-5);
  const Tensor S = random_matrix({4, 4}, t);
  const Tensor s = svdvals(S);
  EXPECT_LT(rel_err(cond(S), div(amax(s), amin(s))), 1e-4);
  EXPECT_LT(rel_err(cond(S, 1.0), mul(matrix_norm(S, 1.0), matrix_norm(inv(S), 1.0))), 1e-4);
  EXPECT_EQ(cond(zeros({3, 3}, t, g_dev), 1.0).to(DType::F64).item<double>(), inf);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinalgDtype, ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::Values(kCPU, cuda_device())),
                         [](const auto& info) {
                           return str(dtype_name(std::get<0>(info.param)), std::get<1>(info.param).is_cuda() ? "_cuda" : "_cpu");
                         });

// A U diag(s) V^T matrix with singular values from 1 down to 1/condition, built in f64.
Tensor conditioned(int64_t n, double condition) {
  const Tensor U = qr(random_matrix({n, n}, DType::F64)).Q, V = qr(random_matrix({n, n}, DType::F64)).Q;
  const Tensor s = logspace(0, -std::log10(condition), n, 10.0, DType::F64);
  return matmul(mul(U, s.unsqueeze(0)), V.t());
}

TEST(Linalg, IllConditionedInputStaysAccurate) {
  for (double c : {1e2, 1e6, 1e12}) {
    SCOPED_TRACE(c);
    const Tensor A = conditioned(24, c);
    // Singular values: accurate relative to the largest (backward stable), however small the smallest.
    const Tensor s = svdvals(A);
    const Tensor expected = logspace(0, -std::log10(c), 24, 10.0, DType::F64);
    EXPECT_LT(amax(abs(sub(s, expected))).item<double>(), 100 * 2.22e-16);
    // A solve's residual is small relative to ||A|| ||X|| (backward stable), its error grows with c.
    const Tensor B = random_matrix({24, 2}, DType::F64);
    const Tensor X = solve(A, B);
    const double resid = vector_norm(sub(matmul(A, X), B)).item<double>();
    EXPECT_LT(resid, 1e3 * 2.22e-16 * vector_norm(A).item<double>() * vector_norm(X).item<double>());
    // pinv stays right where the smallest singular values fall below the tolerance.
    const Tensor P = pinv(A, std::nullopt, 1e-8);
    EXPECT_LT(rel_err(matmul(matmul(A, P), A), A), c > 1e8 ? 1e-7 : c * 1e-14);
  }
}

TEST(Linalg, ExtremeMagnitudesAndSpecialShapes) {
  for (double scale : {1e-30, 1e30}) {
    SCOPED_TRACE(scale);
    const Tensor A = mul(random_matrix({6, 6}, DType::F32), Scalar(scale));
    const Tensor s = svdvals(A);
    const Tensor ref = svdvals(A.to(DType::F64));
    EXPECT_LT(rel_err(s, ref), 1e-5);
    EXPECT_TRUE(all(isfinite(s)).item<bool>());
    const Tensor Ainv = inv(A);
    EXPECT_LT(rel_err(matmul(A, Ainv), eye_like(6, DType::F32)), 1e-4);
  }
  // Empty: 0 x 0 and 0 x n batches give empty results, not errors.
  EXPECT_EQ(inv(zeros({2, 0, 0})).sizes(), (Shape{2, 0, 0}));
  EXPECT_EQ(svdvals(zeros({0, 3})).sizes(), (Shape{0}));
  EXPECT_EQ(qr(zeros({3, 0})).R.sizes(), (Shape{0, 0}));
  EXPECT_EQ(det(zeros({4, 0, 0})).to_vector<float>(), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(solve(zeros({0, 0}), zeros({0, 2})).sizes(), (Shape{0, 2}));
  // 1 x 1.
  EXPECT_FLOAT_EQ(inv(full({1, 1}, 4.0)).item<float>(), 0.25f);
  // Strided (transposed) and broadcast batches.
  const Tensor A = add(random_matrix({5, 5}, DType::F64), mul(eye_like(5, DType::F64), Scalar(3.0)));
  EXPECT_LT(rel_err(inv(A.t()), inv(A.t().contiguous())), 1e-14);
  const Tensor B = random_matrix({4, 5, 2}, DType::F64);
  EXPECT_EQ(solve(A.expand({4, 5, 5}), B).sizes(), (Shape{4, 5, 2}));
  EXPECT_LT(rel_err(matmul(A, solve(A, B)), B), 1e-13);  // A broadcast over B's batch
  // Complex with purely imaginary pivots.
  Tensor Z = zeros({3, 3}, DType::C64);
  view_as_real(Z).select(-1, 1).copy_(add(random_matrix({3, 3}, DType::F32), mul(eye(3), Scalar(4.0))));
  EXPECT_LT(rel_err(matmul(Z, inv(Z)), eye_like(3, DType::C64)), 1e-5);
  PLU f = lu(Z);
  EXPECT_LT(rel_err(matmul(matmul(f.P, f.L), f.U), Z), 1e-5);
}

TEST(Linalg, SingularAndNonFiniteInputIsReportedNotReturned) {
  Tensor A = stack({eye(3), zeros({3, 3}), eye(3)});
  EXPECT_TRUE(test::throws_error([&] { inv(A); }, {"linalg.inv", "batch element 1", "singular"}));
  InvEx ex = inv_ex(A);
  EXPECT_EQ(ex.info.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_TRUE(test::throws_error([&] { solve(A, ones({3, 3, 1})); }, {"linalg.solve", "batch element 1", "singular"}));
  EXPECT_EQ(solve_ex(A, ones({3, 3, 1})).info.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_TRUE(test::throws_error([&] { lu_factor(zeros({2, 2})); }, {"linalg.lu_factor", "U[0, 0] is zero"}));
  EXPECT_NO_THROW(lu(zeros({2, 2})));  // the factorisation of a singular matrix exists
  EXPECT_TRUE(test::throws_error([&] { lu_factor_ex(zeros({2, 2}), true, true); }, {"singular"}));
  Tensor N = eye(3);
  N.fill_(NAN);
  for (auto f : {+[](const Tensor& x) { svd(x); }, +[](const Tensor& x) { eigh(x); }, +[](const Tensor& x) { pinv(x); },
                 +[](const Tensor& x) { matrix_rank(x); }})
    EXPECT_TRUE(test::throws_error([&] { f(N); }, {"non-finite"}));
}

// LAPACK overwrites its buffers: no input may share memory with them, also where a transposed or size-1
// layout makes the column-major copy look unnecessary.
TEST(Linalg, InputsAreNeverWritten) {
  const Tensor base = add(random_matrix({4, 4}, DType::F64), mul(eye(4, std::nullopt, DType::F64), Scalar(3.0)));
  for (const Tensor& A : {base.t(), random_matrix({3, 1, 1}, DType::F64), base}) {
    const Tensor keep = A.clone();
    const Tensor v = random_matrix({A.size(-1)}, DType::F64);
    const Tensor vkeep = v.clone();
    const Tensor Bt = random_matrix({A.size(-1), 2}, DType::F64).t();  // [2, n], transposed
    const Tensor Bkeep = Bt.clone();
    (void)inv(A);
    (void)det(A);
    (void)lu(A);
    (void)qr(A);
    (void)svd(A);
    (void)eigh(add(A, A.transpose(-2, -1)));
    (void)solve(A, v.expand(cat_shape_for_test(A, v)));
    (void)solve(A, Bt.expand({A.size(-1) == 1 ? 2 : 2, A.size(-1)}), /*left=*/false);
    (void)solve_triangular(A, Bt, true, false);
    (void)cholesky(add(matmul(A, A.transpose(-2, -1)), eye(A.size(-1), std::nullopt, DType::F64)));
    EXPECT_EQ(amax(abs(sub(A, keep))).item<double>(), 0.0);
    EXPECT_EQ(amax(abs(sub(v, vkeep))).item<double>(), 0.0);
    EXPECT_EQ(amax(abs(sub(Bt, Bkeep))).item<double>(), 0.0);
  }
}

TEST(Linalg, BadArgumentsNameWhatWouldBeValid) {
  EXPECT_TRUE(test::throws_error([] { inv(ones({2, 3})); }, {"linalg.inv", "square", "[2, 3]"}));
  EXPECT_TRUE(test::throws_error([] { inv(ones({3})); }, {"at least 2 dims"}));
  EXPECT_TRUE(test::throws_error([] { inv(ones({2, 2}, DType::I64)); }, {"float32, float64 or complex64", "int64"}));
  EXPECT_TRUE(test::throws_error([] { det(ones({2, 2}, DType::BF16)); }, {"float32, float64 or complex64"}));
  EXPECT_TRUE(test::throws_error([] { solve(eye(3), ones({4, 2})); }, {"does not fit"}));
  EXPECT_TRUE(test::throws_error([] { solve(eye(3), ones({3, 2}, DType::F64)); }, {"one dtype"}));
  EXPECT_TRUE(test::throws_error([] { solve(ones({2, 3, 3}), ones({4, 3, 1})); }, {"broadcast"}));
  EXPECT_TRUE(test::throws_error([] { qr(eye(3), "full"); }, {"'reduced', 'complete' or 'r'"}));
  EXPECT_TRUE(test::throws_error([] { eigh(eye(3), "X"); }, {"'L' or 'U'"}));
  EXPECT_TRUE(test::throws_error([] { matrix_norm(eye(3), 3.0); }, {"inf, -inf, 1, -1, 2 or -2"}));
  EXPECT_TRUE(test::throws_error([] { lu_factor(eye(3), false); }, {"without pivoting"}));
  EXPECT_TRUE(test::throws_error([] { lu_solve(eye(3), ones({3}, DType::I64), ones({3, 1})); }, {"pivots must be int32"}));
}

TEST(Linalg, ComplexHelpers) {
  const Tensor z = from_vector<Complex64>({{1, 2}, {3, -4}});
  EXPECT_EQ(real(z).to_vector<float>(), (std::vector<float>{1, 3}));
  EXPECT_EQ(imag(z).to_vector<float>(), (std::vector<float>{2, -4}));
  EXPECT_EQ(imag(conj(z)).to_vector<float>(), (std::vector<float>{-2, 4}));
  EXPECT_EQ(view_as_real(z).sizes(), (Shape{2, 2}));
  imag(z).fill_(0.5);  // a view: writes reach z
  EXPECT_EQ(imag(z).to_vector<float>(), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(triu(ones({3, 3}), 1).to_vector<float>(), (std::vector<float>{0, 1, 1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(tril(ones({2, 3}), -1).to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 0, 0}));
}

// CUDA against the CPU: the one-launch kernels (n <= 32) and cuSOLVER (larger, rectangular) pick LAPACK's pivots
// and report LAPACK's info; factors and results agree with the CPU's to rounding.
TEST(LinalgCuda, FactorsPivotsAndInfoMatchTheCpu) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device();
  for (DType t : kDtypes) {
    for (const Shape& s : {Shape{257, 1, 1}, Shape{300, 2, 2}, Shape{100, 3, 3}, Shape{1000, 4, 4}, Shape{64, 7, 7},
                           Shape{33, 16, 16}, Shape{9, 31, 31}, Shape{5, 32, 32}, Shape{3, 33, 33}, Shape{8, 64, 64}, Shape{2, 65, 65},
                           Shape{2, 100, 100}, Shape{1, 48, 48}, Shape{1, 64, 64}, Shape{1, 128, 128}, Shape{3, 128, 128},
                           Shape{2, 40, 20}, Shape{2, 20, 40}, Shape{1, 300, 300}}) {
      SCOPED_TRACE(str(dtype_name(t), " ", shape_str(s)));
      const Tensor A = random_matrix(s, t);  // g_dev is the CPU here
      const Tensor Ad = A.to(dev);
      const LUFactorEx c = lu_factor_ex(A), g = lu_factor_ex(Ad);
      EXPECT_TRUE(g.LU.is_cuda() && g.pivots.is_cuda() && g.info.is_cuda());
      // Pivots are chosen by exact comparisons of the same values: equal unless rounding in f32 reorders a
      // near-tie, which fresh random matrices make rare; LU's entries agree to rounding.
      const auto pc = c.pivots.to_vector<int32_t>(), pg = g.pivots.to_vector<int32_t>();
      int64_t differ = 0;
      for (size_t i = 0; i < pc.size(); ++i) differ += pc[i] != pg[i];
      EXPECT_LE(differ, t == DType::F64 ? 0 : static_cast<int64_t>(pc.size() / 100 + 1));
      if (differ == 0) EXPECT_LT(rel_err(g.LU.cpu(), c.LU), tol(t, s.back()) * 10);
      EXPECT_EQ(g.info.to_vector<int32_t>(), c.info.to_vector<int32_t>());
      if (s[1] != s[2]) continue;
      const int64_t n = s.back();
      const Tensor W = add(A, mul(eye_like(n, t), Scalar(2.0))), Wd = W.to(dev);
      const Tensor Xc = inv(W), Xg = inv(Wd);
      EXPECT_LT(backward_err(matmul(W, Xg.cpu()), W, Xg.cpu(), eye_like(n, t).expand(W.sizes())), tol(t, n));
      // The two inverses are each within c n eps cond(W) of the true one (forward error = condition x backward
      // error): their difference is bounded by that, not by eps alone (a random W + 2I can be ill-conditioned).
      const double kappa = amax(cond(W)).to(DType::F64).item<double>();
      EXPECT_LT(rel_err(Xg.cpu(), Xc), 2 * tol(t, n) * std::max(kappa, 1.0)) << "cond " << kappa;
      const Tensor B = random_matrix({s[0], n, 3}, t);
      for (bool adjoint_solve : {false, true}) {
        const LUFactor f = lu_factor(Wd);
        const Tensor X = lu_solve(f.LU, f.pivots, B.to(dev), true, adjoint_solve).cpu();
        EXPECT_LT(backward_err(matmul(adjoint_solve ? adjoint(W) : W, X), W, X, B), tol(t, n));
      }
      // slogdet, not det: the determinants of the larger matrices overflow.
      const SlogDet sc = slogdet(W), sg = slogdet(Wd);
      EXPECT_LT(rel_err(sg.logabsdet.cpu(), sc.logabsdet), 1e3 * eps(t) * n);
      EXPECT_LT(rel_err(sg.sign.cpu(), sc.sign), 1e3 * eps(t) * n);
    }
  }
}

// The first zero pivot of each matrix is its info, as LAPACK's getrf reports it, on every path.
TEST(LinalgCuda, SingularMatricesReportTheFirstZeroPivot) {
  KILN_REQUIRE_CUDA();
  for (auto [t, n] : {std::pair{DType::F64, 4}, {DType::F64, 32}, {DType::F64, 40}, {DType::F64, 64}, {DType::C64, 64},
                      {DType::C64, 100}}) {
    SCOPED_TRACE(str(dtype_name(t), " ", n));
    Tensor A = add(random_matrix({3, n, n}, t), mul(eye_like(n, t), Scalar(4.0)));
    A.select(0, 1).select(-1, 2).fill_(0.0);  // matrix 1: column 2 is zero
    A.select(0, 2).fill_(0.0);               // matrix 2: all zero
    const LUFactorEx c = lu_factor_ex(A), g = lu_factor_ex(A.to(cuda_device()));
    EXPECT_EQ(g.info.to_vector<int32_t>(), c.info.to_vector<int32_t>());
    EXPECT_EQ(g.info.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1}));
    EXPECT_TRUE(test::throws_error([&] { inv(A.to(cuda_device())); }, {"linalg.inv", "batch element 1", "singular"}));
    EXPECT_EQ(inv_ex(A.to(cuda_device())).info.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1}));
  }
}

// Complex pivots are chosen by |re| + |im| (LAPACK's icamax), also when every entry is purely imaginary or the
// magnitudes differ by 1e±30: the CUDA kernels pick the CPU's pivots and agree with its factors.
TEST(LinalgCuda, ComplexLuPicksLapacksPivots) {
  KILN_REQUIRE_CUDA();
  for (int64_t n : {20, 48, 64, 100, 128}) {
    for (double scale : {1.0, 1e30, 1e-30}) {
      SCOPED_TRACE(str(n, " ", scale));
      // Matrix 0: purely imaginary; matrix 1: random parts, where |re| + |im| and |z| order some candidates
      // differently.
      const Tensor z = random_matrix({2, n, n}, DType::C64);
      view_as_real(z).select(0, 0).select(-1, 0).fill_(0.0);
      Tensor parts = view_as_real(z);
      mul_(parts, Scalar(scale));
      const LUFactorEx c = lu_factor_ex(z), g = lu_factor_ex(z.to(cuda_device()));
      // The first column's pivot compares the input's own values: equal. Later ones compare computed values, where
      // rounding may reorder a near-tie (rare).
      const auto pc = c.pivots.to_vector<int32_t>(), pg = g.pivots.cpu().to_vector<int32_t>();
      EXPECT_EQ(pg[0], pc[0]);
      EXPECT_EQ(pg[n], pc[n]);
      int64_t differ = 0;
      for (size_t i = 0; i < pc.size(); ++i) differ += pc[i] != pg[i];
      EXPECT_LE(differ, 2);
      if (differ == 0) EXPECT_LT(rel_err(g.LU.cpu(), c.LU), tol(DType::C64, n) * 10);
      EXPECT_EQ(g.info.to_vector<int32_t>(), (std::vector<int32_t>{0, 0}));
    }
  }
}

// Jacobi SVD on CUDA keeps the singular values of ill-conditioned matrices accurate relative to the largest, in
// the batched (<= 32 x 32) and the per-matrix routine; pinv and matrix_rank follow.
TEST(LinalgCuda, SvdOfIllConditionedMatricesStaysAccurate) {
  KILN_REQUIRE_CUDA();
  for (int64_t n : {24, 48}) {
    for (double c : {1e6, 1e12}) {
      SCOPED_TRACE(str(n, " ", c));
      const Tensor A = stack({conditioned(n, c), conditioned(n, c)}).to(cuda_device());
      const Tensor expected = logspace(0, -std::log10(c), n, 10.0, DType::F64);
      const SVD f = svd(A, false);
      // Jacobi's error bound grows with n (O(n eps) of the largest singular value, here 1).
      EXPECT_LT(amax(abs(sub(f.S.cpu(), expected.expand({2, n})))).item<double>(), 4 * n * 2.22e-16);
      EXPECT_LT(rel_err(matmul(mul(f.U, f.S.unsqueeze(-2)), f.Vh).cpu(), A.cpu()), 1e-13);
      EXPECT_EQ(matrix_rank(A, std::nullopt, 1e-9).to_vector<int64_t>(),
                (std::vector<int64_t>(2, c > 1e9 ? n - n / 4 : n)));
    }
  }
}

}  // namespace
}  // namespace kiln
