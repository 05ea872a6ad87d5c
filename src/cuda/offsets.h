// Host side of kernels/strided.cuh: builds an Offsets<N> from a shape and the strides of N operands.
// Include from .cu files only.
#pragma once

#include <array>

#include "cuda/kernels/strided.cuh"
#include "kiln/tensor.h"

namespace kiln::cuda {

// Size-1 dims are dropped and dim d merges into d+1 when stride[d] == stride[d+1] * size[d+1] for every
// operand, which keeps the row-major order of elements. Throws when more than kMaxDims dims remain.
template <int N>
Offsets<N> make_offsets(const char* op, const Shape& sizes, const std::array<Shape, N>& strides) {
  Shape sz;
  std::array<Shape, N> st;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = !sz.empty();
    for (int k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * sizes[d];
    if (merge) {
      sz.back() *= sizes[d];
      for (int k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sz.push_back(sizes[d]);
      for (int k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  KILN_CHECK(sz.size() <= static_cast<size_t>(kMaxDims), op, ": tensors of shape ", sizes, " need ", sz.size(),
             " dims after merging contiguous ones; the CUDA backend supports at most ", kMaxDims);
  Offsets<N> o{};
  o.ndim = static_cast<int>(sz.size());
  for (size_t d = 0; d < sz.size(); ++d) {
    o.sizes[d] = sz[d];
    for (int k = 0; k < N; ++k) o.strides[k][d] = st[k][d];
  }
  return o;
}

}  // namespace kiln::cuda
