// CUDA launchers of rand/uniform_, randn/normal_ and randint. Built with --fmad=false (src/CMakeLists.txt).
#include "cuda/random.h"

#include "core/dispatch.h"
#include "cuda/kernels/random.cuh"
#include "cuda/launch.h"
#include "cuda/offsets.h"

namespace kiln::cuda {

namespace {
constexpr int kThreads = 256;

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

}  // namespace kiln::cuda
