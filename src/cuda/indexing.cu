// CUDA launchers: gather (index_select, gather), take, and the strided copy the indexing ops need.
#include "cuda/indexing.h"

#include "core/dispatch.h"
#include "cuda/kernels/indexing.cuh"
#include "cuda/launch.h"
#include "cuda/offsets.h"
#include "cuda/visit.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {
constexpr int kThreads = 256;
}  // namespace

void gather_elements(const Tensor& out, const Tensor& src_r, const Tensor& idx_r, int64_t dim_stride,
                     int64_t bound, OpId op) {
  const char* name = op == OpId::IndexSelect ? "index_select" : "gather";
  const Device dev = out.device();
  check_same_device(name, dev, src_r);
  check_same_device(name, dev, idx_r);
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(dev);
  const auto off = make_offsets<2>(name, out.sizes(), {src_r.strides(), idx_r.strides()});
  DeviceErrorRecord* err = device_error_record(dev.index);
  const cudaStream_t stream = stream_of(dev);
  visit_itemsize(out.itemsize(), name, [&](auto utag) {
    using U = typename decltype(utag)::type;
    visit_index(idx_r.dtype(), name, [&](auto itag) {
      using I = typename decltype(itag)::type;
      gather_kernel<U, I><<<grid_for(n, kThreads, dev.index), kThreads, 0, stream>>>(
          static_cast<U*>(out.data_ptr()), static_cast<const U*>(src_r.data_ptr()),
          static_cast<const I*>(idx_r.data_ptr()), off, n, dim_stride, bound, err, op);
    });
  });
  check_launch(name);
}

void take(const Tensor& out, const Tensor& x, const Tensor& index) {
  const Device dev = out.device();
  check_same_device("take", dev, x);
  check_same_device("take", dev, index);
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(dev);
  const auto idx_off = make_offsets<1>("take", index.sizes(), {index.strides()});
  const auto x_off = make_offsets<1>("take", x.sizes(), {x.strides()});
  DeviceErrorRecord* err = device_error_record(dev.index);
  const cudaStream_t stream = stream_of(dev);
  visit_itemsize(out.itemsize(), "take", [&](auto utag) {
    using U = typename decltype(utag)::type;
    visit_index(index.dtype(), "take", [&](auto itag) {
      using I = typename decltype(itag)::type;
      take_kernel<U, I><<<grid_for(n, kThreads, dev.index), kThreads, 0, stream>>>(
          static_cast<U*>(out.data_ptr()), static_cast<const U*>(x.data_ptr()),
          static_cast<const I*>(index.data_ptr()), idx_off, x_off, n, x.numel(), err);
    });
  });
  check_launch("take");
}

}  // namespace kiln::cuda
