// Linear algebra with torch.linalg's names, arguments and results. Every function takes matrices in the last
// two dims and batches over the leading ones (broadcast where torch broadcasts); dtypes float32, float64 and
// complex64. Results are contiguous tensors on the input's device.
//
// Failure: the `_ex` forms return LAPACK's `info` per batch element (0: success; for a factorisation, k > 0:
// the k-th pivot or leading minor is zero or not positive) and leave the output as computed; the plain forms
// throw kiln::Error naming the batch element and the failure, as torch.linalg does. The spectral functions
// (svd, svdvals, eigh, eigvalsh, pinv, cond, matrix_rank) refuse non-finite input with an error.
//
// The CPU runs LAPACK (OpenBLAS's; batches of matrices spread over the threads); CUDA runs cuSOLVER, cuBLAS and
// kiln's small-matrix kernels on the current stream (docs/architecture.md, "Linear algebra"). The `_ex` forms
// do not synchronise; the plain forms wait for `info` to raise their errors.
#pragma once

#include <optional>
#include <string_view>

#include "kiln/tensor.h"

namespace kiln::linalg {

// ---- LU ------------------------------------------------------------------------------------------------------
// A = P L U with partial pivoting (complex pivots by |re| + |im|, as LAPACK's icamax). LU holds L (unit
// diagonal, not stored) below and U on and above the diagonal; pivots are int32, 1-based as torch returns
// them: row i was swapped with row pivots[i] - 1.
struct LUFactor {
  Tensor LU, pivots;
};
struct LUFactorEx {
  Tensor LU, pivots, info;
};
LUFactor lu_factor(const Tensor& A, bool pivot = true);
LUFactorEx lu_factor_ex(const Tensor& A, bool pivot = true, bool check_errors = false);
struct PLU {
  Tensor P, L, U;
};
PLU lu(const Tensor& A, bool pivot = true);
// X with A X = B (left) or X A = B (right), A given by lu_factor; adjoint solves with A^H.
Tensor lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left = true, bool adjoint = false);

// ---- Solves and inverses --------------------------------------------------------------------------------------
// A triangular (only its upper or lower triangle is read); X with A X = B (left) or X A = B (right).
Tensor solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left = true, bool unitriangular = false);
// A square; B [..., n, k] or [..., n] (a vector, when its shape is A's batch shape plus n).
Tensor solve(const Tensor& A, const Tensor& B, bool left = true);
struct SolveEx {
  Tensor result, info;
};
SolveEx solve_ex(const Tensor& A, const Tensor& B, bool left = true, bool check_errors = false);
Tensor inv(const Tensor& A);
struct InvEx {
  Tensor inverse, info;
};
InvEx inv_ex(const Tensor& A, bool check_errors = false);
Tensor det(const Tensor& A);
// sign (a unit complex number for complex input; 0 for a singular matrix) and log|det| (-inf when singular).
struct SlogDet {
  Tensor sign, logabsdet;
};
SlogDet slogdet(const Tensor& A);
// Hermitian positive-definite A = L L^H (upper: A = U^H U).
Tensor cholesky(const Tensor& A, bool upper = false);
struct CholeskyEx {
  Tensor L, info;
};
CholeskyEx cholesky_ex(const Tensor& A, bool upper = false, bool check_errors = false);

// ---- Factorisations ---------------------------------------------------------------------------------------------
// mode "reduced" (Q [m, k], R [k, n], k = min(m, n)), "complete" (Q [m, m], R [m, n]) or "r" (Q empty).
struct QR {
  Tensor Q, R;
};
QR qr(const Tensor& A, std::string_view mode = "reduced");
// A = U diag(S) Vh; S real, descending. full_matrices: U [m, m] and Vh [n, n], else [m, k] and [k, n].
struct SVD {
  Tensor U, S, Vh;
};
SVD svd(const Tensor& A, bool full_matrices = true);
Tensor svdvals(const Tensor& A);
// Hermitian A (only the UPLO triangle is read): eigenvalues ascending (real), eigenvectors as columns.
struct Eigh {
  Tensor eigenvalues, eigenvectors;
};
Eigh eigh(const Tensor& A, std::string_view UPLO = "L");
Tensor eigvalsh(const Tensor& A, std::string_view UPLO = "L");
// Moore-Penrose inverse from the SVD (or eigh when hermitian): singular values at or below
// max(atol, rtol * largest) are dropped. Neither given: rtol = eps(dtype) * max(m, n); atol alone: rtol 0.
Tensor pinv(const Tensor& A, std::optional<double> atol = std::nullopt, std::optional<double> rtol = std::nullopt,
            bool hermitian = false);
// The number of singular values (eigenvalue magnitudes when hermitian) above that tolerance, int64.
Tensor matrix_rank(const Tensor& A, std::optional<double> atol = std::nullopt, std::optional<double> rtol = std::nullopt,
                   bool hermitian = false);

// ---- Norms ------------------------------------------------------------------------------------------------------
// ord: "fro", "nuc", or a number: inf, -inf, 1, -1, 2, -2 (the last two from the singular values).
Tensor matrix_norm(const Tensor& A, std::string_view ord = "fro", bool keepdim = false);
Tensor matrix_norm(const Tensor& A, double ord, bool keepdim = false);
// sum(|x|^ord)^(1/ord) over `dims` (all when empty); inf / -inf: max / min |x|; 0: the count of nonzeros.
Tensor vector_norm(const Tensor& x, double ord = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The condition number in a matrix norm: p 2 / -2 from the singular values, "fro", "nuc", inf, -inf, 1, -1 as
// norm(A) * norm(inv(A)).
Tensor cond(const Tensor& A, std::optional<double> p = std::nullopt);
Tensor cond(const Tensor& A, std::string_view p);

}  // namespace kiln::linalg
