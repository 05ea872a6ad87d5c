// The index map of pad (kiln/nn.h), shared by the CPU and CUDA kernels: the output is [outer, o0, o1, o2] (the
// last three dims padded; fewer padded dims take size-1 leading ones), each output position reads the input
// position pad_source gives per dim, or the constant where any dim is outside the input.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"  // KILN_HD

namespace kiln {

enum class PadMode : int { Constant, Reflect, Replicate, Circular };

// The input index along a dim of `size` (padded by `left` on the low side) for output position i; -1 for the
// constant. Negative `left` crops.
KILN_HD int64_t pad_source(int64_t i, int64_t left, int64_t size, PadMode mode) {
  int64_t j = i - left;
  if (j >= 0 && j < size) return j;  // inside the input: every mode reads it (no division on the common path)
  switch (mode) {
    case PadMode::Constant: return (j >= 0 && j < size) ? j : -1;
    case PadMode::Replicate: return j < 0 ? 0 : (j >= size ? size - 1 : j);
    case PadMode::Circular: return ((j % size) + size) % size;
    case PadMode::Reflect: {
      // Mirror about the edges, the edge itself not repeated.
      if (size == 1) return 0;
      const int64_t period = 2 * (size - 1);
      j = ((j % period) + period) % period;
      return j < size ? j : period - j;
    }
  }
  return -1;
}

// pad_source for a position j = i - left outside a row of `size` (< 2^31) elements, in 32-bit arithmetic and,
// within one row's length of its edges (every reflect and circular pad pad() accepts), with no remainder: the
// CUDA kernel meets the edges of every row, and a remainder there is a long instruction sequence.
KILN_HD int pad_source_edge(int j, int size, PadMode mode) {
  switch (mode) {
    case PadMode::Constant: return -1;
    case PadMode::Replicate: return j < 0 ? 0 : size - 1;
    case PadMode::Circular: {
      const int r = j < 0 ? j + size : j - size;
      if (r >= 0 && r < size) return r;
      return ((j % size) + size) % size;
    }
    case PadMode::Reflect: {
      if (size == 1) return 0;
      const int r = j < 0 ? -j : 2 * (size - 1) - j;
      if (r >= 0 && r < size) return r;
      const int period = 2 * (size - 1);
      j = ((j % period) + period) % period;
      return j < size ? j : period - j;
    }
  }
  return -1;
}

struct PadGeometry {
  int64_t outer = 1;        // product of the dims that are not padded
  int64_t out[3] = {1, 1, 1};
  int64_t in[3] = {1, 1, 1};
  int64_t left[3] = {0, 0, 0};
  int64_t in_stride[3] = {0, 0, 0};  // element strides of the input's padded dims
  int64_t outer_stride = 0;          // element stride between the input's outer blocks
  PadMode mode = PadMode::Constant;
};

}  // namespace kiln
