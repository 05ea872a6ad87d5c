// CUDA's fused kernels for small matrices (src/cuda/solver_fused.cu: the inverse for n <= 16, the determinant and
// the one-vector solve for n <= 4, each one launch on the row-major batch) against f64 references on the CPU, at
// tolerances scaled by each matrix's condition number; getrf's info and the raising forms on singular batch
// elements; batch sizes that leave a warp or a block part-full; non-contiguous input; outputs on poisoned memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kiln/linalg.h"
#include "test_util.h"

namespace kiln {
namespace {

using namespace kiln::linalg;

double eps(DType t) { return t == DType::F64 ? 2.22e-16 : 1.19e-7; }

// A backward-stable inverse or solve has a forward error below c * n * eps * cond(A) with a small c; this c
// leaves room for the reference's own error and is still far below what a wrong pivot or a missed update gives.
constexpr double kStable = 10.0;

Tensor normal(const Shape& shape) {
  std::normal_distribution<double> dist;
  std::vector<double> v(static_cast<size_t>(checked_numel(shape)));
  for (auto& x : v) x = dist(test::rng());
  return from_vector<double>(v, shape);
}

// Standard normal entries plus n I (well-conditioned), on the CPU; complex: both parts normal.
Tensor well_conditioned(const Shape& shape, DType t) {
  const int64_t n = shape.back();
  const Tensor re = add(normal(shape), mul(eye(n, std::nullopt, DType::F64), Scalar(static_cast<double>(n))));
  if (t != DType::C64) return re.to(t);
  Tensor z = empty(shape, DType::C64);
  view_as_real(z).select(-1, 0).copy_(re.to(DType::F32));
  view_as_real(z).select(-1, 1).copy_(normal(shape).to(DType::F32));
  return z;
}

// The reference's dtype: f64 for real input (exact conversion), c64 for complex (kiln has no complex128).
DType reference_dtype(DType t) { return t == DType::C64 ? DType::C64 : DType::F64; }

// Leaves freed blocks of these sizes full of 0xFF bytes (NaN in every float dtype, -1 as int32) in the caching
// allocator, so the op's outputs most likely land on them: an element a kernel does not write stays NaN or -1.
void poison_next(std::initializer_list<int64_t> bytes) {
  std::vector<Tensor> junk;
  for (int64_t b : bytes) {
    junk.push_back(empty({std::max<int64_t>(b, 1)}, DType::U8, cuda_device()));
    junk.back().fill_(0xFF);
  }
}

int64_t nbytes(int64_t numel, DType t) { return numel * static_cast<int64_t>(itemsize(t)); }

// Per matrix of [B, n, n] (CPU, reference dtype): the 1-norm condition number from A and its inverse R.
std::vector<double> cond_1(const Tensor& A, const Tensor& R) {
  return mul(matrix_norm(A, 1.0), matrix_norm(R, 1.0)).to(DType::F64).to_vector<double>();
}

// Per item of [B, ...]: ||X - R||_1 / ||R||_1 (matrices: the induced norm; vectors [B, n]: the vector norm).
std::vector<double> rel_err_1(const Tensor& X, const Tensor& R) {
  const bool matrices = R.dim() == 3;
  const Tensor d = sub(X.to(R.dtype()), R);
  const Tensor num = matrices ? matrix_norm(d, 1.0) : vector_norm(d, 1.0, {-1});
  const Tensor den = matrices ? matrix_norm(R, 1.0) : vector_norm(R, 1.0, {-1});
  return div(num, den).to(DType::F64).to_vector<double>();
}

// Makes some elements of a CPU batch [B, n, n] singular and returns getrf's info for each: element 1 a zero
// column n / 2 (info n / 2 + 1), element 3 all zero (info 1), element 5 (n > 1) a last row equal to its first row
// for real dtypes, zero for complex (info n: that row is eliminated to exact zeros and is the pivot of the last
// step), the last element (when B > 7) a zero first column (info 1).
//
// The duplicate row becomes exactly zero because the fused kernels form LU's multipliers by division (a / a is 1
// exactly); LAPACK scales by the pivot's reciprocal, and a * (1 / a) is not always 1, so the CPU may report a
// tiny pivot there instead of a zero one. Complex division is not exact that way either.
std::vector<int32_t> make_singular(Tensor& A) {
  const int64_t B = A.size(0), n = A.size(-1);
  std::vector<int32_t> info(static_cast<size_t>(B), 0);
  if (B > 1) {
    A.select(0, 1).select(-1, n / 2).fill_(0.0);
    info[1] = static_cast<int32_t>(n / 2 + 1);
  }
  if (B > 3) {
    A.select(0, 3).fill_(0.0);
    info[3] = 1;
  }
  if (B > 5 && n > 1) {
    Tensor last = A.select(0, 5).select(0, n - 1);
    if (A.dtype() == DType::C64) last.fill_(0.0);
    else last.copy_(A.select(0, 5).select(0, 0));
    info[5] = static_cast<int32_t>(n);
  }
  if (B > 7) {
    A.select(0, B - 1).select(-1, 0).fill_(0.0);
    info[static_cast<size_t>(B - 1)] = 1;
  }
  return info;
}

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

int64_t first_nonzero(const std::vector<int32_t>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0) return static_cast<int64_t>(i);
  return -1;
}

std::vector<int64_t> batch_sizes(int64_t n) {
  if (n == 4) return {1, 7, 1000, 65537};  // 65537: one matrix past a multiple of every warp and block size
  if (n <= 4) return {1, 7, 1000};
  return {1, 7, 999};
}

std::vector<DType> dtypes_for(int64_t n) {
  if (n <= 4) return {DType::F32, DType::F64, DType::C64};
  return {DType::F32, DType::F64};
}

TEST(LinalgSmallCuda, InverseMatchesTheF64ReferenceWithLapackInfo) {
  KILN_REQUIRE_CUDA();
  for (int64_t n = 1; n <= 16; ++n) {
    for (DType t : dtypes_for(n)) {
      for (int64_t B : batch_sizes(n)) {
        SCOPED_TRACE(str("n ", n, ", ", dtype_name(t), ", batch ", B));
        Tensor A = well_conditioned({B, n, n}, t);
        const std::vector<int32_t> expected_info = make_singular(A);
        const Tensor Ar = A.to(reference_dtype(t));
        const InvEx ref = inv_ex(Ar);
        const Tensor Ag = A.to(cuda_device());
        poison_next({nbytes(B * n * n, t), nbytes(B, DType::I32)});
        const InvEx got = inv_ex(Ag);
        ASSERT_TRUE(got.inverse.is_cuda() && got.info.is_cuda());
        ASSERT_EQ(got.inverse.sizes(), (Shape{B, n, n}));
        EXPECT_EQ(got.info.to_vector<int32_t>(), expected_info);
        const Tensor X = got.inverse.cpu();
        const std::vector<double> err = rel_err_1(X, ref.inverse), cond = cond_1(Ar, ref.inverse);
        // The left residual, independent of the reference: ||X A - I||_1 / (||X||_1 ||A||_1), within c n eps for
        // LU-based inversion (LAPACK's getri) and Gauss-Jordan alike (Higham, Accuracy and Stability, ch. 14).
        const Tensor I = eye(n, std::nullopt, reference_dtype(t)).expand({B, n, n});
        const Tensor Xr = X.to(reference_dtype(t));
        const std::vector<double> resid =
            div(matrix_norm(sub(matmul(Xr, Ar), I), 1.0), mul(matrix_norm(Xr, 1.0), matrix_norm(Ar, 1.0)))
                .to(DType::F64)
                .to_vector<double>();
        double worst = 0, worst_resid = 0;
        for (int64_t b = 0; b < B; ++b) {
          if (expected_info[static_cast<size_t>(b)] != 0) continue;
          worst = std::max(worst, err[b] / (n * eps(t) * cond[b]));
          worst_resid = std::max(worst_resid, resid[b] / (n * eps(t)));
        }
        EXPECT_LT(worst, kStable) << "forward error / (n eps cond)";
        EXPECT_LT(worst_resid, kStable) << "left residual / (n eps)";
        // The raising form names the first singular element; without one it returns the same inverse.
        const int64_t bad = first_nonzero(expected_info);
        if (bad >= 0) {
          EXPECT_TRUE(test::throws_error([&] { inv(Ag); }, {"linalg.inv", str("batch element ", bad), "singular"}));
          EXPECT_TRUE(test::throws_error([&] { inv_ex(Ag, true); }, {"linalg.inv_ex", str("batch element ", bad)}));
        } else {
          EXPECT_TRUE(test::equal(inv(Ag).cpu(), X));
        }
      }
    }
  }
}

// The batch's own shape comes back; strided input (a transpose, a narrowed wider buffer) is read as its values.
TEST(LinalgSmallCuda, InverseOfBatchedAndStridedInput) {
  KILN_REQUIRE_CUDA();
  for (int64_t n : {3, 4, 6, 16}) {
    for (DType t : dtypes_for(n)) {
      SCOPED_TRACE(str("n ", n, ", ", dtype_name(t)));
      const Tensor A = well_conditioned({3, 5, n, n}, t);
      const Tensor R = inv(A.to(reference_dtype(t)));
      const Tensor Ag = A.to(cuda_device());
      const Tensor X = inv(Ag);
      EXPECT_EQ(X.sizes(), (Shape{3, 5, n, n}));
      const Tensor R15 = R.reshape({15, n, n});
      const double tol = kStable * n * eps(t) * max_of(cond_1(A.to(reference_dtype(t)).reshape({15, n, n}), R15));
      EXPECT_LT(max_of(rel_err_1(X.cpu().reshape({15, n, n}), R15)), tol);
      const Tensor Xt = inv(Ag.transpose(-2, -1));
      EXPECT_LT(max_of(rel_err_1(Xt.cpu().reshape({15, n, n}), R15.transpose(-2, -1).contiguous())), tol);
      const Tensor wide = cat({Ag, zeros({3, 5, n, 3}, t, cuda_device())}, -1).narrow(-1, 0, n);
      ASSERT_FALSE(wide.is_contiguous());
      EXPECT_LT(max_of(rel_err_1(inv(wide).cpu().reshape({15, n, n}), R15)), tol);
      // A single matrix: info is a 0-d tensor, as on the CPU.
      EXPECT_EQ(inv_ex(Ag.select(0, 0).select(0, 0)).info.dim(), 0);
    }
  }
}

TEST(LinalgSmallCuda, DeterminantOfTinyMatrices) {
  KILN_REQUIRE_CUDA();
  for (int64_t n = 1; n <= 4; ++n) {
    for (DType t : dtypes_for(n)) {
      for (int64_t B : batch_sizes(n)) {
        SCOPED_TRACE(str("n ", n, ", ", dtype_name(t), ", batch ", B));
        Tensor A = well_conditioned({B, n, n}, t);
        const std::vector<int32_t> info = make_singular(A);
        const Tensor Ar = A.to(reference_dtype(t));
        const Tensor ref = det(Ar);
        const std::vector<double> cond = cond_1(Ar, inv_ex(Ar).inverse);
        poison_next({nbytes(B, t)});
        const Tensor got = det(A.to(cuda_device()));
        ASSERT_TRUE(got.is_cuda());
        ASSERT_EQ(got.sizes(), (Shape{B}));
        const std::vector<double> d = abs(sub(got.cpu().to(ref.dtype()), ref)).to(DType::F64).to_vector<double>();
        const std::vector<double> mag = abs(ref).to(DType::F64).to_vector<double>();
        const std::vector<double> g = abs(got.cpu()).to(DType::F64).to_vector<double>();
        double worst = 0;
        for (int64_t b = 0; b < B; ++b) {
          if (info[static_cast<size_t>(b)] != 0) {
            EXPECT_EQ(g[b], 0.0) << "singular element " << b;  // an exact zero pivot
            continue;
          }
          worst = std::max(worst, d[b] / (mag[b] * n * n * eps(t) * cond[b]));
        }
        // det(A + E) / det(A) - 1 ~ trace(A^-1 E): an LU with backward error c n eps |A| moves it by up to
        // c n^2 eps cond(A).
        EXPECT_LT(worst, kStable) << "relative error / (n^2 eps cond)";
      }
    }
  }
}

TEST(LinalgSmallCuda, SolveOfTinySystemsWithOneVector) {
  KILN_REQUIRE_CUDA();
  for (int64_t n = 1; n <= 4; ++n) {
    for (DType t : dtypes_for(n)) {
      for (int64_t B : batch_sizes(n)) {
        SCOPED_TRACE(str("n ", n, ", ", dtype_name(t), ", batch ", B));
        Tensor A = well_conditioned({B, n, n}, t);
        const std::vector<int32_t> expected_info = make_singular(A);
        const Tensor b = well_conditioned({B, n, n}, t).select(-1, 0).contiguous();  // [B, n]
        const Tensor Ar = A.to(reference_dtype(t)), br = b.to(reference_dtype(t));
        const SolveEx ref = solve_ex(Ar, br);
        const std::vector<double> cond = cond_1(Ar, inv_ex(Ar).inverse);
        const Tensor Ag = A.to(cuda_device()), bg = b.to(cuda_device());
        poison_next({nbytes(B * n, t), nbytes(B, DType::I32)});
        const SolveEx got = solve_ex(Ag, bg);
        ASSERT_EQ(got.result.sizes(), (Shape{B, n}));
        EXPECT_EQ(got.info.to_vector<int32_t>(), expected_info);
        const std::vector<double> err = rel_err_1(got.result.cpu(), ref.result);
        double worst = 0;
        for (int64_t i = 0; i < B; ++i)
          if (expected_info[static_cast<size_t>(i)] == 0) worst = std::max(worst, err[i] / (n * eps(t) * cond[i]));
        EXPECT_LT(worst, kStable) << "forward error / (n eps cond)";
        const int64_t bad = first_nonzero(expected_info);
        if (bad >= 0)
          EXPECT_TRUE(test::throws_error([&] { solve(Ag, bg); }, {"linalg.solve", str("batch element ", bad), "singular"}));
        // A strided right-hand side (a column of a matrix) gives the same solution, bit for bit (NaN where the
        // matrix is singular).
        const Tensor col = cat({bg.unsqueeze(-1), bg.unsqueeze(-1)}, -1).select(-1, 1);
        ASSERT_TRUE(!col.is_contiguous() || n == 1);
        EXPECT_TRUE(test::equal(solve_ex(Ag, col).result.cpu(), got.result.cpu()));
      }
    }
  }
}

}  // namespace
}  // namespace kiln
