// pad on CUDA: the source of each output element computed in the kernel from the shared map of
// src/ops/pad_index.h: one pass, no index tensors, any size. Elements move as bytes of their size.
//  - pad_staged_kernel (rows of up to 32 KB): a block takes a group of consecutive output rows, stages their
//    input rows in shared memory (16-byte loads where the rows are 16-byte aligned) and writes the group's
//    output, one contiguous region, in 8-byte units: whole-warp runs of coalesced stores whatever the row length
//    and the pads.
//  - pad_rows_kernel (longer rows): one warp per output row, reading the input row in place.
#include "cuda/pad.h"

#include <algorithm>
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

// Staged rows. Per group of `rows_per` output rows: (0) one thread per row finds its input row (or -1 where a
// padded row of dims 0-1 is all constant); (1) the block copies those input rows into shared memory, row q at
// q * in2; (2) the block writes the group's output region y[r0 * out2, (r0 + n) * out2) as units of E elements
// (8 bytes; 8-byte elements one at a time), the few elements before the first 8-byte boundary and after the last
// whole unit one per thread. VecIn: every input row starts 16-byte aligned and is a whole number of 16-byte
// chunks (the host checks the base, the strides and the row length).
template <class U, bool VecIn>
__global__ void __launch_bounds__(kThreads) pad_staged_kernel(const U* __restrict__ x, U* __restrict__ y,
                                                              PadGeometry g, U value, int64_t rows, int rows_per) {
  using P = std::conditional_t<(sizeof(U) < 8), uint2, U>;
  constexpr int E = sizeof(P) / sizeof(U);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int64_t* src = reinterpret_cast<int64_t*>(smem_raw);  // rows_per input-row offsets, -1 for a constant row
  U* buf = reinterpret_cast<U*>(smem_raw + ((static_cast<size_t>(rows_per) * sizeof(int64_t) + 15) / 16) * 16);
  const int in2 = static_cast<int>(g.in[2]), out2 = static_cast<int>(g.out[2]), left2 = static_cast<int>(g.left[2]);
  const int64_t st2 = g.in_stride[2];
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * rows_per) {
    const int n = static_cast<int>(min(static_cast<int64_t>(rows_per), rows - r0));
    if (static_cast<int>(threadIdx.x) < n) {
      const int64_t r = r0 + threadIdx.x, t = r / g.out[1], i1 = r - t * g.out[1], i0 = t % g.out[0], o = t / g.out[0];
      const int64_t s0 = pad_source(i0, g.left[0], g.in[0], g.mode), s1 = pad_source(i1, g.left[1], g.in[1], g.mode);
      src[threadIdx.x] = (s0 < 0 || s1 < 0) ? -1 : o * g.outer_stride + s0 * g.in_stride[0] + s1 * g.in_stride[1];
    }
    __syncthreads();
    if constexpr (VecIn) {
      // kLoads chunks a thread in flight before any is stored.
      constexpr int C16 = 16 / sizeof(U), kLoads = 4;
      const int chunks = in2 / C16, total = n * chunks;
      for (int k0 = threadIdx.x; k0 < total; k0 += kLoads * blockDim.x) {
        uint4 v[kLoads];
        int64_t off[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int k = k0 + u * static_cast<int>(blockDim.x), q = k / chunks;
          off[u] = k < total ? src[q] : -1;
          if (off[u] >= 0) v[u] = __ldg(reinterpret_cast<const uint4*>(x + off[u]) + (k - q * chunks));
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int k = k0 + u * static_cast<int>(blockDim.x), q = k / chunks;
          if (off[u] >= 0) reinterpret_cast<uint4*>(buf + static_cast<size_t>(q) * in2)[k - q * chunks] = v[u];
        }
      }
    } else {
      const int total = n * in2;
      for (int k = threadIdx.x; k < total; k += blockDim.x) {
        const int q = k / in2, j = k - q * in2;
        const int64_t off = src[q];
        if (off >= 0) buf[k] = x[off + j * st2];
      }
    }
    __syncthreads();
    // The element at (row q, position i) of the group.
    const auto at = [&](int q, int i) -> U {
      if (src[q] < 0) return value;
      int j = i - left2;
      if (j < 0 || j >= in2) j = pad_source_edge(j, in2, g.mode);
      return j < 0 ? value : buf[q * in2 + j];
    };
    U* region = y + r0 * out2;
    const int len = n * out2;
    // y is at least 8-byte aligned (allocations are), so the region's misalignment follows from its offset.
    const int head = min(len, static_cast<int>((E - (r0 * out2) % E) % E));
    const int units = (len - head) / E, tail_start = head + units * E;
    // A thread's units are blockDim.x * E elements apart: its (row, position) advances by (dq, di), one
    // division per group instead of one per unit.
    const int step = static_cast<int>(blockDim.x) * E, dq = step / out2, di = step - dq * out2;
    int q = (head + static_cast<int>(threadIdx.x) * E) / out2, i = head + static_cast<int>(threadIdx.x) * E - q * out2;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      U v[E];
      int qe = q, ie = i;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        v[e] = at(qe, ie);
        if (++ie == out2) ie = 0, ++qe;
      }
      P w;
      memcpy(&w, v, sizeof(P));
      reinterpret_cast<P*>(region + head)[u] = w;
      q += dq;
      i += di;
      if (i >= out2) i -= out2, ++q;
    }
    const int extra = head + (len - tail_start);
    if (static_cast<int>(threadIdx.x) < extra) {
      const int p = threadIdx.x < head ? threadIdx.x : tail_start + (threadIdx.x - head);
      const int q = p / out2;
      region[p] = at(q, p - q * out2);
    }
    __syncthreads();
  }
}

