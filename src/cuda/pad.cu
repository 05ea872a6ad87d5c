// pad on CUDA: one thread per output element (grid-stride, 64-bit indices), the source computed in the kernel
// from the shared map of src/ops/pad_index.h: one pass, no index tensors, any size. Element copies by size.
#include "cuda/pad.h"

#include <cstring>

#include "cuda/launch.h"
#include "cuda/visit.h"

namespace kiln::cuda {

namespace {

template <class U>
__global__ void pad_kernel(const U* __restrict__ x, U* __restrict__ y, PadGeometry g, U value, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    const int64_t i2 = rest % g.out[2];
    rest /= g.out[2];
    const int64_t i1 = rest % g.out[1];
    rest /= g.out[1];
    const int64_t i0 = rest % g.out[0];
    const int64_t o = rest / g.out[0];
    const int64_t s0 = pad_source(i0, g.left[0], g.in[0], g.mode), s1 = pad_source(i1, g.left[1], g.in[1], g.mode),
                  s2 = pad_source(i2, g.left[2], g.in[2], g.mode);
    y[i] = (s0 < 0 || s1 < 0 || s2 < 0)
               ? value
               : x[o * g.outer_stride + s0 * g.in_stride[0] + s1 * g.in_stride[1] + s2 * g.in_stride[2]];
  }
}

}  // namespace

void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value) {
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceGuard guard(y.device());
  constexpr int kThreads = 256;
  visit_itemsize(y.itemsize(), "pad", [&](auto tag) {
    using U = typename decltype(tag)::type;
    U v;
    std::memcpy(&v, value, sizeof(U));
    pad_kernel<U><<<grid_for(n, kThreads, y.device().index), kThreads, 0, stream_of(y.device())>>>(
        static_cast<const U*>(x.data_ptr()), static_cast<U*>(y.data_ptr()), g, v, n);
  });
  check_launch("pad");
}

}  // namespace kiln::cuda
