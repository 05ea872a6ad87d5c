// layer_norm, group_norm and batch_norm on CUDA (cuda/moments.h): the statistics in one read of the input,
// split over many blocks and merged by Chan's formula; then one pass that normalises. Half-precision input
// accumulates in f32, f64 in f64.
#include "cuda/moments.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

// Count, mean and sum of squared deviations of a set of values.
template <class A>
struct Moments {
  A n = 0, mean = 0, m2 = 0;
  // Chan et al.: merges the moments of another set (nb values).
  __device__ void merge(A nb, A mean_b, A m2_b) {
    if (nb == 0) return;
    const A total = n + nb, delta = mean_b - mean, f = nb / total;
    mean += delta * f;
    m2 += m2_b + delta * delta * n * f;
    n = total;
  }
};

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Merges the moments of every thread of the block into thread 0's.
template <class A>
__device__ Moments<A> block_merge(Moments<A> m) {
  __shared__ A sh[3][kThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const A n = __shfl_xor_sync(0xffffffffu, m.n, o), mean = __shfl_xor_sync(0xffffffffu, m.mean, o),
            m2 = __shfl_xor_sync(0xffffffffu, m.m2, o);
    m.merge(n, mean, m2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh[0][warp] = m.n;
    sh[1][warp] = m.mean;
    sh[2][warp] = m.m2;
  }
  __syncthreads();
  Moments<A> r;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) r.merge(sh[0][w], sh[1][w], sh[2][w]);
  return r;
}

// Block (set, split) takes the split-th chunk of `chunk` elements of its set's logical sequence (`runs` runs of
// `len`, run j at set * set_stride + j * run_stride) and writes their mean and m2 to part[set * splits + split].
// V elements per access: chunk, len and both strides are multiples of V (checked on the host).
template <class T, class A, int V>
__global__ void __launch_bounds__(kThreads) moments_kernel(const T* __restrict__ x, int64_t total, int64_t len,
                                                           int64_t set_stride, int64_t run_stride, int64_t chunk,
                                                           int splits, A* __restrict__ part) {
  const int64_t set = blockIdx.x / splits;
  const int split = static_cast<int>(blockIdx.x % splits);
  const int64_t begin = split * chunk, end = lmin(total, begin + chunk);
  Moments<A> m;
  for (int64_t j = begin; j < end;) {
    // The piece of the chunk inside one run: logical elements [j, piece_end), run elements from j - run * len.
    const int64_t run = j / len, piece_end = lmin(end, (run + 1) * len);
    const T* p = x + set * set_stride + run * run_stride;
    for (int64_t i = j - run * len + static_cast<int64_t>(threadIdx.x) * V; i < piece_end - run * len;
         i += static_cast<int64_t>(kThreads) * V) {
      const Pack<T, V> pk = *reinterpret_cast<const Pack<T, V>*>(p + i);
      A s = 0;
#pragma unroll
      for (int k = 0; k < V; ++k) s += static_cast<A>(pk.v[k]);
      const A mean_b = s / V;
      A m2_b = 0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A d = static_cast<A>(pk.v[k]) - mean_b;
        m2_b += d * d;
      }
      m.merge(A(V), mean_b, m2_b);
    }
    j = piece_end;
  }
  m = block_merge(m);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = m.mean;
    part[2 * blockIdx.x + 1] = m.m2;
  }
}

// One thread per set: merges the splits' moments (split s holds min(chunk, total - s * chunk) values) into the
// mean and the biased variance.
template <class A>
__global__ void moments_finish(const A* __restrict__ part, int64_t sets, int splits, int64_t total, int64_t chunk,
                               A* __restrict__ mean, A* __restrict__ var) {
  const int64_t set = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (set >= sets) return;
  Moments<A> m;
  for (int s = 0; s < splits; ++s) {
    const int64_t n = lmin(chunk, total - s * chunk);
    m.merge(static_cast<A>(n), part[2 * (set * splits + s)], part[2 * (set * splits + s) + 1]);
  }
  mean[set] = m.mean;
  var[set] = m.m2 / static_cast<A>(total);
}

