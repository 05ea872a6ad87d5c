// CPU kernels for indexing and data movement (gather, scatter, take, masked_fill). Pure data movement
// copies elements by their byte size (1/2/4/8), so one instantiation serves every dtype of that size.
// Callers (src/ops/indexing.cpp) validate shapes and every index value before calling: these kernels
// trust that each index is in range.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/tensor.h"

namespace kiln::cpu {

// The first index value (in the iteration order of `index`) outside [lo, hi), if any. index is i32 or i64.
std::optional<int64_t> find_bad_index(const Tensor& index, int64_t lo, int64_t hi);

// out[i] = src_r[i] advanced by idx_r[i] * dim_stride elements, where src_r is src restrided to out's shape
// with stride 0 along the indexed dim, and idx_r the index restrided to out's shape. When wrap > 0 a
// negative index counts from wrap (take).
void gather_elements(const Tensor& out, const Tensor& src_r, const Tensor& idx_r, int64_t dim_stride,
                     int64_t wrap = 0);

// self[..., index[i], ...] (along dim) = src[i] (or += src[i] when add), over every position i of index;
// with src undefined, value (itemsize bytes of self's dtype) is written instead. add supports f32, f64,
// c64, integers (wrapping) and bool (or); the caller converts half types to f32. Lines along dim are handed
// to threads whole, so duplicate indices never race and accumulate in index order.
void scatter_elements(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const void* value, bool add);

// out[i] = value where mask[i] (mask already expanded to out's shape).
void masked_fill(const Tensor& out, const Tensor& mask, const void* value);

}  // namespace kiln::cpu
