// The launcher of the one-row TMA-stream matrix-vector kernel (kernels/gemv_tma.cuh), shared by linear's
// 16-bit decode case (linear.cu) and linear(Fp8Weight)'s (fp8.cu). Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/gemv_tma.cuh"
#include "cuda/launch.h"
#include "cuda/linear.h"

namespace kiln::cuda {

namespace detail {

template <class W, class X, class B, int KB>
bool launch_gemv_tma_kb(const CUtensorMap& map, int64_t n, int k, const X* x, kernels::GemvTmaScales sc,
                        const B* bias, X* y, int device, cudaStream_t stream, const char* op) {
  auto kernel = kernels::gemv_tma_kernel<W, X, B, KB>;
  static const int per_sm = [&] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kernels::kGemvTmaThreads, 0) != cudaSuccess) {
      cudaGetLastError();
      b = 1;
    }
    return std::max(b, 1);
  }();
  const int64_t units = (n + kernels::kGemvTmaRows - 1) / kernels::kGemvTmaRows;
  // Every block the same number of units: the fewest rounds the resident slots allow, spread over as many
  // blocks as that needs.
  const int64_t slots = static_cast<int64_t>(per_sm) * multiprocessor_count(device);
  const int64_t rounds = (units + slots - 1) / slots;
  const int64_t grid = (units + rounds - 1) / rounds;
  launch_dependent(kernel, dim3(static_cast<unsigned>(grid)), dim3(kernels::kGemvTmaThreads), 0, stream, device, op,
                   map, x, n, k, sc, bias, y, units);
  return true;
}

}  // namespace detail

// y[j] = x . w[j] (+ bias[j]) for one row x of k activations and w [n, k] with row stride ldw (elements), by the
// TMA-stream kernel. False, launching nothing, where it cannot run: no Hopper code in this build or a device
// without it, k or n not positive, rows that are not a whole number of 16-byte chunks or not 16-byte aligned,
// x not 16-byte aligned, a layout the driver's tensor-map encoder rejects.
template <class W, class X, class B>
bool launch_gemv_tma(const W* w, int64_t ldw, int64_t n, int k, const X* x, kernels::GemvTmaScales sc,
                     const B* bias, X* y, int device, cudaStream_t stream, const char* op) {
  const int64_t wsz = static_cast<int64_t>(sizeof(W));
  const int64_t row_bytes = static_cast<int64_t>(k) * wsz;
  if (!wgmma_available(device) || k <= 0 || n <= 0 || n > (int64_t{1} << 31) || row_bytes % 16 != 0 ||
      (ldw * wsz) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return false;
  const int box = gemv_tma_box();
  CUtensorMap map;
  const uint64_t dims[2] = {static_cast<uint64_t>(row_bytes / 8), static_cast<uint64_t>(n)};
  if (!encode_tensor_map_words(&map, w, dims, static_cast<uint64_t>(ldw * wsz), static_cast<uint32_t>(box / 8),
                               kernels::kGemvTmaRows))
    return false;
  return box == 512 ? detail::launch_gemv_tma_kb<W, X, B, 512>(map, n, k, x, sc, bias, y, device, stream, op)
                    : detail::launch_gemv_tma_kb<W, X, B, 1024>(map, n, k, x, sc, bias, y, device, stream, op);
}

}  // namespace kiln::cuda
