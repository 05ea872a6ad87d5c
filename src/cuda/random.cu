// CUDA launchers of rand/uniform_, randn/normal_ and randint. Built with --fmad=false (src/CMakeLists.txt).
#include "cuda/random.h"

#include "core/dispatch.h"
#include "cuda/kernels/random.cuh"
#include "cuda/launch.h"
#include "cuda/offsets.h"
#include "ops/dropout_math.h"

namespace kiln::cuda {

namespace {
constexpr int kThreads = 256;

template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

// One thread per Philox block: elements 4g .. 4g + 3, moved as one access when VEC (x and out aligned to four
// elements), else one by one. With VEC a thread loads the quads of two blocks a grid apart before it draws for
// either (two loads in flight: the draws' arithmetic overlaps the memory).
template <class T, class C, bool VEC>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ x, DropoutRule<C> rule, int64_t n) {
  const int64_t blocks = (n + 3) / 4, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (VEC) {
    const int64_t whole = n / 4;  // blocks whose four elements all exist
    for (; g + stride < whole; g += 2 * stride) {
      const Quad<T> in0 = *reinterpret_cast<const Quad<T>*>(x + 4 * g);
      const Quad<T> in1 = *reinterpret_cast<const Quad<T>*>(x + 4 * (g + stride));
      const PhiloxOut o0 = rule.block(static_cast<uint64_t>(g)), o1 = rule.block(static_cast<uint64_t>(g + stride));
      Quad<T> r0, r1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        r0.v[j] = convert<T>(rule.apply(convert<C>(in0.v[j]), o0, j));
        r1.v[j] = convert<T>(rule.apply(convert<C>(in1.v[j]), o1, j));
      }
      *reinterpret_cast<Quad<T>*>(out + 4 * g) = r0;
      *reinterpret_cast<Quad<T>*>(out + 4 * (g + stride)) = r1;
    }
  }
  for (; g < blocks; g += stride) {
    const PhiloxOut o = rule.block(static_cast<uint64_t>(g));
    const int64_t i = 4 * g;
    if (VEC && i + 4 <= n) {
      const Quad<T> in = *reinterpret_cast<const Quad<T>*>(x + i);
      Quad<T> r;
#pragma unroll
      for (int j = 0; j < 4; ++j) r.v[j] = convert<T>(rule.apply(convert<C>(in.v[j]), o, j));
      *reinterpret_cast<Quad<T>*>(out + i) = r;
    } else {
      for (int j = 0; j < 4 && i + j < n; ++j) out[i + j] = convert<T>(rule.apply(convert<C>(x[i + j]), o, j));
    }
  }
}

Offsets<1> output_offsets(const char* op, const Tensor& t) { return make_offsets<1>(op, t.sizes(), {t.strides()}); }
}  // namespace

void uniform_fill(const Tensor& t, double from, double to, uint64_t seed, uint64_t offset) {
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceGuard guard(t.device());
  const auto off = output_offsets("uniform_", t);
  const bool contiguous = t.is_contiguous();
  // The same host-side constants as cpu::uniform_fill.
  const float from_f = static_cast<float>(from), range_f = static_cast<float>(to) - static_cast<float>(from);
  visit_dtypes<kFloatTypes>(t.dtype(), "uniform_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    uniform_kernel<T><<<grid_for(n, kThreads, t.device().index), kThreads, 0, stream_of(t.device())>>>(
        static_cast<T*>(t.data_ptr()), off, contiguous, n, from, to - from, from_f, range_f, seed, offset);
  });
  check_launch("uniform_");
}

void normal_fill(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset) {
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceGuard guard(t.device());
  const auto off = output_offsets("normal_", t);
  const bool contiguous = t.is_contiguous();
  visit_dtypes<kFloatTypes>(t.dtype(), "normal_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    normal_kernel<T><<<grid_for(n, kThreads, t.device().index), kThreads, 0, stream_of(t.device())>>>(
        static_cast<T*>(t.data_ptr()), off, contiguous, n, mean, std, seed, offset);
  });
  check_launch("normal_");
}

void randint_fill(const Tensor& out, int64_t low, uint64_t range, uint64_t seed, uint64_t offset) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  visit_dtypes<kIntTypes | kFloatTypes | kBoolType>(out.dtype(), "randint", [&](auto tag) {
    using T = typename decltype(tag)::type;
    randint_kernel<T><<<grid_for(n, kThreads, out.device().index), kThreads, 0, stream_of(out.device())>>>(
        static_cast<T*>(out.data_ptr()), n, low, range, seed, offset);
  });
  check_launch("randint");
}

void dropout_apply(const Tensor& out, const Tensor& x, double p, double ka, double kb, double drop, uint64_t seed,
                   uint64_t offset) {
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard guard(x.device());
  visit_dtypes<kFloatTypes>(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const DropoutRule<C> rule{seed, offset, static_cast<float>(p), static_cast<C>(ka), static_cast<C>(kb),
                              static_cast<C>(drop)};
    T* po = static_cast<T*>(out.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    const unsigned grid = grid_for((n + 3) / 4, kThreads, x.device().index);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0; };
    if (aligned(po) && aligned(px)) dropout_kernel<T, C, true><<<grid, kThreads, 0, stream_of(x.device())>>>(po, px, rule, n);
    else dropout_kernel<T, C, false><<<grid, kThreads, 0, stream_of(x.device())>>>(po, px, rule, n);
  });
  check_launch("dropout");
}

}  // namespace kiln::cuda
