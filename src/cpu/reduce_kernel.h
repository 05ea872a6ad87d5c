// The CPU reduction engine: one templated driver runs every reduction op of src/ops/reduce_functors.h.
//
// A ReducePlan splits the input's dims into kept dims (one output element per index) and reduced dims,
// drops size-1 dims, orders each group by input stride (outermost first) and merges dims that are
// contiguous with each other. Two traversal orders:
//  - rows: the innermost reduced dim is the input's fastest dim. Each output folds its elements into L
//    interleaved lanes (independent chains the compiler can vectorise), then merges the lanes.
//  - columns: the innermost kept dim is the input's fastest dim (e.g. summing over dim 0 of a row-major
//    matrix). A block of W adjacent outputs is accumulated at once, walking the input row by row, so every
//    load is contiguous instead of striding down a column.
// Work is parallel over outputs (OpenMP); when there are few outputs but many elements per output (one
// long row), the reduced range is split into chunks whose partials are combined afterwards. Chunking
// depends only on the shape, not the thread count, so results are reproducible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/loops.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

struct ReducePlan {
  Shape ksize, kin, kout;  // kept dims, outermost first: sizes, input strides, output strides (elements)
  Shape rsize, rin;        // reduced dims, outermost first: sizes, input strides
  int64_t out_numel = 1, red_numel = 1;
  bool columns = false;
};

// `reduced[d]` marks the reduced dims of x; the output is contiguous with x's kept dims in order.
ReducePlan make_reduce_plan(const Tensor& x, const std::vector<bool>& reduced);

namespace detail {

inline constexpr int kLanes = 8;
inline constexpr int64_t kColumnBlock = 64;
inline constexpr int64_t kSplitChunk = 32768;  // elements per partial when one output is split
inline constexpr int64_t kFewTasks = 32;       // below this many output tasks, split the reduced range

// Calls f(input offset, length, linear index of the first element) for each run of the innermost reduced
// dim inside linear range [lo, hi) of the reduced dims.
template <class F>
void for_each_reduced_run(const ReducePlan& p, int64_t lo, int64_t hi, F&& f) {
  const int nd = static_cast<int>(p.rsize.size());
  const int64_t inner = p.rsize.back();
  for (int64_t idx = lo; idx < hi;) {
    int64_t rem = idx / inner;
    const int64_t i0 = idx - rem * inner;
    int64_t off = i0 * p.rin.back();
    for (int d = nd - 2; d >= 0 && rem > 0; --d) {
      off += (rem % p.rsize[d]) * p.rin[d];
      rem /= p.rsize[d];
    }
    const int64_t n = std::min(inner - i0, hi - idx);
    f(off, n, idx);
    idx += n;
  }
}

// Input and output offsets of kept index k (linear over the plan's kept dims, `skip_inner` dims excluded
// from the innermost end).
inline void kept_offsets(const ReducePlan& p, int64_t k, int skip_inner, int64_t& in_off, int64_t& out_off) {
  in_off = out_off = 0;
  for (int d = static_cast<int>(p.ksize.size()) - 1 - skip_inner; d >= 0 && k > 0; --d) {
    const int64_t i = k % p.ksize[d];
    k /= p.ksize[d];
    in_off += i * p.kin[d];
    out_off += i * p.kout[d];
  }
}

template <class Op, class In>
typename Op::acc_t reduce_run_lanes(const Op& op, const In* x, int64_t lo, int64_t hi, const ReducePlan& p) {
  using Acc = typename Op::acc_t;
  Acc lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = op.identity();
  const int64_t s = p.rin.back();
  for_each_reduced_run(p, lo, hi, [&](int64_t off, int64_t n, int64_t idx0) {
    const In* r = x + off;
    int64_t i = 0;
    if (s == 1) {
      for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] = op.reduce(lane[j], r[i + j], idx0 + i + j);
    } else {
      for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] = op.reduce(lane[j], r[(i + j) * s], idx0 + i + j);
    }
    for (; i < n; ++i) lane[0] = op.reduce(lane[0], r[i * s], idx0 + i);
  });
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] = op.combine(lane[j], lane[j + w]);
  return lane[0];
}

