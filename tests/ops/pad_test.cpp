// The index map of pad (src/ops/pad_index.h): the CUDA kernel's 32-bit edge form against pad_source, for every
// mode and every position within three row lengths of a row's edges (reflect's and circular's near form and
// their remainder fallback both). pad's values are tested against NumPy in tests/python/test_functional.py.
#include <gtest/gtest.h>

#include "ops/pad_index.h"

namespace kiln::test {
namespace {

TEST(PadIndex, EdgeFormEqualsPadSource) {
  for (const PadMode mode : {PadMode::Constant, PadMode::Reflect, PadMode::Replicate, PadMode::Circular}) {
    for (int size = 1; size <= 24; ++size) {
      for (int j = -3 * size - 2; j < 4 * size + 2; ++j) {
        if (j >= 0 && j < size) continue;  // inside the row: the kernel reads it directly
        EXPECT_EQ(pad_source_edge(j, size, mode), pad_source(j, 0, size, mode))
            << "mode " << static_cast<int>(mode) << ", size " << size << ", j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
