// bincount on CUDA: with few enough bins each block counts into a histogram in shared memory (privatised
// atomics: the contended adds stay on the SM) and adds it to the output once; otherwise straight global atomics.
#include "cpu/bincount.h"
#include "cuda/launch.h"

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

template <class I>
void by_weight(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts) {
  switch (counts.dtype()) {
    case DType::I64: return launch<I, unsigned long long, unsigned>(x, nullptr, counts);
    case DType::F32: return launch<I, float, float>(x, weights->data<float>(), counts);
    case DType::F64: return launch<I, double, double>(x, weights->data<double>(), counts);
    default: throw Error(str("bincount: internal error: counts of dtype ", dtype_name(counts.dtype())));
  }
}

}  // namespace

void bincount(const Tensor& x, const std::optional<Tensor>& weights, Tensor& counts) {
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device());
  if (x.dtype() == DType::I32) by_weight<int32_t>(x, weights, counts);
  else by_weight<int64_t>(x, weights, counts);
  check_launch("bincount");
}

}  // namespace kiln::cuda
