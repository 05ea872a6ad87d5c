// The CPU kernels of Q8_0 weights (kiln/nn.h, Q8Weight; llama.cpp's block format): blocks of 32 int8 values
// with one f16 scale, value = scale x q. Products quantise the activations to the same format (per block of 32:
// scale = max|x| / 127, q = round(x / scale)) and take int8 dot products: AVX-512 VNNI where the CPU has it,
// AVX2 otherwise, scalar code elsewhere. Each block's integer sum is exact; the three differ only in the order
// of the f32 sums over the blocks.
#pragma once

#include <cstdint>

namespace kiln::cpu {

inline constexpr int64_t kQ8Block = 32;

// x [K] (K a multiple of 32) -> q [K], d [K / 32] (f32 scales). A block holding NaN or an infinity gives zeros
// and a NaN scale.
void q8_quantize_row(const float* x, int64_t K, int8_t* q, float* d);
// The weight's form of the same: scales as f16 bits.
void q8_quantize_weight_row(const float* x, int64_t K, int8_t* q, uint16_t* d);

// out[r * ldo + j] = sum over blocks b of xd[r][b] * wd[j][b] * (xq[r] . w[j] over block b): rows <= 4 activation
// rows (ldq apart, their scales ldd apart) against nw consecutive weight rows of nb blocks each (values w, f16
// scales wd, both contiguous).
void q8_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, int64_t ldd, int rows, const int8_t* w,
                 const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo);

// Q4_0 weights (Q4Weight): blocks of 32 4-bit codes with one f16 scale, value = (code - 8) x scale; a row of a
// block packs 16 bytes, byte j holding code j in its low nibble and code j + 16 in its high one (llama.cpp's
// layout). The dot products take the codes as unsigned bytes against the quantised activations.
// xn: per row (ldq / 4 apart) -8 x the sum of each 4 consecutive quantised activations (q4_row_corrections):
// the SIMD kernels multiply the codes as unsigned bytes and start each 4-byte lane's sum at it.
void q4_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const int32_t* xn, int64_t ldd, int rows,
                 const uint8_t* w, const uint16_t* wd, int64_t nb, int64_t nw, float* out, int64_t ldo);
void q4_row_corrections(const int8_t* xq, int64_t K, int32_t* xn);
// x [K] -> packed codes q [K / 2] and f16 scales d [K / 32] (llama.cpp's reference rounding).
void q4_quantize_weight_row(const float* x, int64_t K, uint8_t* q, uint16_t* d);
// The row's values in f32.
void q4_unpack_row(const uint8_t* q, const uint16_t* d, int64_t K, float* out);

// Q4_K weights (Q4KWeight): super-blocks of 256 values in 144 bytes, GGUF's layout (kiln/nn.h). A row of nsb
// super-blocks against activation rows quantised per block of 32 (q8_quantize_row) with, per block b, xs[b] =
// xd[b] x (the sum of its quantised values), for the mins (q4k_row_sums). Arguments as q4_dot_rows'.
inline constexpr int64_t kQ4KBlock = 256, kQ4KBytes = 144;
void q4k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo);
void q4k_row_sums(const int8_t* xq, const float* xd, int64_t K, float* xs);
// x [K] -> K / 256 super-blocks (llama.cpp's quantize_row_q4_K_ref).
void q4k_quantize_row(const float* x, int64_t K, uint8_t* out);
// The row's values in f32.
void q4k_unpack_row(const uint8_t* w, int64_t K, float* out);

// Q5_K weights (Q5KWeight): Q4_K's super-block with 32 bytes of fifth bits (qh) between the scales and the
// codes, 176 bytes: sub-block j's codes gain bit j of qh[l]. Arguments as q4k_dot_rows'.
inline constexpr int64_t kQ5KBytes = 176;
void q5k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const float* xs, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo);
void q5k_unpack_row(const uint8_t* w, int64_t K, float* out);

// Q6_K weights (Q6KWeight): super-blocks of 256 values in 210 bytes, GGUF's layout (kiln/nn.h), against
// activation rows quantised per block of 32 (q8_quantize_row) with, per row (ldq / 16 apart), the sums of each
// 16 consecutive quantised values (q6k_group_sums: the codes' -32 offset). Arguments as q8_dot_rows' (nsb
// super-blocks a row).
inline constexpr int64_t kQ6KBlock = 256, kQ6KBytes = 210;
void q6k_dot_rows(const int8_t* xq, int64_t ldq, const float* xd, const int16_t* xg, int64_t ldd, int rows,
                  const uint8_t* w, int64_t nsb, int64_t nw, float* out, int64_t ldo);
void q6k_group_sums(const int8_t* xq, int64_t K, int16_t* xg);
// The row's values in f32.
void q6k_unpack_row(const uint8_t* w, int64_t K, float* out);

// The instruction set the dot products use: "avx512-vnni", "avx2" or "scalar".
const char* q8_isa();
// Caps it at "avx2" or "scalar" ("avx512-vnni": no cap), so that tests reach every path on one CPU.
void q8_limit_isa(const char* name);

}  // namespace kiln::cpu

#include "kiln/tensor.h"

namespace kiln::cpu {
// out [M, N] (x's dtype, contiguous) = x [M, K] (contiguous f32/f16/bf16) @ dequant(w)^T + bias, w the Q8_0
// weight (values int8 [N, K]) or the Q4_0 one (values uint8 [N, K / 2]), scales f16 [N, K / 32] (contiguous): x
// quantised per block, int8 dot products.
// linear(x, Q8Weight / Q4Weight / Q4KWeight) takes these products for `rows` rows of x when q8_dot_takes(rows):
// any number of rows where the AVX2 or AVX-512 VNNI kernels run (an int8 product of the codes costs less than
// dequantising the weight for a float GEMM), up to kQ8DotRows on the scalar path (more rows there multiply
// dequantised slices of the weight).
inline constexpr int64_t kQ8DotRows = 16;
bool q8_dot_takes(int64_t rows);
void linear_q8(const Tensor& out, const Tensor& x, const Tensor& values, const Tensor& scales, const Tensor* bias);
// out [N, K] f32 = the weight's values x scales (Q8_0 or, for uint8 values, Q4_0).
void dequantize_q8(const Tensor& out, const Tensor& values, const Tensor& scales);
// The same for a Q4_K weight (blocks uint8 [N, K / 256 x 144], contiguous).
void linear_q4k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias);
void dequantize_q4k(const Tensor& out, const Tensor& blocks);
// The same for a Q5_K weight (blocks uint8 [N, K / 256 x 176], contiguous) and a Q6_K one (x 210).
void linear_q5k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias);
void dequantize_q5k(const Tensor& out, const Tensor& blocks);
void linear_q6k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias);
void dequantize_q6k(const Tensor& out, const Tensor& blocks);
}  // namespace kiln::cpu