template <class Op, class In>
void reduce_run_columns(const Op& op, const In* x, int64_t width, int64_t lo, int64_t hi, const ReducePlan& p,
                        typename Op::acc_t* acc) {
  for (int64_t c = 0; c < width; ++c) acc[c] = op.identity();
  const int64_t ks = p.kin.back(), rs = p.rin.back();
  for_each_reduced_run(p, lo, hi, [&](int64_t off, int64_t n, int64_t idx0) {
    for (int64_t i = 0; i < n; ++i) {
      const In* r = x + off + i * rs;
      if (ks == 1) {
        for (int64_t c = 0; c < width; ++c) acc[c] = op.reduce(acc[c], r[c], idx0 + i);
      } else {
        for (int64_t c = 0; c < width; ++c) acc[c] = op.reduce(acc[c], r[c * ks], idx0 + i);
      }
    }
  });
}

}  // namespace detail

// Reduces x (element type In, laid out as planned) and calls store(output element offset, accumulator)
// once per output element.
template <class Op, class In, class Store>
void run_reduce(const ReducePlan& p, const In* x, const Op& op, Store&& store) {
  using Acc = typename Op::acc_t;
  using namespace detail;
  if (p.out_numel == 0) return;
  const bool parallel = p.out_numel * std::max<int64_t>(p.red_numel, 1) >= kParallelGrain;
  const int64_t width = p.columns ? std::min(kColumnBlock, p.ksize.back()) : 1;
  const int64_t blocks_per_row = p.columns ? (p.ksize.back() + width - 1) / width : 1;
  const int64_t tasks = p.columns ? (p.out_numel / p.ksize.back()) * blocks_per_row : p.out_numel;
  const int skip = p.columns ? 1 : 0;

  int64_t splits = 1;
  if (parallel && tasks < kFewTasks && p.red_numel >= 2 * kSplitChunk)
    splits = std::min((p.red_numel + kSplitChunk - 1) / kSplitChunk, std::max<int64_t>(2, 256 / tasks));
  const int64_t chunk = (p.red_numel + splits - 1) / splits;

  // Partial results of task t, split s, column c at [(t * splits + s) * width + c].
  // (not std::vector: Acc may be bool)
  std::unique_ptr<Acc[]> partial;
  if (splits > 1) partial.reset(new Acc[static_cast<size_t>(tasks * splits * width)]);

  auto run_task = [&](int64_t t, int64_t s, Acc* dst) {
    const int64_t lo = std::min(p.red_numel, s * chunk), hi = std::min(p.red_numel, lo + chunk);
    int64_t in_off, out_off;
    if (!p.columns) {
      kept_offsets(p, t, 0, in_off, out_off);
      const Acc a = reduce_run_lanes(op, x + in_off, lo, hi, p);
      if (dst) dst[0] = a;
      else store(out_off, a);
      return;
    }
    const int64_t row = t / blocks_per_row, c0 = (t % blocks_per_row) * width;
    const int64_t w = std::min(width, p.ksize.back() - c0);
    kept_offsets(p, row, 1, in_off, out_off);
    in_off += c0 * p.kin.back();
    out_off += c0 * p.kout.back();
    Acc local[kColumnBlock];
    Acc* acc = dst ? dst : local;
    reduce_run_columns(op, x + in_off, w, lo, hi, p, acc);
    if (!dst)
      for (int64_t c = 0; c < w; ++c) store(out_off + c * p.kout.back(), acc[c]);
  };

  if (splits == 1) {
#pragma omp parallel for schedule(dynamic, 1) if (parallel && tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) run_task(t, 0, nullptr);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ts = 0; ts < tasks * splits; ++ts)
    run_task(ts / splits, ts % splits, partial.get() + ts * width);
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t in_off, out_off;
    int64_t w = 1, ostride = 0;
    if (p.columns) {
      const int64_t row = t / blocks_per_row, c0 = (t % blocks_per_row) * width;
      w = std::min(width, p.ksize.back() - c0);
      kept_offsets(p, row, 1, in_off, out_off);
      out_off += c0 * p.kout.back();
      ostride = p.kout.back();
    } else {
      kept_offsets(p, t, skip, in_off, out_off);
    }
    for (int64_t c = 0; c < w; ++c) {
      Acc a = partial[static_cast<size_t>(t * splits * width + c)];
      for (int64_t s = 1; s < splits; ++s) a = op.combine(a, partial[static_cast<size_t>((t * splits + s) * width + c)]);
      store(out_off + c * ostride, a);
    }
  }
}

}  // namespace kiln::cpu
