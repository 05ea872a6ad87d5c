// CUDA launchers of softmax / log_softmax: layout analysis, path choice by shape, one dtype dispatch. The
// kernels are in src/cuda/kernels/softmax.cuh, the row math (shared with the CPU) in src/ops/softmax_math.h.
//
// Paths, for a reduced dim of n elements and `rows` rows:
//   rows view (the reduced dim is contiguous and the other dims collapse to one row stride):
//     n <= kWarpRowMax (1024)                        softmax_rows_kernel, a row per warp (launch_rows)
//     n <= block capacity (32768; 16384 for f64)
//       and not (rows <= kSplitMaxRows (16) and n >= kSplitMinLen (16384))
//                                                    softmax_rows_kernel, a row per block of 64..512 threads
//     otherwise                                      split: softmax_split_partial_kernel +
//                                                    softmax_split_write_kernel, ~2 blocks per SM in all,
//                                                    chunks of >= 4 KB (launch_split); the second launched
//                                                    as a programmatic dependent launch on sm_90
//   otherwise (reduced dim strided, e.g. dim != last) softmax_strided_kernel on x made contiguous
// Non-contiguous x that has no rows view is copied to a contiguous tensor first.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/kernels/softmax.cuh"
#include "cuda/launch.h"
#include "cuda/softmax.h"
#include "kiln/ops.h"

