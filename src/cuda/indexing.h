// CUDA launchers of the indexing ops (kernels in cuda/kernels/indexing.cuh). The public ops in
// src/ops/indexing.cpp check shapes, dtypes and devices and restride the operands exactly as for the CPU
// kernels (cpu/indexing.h); index values are checked by the kernels, which report a bad one through the
// device error record instead of synchronising.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// As cpu::gather_elements (out contiguous, fresh): indices must lie in [0, bound); `op` names the op in
// the error a bad index raises.
void gather_elements(const Tensor& out, const Tensor& src_r, const Tensor& idx_r, int64_t dim_stride,
                     int64_t bound, OpId op);

// out (contiguous, index's shape) = elements of x (any strides) at the flat indices, which may be negative
// (counting from x.numel()).
void take(const Tensor& out, const Tensor& x, const Tensor& index);

// As cpu::scatter_elements, with self, index and src at least 1-d and any strides. Indices must lie in
// [0, self.size(dim)). add supports f16, bf16 (accumulated in f32, each element rounded once, as on the
// CPU), f32, f64, c64, integers (wrapping) and bool (or).
void scatter_elements(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      const void* value, bool add);


}  // namespace kiln::cuda