// layer_norm: block b covers columns [tile * kThreads * V, ...) of row b / tiles; w and b per column (or null).
template <class T, class A, int V>
__global__ void __launch_bounds__(kThreads) normalize_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t d,
                                                                  int64_t tiles, const A* __restrict__ mean,
                                                                  const A* __restrict__ var, const A* __restrict__ w,
                                                                  const A* __restrict__ b, A eps) {
  const int64_t row = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const A mu = mean[row], rstd = A(1) / ::sqrt(var[row] + eps);
  const int64_t c0 = (tile * kThreads + threadIdx.x) * V;
  if (c0 >= d) return;
  const Pack<T, V> in = *reinterpret_cast<const Pack<T, V>*>(x + row * d + c0);
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    A v = (static_cast<A>(in.v[k]) - mu) * rstd;
    if (w) v *= w[c0 + k];
    if (b) v += b[c0 + k];
    out.v[k] = static_cast<T>(v);
  }
  *reinterpret_cast<Pack<T, V>*>(y + row * d + c0) = out;
}

// group_norm / batch_norm, flat over the tensor: block b covers packs [b * kThreads * kPlaneIters, ...), pack q
// holding elements [q V, q V + V) of plane q / plane_packs (planes are whole packs). Plane p = n * C + c:
// channel c = p % C, statistics index c for batch_norm (per_channel), p / stat_div for group_norm. Small planes
// (batch_norm's 56 x 56) leave no lanes idle; each pack computes its scale and shift from the per-channel values
// (a few loads that stay in L1).
// The loads of all kPlaneIters packs are issued before the first store. I: 32-bit indices below 2^31 packs.
constexpr int kPlaneIters = 4;
template <class T, class A, int V, class I>
__global__ void __launch_bounds__(kThreads) normalize_planes_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                    I packs, I plane_packs, I channels, I stat_div,
                                                                    bool per_channel, const A* __restrict__ mean,
                                                                    const A* __restrict__ var, const A* __restrict__ w,
                                                                    const A* __restrict__ b, A eps) {
  const I q0 = static_cast<I>(blockIdx.x) * (kThreads * kPlaneIters) + threadIdx.x;
  Pack<T, V> in[kPlaneIters];
#pragma unroll
  for (int it = 0; it < kPlaneIters; ++it) {
    const I q = q0 + it * kThreads;
    if (q < packs) in[it] = reinterpret_cast<const Pack<T, V>*>(x)[q];
  }
#pragma unroll
  for (int it = 0; it < kPlaneIters; ++it) {
    const I q = q0 + it * kThreads;
    if (q >= packs) break;
    const I p = q / plane_packs, c = p % channels, st = per_channel ? c : p / stat_div;
    A scale = A(1) / ::sqrt(var[st] + eps);
    if (w) scale *= w[c];
    const A shift = (b ? b[c] : A(0)) - mean[st] * scale;
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(static_cast<A>(in[it].v[k]) * scale + shift);
    reinterpret_cast<Pack<T, V>*>(y)[q] = out;
  }
}

// Sum over the block of NT threads, returned to every thread; `sh` holds NT / 32 partials (one array per
// reduction in flight).
template <int NT, class A>
__device__ A block_sum(A v, A* sh) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  A t = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) t += sh[w];
  return t;
}

// layer_norm of one row per block of NT threads, the row in registers (at most kFusedPacks packs of V per
// thread): the mean, then the variance from the centred values, then the output, with one read of x; the weight
// and bias read as packs too.
constexpr int kFusedPacks = 4;
template <class T, class A, int V, int NT>
__global__ void __launch_bounds__(NT) layer_norm_fused_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t d,
                                                              const A* __restrict__ w, const A* __restrict__ b, A eps) {
  __shared__ A sh[2][NT / 32];
  const int64_t row = blockIdx.x;
  const int packs = static_cast<int>(d / V);
  A v[kFusedPacks][V];
  A s = 0;
#pragma unroll
  for (int c = 0; c < kFusedPacks; ++c) {
    const int p = threadIdx.x + c * NT;
    if (p < packs) {
      const Pack<T, V> in = *reinterpret_cast<const Pack<T, V>*>(x + row * d + static_cast<int64_t>(p) * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[c][k] = static_cast<A>(in.v[k]);
        s += v[c][k];
      }
    }
  }
  const A mean = block_sum<NT>(s, sh[0]) / static_cast<A>(d);
  A q = 0;
#pragma unroll
  for (int c = 0; c < kFusedPacks; ++c) {
    if (threadIdx.x + c * NT < packs) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A dv = v[c][k] - mean;
        q += dv * dv;
      }
    }
  }
  const A rstd = A(1) / ::sqrt(block_sum<NT>(q, sh[1]) / static_cast<A>(d) + eps);
