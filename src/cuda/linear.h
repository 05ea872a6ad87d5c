// CUDA linear (y = x @ weight^T + bias): the path choice between the matrix-vector kernel (decode, few rows),
// cuBLASLt with the bias epilogue (more rows) and the general matrix-product ops. Only in KILN_HAVE_CUDA
// builds. The op layer (src/ops/linear.cpp) has checked shapes, dtypes and devices.
#pragma once

#include <optional>

#include "kiln/tensor.h"

namespace kiln::cuda {

enum class LinearPath {
  Auto,      // linear_path_for's choice
  Gemv,      // src/cuda/kernels/gemv.cuh (any M: more than 16 rows run in launches of 16)
  CublasLt,  // one cublasLtMatmul with the bias epilogue
  Gemm,      // mm / addmm (cuBLAS), the general fallback
};
const char* linear_path_name(LinearPath p);

// The heuristic: which path linear takes for M rows (product of x's leading dims), weight [N, K], dtype.
LinearPath linear_path_for(int64_t m, int64_t n, int64_t k, DType dtype);

// Forces every CUDA linear to one path (Auto: the heuristic), process-wide, for benchmarks and tests that
// compare the paths. The initial value comes from the environment variable KILN_LINEAR_PATH (auto, gemv,
// cublaslt or gemm). A forced path that cannot take a call (a dtype it lacks, a layout cuBLASLt rejects)
// falls back to Gemm for that call.
void set_forced_linear_path(LinearPath p);
LinearPath forced_linear_path();

// The matrix-vector kernel's warps per weight-row group (split-K inside a block): 0 (the default) the
// launcher's rule (split_for in linear.cu), or 1, 2, 4 or 8 for every launch, for tests and A/B runs of the
// rule. The initial value comes from KILN_GEMV_SPLIT.
void set_gemv_split(int split);
int gemv_split();

// The one-row 16-bit matrix-vector instances (linear and linear_silu_mul_gemv): 0 (the default) per grid, the
// five-blocks one where the grid fits one round of its resident blocks but not of the usual instance's
// (take_five_blocks in linear.cu); 4: always the compiler's register count (four blocks of 256 threads per SM);
// 5: always at most 48 registers, five blocks per SM. The initial value comes from KILN_GEMV_MINB.
void set_gemv_min_blocks(int n);
int gemv_min_blocks();

// linear on CUDA tensors. `path` overrides both the forced path and the heuristic when it is not Auto.
// `taken`, when given, receives the path that ran.
Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
              LinearPath path = LinearPath::Auto, LinearPath* taken = nullptr);

// The paths themselves, on 2-d operands: x2 [M, K] with unit inner stride, weight [N, K] with unit inner
// stride, bias [N] or null, y [M, N] contiguous (allocated by the caller). Each returns false, having done
// nothing, when it cannot take the call; then the caller falls back.
bool linear_gemv(const Tensor& y, const Tensor& x2, const Tensor& weight, const Tensor* bias);
bool linear_cublaslt(const Tensor& y, const Tensor& x2, const Tensor& weight, const Tensor* bias);
// silu_and_mul(x2 @ weight^T) for one row (x2 [1, K], weight [2N, K]: gate rows then up rows, y [1, N]
// contiguous) by the matrix-vector kernel with the activation in its epilogue, from the f32 sums (the
// product is not rounded first). False, having done nothing, when it cannot take the call.
bool linear_silu_mul_gemv(const Tensor& y, const Tensor& x2, const Tensor& weight);

// The calling thread's cuBLASLt handle (a cublasLtHandle_t) for `device`, shared by every cuBLASLt user.
void* lt_handle(int device);

}  // namespace kiln::cuda
