// Float8 weights read in place on the CPU: the dot products and row conversions under linear(x, Fp8Weight)
// and the MoE block's FP8 experts. On x86-64 with AVX2, FMA and F16C (checked at run time) 16 weights at a time
// go through the F16C converter (e4m3 by a shift into f16's layout, e5m2 is f16's top byte); elsewhere the
// scalar conversions of kiln/scalar_types.h. Every weight converts exactly; a NaN code gives NaN.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// One row of a block-scaled FP8 matrix against rows of x: K float8 codes w (e5m2 when `e5m2`, else e4m3fn) in
// blocks of bk (the last may be shorter), block b weighted by scales[b]; for r < rows (1..4),
// out[r] = sum over b of scales[b] x (x[r * ldx + ...] . w over block b). f32 sums, reassociated across SIMD
// lanes; each code is converted once for all rows; a NaN code makes every out[r] NaN.
void fp8_dot_rows_scaled(const float* x, int64_t ldx, int rows, const uint8_t* w, const float* scales, int64_t K,
                         int64_t bk, bool e5m2, float* out);

// out[i] = w[i] * scale for i < n: the codes converted to f32 and each multiplied by the scale once (the
// reference's dequantised value, bit for bit).
void fp8_dequantize_row(const uint8_t* w, int64_t n, bool e5m2, float scale, float* out);

// Whether the SIMD path is taken: the machine has it and it is not switched off. Switching it off (tests) runs
// the scalar path that machines without AVX2/FMA/F16C take.
bool fp8_simd_available();
void fp8_set_simd_enabled(bool enabled);
bool fp8_simd_enabled();

}  // namespace kiln::cpu
