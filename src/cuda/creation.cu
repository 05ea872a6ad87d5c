// CUDA launchers of arange, linspace, logspace and eye. Built with --fmad=false (src/CMakeLists.txt): the
// shared formulas of ops/range.h must round as on the CPU.
#include "cuda/creation.h"

#include <algorithm>
#include <cstring>

#include "core/dispatch.h"
#include "cuda/kernels/creation.cuh"
#include "cuda/launch.h"
#include "cuda/visit.h"
#include "kiln/ops.h"
#include "ops/range.h"

namespace kiln::cuda {

namespace {
constexpr int kThreads = 256;
constexpr DTypeSet kRangeTypes = kFloatTypes | kIntTypes;

template <class T, class Op>
void launch_indexed(Tensor& out, const Op& op, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  indexed_fill_kernel<T, Op><<<grid_for(n, kThreads, out.device().index), kThreads, 0, stream_of(out.device())>>>(
      static_cast<T*>(out.data_ptr()), n, op);
  check_launch(name);
}
}  // namespace

void arange_fill(Tensor& out, const Scalar& start, const Scalar& step) {
  visit_dtypes<kRangeTypes>(out.dtype(), "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_indexed<T>(out, make_arange_op<T>(start, step, out.numel()), "arange");
  });
}

void linspace_fill(Tensor& out, double start, double end) {
  visit_dtypes<kRangeTypes>(out.dtype(), "linspace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_indexed<T>(out, make_linspace_op<T>(start, end, out.numel()), "linspace");
  });
}

void logspace_fill(Tensor& out, double start, double end, double base) {
  visit_dtypes<kRangeTypes>(out.dtype(), "logspace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_indexed<T>(out, LogspaceOp<T>{make_linspace_op<T>(start, end, out.numel()), base}, "logspace");
  });
}

void eye_fill(Tensor& out) {
  const int64_t rows = out.size(0), cols = out.size(1), diag = std::min(rows, cols);
  if (diag == 0) return;
  // The bytes of 1 in out's dtype (converted on the host once); the kernel only moves them.
  const Tensor one = full({}, 1, out.dtype(), kCPU);
  DeviceGuard guard(out.device());
  visit_itemsize(out.itemsize(), "eye", [&](auto utag) {
    using U = typename decltype(utag)::type;
    U v;
    std::memcpy(&v, one.data_ptr(), sizeof(U));
    eye_kernel<U><<<grid_for(diag, kThreads, out.device().index), kThreads, 0, stream_of(out.device())>>>(
        static_cast<U*>(out.data_ptr()), diag, cols, v);
  });
  check_launch("eye");
}

}  // namespace kiln::cuda
