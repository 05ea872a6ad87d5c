// pad on the CPU: one pass over the output, rows of the last dim in parallel; the per-dim source maps are
// computed once. Element copies by size (1, 2, 4 or 8 bytes): no per-dtype code.
#include "cpu/pad.h"

#include <cstring>
#include <vector>

namespace kiln::cpu {

namespace {

template <class U>
void run(const U* x, U* y, const PadGeometry& g, U value) {
  std::vector<int64_t> map[3];
  for (int d = 0; d < 3; ++d) {
    map[d].resize(static_cast<size_t>(g.out[d]));
    for (int64_t i = 0; i < g.out[d]; ++i) {
      const int64_t s = pad_source(i, g.left[d], g.in[d], g.mode);
      map[d][i] = s < 0 ? -1 : s * g.in_stride[d];
    }
  }
  const int64_t rows = g.outer * g.out[0] * g.out[1], width = g.out[2];
  const int64_t* m0 = map[0].data();
  const int64_t* m1 = map[1].data();
  const int64_t* m2 = map[2].data();
#pragma omp parallel for schedule(static) if (rows * width > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i1 = r % g.out[1], i0 = (r / g.out[1]) % g.out[0], o = r / (g.out[1] * g.out[0]);
    U* dst = y + r * width;
    if (m0[i0] < 0 || m1[i1] < 0) {
      for (int64_t i = 0; i < width; ++i) dst[i] = value;
      continue;
    }
    const U* src = x + o * g.outer_stride + m0[i0] + m1[i1];
    for (int64_t i = 0; i < width; ++i) dst[i] = m2[i] < 0 ? value : src[m2[i]];
  }
}

}  // namespace

void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value) {
  if (y.numel() == 0) return;
  const void* xp = x.data_ptr();
  void* yp = y.data_ptr();
  switch (y.itemsize()) {
    case 1: { uint8_t v; std::memcpy(&v, value, 1); return run(static_cast<const uint8_t*>(xp), static_cast<uint8_t*>(yp), g, v); }
    case 2: { uint16_t v; std::memcpy(&v, value, 2); return run(static_cast<const uint16_t*>(xp), static_cast<uint16_t*>(yp), g, v); }
    case 4: { uint32_t v; std::memcpy(&v, value, 4); return run(static_cast<const uint32_t*>(xp), static_cast<uint32_t*>(yp), g, v); }
    case 8: { uint64_t v; std::memcpy(&v, value, 8); return run(static_cast<const uint64_t*>(xp), static_cast<uint64_t*>(yp), g, v); }
    default: throw Error(str("pad: unsupported element size ", y.itemsize()));
  }
}

}  // namespace kiln::cpu
