// cross_entropy over rows of logits on CUDA (cuda/loss.h): one read of each row, the log-sum-exp by an online
// softmax, the target's logit and the sums label smoothing needs, per row; no host synchronisation.
#include "cuda/loss.h"

#include <cmath>
#include <cstdint>

#include "core/dispatch.h"
#include "cuda/device_error.h"
#include "cuda/launch.h"

namespace kiln::cuda {

namespace {

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }
__device__ __forceinline__ float lg(float v) { return logf(v); }
__device__ __forceinline__ double lg(double v) { return log(v); }

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Running (max, sum of exp(x - max)) of a set; merged with another set's.
template <class A>
__device__ __forceinline__ void merge_lse(A& m, A& s, A m2, A s2) {
  const A top = m > m2 ? m : m2;
  if (top == -INFINITY) return;  // both empty (or all -inf): nothing to add
  s = s * ex(m - top) + s2 * ex(m2 - top);
  m = top;
}

// Block b: row b of x [N, C]. V elements per access (C % V == 0, x aligned to 16 bytes when V > 1).
template <class T, class A, class I, int V>
__global__ void cross_entropy_kernel(const T* __restrict__ x, const I* __restrict__ target, const A* __restrict__ w,
                                     const A* __restrict__ w_total, int64_t c, int64_t ignore_index,
                                     A* __restrict__ nll, A* __restrict__ wsum, A* __restrict__ smooth,
                                     DeviceErrorRecord* err) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * c;
  A m = -INFINITY, s = 0, sx = 0;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * V; i < c; i += static_cast<int64_t>(blockDim.x) * V) {
    const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(xr + i);
    A v[V], lm = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = static_cast<A>(p.v[k]);
      lm = v[k] > lm ? v[k] : lm;
      sx += w ? w[i + k] * v[k] : v[k];
    }
    A ls = 0;
    if (lm != -INFINITY) {
#pragma unroll
      for (int k = 0; k < V; ++k) ls += ex(v[k] - lm);
    }
    merge_lse(m, s, lm, ls);
  }
  for (int o = 16; o > 0; o /= 2) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_lse(m, s, m2, s2);
    sx += __shfl_xor_sync(0xffffffffu, sx, o);
  }
  __shared__ A sh[3][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh[0][warp] = m;
    sh[1][warp] = s;
    sh[2][warp] = sx;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  m = -INFINITY;
  s = 0;
  sx = 0;
  for (int k = 0; k < static_cast<int>(blockDim.x / 32); ++k) {
    merge_lse(m, s, sh[0][k], sh[1][k]);
    sx += sh[2][k];
  }
  const A lse = m + lg(s);
  const int64_t t = static_cast<int64_t>(target[row]);
  A loss = 0, wt = 0, sm = 0;
  if (t != ignore_index) {
    if (t < 0 || t >= c) {
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::CrossEntropy, t, c);
    } else {
      wt = w ? w[t] : A(1);
      loss = wt * (lse - static_cast<A>(xr[t]));
      sm = (w ? *w_total : static_cast<A>(c)) * lse - sx;
    }
  }
  nll[row] = loss;
  wsum[row] = wt;
  smooth[row] = sm;
}

}  // namespace

void cross_entropy_rows(const Tensor& x, const Tensor& target, const Tensor& w, const Tensor& w_total,
                        int64_t ignore_index, Tensor& nll, Tensor& wsum, Tensor& smooth) {
  const int64_t n = x.size(0), c = x.size(1);
  if (n == 0) return;
  KILN_CHECK(n <= INT32_MAX, "cross_entropy: ", n, " rows are too many for one launch");
  DeviceGuard guard(x.device());
  const cudaStream_t s = stream_of(x.device());
  DeviceErrorRecord* err = device_error_record(x.device().index);
  const int threads = c <= 1024 ? 32 : c <= 8192 ? 128 : 512;
  visit_dtypes<kFloatTypes>(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename AccOf<T>::type;
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const auto* px = static_cast<const T*>(x.data_ptr());
    const auto* pw = w.defined() ? w.data<A>() : nullptr;
    const auto* pt = w_total.defined() ? w_total.data<A>() : nullptr;
    const bool vec = c % V == 0 && reinterpret_cast<uintptr_t>(px) % 16 == 0;
    auto run = [&](auto itag) {
      using I = typename decltype(itag)::type;
      const auto* tg = static_cast<const I*>(target.data_ptr());
      if (vec)
        cross_entropy_kernel<T, A, I, V><<<static_cast<unsigned>(n), threads, 0, s>>>(
            px, tg, pw, pt, c, ignore_index, nll.data<A>(), wsum.data<A>(), smooth.data<A>(), err);
      else
        cross_entropy_kernel<T, A, I, 1><<<static_cast<unsigned>(n), threads, 0, s>>>(
            px, tg, pw, pt, c, ignore_index, nll.data<A>(), wsum.data<A>(), smooth.data<A>(), err);
    };
    if (target.dtype() == DType::I32) run(TypeTag<int32_t>{});
    else run(TypeTag<int64_t>{});
  });
  check_launch("cross_entropy");
}

}  // namespace kiln::cuda
