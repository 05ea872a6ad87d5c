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

// The BLAS library in use and how it threads, e.g. "OpenBLAS 0.3.21 ... (OpenMP threads)".
std::string blas_description();

}  // namespace kiln::cpu