// The staged kernel's limits: input rows of at most kStageRowBytes, groups of about kStageBytes of input, at
// most kThreads rows (one thread each finds a row's source): at most 32 KB of shared memory a block, within the
// default 48 KB.
constexpr int64_t kStageRowBytes = 32 * 1024, kStageBytes = 16 * 1024;

}  // namespace

void pad(const Tensor& x, Tensor& y, const PadGeometry& g, const void* value) {
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / g.out[2];
  DeviceGuard guard(y.device());
  const cudaStream_t stream = stream_of(y.device());
  visit_itemsize(y.itemsize(), "pad", [&](auto tag) {
    using U = typename decltype(tag)::type;
    U v;
    std::memcpy(&v, value, sizeof(U));
    const U* px = static_cast<const U*>(x.data_ptr());
    U* py = static_cast<U*>(y.data_ptr());
    const int64_t row_bytes = g.in[2] * static_cast<int64_t>(sizeof(U));
    if (g.in[2] > 0 && row_bytes <= kStageRowBytes && g.out[2] < (int64_t{1} << 22)) {
      const int rows_per = static_cast<int>(std::clamp<int64_t>(kStageBytes / row_bytes, 1, kThreads));
      const size_t smem = (static_cast<size_t>(rows_per) * sizeof(int64_t) + 15) / 16 * 16 +
                          static_cast<size_t>(rows_per) * static_cast<size_t>(row_bytes);
      // Whole 16-byte chunks at 16-byte aligned starts: the base, the row length and every stride that moves
      // between rows (a dim of size one never moves).
      const auto aligned = [](int64_t elements) { return elements * static_cast<int64_t>(sizeof(U)) % 16 == 0; };
      const bool vec = g.in_stride[2] == 1 && reinterpret_cast<uintptr_t>(px) % 16 == 0 && aligned(g.in[2]) &&
                       (g.outer == 1 || aligned(g.outer_stride)) && (g.in[0] == 1 || aligned(g.in_stride[0])) &&
                       (g.in[1] == 1 || aligned(g.in_stride[1]));
      const int64_t groups = (rows + rows_per - 1) / rows_per;
      const unsigned blocks = static_cast<unsigned>(
          std::min<int64_t>(groups, static_cast<int64_t>(multiprocessor_count(y.device().index)) * 64));
      const auto kernel = vec ? pad_staged_kernel<U, true> : pad_staged_kernel<U, false>;
      kernel<<<blocks, kThreads, smem, stream>>>(px, py, g, v, rows, rows_per);
      return;
    }
    // grid_for caps the blocks at a multiple of the SMs; each block takes kRowsPerBlock rows per step.
    const unsigned blocks = grid_for((rows + kRowsPerBlock - 1) / kRowsPerBlock * kThreads, kThreads, y.device().index);
    if (rows < (int64_t{1} << 31)) pad_rows_kernel<U, uint32_t><<<blocks, kThreads, 0, stream>>>(px, py, g, v, rows);
    else pad_rows_kernel<U, int64_t><<<blocks, kThreads, 0, stream>>>(px, py, g, v, rows);
  });
  check_launch("pad");
}

}  // namespace kiln::cuda