#pragma unroll
  for (int c = 0; c < kFusedPacks; ++c) {
    const int p = threadIdx.x + c * NT;
    if (p < packs) {
      Pack<A, V> wp, bp;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        wp.v[k] = A(1);
        bp.v[k] = A(0);
      }
      if (w) wp = *reinterpret_cast<const Pack<A, V>*>(w + p * V);
      if (b) bp = *reinterpret_cast<const Pack<A, V>*>(b + p * V);
      Pack<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>((v[c][k] - mean) * rstd * wp.v[k] + bp.v[k]);
      *reinterpret_cast<Pack<T, V>*>(y + row * d + static_cast<int64_t>(p) * V) = out;
    }
  }
}

template <class F>
void visit_float(DType t, const char* op, F&& f) {
  visit_dtypes<kFloatTypes>(t, op, [&](auto tag) { f(tag); });
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

void moments(const Tensor& x, int64_t sets, int64_t runs, int64_t len, int64_t set_stride, int64_t run_stride,
             Tensor& mean, Tensor& var) {
  const int64_t total = runs * len;
  if (sets == 0) return;
  KILN_CHECK(total > 0, "moments: internal error: empty sets");
  DeviceGuard guard(x.device());
  const int dev = x.device().index;
  const cudaStream_t s = stream_of(x.device());
  visit_float(x.dtype(), "normalisation", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const bool vec = len % V == 0 && set_stride % V == 0 && run_stride % V == 0 && aligned(x.data_ptr(), 16);
    // Enough blocks to fill the GPU four times over, each with at least 16 elements per thread.
    const int64_t want = 4 * static_cast<int64_t>(multiprocessor_count(dev));
    const int64_t most = std::max<int64_t>(1, total / (16 * kThreads));
    int splits = static_cast<int>(std::clamp<int64_t>((want + sets - 1) / sets, 1, std::min<int64_t>(most, 1024)));
    const int step = vec ? V : 1;
    int64_t chunk = (total + splits - 1) / splits;
    chunk = (chunk + step - 1) / step * step;
    splits = static_cast<int>((total + chunk - 1) / chunk);
    KILN_CHECK(sets * splits <= INT32_MAX, "normalisation: ", sets, " sets are too many for one launch");
    Tensor part = empty({sets * splits, 2}, mean.dtype(), x.device());
    const auto* px = static_cast<const T*>(x.data_ptr());
    const unsigned blocks = static_cast<unsigned>(sets * splits);
    if (vec)
      moments_kernel<T, A, V><<<blocks, kThreads, 0, s>>>(px, total, len, set_stride, run_stride, chunk, splits,
                                                         part.data<A>());
    else
      moments_kernel<T, A, 1><<<blocks, kThreads, 0, s>>>(px, total, len, set_stride, run_stride, chunk, splits,
                                                         part.data<A>());
    moments_finish<A><<<static_cast<unsigned>((sets + 127) / 128), 128, 0, s>>>(part.data<A>(), sets, splits, total,
                                                                              chunk, mean.data<A>(), var.data<A>());
  });
  check_launch("normalisation statistics");
}

namespace {

// The normalising passes' common launch: typed pointers, V elements per access where every row (or plane) of
// `inner` elements is a whole number of 16-byte packs and x and y are aligned, one element otherwise.
// launch(kernel_tag<V>, px, py, pw, pb, pmean, pvar) starts the kernel.
template <class Launch>
void normalize_launch(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                      int64_t inner, Tensor& y, const char* op, Launch&& launch) {
  DeviceGuard guard(x.device());
  visit_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const auto* px = static_cast<const T*>(x.data_ptr());
    auto* py = static_cast<T*>(y.data_ptr());
    const auto* pw = static_cast<const A*>(data_or_null(w));
    const auto* pb = static_cast<const A*>(data_or_null(b));
    if (inner % V == 0 && aligned(px, 16) && aligned(py, 16))
      launch(std::integral_constant<int, V>{}, px, py, pw, pb, mean.data<A>(), var.data<A>());
    else
      launch(std::integral_constant<int, 1>{}, px, py, pw, pb, mean.data<A>(), var.data<A>());
  });
  check_launch(op);
}

}  // namespace

