// Minimal CUDA backend: device discovery, plain allocation, copies and fill. The caching allocator,
// streams and the GPU op library build on this (docs/architecture.md).
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>

#include "core/copy.h"
#include "cuda/allocator.h"
#include "cuda/backend.h"
#include "cuda/device_error.h"
#include "cuda/launch.h"
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
    std::call_once(flags[device.index], [&] { runnable[device.index] = kernels_runnable(device.index); });
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
  // Same dtype, both contiguous: one cudaMemcpy. Otherwise convert through a contiguous host copy.
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    const Device dev = dst.is_cuda() ? dst.device() : src.device();
    check(cudaSetDevice(dev.index), "cudaSetDevice");
    const cudaStream_t s = stream_of(dev);
    check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDefault, s), "copy");
    // The host reads what it copied out: wait for this stream only (never the whole device).
    if (dst.is_cpu()) {
      check(cudaStreamSynchronize(s), "copy to host");
      check_device_errors(dev.index);
    }
    return;
  }
  KILN_CHECK(src.is_cpu() || src.is_contiguous(),
             "copy: a non-contiguous CUDA source is not supported by this backend yet (", src.meta(), ")");
  Tensor host_src = src.is_cpu() ? src : src.to(kCPU);
  if (dst.is_cpu()) {
    cpu::copy_cast(dst, host_src);
    return;
  }
  Tensor staged(kiln::allocate_storage(dst.nbytes(), kCPU), dst.sizes(), contiguous_strides(dst.sizes()), 0,
                dst.dtype());
  cpu::copy_cast(staged, host_src);
  KILN_CHECK(dst.is_contiguous(), "copy: non-contiguous device destination is not supported by this backend yet");
  check(cudaSetDevice(dst.device().index), "cudaSetDevice");
  // Synchronous with respect to the host: `staged` is pageable and dies at the end of this scope.
  const cudaStream_t s = stream_of(dst.device());
  check(cudaMemcpyAsync(dst.data_ptr(), staged.data_ptr(), dst.nbytes(), cudaMemcpyHostToDevice, s), "copy");
  check(cudaStreamSynchronize(s), "copy to device");
}

namespace {
template <int N>
__global__ void fill_kernel(unsigned char* p, int64_t n, const unsigned char* __restrict__ dummy,
                            uint64_t item) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t k = i; k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    unsigned char* q = p + k * N;
    for (int b = 0; b < N; ++b) q[b] = static_cast<unsigned char>(item >> (8 * b));
  }
}
}  // namespace

int multiprocessor_count(int device) {
  static int cached[64] = {};
  if (device >= 0 && device < 64 && cached[device]) return cached[device];
  int n = 0;
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (device >= 0 && device < 64) cached[device] = n;
  return n;
}

void check_same_device(const char* op, Device device, const Tensor& t) {
  KILN_CHECK(t.device() == device, op, ": expected every tensor on ", device.str(), ", got ", t.meta());
}

bool kernels_runnable(int device) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, fill_kernel<1>);
  cudaGetLastError();
  cudaSetDevice(prev);
  return e == cudaSuccess;
}

void fill_bytes(const Tensor& t, const unsigned char* item, size_t size) {
  KILN_CHECK(t.is_contiguous(), "fill_: non-contiguous device tensors are not supported by this backend yet");
  uint64_t v = 0;
  std::memcpy(&v, item, size);
  const int64_t n = t.numel();
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  check(cudaSetDevice(t.device().index), "cudaSetDevice");
  const cudaStream_t s = stream_of(t.device());
  switch (size) {
    case 1: fill_kernel<1><<<blocks, threads, 0, s>>>(p, n, nullptr, v); break;
    case 2: fill_kernel<2><<<blocks, threads, 0, s>>>(p, n, nullptr, v); break;
    case 4: fill_kernel<4><<<blocks, threads, 0, s>>>(p, n, nullptr, v); break;
    default: fill_kernel<8><<<blocks, threads, 0, s>>>(p, n, nullptr, v); break;
  }
  check(cudaGetLastError(), "fill_ kernel launch");
}

}  // namespace kiln::cuda
