// CUDA side of the FP8 family (quantize_fp8, dequantize_fp8, scaled_mm, linear with an Fp8Weight). Only in
// KILN_HAVE_CUDA builds. The op layer (src/ops/fp8.cpp) has checked shapes, dtypes and devices; it also owns
// the reference composition (dequantise both operands in f32, mm, bias) that serves as the general fallback.
#pragma once

#include <optional>

#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// x [M, K] f32/f16/bf16 (any strides) into values [M, K] (contiguous, float8) and scales [sm, sk] (contiguous
// f32) over groups of bm x bk (the CPU's Grid); `tensor_wise`: one group, reduced in two kernels.
void quantize_fp8(const Tensor& x, const Tensor& values, const Tensor& scales, int64_t bm, int64_t bk, bool tensor_wise);

// out [M, K] (contiguous f32, f16 or bf16) = v * scales[(m / bm) * ss0 + (k / bk) * ss1], the product in f32
// rounded once to out's dtype (the bits of the f32 result converted); v [M, K] float8, any strides; scales f32
// with element strides (ss0, ss1) (0 for a broadcast scale).
void dequantize_fp8(const Tensor& v, const Tensor& scales, int64_t ss0, int64_t ss1, int64_t bm, int64_t bk,
                    const Tensor& out);

enum class Fp8Path {
  Auto,      // the heuristic
  Gemv,      // the FP8 matrix-vector kernel (kernels/fp8.cuh), 1..16 rows per launch
  CublasLt,  // cuBLASLt FP8 (scaled_mm) / activation quantised to FP8 + cuBLASLt (linear, block-wise weights)
  Fallback,  // the exact definition on the device: dequantise in f32, then f32 matrix products
};
const char* fp8_path_name(Fp8Path p);

// The shape of the FP8 matrix-vector kernel for one row of 16-bit activations (linear's decode case): -1
// (auto, the default: chosen per layer shape, see auto_config in fp8.cu) or forced, for tests and A/B runs:
// 0: 4 weight rows per warp group x 2 loads each, two blocks per multiprocessor; 1: 2 x 4, three blocks;
// 2: 4 x 1, three blocks; 3: 2 x 2, four blocks; 4..6: pipelined 2 x 1 (four blocks), 2 x 2 (three), 4 x 1
// (two); 7: the tensor-core kernel where the operands fit it (kernels/fp8.cuh); 8: config 3's shape through
// the general loop. Process-wide; initial value from KILN_FP8_GEMV_CONFIG (auto or 0..8).
void set_fp8_gemv_config(int c);
int fp8_gemv_config();
// Launches of the tensor-core one-row kernel so far in this process (tests check that it ran).
int64_t fp8_gemv_mma_launches();

// Forces the path of every CUDA scaled_mm and linear(Fp8Weight) (Auto: the heuristic), process-wide; initial
// value from KILN_FP8_PATH (auto, gemv, cublaslt, fallback). A forced path that cannot take a call (layout,
// dtype) falls back to Fallback for that call.
void set_forced_fp8_path(Fp8Path p);
Fp8Path forced_fp8_path();

// scaled_mm on CUDA tensors. Returns nullopt when the chosen path cannot take the call: the op layer then runs
// the reference composition (which is also what Fp8Path::Fallback selects). `taken` receives the path that ran.
std::optional<Tensor> scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                                ScaleRecipe recipe, const std::optional<Tensor>& bias, DType out_dtype,
                                Fp8Path path = Fp8Path::Auto, Fp8Path* taken = nullptr);

// linear(x, Fp8Weight) on CUDA: x2 [M, K] (any strides), w.values [N, K], scales reshaped to [gn, gk]
// (contiguous), bias [N] in x's dtype or null. Returns y [M, N] in x's dtype.
Tensor linear_fp8(const Tensor& x2, const Tensor& w, const Tensor& scales, int64_t bn, int64_t bk, ScaleRecipe recipe,
                  const Tensor* bias, Fp8Path path = Fp8Path::Auto, Fp8Path* taken = nullptr);

// cuBLASLt FP8 product out = (a * sa) @ (b * sb) (+ bias): out [M, N] contiguous (allocated by the caller),
// a [M, K] row-major (unit inner stride), b [K, N] column-major (b.stride(0) == 1). Scales as scaled_mm's
// contract. Returns false, having enqueued nothing, when cuBLASLt cannot take the call (layout, alignment,
// dtype, a scale mode this cuBLASLt lacks). In fp8_lt.cpp.
bool scaled_mm_cublaslt(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                        const Tensor& scale_b, ScaleRecipe recipe, const Tensor* bias);

}  // namespace kiln::cuda
