// The host side shared by every CUDA reduction launcher (src/cuda/reduce*.cu): runs a plan
// (src/cuda/reduce_plan.h) with an op of src/ops/reduce_functors.h and a Store functor that writes output o
// from its accumulator: `__device__ void operator()(int64_t o, const Acc& a) const`. Include from .cu files.
#pragma once

#include <cstdint>

#include "cuda/kernels/reduce.cuh"
#include "cuda/launch.h"
#include "cuda/reduce_plan.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace detail {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Scratch for `n` accumulators, from the stream-ordered caching allocator: releasing it when the
// launcher returns is safe, later work on the stream is ordered after the kernels that use it.
template <class Acc>
Tensor scratch_for(int64_t n, Device device) {
  return empty({n * static_cast<int64_t>(sizeof(Acc))}, DType::U8, device);
}

// Second pass: row o of `partial` ([outputs, splits], contiguous) combined into output o.
template <class Op, class Store>
void combine_partials(const Op& op, const typename Op::acc_t* partial, int64_t outputs, int64_t splits,
                      const Store& store, int device, cudaStream_t stream, const char* name) {
  const int g = group_log2_for(splits);
  const int64_t threads_needed = ((outputs << g) + 31) / 32 * 32;
  kernels::reduce_rows_kernel<<<grid_for(threads_needed, kernels::kReduceThreads, device), kernels::kReduceThreads,
                                0, stream>>>(kernels::FoldPartial<Op>{op}, partial, outputs, splits, splits, g,
                                             false, store);
  check_launch(name);
}

}  // namespace detail

// Runs the reduction planned in `p` (whose input has element type In) on the current stream of its device.
template <class In, class Op, class Store>
void launch_reduce(const ReducePlan& p, const Op& op, const Store& store, const char* name) {
  using Acc = typename Op::acc_t;
  if (p.outputs == 0) return;
  const Device device = p.input.device();
  DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(device);
  const int dev = device.index;
  const In* x = p.len == 0 ? nullptr : static_cast<const In*>(p.input.data_ptr());
  const kernels::FoldInput<Op, In> fold{op};
  constexpr int kThreads = kernels::kReduceThreads;
  // 16-byte loads need an aligned row start (every row: the row stride in bytes a multiple of 16).
  const bool vec_rows = x != nullptr && detail::aligned16(x) &&
                        (p.row_stride * static_cast<int64_t>(sizeof(In))) % 16 == 0;

  switch (p.path) {
    case ReducePath::Rows: {
      const int64_t threads_needed = ((p.outputs << p.group_log2) + 31) / 32 * 32;
      kernels::reduce_rows_kernel<<<grid_for(threads_needed, kThreads, dev), kThreads, 0, stream>>>(
          fold, x, p.outputs, p.len, p.row_stride, p.group_log2, vec_rows && p.group_log2 == 5, store);
      check_launch(name);
      return;
    }
    case ReducePath::SplitRows: {
      // outputs <= 4 * SMs (plan) fits gridDim.y; splits fits gridDim.x.
      Tensor scratch = detail::scratch_for<Acc>(p.outputs * p.splits, device);
      Acc* partial = static_cast<Acc*>(scratch.data_ptr());
      const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.outputs));
      kernels::reduce_split_rows_kernel<<<grid, kThreads, 0, stream>>>(fold, x, p.len, p.row_stride, p.chunk,
                                                                       vec_rows, partial);
      check_launch(name);
      detail::combine_partials(op, partial, p.outputs, p.splits, store, dev, stream, name);
      return;
    }
    case ReducePath::Columns: {
      Tensor scratch;
      Acc* partial = nullptr;
      if (p.splits > 1) {
        scratch = detail::scratch_for<Acc>(p.outputs * p.splits, device);
        partial = static_cast<Acc*>(scratch.data_ptr());
      }
      const dim3 grid(grid_for(p.outputs, kThreads, dev), static_cast<unsigned>(p.splits));
      kernels::reduce_columns_kernel<<<grid, kThreads, 0, stream>>>(fold, x, p.outputs, p.inner, p.outer_stride,
                                                                    p.len, p.red_stride, p.chunk, partial, store);
      check_launch(name);
      if (p.splits > 1) detail::combine_partials(op, partial, p.outputs, p.splits, store, dev, stream, name);
      return;
    }
  }
}

}  // namespace kiln::cuda
