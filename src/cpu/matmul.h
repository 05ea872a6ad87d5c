// CPU matrix-product kernel shared by mm, bmm, matmul and addmm.
#pragma once

#include <string>

#include "kiln/tensor.h"

namespace kiln::cpu {

// c[b] = beta * c[b] + alpha * a[b] @ b[b] for every batch b. c is a contiguous [B, n, m] tensor of the
// same dtype as a [B, n, k] and b [B, k, m] (any strides, batch stride 0 allowed); with beta == 0 the
// contents of c are ignored (NaN included). Dtypes: f32, f64, c64 (BLAS) and the integer types (a
// wrapping loop); half types are converted to f32 by the caller.
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Scalar& alpha, const Scalar& beta);

// Products of 16-bit operands in f32: c [B, n, m] (f32, contiguous; holds the input or zeros, scaled by beta
// here) = beta * c + alpha * a [B, n, k] @ b [B, k, m], for the layouts gemm_half_takes: a and b bf16 or f16
// with unit stride along k (b: a linear layer's transposed weight). Up to 16 rows of a read b in place, each
// weight widened once per group of four rows; more rows widen slices of b to f32 for sgemm. With beta 0, c is
// written without being read (its contents may be anything).
// With oneDNN (KILN_HAVE_DNNL) and a CPU with BF16 dot products, bf16 products of more than 16 rows go to
// oneDNN's matmul instead (dnnl_gemm_half: the count of c's columns it computed, a prefix; 0: c untouched).
// On AMX it takes only the first m / 64 * 64 columns: oneDNN 2.6's AMX matmul gives wrong sums, or stops on an
// illegal instruction, for some shapes whose m leaves 49-63 columns past a multiple of 64 (x of 17-32 rows by
// 49-63 weight rows on 2 threads; 270 x 3583 by 62 on any); kiln's own tiles take the rest.
bool gemm_half_takes(const Tensor& a, const Tensor& b);
void gemm_half(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta);
int64_t dnnl_gemm_half(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta);
// Which of the two the many-row bf16 products take here, in words (`kiln info`).
std::string dnnl_gemm_half_description();

// The BLAS library in use and how it threads, e.g. "OpenBLAS 0.3.21 ... (OpenMP threads)".
std::string blas_description();

}  // namespace kiln::cpu
