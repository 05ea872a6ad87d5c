// pad on CUDA: one warp per output row (grid-stride, 64-bit indices), the source computed in the kernel from the
// shared map of src/ops/pad_index.h: one pass, no index tensors, any size. Element copies by size.
#include "cuda/pad.h"

#include <cstring>

#include "cuda/launch.h"
#include "cuda/visit.h"

namespace kiln::cuda {

namespace {

// One warp per output row (the last dim): the row's input row, and whether it is all constant, come from one
// set of divisions; the lanes then walk the row, the interior a contiguous run of the input row (in_stride[2]
// apart) and only the edges through pad_source. Four elements per lane per step, loads before stores.
constexpr int kThreads = 256, kRowsPerBlock = kThreads / 32, kUnroll = 4;

// I: the row index's type, 32-bit where the rows number fewer than 2^31 (a 64-bit division costs several times a
// 32-bit one, and there are three per row).
template <class U, class I>
__global__ void __launch_bounds__(kThreads) pad_rows_kernel(const U* __restrict__ x, U* __restrict__ y, PadGeometry g,
                                                            U value, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t out2 = g.out[2], in2 = g.in[2], left2 = g.left[2], st2 = g.in_stride[2];
  const I out1 = static_cast<I>(g.out[1]), out0 = static_cast<I>(g.out[0]);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const I ri = static_cast<I>(r), t = ri / out1;
    const int64_t i1 = ri - t * out1, i0 = t % out0, o = t / out0;
    const int64_t s0 = pad_source(i0, g.left[0], g.in[0], g.mode), s1 = pad_source(i1, g.left[1], g.in[1], g.mode);
    U* yr = y + r * out2;
    if (s0 < 0 || s1 < 0) {
      for (int64_t i = lane; i < out2; i += 32) yr[i] = value;
      continue;
    }
    const U* xr = x + o * g.outer_stride + s0 * g.in_stride[0] + s1 * g.in_stride[1];
    for (int64_t base = 0; base < out2; base += 32 * kUnroll) {
      U v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t i = base + lane + 32 * k, j = i - left2;
        if (i < out2) {
          const int64_t s = (j >= 0 && j < in2) ? j : pad_source(i, left2, in2, g.mode);
          v[k] = s < 0 ? value : xr[s * st2];
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t i = base + lane + 32 * k;
        if (i < out2) yr[i] = v[k];
      }
    }
  }
}

}  // namespace

void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value) {
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / g.out[2];
  DeviceGuard guard(y.device());
  visit_itemsize(y.itemsize(), "pad", [&](auto tag) {
    using U = typename decltype(tag)::type;
    U v;
    std::memcpy(&v, value, sizeof(U));
    // grid_for caps the blocks at a multiple of the SMs; each block takes kRowsPerBlock rows per step.
    const unsigned blocks = grid_for((rows + kRowsPerBlock - 1) / kRowsPerBlock * kThreads, kThreads, y.device().index);
    const U* px = static_cast<const U*>(x.data_ptr());
    U* py = static_cast<U*>(y.data_ptr());
    if (rows < (int64_t{1} << 31)) pad_rows_kernel<U, uint32_t><<<blocks, kThreads, 0, stream_of(y.device())>>>(px, py, g, v, rows);
    else pad_rows_kernel<U, int64_t><<<blocks, kThreads, 0, stream_of(y.device())>>>(px, py, g, v, rows);
  });
  check_launch("pad");
}

}  // namespace kiln::cuda
