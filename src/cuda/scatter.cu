// CUDA launchers: scatter (tensor src or one value) and scatter_add. One thread per position of index;
// scatter_add accumulates with atomics (so float sums over duplicate indices are not in index order).
#include <cstring>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cuda/indexing.h"
#include "cuda/kernels/indexing.cuh"
#include "cuda/launch.h"
#include "cuda/offsets.h"
#include "cuda/visit.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

// Strides of `self` seen over index's shape with stride 0 along dim (the line start of each position).
Shape line_strides(const Tensor& self, int64_t dim) {
  Shape st = self.strides();
  st[dim] = 0;
  return st;
}

}  // namespace

void scatter_elements(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, const void* value,
                      bool add) {
  const char* name = add ? "scatter_add" : "scatter";
  const Device dev = self.device();
  check_same_device(name, dev, index);
  if (src.defined()) check_same_device(name, dev, src);
  const int64_t n = index.numel();
  if (n == 0) return;
  DeviceGuard guard(dev);
  const Shape src_strides = src.defined() ? src.strides() : Shape(index.dim(), 0);
  const int64_t bound = self.size(dim);
  DeviceErrorRecord* err = device_error_record(dev.index);
  const cudaStream_t stream = stream_of(dev);
  const unsigned grid = grid_for(n, kThreads, dev.index);

  if (!add) {
    const auto off = make_offsets<3>(name, index.sizes(), {index.strides(), src_strides, line_strides(self, dim)});
    visit_itemsize(self.itemsize(), name, [&](auto utag) {
      using U = typename decltype(utag)::type;
      U v{};
      if (!src.defined()) std::memcpy(&v, value, sizeof(U));
      const U* sp = src.defined() ? static_cast<const U*>(src.data_ptr()) : nullptr;
      visit_index(index.dtype(), name, [&](auto itag) {
        using I = typename decltype(itag)::type;
        scatter_kernel<U, I><<<grid, kThreads, 0, stream>>>(static_cast<U*>(self.data_ptr()), sp, v,
                                                           static_cast<const I*>(index.data_ptr()), off, n,
                                                           self.stride(dim), bound, err, OpId::Scatter);
      });
    });
    check_launch(name);
    return;
  }

  KILN_CHECK(src.defined(), "scatter_add: src is undefined");
  constexpr DTypeSet kAddTypes = kFloatTypes | kIntTypes | kBoolType | kComplexTypes;
  visit_dtypes<kAddTypes>(self.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // f16/bf16 accumulate into an f32 copy of self and round once at the end (the CPU's semantics; 3000
    // f16 ones into one slot give 3000, where per-addition f16 atomics would stop at 2048).
    using A = std::conditional_t<is_reduced_float_v<T>, float, T>;
    Tensor acc = self;
    if constexpr (!std::is_same_v<A, T>) {
      acc = empty(self.sizes(), DType::F32, dev);
      ::kiln::copy_tensor(acc, self);
    }
    const auto off = make_offsets<3>(name, index.sizes(), {index.strides(), src_strides, line_strides(acc, dim)});
    visit_index(index.dtype(), name, [&](auto itag) {
      using I = typename decltype(itag)::type;
      scatter_add_kernel<A, T, I><<<grid, kThreads, 0, stream>>>(
          static_cast<A*>(acc.data_ptr()), static_cast<const T*>(src.data_ptr()),
          static_cast<const I*>(index.data_ptr()), off, n, acc.stride(dim), bound, err);
    });
    check_launch(name);
    if constexpr (!std::is_same_v<A, T>) ::kiln::copy_tensor(self, acc);
  });
}

}  // namespace kiln::cuda