namespace kiln::cuda {
namespace {

namespace k = kernels;

constexpr int64_t kWarpRowMax = 1024;         // a row per warp up to here: 32 values per lane in registers
constexpr int64_t kSplitMaxRows = 16;         // this few rows of >= kSplitMinLen: split them across blocks
constexpr int64_t kSplitMinLen = 16384;
constexpr int64_t kSplitMinChunkBytes = 4096;  // one 16-byte group per thread of a 256-thread block
constexpr int64_t kSplitMaxChunks = 1024;
constexpr int64_t kSplitBlocksPerSm = 2;

// Values per thread of the block-row path: 64 registers' worth (R groups of V).
template <class T>
constexpr int block_row_groups() {
  return static_cast<int>(64 * sizeof(float) / sizeof(opmath_t<T>)) / k::kSoftmaxVec<T>;
}
template <class T>
constexpr int warp_row_groups() {
  return static_cast<int>(kWarpRowMax / 32) / k::kSoftmaxVec<T>;
}
template <class T>
constexpr int64_t block_row_max() {
  return static_cast<int64_t>(k::kSoftmaxBlockRowMaxThreads) * block_row_groups<T>() * k::kSoftmaxVec<T>;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

std::atomic<bool> g_pdl_enabled{true};

// The split path's own switch (tests compare both) on top of the global one.
bool use_pdl(int device) { return g_pdl_enabled.load(std::memory_order_relaxed) && dependent_launch_enabled(device); }

// x as `rows` rows of n contiguous elements, row r at r * ld: the reduced dim has unit stride (or size 1),
// every later dim has size 1, and the earlier dims of size > 1 nest exactly (stride[d] = stride[d'] *
// size[d'] for the next such d'). ok = false when x is not laid out so.
struct RowsView {
  bool ok = false;
  int64_t rows = 1, ld = 0;
};

RowsView rows_view(const Tensor& x, int64_t dim) {
  RowsView v;
  const int64_t n = x.size(dim);
  for (int64_t d = dim + 1; d < x.dim(); ++d)
    if (x.size(d) != 1) return v;
  if (n > 1 && x.stride(dim) != 1) return v;
  v.ld = n;
  int64_t expect = -1;  // the stride the next outer dim of size > 1 must have
  for (int64_t d = dim - 1; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (expect < 0) v.ld = x.stride(d);
    else if (x.stride(d) != expect) return v;
    expect = x.stride(d) * x.size(d);
    v.rows *= x.size(d);
  }
  v.ok = true;
  return v;
}

struct Launch {
  Device device;
  cudaStream_t stream;
  const char* name;
  bool log;
};

template <class Tin, class Tout, int R, bool WarpPerRow>
void launch_rows_kernel(const Tin* x, Tout* y, int64_t rows, int64_t n, int64_t ld, bool vec_x, bool vec_y,
                        unsigned blocks, int threads, const Launch& L) {
  k::softmax_rows_kernel<Tin, Tout, R, WarpPerRow><<<blocks, threads, 0, L.stream>>>(
      x, y, rows, static_cast<int>(n), ld, vec_x, vec_y, L.log);
  check_launch(L.name);
}

template <class Tin, class Tout>
void launch_split(const Tin* x, Tout* y, int64_t rows, int64_t n, int64_t ld, bool vec_x, bool vec_y,
                  const Launch& L) {
  using A = opmath_t<Tin>;
  constexpr int64_t V = k::kSoftmaxVec<Tin>;
  const int64_t sms = multiprocessor_count(L.device.index);
  const int64_t min_chunk = kSplitMinChunkBytes / static_cast<int64_t>(sizeof(Tin));
  const int64_t want = std::max<int64_t>(1, (kSplitBlocksPerSm * sms + rows - 1) / rows);
  int64_t chunks = std::clamp<int64_t>(std::min(want, (n + min_chunk - 1) / min_chunk), 1, kSplitMaxChunks);
  const int64_t chunk = ((n + chunks - 1) / chunks + V - 1) / V * V;  // a multiple of V: groups stay aligned
  chunks = (n + chunk - 1) / chunk;
  KILN_CHECK(rows * chunks <= INT32_MAX, L.name, ": ", rows, " rows of ", n, " elements need ", rows * chunks,
             " blocks, more than a CUDA grid holds");
  const unsigned blocks = static_cast<unsigned>(rows * chunks);
  // Scratch from the stream-ordered caching allocator: freeing it when this returns is safe, later work on
  // the stream is ordered after both kernels (and under graph capture it lives in the graph's pool).
  Tensor scratch = empty({rows * chunks * static_cast<int64_t>(sizeof(softmax_math::MaxSum<A>))}, DType::U8,
                         L.device);
  auto* partial = static_cast<softmax_math::MaxSum<A>*>(scratch.data_ptr());
  k::softmax_split_partial_kernel<Tin><<<blocks, k::kSoftmaxSplitThreads, 0, L.stream>>>(
      x, n, ld, chunk, static_cast<int>(chunks), vec_x, partial);
  check_launch(L.name);
  // Pass 2 may start while pass 1 runs (programmatic dependent launch, sm_90): it loads its x chunk, then
  // waits in the kernel for pass 1. That hides the second launch's latency; under stream capture the
  // dependency becomes a programmatic graph edge.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(k::kSoftmaxSplitThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = L.stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (use_pdl(L.device.index)) {
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const softmax_math::MaxSum<A>* cpartial = partial;
  check(cudaLaunchKernelEx(&cfg, k::softmax_split_write_kernel<Tin, Tout>, x, y, n, ld, chunk,
                           static_cast<int>(chunks), vec_x, vec_y, cpartial, L.log),
        L.name);
  check_launch(L.name);
}

template <class Tin, class Tout>
void launch_rows(const Tin* x, Tout* y, int64_t rows, int64_t n, int64_t ld, const Launch& L) {
  constexpr int64_t V = k::kSoftmaxVec<Tin>;
  // 16-byte groups need every row start aligned: the base and the row stride in bytes.
  const bool vec_x = aligned16(x) && (ld * static_cast<int64_t>(sizeof(Tin))) % 16 == 0;
  const bool vec_y = aligned16(y) && (n * static_cast<int64_t>(sizeof(Tout))) % 16 == 0;
  const int64_t sms = multiprocessor_count(L.device.index);
  if (n <= kWarpRowMax) {
    constexpr int kRowsPerBlock = k::kSoftmaxWarpRowThreads / 32;
    const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, sms * 64);
    launch_rows_kernel<Tin, Tout, warp_row_groups<Tin>(), true>(x, y, rows, n, ld, vec_x, vec_y,
                                                                static_cast<unsigned>(blocks),
                                                                k::kSoftmaxWarpRowThreads, L);
    return;
  }
  const bool few_long = rows <= kSplitMaxRows && n >= kSplitMinLen;
  if (n <= block_row_max<Tin>() && !few_long) {
    // About 4 groups per thread, 64..512 threads: threads * R * V >= n holds (R >= 4, and n <= the capacity
    // at 512 threads).
    const int64_t want = ((n + 4 * V - 1) / (4 * V) + 31) / 32 * 32;
    const int threads = static_cast<int>(std::clamp<int64_t>(want, 64, k::kSoftmaxBlockRowMaxThreads));
    const int64_t blocks = std::min<int64_t>(rows, sms * 64);
    launch_rows_kernel<Tin, Tout, block_row_groups<Tin>(), false>(x, y, rows, n, ld, vec_x, vec_y,
                                                                  static_cast<unsigned>(blocks), threads, L);
    return;
  }
  launch_split(x, y, rows, n, ld, vec_x, vec_y, L);
}

template <class Tin, class Tout>
void launch_strided(const Tin* x, Tout* y, int64_t outer, int64_t n, int64_t inner, const Launch& L) {
  const int64_t tiles = (inner + k::kSoftmaxStridedX - 1) / k::kSoftmaxStridedX;
  const int64_t sms = multiprocessor_count(L.device.index);
  const int64_t blocks = std::min<int64_t>(outer * tiles, sms * 32);
  k::softmax_strided_kernel<Tin, Tout>
      <<<static_cast<unsigned>(blocks), dim3(k::kSoftmaxStridedX, k::kSoftmaxStridedY), 0, L.stream>>>(
          x, y, outer, n, inner, tiles, L.log);
  check_launch(L.name);
}

}  // namespace

void set_softmax_dependent_launch(bool enabled) { g_pdl_enabled.store(enabled, std::memory_order_relaxed); }

void softmax(const Tensor& out, const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  if (out.numel() == 0) return;
  check_same_device(name, x.device(), out);
  DeviceGuard guard(x.device());
  const Launch L{x.device(), stream_of(x.device()), name, log};
  const int64_t n = x.size(dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);

  Tensor xc = x;
  RowsView rv = rows_view(x, dim);
  if (!rv.ok && !x.is_contiguous()) {
    xc = x.contiguous();
    rv = rows_view(xc, dim);
  }
  visit_dtypes<kFloatTypes>(x.dtype(), name, [&](auto tag) {
    using Tin = typename decltype(tag)::type;
    auto run = [&](auto out_tag) {
      using Tout = typename decltype(out_tag)::type;
      const Tin* xp = static_cast<const Tin*>(xc.data_ptr());
      Tout* yp = static_cast<Tout*>(out.data_ptr());
      if (rv.ok) launch_rows(xp, yp, rv.rows, n, rv.ld, L);
      else launch_strided(xp, yp, outer, n, inner, L);
    };
    if (out.dtype() == x.dtype()) {
      run(TypeTag<Tin>{});
      return;
    }
    if constexpr (std::is_same_v<Tin, Half> || std::is_same_v<Tin, BFloat16>) {
      if (out.dtype() == DType::F32) {
        run(TypeTag<float>{});
        return;
      }
    }
    KILN_CHECK(false, name, ": internal error: no CUDA kernel from ", x.meta(), " to ", dtype_name(out.dtype()),
               " (the op layer converts the input first)");
  });
}

}  // namespace kiln::cuda