bool layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y) {
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  if (x.numel() == 0 || rows > INT32_MAX) return false;
  bool done = false;
  visit_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const auto* px = static_cast<const T*>(x.data_ptr());
    auto* py = static_cast<T*>(y.data_ptr());
    const void* pwv = data_or_null(w);
    const void* pbv = data_or_null(b);
    if (d % V != 0 || d > static_cast<int64_t>(kThreads) * V * kFusedPacks || !aligned(px, 16) || !aligned(py, 16) ||
        !aligned(pwv, sizeof(A) * V) || !aligned(pbv, sizeof(A) * V))
      return;
    DeviceGuard guard(x.device());
    const auto* pw = static_cast<const A*>(data_or_null(w));
    const auto* pb = static_cast<const A*>(data_or_null(b));
    // Half the threads where they suffice: twice the rows per SM, cheaper reductions.
    if (d <= static_cast<int64_t>(kThreads / 2) * V * kFusedPacks)
      layer_norm_fused_kernel<T, A, V, kThreads / 2><<<static_cast<unsigned>(rows), kThreads / 2, 0, stream_of(x.device())>>>(
          px, py, d, pw, pb, static_cast<A>(eps));
    else
      layer_norm_fused_kernel<T, A, V, kThreads><<<static_cast<unsigned>(rows), kThreads, 0, stream_of(x.device())>>>(
          px, py, d, pw, pb, static_cast<A>(eps));
    check_launch("layer_norm");
    done = true;
  });
  return done;
}

void normalize_rows(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
                    Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const cudaStream_t s = stream_of(x.device());
  normalize_launch(x, mean, var, w, b, d, y, "layer_norm", [&](auto v, const auto* px, auto* py, const auto* pw,
                                                               const auto* pb, const auto* pm, const auto* pv) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
    using A = std::remove_cv_t<std::remove_pointer_t<decltype(pm)>>;
    const int64_t per_tile = static_cast<int64_t>(kThreads) * v, tiles = (d + per_tile - 1) / per_tile;
    KILN_CHECK(rows * tiles <= INT32_MAX, "layer_norm: ", x.meta(), " is too large for one launch");
    normalize_rows_kernel<T, A, decltype(v)::value><<<static_cast<unsigned>(rows * tiles), kThreads, 0, s>>>(
        px, py, d, tiles, pm, pv, pw, pb, static_cast<A>(eps));
  });
}

void normalize_planes(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b,
                      double eps, int64_t channels, int64_t stat_div, bool per_channel, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t planes = x.size(0) * channels, plane = x.numel() / planes;
  const cudaStream_t s = stream_of(x.device());
  normalize_launch(x, mean, var, w, b, plane, y, "normalisation", [&](auto v, const auto* px, auto* py,
                                                                      const auto* pw, const auto* pb, const auto* pm,
                                                                      const auto* pv) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(px)>>;
    using A = std::remove_cv_t<std::remove_pointer_t<decltype(pm)>>;
    constexpr int Vn = decltype(v)::value;
    const int64_t packs = x.numel() / Vn, per_block = static_cast<int64_t>(kThreads) * kPlaneIters;
    const int64_t blocks = (packs + per_block - 1) / per_block;
    KILN_CHECK(blocks <= INT32_MAX, "normalisation: ", x.meta(), " is too large for one launch");
    const auto go = [&](auto index) {
      using I = decltype(index);
      normalize_planes_kernel<T, A, Vn, I><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
          px, py, static_cast<I>(packs), static_cast<I>(plane / Vn), static_cast<I>(channels), static_cast<I>(stat_div),
          per_channel, pm, pv, pw, pb, static_cast<A>(eps));
    };
    if (packs + per_block < INT32_MAX) go(int32_t{});
    else go(int64_t{});
  });
}

}  // namespace kiln::cuda
