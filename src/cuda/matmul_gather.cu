// Launcher of the strided gather the matmul family uses to make operands contiguous and to lay addmm's
// broadcast input (times beta) into the output before cuBLAS accumulates onto it.
#include "core/dispatch.h"
#include "cuda/kernels/matmul.cuh"
#include "cuda/launch.h"
#include "cuda/matmul.h"

namespace kiln::cuda {

namespace {

// src's dims with size-1 dims dropped and adjacent dims merged where they form one stride, so that common
// views (transposes, slices, broadcasts) need few dims and the index math stays short.
kernels::GatherIndex merged_index(const Tensor& src) {
  int64_t sizes[64], strides[64];
  int nd = 0;
  for (int64_t d = 0; d < src.dim(); ++d) {
    const int64_t size = src.size(d), stride = src.stride(d);
    if (size == 1) continue;
    if (nd > 0 && strides[nd - 1] == stride * size) {
      sizes[nd - 1] *= size;
      strides[nd - 1] = stride;
      continue;
    }
    KILN_CHECK(nd < 64, "matmul: operand ", src.meta(), " has too many dims");
    sizes[nd] = size;
    strides[nd] = stride;
    ++nd;
  }
  KILN_CHECK(nd <= kernels::kMaxGatherDims, "matmul: operand ", src.meta(), " has ", nd,
             " dims that cannot be merged; at most ", kernels::kMaxGatherDims, " are supported");
  kernels::GatherIndex ix{};
  ix.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    ix.sizes[d] = sizes[d];
    ix.strides[d] = strides[d];
  }
  return ix;
}

template <class T>
opmath_t<T> scalar_as(const Scalar& s) {
  if constexpr (std::is_same_v<T, Complex64>) return s.to_complex();
  else return static_cast<opmath_t<T>>(s.to_double());
}

}  // namespace

void gather_contiguous(const Tensor& dst, const Tensor& src, const Scalar* beta) {
  KILN_CHECK(dst.is_contiguous() && dst.sizes() == src.sizes() && dst.dtype() == src.dtype(),
             "matmul: internal gather needs a contiguous destination like the source, got ", dst.meta(), " and ",
             src.meta());
  check_same_device("matmul", dst.device(), src);
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  const cudaStream_t stream = stream_of(dst.device());
  if (!beta && src.is_contiguous()) {
    check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream),
          "matmul: device copy");
    return;
  }
  const kernels::GatherIndex ix = merged_index(src);
  visit_dtypes<kFloatTypes | kComplexTypes>(dst.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const opmath_t<T> s = beta ? scalar_as<T>(*beta) : opmath_t<T>(0);
    const int threads = 256;
    kernels::gather_kernel<T, opmath_t<T>><<<grid_for(n, threads, dst.device().index), threads, 0, stream>>>(
        static_cast<T*>(dst.data_ptr()), static_cast<const T*>(src.data_ptr()), n, ix, beta != nullptr, s);
    check_launch("matmul: gather kernel");
  });
}

}  // namespace kiln::cuda
