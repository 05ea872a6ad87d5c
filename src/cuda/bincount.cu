// bincount on CUDA: with few enough bins each block counts into a histogram in shared memory (privatised
// atomics: the contended adds stay on the SM) and adds it to the output once; otherwise straight global atomics.
#include <algorithm>

#include "cpu/bincount.h"
#include "cuda/launch.h"
#include "cuda/visit.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 512;
constexpr size_t kSharedBytes = 48 * 1024;

__device__ inline void add_to(unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
__device__ inline void add_to(float* p, float v) { atomicAdd(p, v); }
__device__ inline void add_to(double* p, double v) { atomicAdd(p, v); }

// S: the shared counter type (u32 for counts, else W); W: the output's (u64 for int64 counts).
template <class I, class W, class S>
__global__ void bincount_shared(const I* __restrict__ x, const W* __restrict__ w, int64_t n, W* __restrict__ out,
                                int bins) {
  extern __shared__ unsigned char smem_raw[];
  S* h = reinterpret_cast<S*>(smem_raw);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) h[b] = S(0);
  __syncthreads();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<S, unsigned>) atomicAdd(&h[x[i]], 1u);
    else atomicAdd(&h[x[i]], w[i]);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (h[b] != S(0)) add_to(&out[b], static_cast<W>(h[b]));
}

template <class I, class W>
__global__ void bincount_global(const I* __restrict__ x, const W* __restrict__ w, int64_t n, W* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    add_to(&out[x[i]], w ? w[i] : W(1));
}

// bincount_one_pass: counts below `bins` as bincount_shared does, and each warp's largest value and largest
// negation (so -min for a negative minimum) folded into range[] by atomicMax: zero-initialised, it ends
// holding max(0, max x) and max(0, -min x). Four loads in flight per thread before their atomics.
constexpr int kUnroll = 4;
template <class I, class W, class S>
__global__ void __launch_bounds__(kThreads) bincount_ranged(const I* __restrict__ x, const W* __restrict__ w, int64_t n,
                                                            W* __restrict__ out, int bins,
                                                            unsigned long long* __restrict__ range) {
  extern __shared__ unsigned char smem_raw[];
  S* h = reinterpret_cast<S*>(smem_raw);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) h[b] = S(0);
  __syncthreads();
  long long hi = 0;
  unsigned long long neg = 0;  // unsigned: the negation of INT64_MIN fits
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n; i0 += stride * kUnroll) {
    I v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = i0 + k * stride < n ? x[i0 + k * stride] : I(0);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long a = static_cast<long long>(v[k]);
      hi = a > hi ? a : hi;
      const unsigned long long na = a < 0 ? 0ull - static_cast<unsigned long long>(a) : 0ull;
      neg = na > neg ? na : neg;
      if (i0 + k * stride < n && a >= 0 && a < bins) {
        if constexpr (std::is_same_v<S, unsigned>) atomicAdd(&h[a], 1u);
        else atomicAdd(&h[a], w[i0 + k * stride]);
      }
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    neg = max(neg, __shfl_xor_sync(0xffffffffu, neg, o));
  }
  if (threadIdx.x % 32 == 0) {
    if (hi > 0) atomicMax(&range[1], static_cast<unsigned long long>(hi));
    if (neg > 0) atomicMax(&range[0], static_cast<unsigned long long>(neg));
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (h[b] != S(0)) add_to(&out[b], static_cast<W>(h[b]));
}

// The one-pass kernel's bins: its shared histogram at most 32 KB (several blocks per SM).
constexpr size_t kOnePassBytes = 32 * 1024;

template <class I, class W, class S>
void launch(const Tensor& x, const W* w, Tensor& counts) {
  const int64_t n = x.numel(), bins = counts.numel();
  W* out = static_cast<W*>(counts.data_ptr());
  const unsigned grid = grid_for(n, kThreads, x.device().index);
  const cudaStream_t s = stream_of(x.device());
  if (static_cast<size_t>(bins) * sizeof(S) <= kSharedBytes)
    bincount_shared<I, W, S><<<grid, kThreads, static_cast<size_t>(bins) * sizeof(S), s>>>(x.data<I>(), w, n, out,
                                                                                         static_cast<int>(bins));
  else
    bincount_global<I, W><<<grid, kThreads, 0, s>>>(x.data<I>(), w, n, out);
}

template <class I, class W, class S>
void launch_ranged(const Tensor& x, const W* w, Tensor& range, Tensor& counts) {
  const int64_t n = x.numel(), bins = counts.numel();
  // As many blocks as fit on the GPU at once (2048 threads a multiprocessor), each looping over the input: every
  // block ends by adding its nonzero bins to the output with global atomics, so a block more costs up to `bins`
  // contended atomics.
  const int64_t resident = static_cast<int64_t>(multiprocessor_count(x.device().index)) * (2048 / kThreads);
  const unsigned grid = static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + kUnroll * kThreads - 1) / (kUnroll * kThreads), resident)));
  bincount_ranged<I, W, S><<<grid, kThreads, static_cast<size_t>(bins) * sizeof(S), stream_of(x.device())>>>(
      x.data<I>(), w, n, static_cast<W*>(counts.data_ptr()), static_cast<int>(bins),
      static_cast<unsigned long long*>(range.data_ptr()));
}

// Calls launch<I, W, S> (ranged: launch_ranged) for the counts' dtype: W the output's element (u64 for int64
// counts), S the shared counter (u32 for counts).
template <class I, bool Ranged>
void by_weight(const Tensor& x, const std::optional<Tensor>& weights, Tensor* range, Tensor& counts) {
  const auto go = [&](auto w_tag, auto s_tag, const auto* w) {
    using W = typename decltype(w_tag)::type;
    using S = typename decltype(s_tag)::type;
    if constexpr (Ranged) launch_ranged<I, W, S>(x, w, *range, counts);
    else launch<I, W, S>(x, w, counts);
  };
  switch (counts.dtype()) {
    case DType::I64: return go(TypeTag<unsigned long long>{}, TypeTag<unsigned>{}, static_cast<const unsigned long long*>(nullptr));
    case DType::F32: return go(TypeTag<float>{}, TypeTag<float>{}, weights->data<float>());
    case DType::F64: return go(TypeTag<double>{}, TypeTag<double>{}, weights->data<double>());
    default: throw Error(str("bincount: internal error: counts of dtype ", dtype_name(counts.dtype())));
  }
}

}  // namespace

void bincount(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts) {
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device());
  if (x.dtype() == DType::I32) by_weight<int32_t, false>(x, weights, nullptr, counts);
  else by_weight<int64_t, false>(x, weights, nullptr, counts);
  check_launch("bincount");
}

int64_t bincount_one_pass_bins(DType counts) {
  return static_cast<int64_t>(kOnePassBytes / (counts == DType::F64 ? sizeof(double) : sizeof(float)));
}

void bincount_one_pass(const Tensor& x, const std::optional<Tensor>& weights, Tensor& range, Tensor& counts) {
  if (x.numel() == 0) return;
  KILN_CHECK(counts.numel() <= bincount_one_pass_bins(counts.dtype()), "bincount: internal error: ", counts.numel(),
             " one-pass bins");
  DeviceGuard guard(x.device());
  if (x.dtype() == DType::I32) by_weight<int32_t, true>(x, weights, &range, counts);
  else by_weight<int64_t, true>(x, weights, &range, counts);
  check_launch("bincount");
}

}  // namespace kiln::cuda
