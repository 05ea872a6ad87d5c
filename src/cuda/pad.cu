// pad on CUDA: one pass over the output, flat: each thread writes two 16-byte runs of consecutive output elements
// (rows of any length, so short rows waste no lanes) and reads each element's source through the shared map of
// src/ops/pad_index.h. No index tensors, no temporaries, any size.
#include "cuda/pad.h"

#include <cstring>

#include "cuda/launch.h"
#include "cuda/visit.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kVecBytes = 16, kVecs = 2;  // per thread and step: kVecs aligned 16-byte stores

template <class U, int V>
struct alignas(sizeof(U) * V) Vec {
  U v[V];
};

// The input row that output row r (of out[2] elements) reads, or null where the row lies in the constant
// border of a padded outer dim. I: the index type, 32-bit below 2^32 rows (a 64-bit division costs several
// times a 32-bit one).
template <class U, class I>
__device__ __forceinline__ const U* source_row(const U* x, const PadGeometry& g, I r) {
  const I out1 = static_cast<I>(g.out[1]), out0 = static_cast<I>(g.out[0]);
  const I t = r / out1, o = t / out0;
  const int64_t i1 = r - t * out1, i0 = t - o * out0;
  const int64_t s0 = pad_source(i0, g.left[0], g.in[0], g.mode), s1 = pad_source(i1, g.left[1], g.in[1], g.mode);
  if (s0 < 0 || s1 < 0) return nullptr;
  return x + static_cast<int64_t>(o) * g.outer_stride + s0 * g.in_stride[0] + s1 * g.in_stride[1];
}
// The same, called where a thread's run crosses into the next row: out of line, so that the unrolled loop
// holds a call per element rather than the divisions.
template <class U, class I>
__device__ __noinline__ const U* next_source_row(const U* x, const PadGeometry& g, I r) {
  return source_row(x, g, r);
}

// Thread t of the grid takes output elements [E t, E t + E) (E = kVecs 16-byte runs), then the grid's stride.
// Its first element's row and column come from one division; the following ones step the column and move to
// the next row where a row ends. All loads are issued before the stores. `vec_stores`: y is 16-byte aligned.
template <class U, class I>
__global__ void __launch_bounds__(kThreads) pad_kernel(const U* __restrict__ x, U* __restrict__ y, PadGeometry g,
                                                       U value, I n, bool vec_stores) {
  constexpr int V = kVecBytes / sizeof(U), E = V * kVecs;
  const I out2 = static_cast<I>(g.out[2]);
  const int64_t in2 = g.in[2], left2 = g.left[2], st2 = g.in_stride[2];
  const I step = static_cast<I>(gridDim.x) * kThreads * E;
  for (I e0 = (static_cast<I>(blockIdx.x) * kThreads + threadIdx.x) * E; e0 < n; e0 += step) {
    I r = e0 / out2, c = e0 - r * out2;
    const U* xr = source_row(x, g, r);
    U v[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      if (e0 + k < n) {
        if (c == out2) {
          c = 0;
          xr = next_source_row(x, g, ++r);
        }
        const int64_t j = static_cast<int64_t>(c) - left2;
        const int64_t s = (j >= 0 && j < in2) ? j : pad_source(c, left2, in2, g.mode);
        v[k] = (xr == nullptr || s < 0) ? value : xr[s * st2];
        ++c;
      }
    }
    if (vec_stores && e0 + E <= n) {
#pragma unroll
      for (int q = 0; q < kVecs; ++q) {
        Vec<U, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = v[q * V + k];
        reinterpret_cast<Vec<U, V>*>(y + e0)[q] = out;
      }
    } else {
#pragma unroll
      for (int k = 0; k < E; ++k)
        if (e0 + k < n) y[e0 + k] = v[k];
    }
  }
}

}  // namespace

void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value) {
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceGuard guard(y.device());
  visit_itemsize(y.itemsize(), "pad", [&](auto tag) {
    using U = typename decltype(tag)::type;
    constexpr int64_t E = kVecBytes / sizeof(U) * kVecs;
    U v;
    std::memcpy(&v, value, sizeof(U));
    // grid_for caps the blocks at a multiple of the SMs; the threads then stride over the output.
    const unsigned blocks = grid_for((n + E - 1) / E, kThreads, y.device().index);
    const U* px = static_cast<const U*>(x.data_ptr());
    U* py = static_cast<U*>(y.data_ptr());
    const bool vec = reinterpret_cast<uintptr_t>(py) % kVecBytes == 0;
    const cudaStream_t s = stream_of(y.device());
    // 32-bit indices while e0 + step stays below 2^32.
    if (n + static_cast<int64_t>(blocks) * kThreads * E < (int64_t{1} << 32))
      pad_kernel<U, uint32_t><<<blocks, kThreads, 0, s>>>(px, py, g, v, static_cast<uint32_t>(n), vec);
    else
      pad_kernel<U, int64_t><<<blocks, kThreads, 0, s>>>(px, py, g, v, n, vec);
  });
  check_launch("pad");
}

}  // namespace kiln::cuda
