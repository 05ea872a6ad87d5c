// N-d strided iteration for CPU kernels (the CPU side of a TensorIterator).
//
// A StridedLoop describes N operands of one shape by their base pointers and byte strides (a broadcast
// operand has stride 0). Dims are coalesced where every operand allows it and sorted so the innermost dim
// is the one with the smallest output stride, then for_each_row calls
//   row(char* const* ptrs, int64_t n, const int64_t* strides)
// once per innermost row, in parallel over rows (OpenMP) when the work is large enough to pay for threads.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cpu {

// Below this many elements a loop runs on one thread: thread start-up costs more than it saves.
inline constexpr int64_t kParallelGrain = 32768;

template <int N>
struct StridedLoop {
  std::vector<int64_t> sizes;                   // innermost last, coalesced
  std::array<std::vector<int64_t>, N> strides;  // bytes
  std::array<char*, N> base{};
  int64_t numel = 0;

  // Operand 0 decides the iteration order (it is the output where there is one).
  StridedLoop(const Shape& shape, const std::array<const Tensor*, N>& ops) {
    numel = checked_numel(shape);
    const size_t nd = shape.size();
    std::array<std::vector<int64_t>, N> st;
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ops[k];
      base[k] = static_cast<char*>(t.data_ptr());
      st[k].assign(nd, 0);
      const size_t lead = nd - static_cast<size_t>(t.dim());
      for (size_t d = 0; d < static_cast<size_t>(t.dim()); ++d)
        st[k][lead + d] = t.sizes()[d] == 1 ? 0 : t.strides()[d] * static_cast<int64_t>(t.itemsize());
    }
    // Order dims by operand 0's |stride| descending (stable), so the innermost dim is its fastest.
    std::vector<size_t> order;
    for (size_t d = 0; d < nd; ++d)
      if (shape[d] != 1) order.push_back(d);
    for (size_t i = 1; i < order.size(); ++i) {
      for (size_t j = i; j > 0; --j) {
        const auto a = order[j - 1], b = order[j];
        auto mag = [](int64_t v) { return v < 0 ? -v : v; };
        if (mag(st[0][a]) < mag(st[0][b])) std::swap(order[j - 1], order[j]);
        else break;
      }
    }
    for (size_t d : order) {
      bool merge = !sizes.empty();
      for (int k = 0; k < N && merge; ++k) merge = strides[k].back() == st[k][d] * shape[d];
      if (merge) {
        sizes.back() *= shape[d];
        for (int k = 0; k < N; ++k) strides[k].back() = st[k][d];
      } else {
        sizes.push_back(shape[d]);
        for (int k = 0; k < N; ++k) strides[k].push_back(st[k][d]);
      }
    }
    if (sizes.empty()) {
      sizes.push_back(1);
      for (int k = 0; k < N; ++k) strides[k].push_back(0);
    }
  }

  int64_t inner() const { return sizes.back(); }
  int64_t rows() const { return inner() == 0 ? 0 : numel / inner(); }

  // Pointers of every operand at the start of row r.
  void row_ptrs(int64_t r, char** out) const {
    for (int k = 0; k < N; ++k) out[k] = base[k];
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0 && r > 0; --d) {
      const int64_t i = r % sizes[d];
      r /= sizes[d];
      for (int k = 0; k < N; ++k) out[k] += i * strides[k][d];
    }
  }

  template <class Row>
  void for_each_row(Row&& row, bool parallel = true) const {
    if (numel == 0) return;
    const int64_t nrows = rows(), n = inner();
    std::array<int64_t, N> inner_strides;
    for (int k = 0; k < N; ++k) inner_strides[k] = strides[k].back();
    if (!parallel || numel < kParallelGrain || nrows == 1) {
      if (nrows == 1 && parallel && numel >= kParallelGrain) {
        // One long row: split it into chunks across threads.
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < (n + kParallelGrain - 1) / kParallelGrain; ++c) {
          std::array<char*, N> p;
          const int64_t lo = c * kParallelGrain, len = std::min(kParallelGrain, n - lo);
          for (int k = 0; k < N; ++k) p[k] = base[k] + lo * inner_strides[k];
          row(p.data(), len, inner_strides.data());
        }
        return;
      }
      std::array<char*, N> p;
      for (int64_t r = 0; r < nrows; ++r) {
        row_ptrs(r, p.data());
        row(p.data(), n, inner_strides.data());
      }
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nrows; ++r) {
      std::array<char*, N> p;
      row_ptrs(r, p.data());
      row(p.data(), n, inner_strides.data());
    }
  }
};

// out[i] = f(in[i]) with conversions at load/store: In and Out are storage types, f works on whatever
// the caller converts to. Contiguous rows get a plain indexed loop the compiler can vectorise.
template <class Out, class In, class F>
void unary_kernel(const Tensor& out, const Tensor& in, F f) {
  StridedLoop<2> loop(out.sizes(), {&out, &in});
  loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const In* a = reinterpret_cast<const In*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const In*>(p[1] + i * s[1]));
    }
  });
}

template <class Out, class A, class B, class F>
void binary_kernel(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  StridedLoop<3> loop(out.sizes(), {&out, &a, &b});
  loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const A* x = reinterpret_cast<const A*>(p[1]);
      const B* y = reinterpret_cast<const B*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == 0) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const A* x = reinterpret_cast<const A*>(p[1]);
      const B y = *reinterpret_cast<const B*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const A*>(p[1] + i * s[1]),
                                                     *reinterpret_cast<const B*>(p[2] + i * s[2]));
    }
  });
}

template <class Out, class C, class A, class B, class F>
void ternary_kernel(const Tensor& out, const Tensor& c, const Tensor& a, const Tensor& b, F f) {
  StridedLoop<4> loop(out.sizes(), {&out, &c, &a, &b});
  loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<Out*>(p[0] + i * s[0]) =
          f(*reinterpret_cast<const C*>(p[1] + i * s[1]), *reinterpret_cast<const A*>(p[2] + i * s[2]),
            *reinterpret_cast<const B*>(p[3] + i * s[3]));
  });
}

}  // namespace kiln::cpu
