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

// One-row products of 16-bit operands without widening b: c [B, 1, m] (f32, contiguous; holds beta * input
// or zeros, and is scaled by beta here) += alpha * a [B, 1, k] @ b [B, k, m], in f32, for a with unit
// stride along k and b with unit stride along k (a linear layer's transposed weight). False, having done
// nothing, for other layouts or dtypes (the caller widens to f32 then).
bool gemv_half(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta);

// The BLAS library in use and how it threads, e.g. "OpenBLAS 0.3.21 ... (OpenMP threads)".
std::string blas_description();

}  // namespace kiln::cpu
