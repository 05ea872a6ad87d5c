// Device code of the random ops: element i (row-major over the output's logical shape) is the CPU's
// function of (seed, offset, i) from core/philox.h, written through the output's strides. Compiled with
// --fmad=false so that `u * range + from` and `mean + std * z` round as on the CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "cuda/kernels/strided.cuh"
#include "kiln/scalar_types.h"

namespace kiln::cuda {

// Random bits a uniform value of T takes from w0 (core/philox.h: 11 for f16, 8 for bf16, 24 for f32).
template <class T>
constexpr int philox_uniform_bits() {
  if constexpr (std::is_same_v<T, Half>) return 11;
  else if constexpr (std::is_same_v<T, BFloat16>) return 8;
  else return 24;
}

__device__ __forceinline__ int64_t element_offset(const Offsets<1>& off, bool contiguous, int64_t i) {
  if (contiguous) return i;
  int64_t o[1];
  off.get(i, o);
  return o[0];
}

// f64: x = u53 * range + from (double); others: x = u * range_f + from_f in float, converted to T.
template <class T>
__global__ void uniform_kernel(T* out, Offsets<1> off, bool contiguous, int64_t n, double from, double range,
                               float from_f, float range_f, uint64_t seed, uint64_t offset) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    const PhiloxOut r = philox_element(seed, offset, static_cast<uint64_t>(i));
    T v;
    if constexpr (std::is_same_v<T, double>) {
      v = philox_uniform_double(r) * range + from;
    } else {
      const float u = philox_uniform_float(r, philox_uniform_bits<T>());
      v = convert<T>(u * range_f + from_f);
    }
    out[element_offset(off, contiguous, i)] = v;
  }
}

template <class T>
__global__ void normal_kernel(T* out, Offsets<1> off, bool contiguous, int64_t n, double mean, double std,
                              uint64_t seed, uint64_t offset) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    const double z = philox_normal(philox_element(seed, offset, static_cast<uint64_t>(i)));
    out[element_offset(off, contiguous, i)] = convert<T>(mean + std * z);
  }
}

// out contiguous: out[i] = low + (64 random bits) % range.
template <class T>
__global__ void randint_kernel(T* __restrict__ out, int64_t n, int64_t low, uint64_t range, uint64_t seed,
                               uint64_t offset) {
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    const uint64_t r = philox_u64(philox_element(seed, offset, static_cast<uint64_t>(i))) % range;
    out[i] = convert<T>(static_cast<int64_t>(static_cast<uint64_t>(low) + r));
  }
}

}  // namespace kiln::cuda
