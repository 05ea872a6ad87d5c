// Host side of the elementwise kernels (src/cuda/kernels/elementwise.cuh): path selection and launch.
// Include from .cu files only. Operands must already have the output's shape (expanded where they
// broadcast) and live on the output's device; the op layer has converted dtypes as it wants them.
//
//   launch_elementwise<Out, A>(out, {&a}, f, "op")          f(A) -> Out
//   launch_elementwise<Out, A, B>(out, {&a, &b}, f, "op")   f(A, B) -> Out, and so on for more inputs
// f is a __device__-callable functor taking and returning storage types.
#pragma once

#include <array>
#include <limits>
#include <tuple>
#include <utility>

#include "cpu/loops.h"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {

namespace detail {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <class... T>
constexpr int vec_for() {
  constexpr size_t biggest = std::max({sizeof(T)...});
  return biggest >= 16 ? 1 : static_cast<int>(16 / biggest);
}

// Element-stride OffsetCalc over the coalesced iteration space StridedLoop computes for the CPU (one
// definition of dim sorting and merging for both backends).
template <int N, class IndexT>
OffsetCalc<N, IndexT> make_offset_calc(const Tensor& out, const std::array<const Tensor*, N>& ops, const char* op) {
  cpu::StridedLoop<N> loop(out.sizes(), ops);
  const int nd = static_cast<int>(loop.sizes.size());
  KILN_CHECK(nd <= kMaxDims, op, ": ", nd, " dims remain after merging (at most ", kMaxDims,
             " supported on CUDA); make the inputs contiguous first");
  OffsetCalc<N, IndexT> oc{};
  oc.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    oc.sizes[d] = static_cast<IndexT>(loop.sizes[d]);
    for (int k = 0; k < N; ++k)
      oc.strides[d][k] = static_cast<IndexT>(loop.strides[k][d] / static_cast<int64_t>(ops[k]->itemsize()));
  }
  return oc;
}

// Whether every element offset of every operand fits in a 32-bit index.
template <int N>
bool fits_32bit(const std::array<const Tensor*, N>& ops) {
  for (const Tensor* t : ops) {
    int64_t extent = 1;
    for (int64_t d = 0; d < t->dim(); ++d) extent += (t->sizes()[d] - 1) * std::abs(t->strides()[d]);
    if (t->numel() >= (int64_t{1} << 31) || extent >= (int64_t{1} << 31)) return false;
  }
  return true;
}

template <class IndexT, class Out, class F, class... In>
void launch_strided(const Tensor& out, const std::array<const Tensor*, 1 + sizeof...(In)>& ops, F f, Out* po,
                    cudaStream_t s, const char* op, const In*... p) {
  const auto oc = make_offset_calc<1 + sizeof...(In), IndexT>(out, ops, op);
  const int64_t n = out.numel();
  elementwise_strided<IndexT><<<grid_for(n, 256, out.device().index), 256, 0, s>>>(static_cast<IndexT>(n), oc, f, po,
                                                                                 p...);
}

}  // namespace detail

template <class Out, class... In, class F>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& in, F f, const char* op) {
  constexpr int K = sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  const cudaStream_t s = stream_of(out.device());
  const int dev = out.device().index;
  const int threads = 256;
  Out* po = static_cast<Out*>(out.data_ptr());
  bool dense = out.is_contiguous(), aligned = detail::aligned16(po);
  for (const Tensor* t : in) {
    dense = dense && t->is_contiguous() && t->sizes() == out.sizes();
    aligned = aligned && detail::aligned16(t->data_ptr());
  }
  auto ptrs = [&]<size_t... I>(std::index_sequence<I...>) {
    return std::make_tuple(static_cast<const In*>(in[I]->data_ptr())...);
  }(std::index_sequence_for<In...>{});
  if (dense) {
    constexpr int V = detail::vec_for<Out, In...>();
    std::apply(
        [&](const In*... p) {
          if (V > 1 && aligned)
            elementwise_contig<V><<<grid_for(n / V + 1, threads, dev), threads, 0, s>>>(n, f, po, p...);
          else
            elementwise_contig<1><<<grid_for(n, threads, dev), threads, 0, s>>>(n, f, po, p...);
        },
        ptrs);
  } else {
    std::array<const Tensor*, K + 1> ops{&out};
    for (int k = 0; k < K; ++k) ops[k + 1] = in[k];
    const bool small = detail::fits_32bit<K + 1>(ops);
    std::apply(
        [&](const In*... p) {
          if (small) detail::launch_strided<uint32_t>(out, ops, f, po, s, op, p...);
          else detail::launch_strided<int64_t>(out, ops, f, po, s, op, p...);
        },
        ptrs);
  }
  check_launch(op);
}

}  // namespace kiln::cuda
