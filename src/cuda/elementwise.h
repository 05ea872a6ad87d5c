// Host side of the elementwise kernels (src/cuda/kernels/elementwise.cuh): path selection and launch.
// Include from .cu files only. Operands must already have the output's shape (expanded where they
// broadcast) and live on the output's device; the op layer has converted dtypes as it wants them.
//
//   launch_elementwise<Out, A>(out, {a}, f, "op")        f(A) -> Out
//   launch_elementwise<Out, A, B>(out, {a, b}, f, "op")  f(A, B) -> Out
// f is a __device__-callable functor taking and returning storage types.
#pragma once

#include <array>
#include <limits>

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

template <class Launch>
void with_index_type(bool small, Launch&& launch) {
  if (small) launch(uint32_t{});
  else launch(int64_t{});
}

}  // namespace detail

template <class Out, class A, class F>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, 1>& in, F f, const char* op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor& a = *in[0];
  DeviceGuard guard(out.device());
  const cudaStream_t s = stream_of(out.device());
  const int threads = 256;
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  if (out.is_contiguous() && a.is_contiguous() && a.sizes() == out.sizes()) {
    constexpr int V = detail::vec_for<Out, A>();
    if (V > 1 && detail::aligned16(po) && detail::aligned16(pa)) {
      elementwise1_contig<V><<<grid_for(n / V + 1, threads, out.device().index), threads, 0, s>>>(n, f, po, pa);
    } else {
      elementwise1_contig<1><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(n, f, po, pa);
    }
  } else {
    const std::array<const Tensor*, 2> ops{&out, &a};
    detail::with_index_type(detail::fits_32bit<2>(ops), [&](auto idx) {
      using I = decltype(idx);
      const auto oc = detail::make_offset_calc<2, I>(out, ops, op);
      elementwise1_strided<I><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(static_cast<I>(n), oc, f,
                                                                                           po, pa);
    });
  }
  check_launch(op);
}

template <class Out, class A, class B, class F>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, 2>& in, F f, const char* op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  DeviceGuard guard(out.device());
  const cudaStream_t s = stream_of(out.device());
  const int threads = 256;
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  const B* pb = static_cast<const B*>(b.data_ptr());
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && a.sizes() == out.sizes() &&
      b.sizes() == out.sizes()) {
    constexpr int V = detail::vec_for<Out, A, B>();
    if (V > 1 && detail::aligned16(po) && detail::aligned16(pa) && detail::aligned16(pb)) {
      elementwise2_contig<V><<<grid_for(n / V + 1, threads, out.device().index), threads, 0, s>>>(n, f, po, pa, pb);
    } else {
      elementwise2_contig<1><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(n, f, po, pa, pb);
    }
  } else {
    const std::array<const Tensor*, 3> ops{&out, &a, &b};
    detail::with_index_type(detail::fits_32bit<3>(ops), [&](auto idx) {
      using I = decltype(idx);
      const auto oc = detail::make_offset_calc<3, I>(out, ops, op);
      elementwise2_strided<I><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(static_cast<I>(n), oc, f,
                                                                                           po, pa, pb);
    });
  }
  check_launch(op);
}

template <class Out, class A, class B, class C, class F>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, 3>& in, F f, const char* op) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  const Tensor& c = *in[2];
  DeviceGuard guard(out.device());
  const cudaStream_t s = stream_of(out.device());
  const int threads = 256;
  Out* po = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  const B* pb = static_cast<const B*>(b.data_ptr());
  const C* pc = static_cast<const C*>(c.data_ptr());
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && c.is_contiguous() &&
      a.sizes() == out.sizes() && b.sizes() == out.sizes() && c.sizes() == out.sizes()) {
    constexpr int V = detail::vec_for<Out, A, B, C>();
    if (V > 1 && detail::aligned16(po) && detail::aligned16(pa) && detail::aligned16(pb) && detail::aligned16(pc)) {
      elementwise3_contig<V><<<grid_for(n / V + 1, threads, out.device().index), threads, 0, s>>>(n, f, po, pa, pb,
                                                                                                   pc);
    } else {
      elementwise3_contig<1><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(n, f, po, pa, pb, pc);
    }
  } else {
    const std::array<const Tensor*, 4> ops{&out, &a, &b, &c};
    detail::with_index_type(detail::fits_32bit<4>(ops), [&](auto idx) {
      using I = decltype(idx);
      const auto oc = detail::make_offset_calc<4, I>(out, ops, op);
      elementwise3_strided<I><<<grid_for(n, threads, out.device().index), threads, 0, s>>>(static_cast<I>(n), oc, f,
                                                                                           po, pa, pb, pc);
    });
  }
  check_launch(op);
}

}  // namespace kiln::cuda
