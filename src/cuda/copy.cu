// Copies on one CUDA device: same-dtype strided copies (by element size) and dtype conversions.
//
// A conversion between two dtypes is one contiguous kernel per (out, in) pair: 256 small kernels, the
// conversion itself (include/kiln/scalar_types.h `convert`, the same bits as the CPU). Strided conversions
// go through a contiguous temporary rather than instantiating the strided kernels per pair as well.
#include "core/dispatch.h"
#include "cuda/copy.h"
#include "cuda/elementwise.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {
template <class T>
struct Identity {
  __device__ __forceinline__ T operator()(T v) const { return v; }
};

template <class Out, class In>
struct Convert {
  __device__ __forceinline__ Out operator()(In v) const { return convert<Out>(v); }
};

DType bits_dtype(size_t itemsize) {
  switch (itemsize) {
    case 1: return DType::U8;
    case 2: return DType::U16;
    case 4: return DType::U32;
    default: return DType::U64;
  }
}

// Same dtype, any strides (dst and src have one shape and do not overlap).
void copy_same_dtype(const Tensor& dst, const Tensor& src) {
  const DType bits = bits_dtype(dst.itemsize());
  const Tensor d = dst.view_as_dtype(bits), s = src.view_as_dtype(bits);
  visit_dtypes<dset(DType::U8, DType::U16, DType::U32, DType::U64)>(bits, "copy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<T, T>(d, {&s}, Identity<T>{}, "copy");
  });
}

// Different dtypes, both contiguous.
void convert_contiguous(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  DeviceGuard guard(dst.device());
  const cudaStream_t stream = stream_of(dst.device());
  visit_dtype(dst.dtype(), "copy", [&](auto out_tag) {
    using Out = typename decltype(out_tag)::type;
    visit_dtype(src.dtype(), "copy", [&](auto in_tag) {
      using In = typename decltype(in_tag)::type;
      elementwise_contig<1><<<grid_for(n, 256, dst.device().index), 256, 0, stream>>>(
          n, Convert<Out, In>{}, static_cast<Out*>(dst.data_ptr()), static_cast<const In*>(src.data_ptr()));
    });
  });
  check_launch("copy (dtype conversion)");
}
}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dst.is_contiguous() && src.is_contiguous()) {
      DeviceGuard guard(dst.device());
      check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                            stream_of(dst.device())),
            "copy");
      return;
    }
    copy_same_dtype(dst, src);
    return;
  }
  const Tensor s = src.is_contiguous() ? src : src.contiguous();
  if (dst.is_contiguous()) {
    convert_contiguous(dst, s);
    return;
  }
  Tensor tmp = empty(dst.sizes(), dst.dtype(), dst.device());
  convert_contiguous(tmp, s);
  copy_same_dtype(dst, tmp);
}

}  // namespace kiln::cuda
