// How a CUDA reduction runs: which kernel of src/cuda/kernels/reduce.cuh, over which view of the input, with
// how many blocks. Chosen on the host from the shape and strides only (src/cuda/reduce_plan.cpp), so a
// given shape on a given device always reduces in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cuda {

enum class ReducePath {
  Rows,       // path 1: a warp (or a part of one, for short rows) per output row
  SplitRows,  // path 2: each long row split over many blocks, partials combined by a second pass
  Columns,    // path 3: threads own outputs and walk an outer reduced dim; split with partials when few
};

struct ReducePlan {
  ReducePath path = ReducePath::Rows;
  // What the kernels read: x itself, or (general layouts) a contiguous copy with the reduced dims last.
  Tensor input;
  int64_t outputs = 0;  // output elements, row-major over x's kept dims (the output is contiguous)
  int64_t len = 0;      // elements reduced per output
  // Rows / SplitRows: output o reduces input[o * row_stride + 0 .. len).
  int64_t row_stride = 0;
  int group_log2 = 5;  // Rows: 1 << group_log2 lanes per row
  // Columns: output o reduces input[(o / inner) * outer_stride + o % inner + r * red_stride], r < len.
  int64_t inner = 1, outer_stride = 0, red_stride = 0;
  // SplitRows / Columns: the reduced range in `splits` chunks of `chunk` (splits == 1: one pass).
  int64_t splits = 1, chunk = 0;
};

// `reduced[d]` marks the dims of x to reduce (x on a CUDA device). The element index an indexed op sees
// is the row-major position over the reduced dims in tensor order (the position along the dim when
// one dim is reduced).
ReducePlan plan_reduce(const Tensor& x, const std::vector<bool>& reduced);

// Lanes per row for a row of `len` elements: 32, or the next power of two for shorter rows.
int group_log2_for(int64_t len);

}  // namespace kiln::cuda
