// Minimal CUDA backend: device discovery, plain allocation, copies and fill. The caching allocator,
// streams and the GPU op library build on this (docs/architecture.md).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/copy.h"
#include "cuda/allocator.h"
#include "cuda/backend.h"
#include "cuda/copy.h"
#include "cuda/device_error.h"
#include "cuda/elementwise.h"
#include "cuda/launch.h"
#include "core/dispatch.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"
#include "kiln/version.h"

namespace kiln::cuda {

void check(int err, const char* what) {
  if (err != cudaSuccess) {
    const auto e = static_cast<cudaError_t>(err);
    throw Error(str(what, ": CUDA error ", err, " (", cudaGetErrorName(e), "): ", cudaGetErrorString(e)));
  }
}

namespace {
struct Discovery {
  int count = 0;
  std::string reason;
};
const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      switch (e) {
        case cudaErrorNoDevice: r.reason = "no CUDA device is present"; break;
        case cudaErrorInsufficientDriver:
          r.reason = "the NVIDIA driver is missing or older than this build's CUDA runtime needs";
          break;
        default: r.reason = str("CUDA initialisation failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
      }
      return r;
    }
    if (n == 0) r.reason = "no CUDA device is present";
    r.count = n;
    return r;
  }();
  return d;
}
}  // namespace

int device_count() { return discovery().count; }
std::string unavailable_reason() { return discovery().reason; }

void check_device(Device device) {
  const auto& d = discovery();
  KILN_CHECK(d.count > 0, "CUDA is not available: ", d.reason);
  KILN_CHECK(device.index < d.count, "device ", device.str(), " does not exist (", d.count, " CUDA device",
             d.count == 1 ? "" : "s", " present)");
  static std::once_flag flags[64];
  static bool runnable[64];
  if (device.index < 64) {
    std::call_once(flags[device.index], [&] {
      runnable[device.index] = kernels_runnable(device.index);
      // The kernel error record is pinned host memory: take it now, not in the middle of a graph capture.
      if (runnable[device.index]) device_error_record(device.index);
    });
    if (!runnable[device.index]) {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, device.index);
      cudaGetLastError();
      throw Error(str("device ", device.str(), " (", p.name, ", compute capability ", p.major, ".", p.minor,
                      ") cannot run this build's kernels: compiled for CUDA architectures ", kCudaArchitectures,
                      "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", p.major, p.minor));
    }
  }
}

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  check_device(device);
  auto& alloc = CachingAllocator::get(device.index);
  void* p = nbytes > 0 ? alloc.malloc(nbytes, stream_of(device)) : nullptr;
  return std::make_shared<Storage>(std::shared_ptr<void>(p, [&alloc](void* q) { alloc.free(q); }), nbytes, device);
}

cudaStream_t stream_of(Device device) { return static_cast<cudaStream_t>(current_stream(device).handle()); }

void copy_tensor(const Tensor& dst, const Tensor& src) {
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device() == src.device()) {
      copy_on_device(dst, src);
      return;
    }
    // Across devices: a contiguous copy of the source on the destination device (peer copy), then the
    // conversion/strides there.
    const Tensor s = src.is_contiguous() ? src : src.contiguous();
    Tensor t = empty(s.sizes(), s.dtype(), dst.device());
    DeviceGuard guard(dst.device());
    check(cudaMemcpyPeerAsync(t.data_ptr(), dst.device().index, s.data_ptr(), src.device().index, s.nbytes(),
                              stream_of(dst.device())),
          "copy between devices");
    copy_on_device(dst, t);
    return;
  }
  if (dst.is_cuda()) copy_host_to_device(dst, src);
  else copy_device_to_host(dst, src);
}

namespace {
// Contiguous fill: 16-byte stores for the first `packs` * (16 / sizeof(T)) elements (p is 16-byte aligned
// when packs > 0), then the tail one element at a time.
template <class T>
__global__ void fill_kernel(T* p, int64_t n, int64_t packs, T v) {
  constexpr int V = 16 / sizeof(T);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Pack<T, V> pk;
#pragma unroll
  for (int j = 0; j < V; ++j) pk.v[j] = v;
  for (int64_t i = tid; i < packs; i += stride) reinterpret_cast<Pack<T, V>*>(p)[i] = pk;
  for (int64_t i = packs * V + tid; i < n; i += stride) p[i] = v;
}

template <class T>
struct ConstFn {
  T v;
  __device__ __forceinline__ T operator()(T) const { return v; }
};
}  // namespace

int multiprocessor_count(int device) {
  static int cached[64] = {};
  if (device >= 0 && device < 64 && cached[device]) return cached[device];
  int n = 0;
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (device >= 0 && device < 64) cached[device] = n;
  return n;
}

namespace {
std::atomic<bool>& pdl_switch() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("KILN_PDL");
    return !(v && std::string(v) == "0");
  }()};
  return on;
}
}  // namespace

bool dependent_launch_enabled(int device) {
  if (!pdl_switch().load(std::memory_order_relaxed)) return false;
  static std::atomic<int> major[64] = {};
  if (device < 0 || device >= 64) return false;
  int m = major[device].load(std::memory_order_relaxed);
  if (m == 0) {
    check(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    major[device].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

void set_dependent_launch(bool enabled) { pdl_switch().store(enabled, std::memory_order_relaxed); }

namespace {
std::atomic<int64_t> g_dependent_launches{0};
}  // namespace
int64_t dependent_launches() { return g_dependent_launches.load(std::memory_order_relaxed); }
void count_dependent_launch() { g_dependent_launches.fetch_add(1, std::memory_order_relaxed); }

void check_same_device(const char* op, Device device, const Tensor& t) {
  KILN_CHECK(t.device() == device, op, ": expected every tensor on ", device.str(), ", got ", t.meta());
}

bool kernels_runnable(int device) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, fill_kernel<uint8_t>);
  cudaGetLastError();
  cudaSetDevice(prev);
  return e == cudaSuccess;
}

void fill_bytes(const Tensor& t, const unsigned char* item, size_t size) {
  if (t.numel() == 0) return;
  uint64_t v = 0;
  std::memcpy(&v, item, size);
  const DType bits = size == 1 ? DType::U8 : size == 2 ? DType::U16 : size == 4 ? DType::U32 : DType::U64;
  const Tensor tb = t.view_as_dtype(bits);
  DeviceGuard guard(t.device());
  const cudaStream_t s = stream_of(t.device());
  visit_dtypes<dset(DType::U8, DType::U16, DType::U32, DType::U64)>(bits, "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T value = static_cast<T>(v);
    if (tb.is_contiguous()) {
      T* p = static_cast<T*>(tb.data_ptr());
      const int64_t n = tb.numel();
      const int64_t packs = (reinterpret_cast<uintptr_t>(p) & 15u) == 0 ? n / (16 / sizeof(T)) : 0;
      fill_kernel<T><<<grid_for(std::max<int64_t>(packs, n - packs * (16 / static_cast<int64_t>(sizeof(T)))), 256,
                                t.device().index),
                       256, 0, s>>>(p, n, packs, value);
      check_launch("fill_");
    } else {
      // Strided (a view of a larger tensor): the generic path, reading the element it overwrites.
      launch_elementwise<T, T>(tb, {&tb}, ConstFn<T>{value}, "fill_");
    }
  });
}

}  // namespace kiln::cuda
