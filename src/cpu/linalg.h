// Batched LAPACK on the CPU (OpenBLAS's LAPACK, through its Fortran entry points: Debian's OpenBLAS is built
// without LAPACKE, and the Fortran routines are what LAPACKE would call).
//
// Matrices are column-major, as LAPACK wants them: a contiguous CPU tensor [B, cols, rows] holds B matrices
// of rows x cols, each stored as the row-major transpose (src/ops/linalg.cpp makes these with .mT().contiguous()).
// dtypes float32, float64, complex64. The batch runs in parallel over the OpenMP threads (each LAPACK call
// then runs on one thread); a single matrix gets OpenBLAS's own threads. info is int32 [B].
#pragma once

#include "kiln/tensor.h"

namespace kiln::cpu {

// LU with partial pivoting in place: a [B, n, m]; piv int32 [B, min(m, n)] (1-based).
void lapack_getrf(Tensor& a, Tensor& piv, Tensor& info);
// Solves op(A) X = B in place of b [B, k, n] (k right-hand sides), A's LU from getrf; trans 'N', 'T' or 'C'.
void lapack_getrs(const Tensor& lu, const Tensor& piv, Tensor& b, char trans);
// The inverse from the LU, in place.
void lapack_getri(Tensor& lu, const Tensor& piv, Tensor& info);
// Cholesky in place (the `upper` triangle of the column-major matrix is read and written).
void lapack_potrf(Tensor& a, bool upper, Tensor& info);
// Householder QR in place: R above the diagonal, the reflectors below; tau [B, min(m, n)].
void lapack_geqrf(Tensor& a, Tensor& tau);
// Q's first q.size(1) columns from k reflectors, in place of q [B, cols, m] (holding geqrf's output).
void lapack_orgqr(Tensor& q, const Tensor& tau, int64_t k);
// SVD by divide and conquer: a [B, n, m] (destroyed); s [B, min] real; jobz 'N' (values only), 'S' (u [B, k, m],
// vt [B, n, k]) or 'A' (u [B, m, m], vt [B, n, n]); column-major like a.
void lapack_gesdd(Tensor& a, Tensor& s, Tensor& u, Tensor& vt, char jobz, Tensor& info);
// Hermitian eigen-decomposition by divide and conquer: a [B, n, n] (eigenvectors in place when `vectors`),
// w [B, n] real ascending; the `upper` triangle (column-major) is read.
void lapack_syevd(Tensor& a, Tensor& w, bool vectors, bool upper, Tensor& info);
// Triangular solve on row-major matrices (BLAS trsm): a [B, n, n] (or one matrix broadcast to the batch),
// b [B, rows, cols] in place; left: A X = B, else X A = B.
void blas_trsm(const Tensor& a, Tensor& b, bool left, bool upper, bool unit);

}  // namespace kiln::cpu
