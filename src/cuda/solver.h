// Batched dense linear algebra on CUDA for kiln::linalg (src/ops/linalg.cpp), with the contract of the CPU's
// LAPACK layer (src/cpu/linalg.h): matrices column-major in contiguous device tensors [B, cols, rows], pivots
// int32 1-based, info int32 [B] written on the device (the caller reads it only when it must). Everything is
// asynchronous on the current stream. Only in KILN_HAVE_CUDA builds.
//
// Square matrices of n <= kSmallN take kiln's own one-launch kernels (src/cuda/solver_small.cu) for inverse
// and LU solves, n <= kSmallLuN for LU (complex: kSmallComplexLuN; with LAPACK's pivots, which cuBLAS's complex
// batched LU does not pick); batches of mid-sized ones (up to 512) cuBLAS's batched LU, solve and inverse; the rest, and the other
// factorisations, cuSOLVER per matrix, with its device workspace from kiln's caching allocator (so the memory
// figures count it).
//
// Before any of those, src/ops/linalg.cpp sends the inverse of n <= kFusedInvN, and the determinant and the
// one-vector solve of n <= kTinyN, to the fused kernels of src/cuda/solver_fused.cu, which read the caller's
// row-major matrices and write row-major results in a single launch.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

inline constexpr int64_t kSmallN = 32;    // inverse and LU solves
inline constexpr int64_t kSmallLuN = 64;  // LU
inline constexpr int64_t kSmallComplexLuN = 128;  // complex LU
// Whether lu_small takes square matrices of this dtype and size.
inline bool lu_small_fits(DType t, int64_t n) { return n <= kSmallLuN || (t == DType::C64 && n <= kSmallComplexLuN); }

void solver_getrf(Tensor& a, Tensor& piv, Tensor& info);
void solver_getrs(const Tensor& lu, const Tensor& piv, Tensor& b, char trans);
void solver_getri(Tensor& lu, const Tensor& piv, Tensor& info);
void solver_potrf(Tensor& a, bool upper, Tensor& info);
void solver_geqrf(Tensor& a, Tensor& tau);
void solver_orgqr(Tensor& q, const Tensor& tau, int64_t k);
// SVD by one-sided Jacobi (cuSOLVER's gesvdj; gesvdjBatched for batches of matrices up to 32 x 32), with the
// outputs of the CPU's gesdd: jobz 'N', 'S' or 'A', vt holding V^H.
void solver_gesvd(Tensor& a, Tensor& s, Tensor& u, Tensor& vt, char jobz, Tensor& info);
void solver_syevd(Tensor& a, Tensor& w, bool vectors, bool upper, Tensor& info);
// Row-major triangular solves (cuBLAS trsm), as cpu::blas_trsm.
void blas_trsm(const Tensor& a, Tensor& b, bool left, bool upper, bool unit);

// The one-launch kernels (square): LU in place (lu_small_fits: a warp per matrix up to n = 32, a block above);
// the inverse from the LU in place; LU solves of
// b [B, k, n] in place (trans 'N', 'T' or 'C').
void lu_small(Tensor& a, Tensor& piv, Tensor& info);
// The block kernel of lu_small (kSmallN < n, lu_small_fits) from `in` [B, n, n] into `out` (the same buffer or
// another of in's shape): column-major buffers, or row-major ones with row_major (lu_factor's own layout, no
// transposes around the kernel).
void lu_block(const Tensor& in, Tensor& out, Tensor& piv, Tensor& info, bool row_major);
void inverse_small(Tensor& lu, const Tensor& piv);
void lu_solve_small(const Tensor& lu, const Tensor& piv, Tensor& b, char trans);
// The fused kernels: a [B, n, n] contiguous and row-major (not LAPACK's layout), results row-major and contiguous,
// info int32 [B] as getrf's. n <= kTinyN: one thread per matrix (f32, f64, c64); kTinyN < n <= kFusedInvN:
// Gauss-Jordan with a few lanes per matrix, 4 rows each in f32 (2 or 4 lanes) and 2 in f64 (4 or 8 lanes).
inline constexpr int64_t kTinyN = 4;
inline constexpr int64_t kFusedInvN = 16;
// Whether inverse_fused takes matrices of this dtype and size.
bool fused_inverse_fits(DType t, int64_t n);
// out [B, n, n] = a^-1 and info [B].
void inverse_fused(const Tensor& a, Tensor& out, Tensor& info);
// det [B] (a's dtype), 1 <= n <= kTinyN.
void det_tiny(const Tensor& a, Tensor& det);
// x [B, n] with a x = b for b [B, n], and info [B]; 1 <= n <= kTinyN.
void solve_tiny(const Tensor& a, const Tensor& b, Tensor& x, Tensor& info);

// sign (lu's dtype) and log|det| (its real dtype), [B] each, from an LU of any n and its pivots: one thread per
// matrix, accumulated in double.
void slogdet_from_lu(const Tensor& lu, const Tensor& piv, Tensor& sign, Tensor& logabs);

}  // namespace kiln::cuda
