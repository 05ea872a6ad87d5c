// Host-side helpers every CUDA launcher uses: the device guard, the current stream, launch checks, grid
// sizing. Include from .cu files only.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "cuda/backend.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// Makes `device` current for the calling thread for a scope (restores the previous device).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) {
    cudaGetDevice(&prev_);
    if (prev_ != device.index) check(cudaSetDevice(device.index), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = 0;
    cudaGetDevice(&now);
    if (now != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Throws a kiln::Error naming the op when the last launch failed (bad configuration, no kernel image).
inline void check_launch(const char* op) { check(cudaGetLastError(), op); }

// Number of multiprocessors of a device (cached).
int multiprocessor_count(int device);

// Opts a kernel into `bytes` of dynamic shared memory (above the default 48 KiB), once per (kernel, device);
// failures name the op.
void set_max_dynamic_smem(const void* kernel, size_t bytes, int device, const char* op);

// Whether the Hopper wgmma kernels can run on a device: this build has sm_90a code (KILN_HAVE_SM90A, from
// CMAKE_CUDA_ARCHITECTURES) and the device has compute capability 9.0 (cached).
bool wgmma_available(int device);

// A TMA tensor map over a 16-bit (bf16 or f16) tensor of dims[2] x dims[1] x dims[0] elements (dims[0]
// contiguous; strides[0] and strides[1] the byte strides of dims 1 and 2): boxes of box0 x box1 x 1 land in
// shared memory with the 128-byte swizzle (box0 = 64: one 128-byte row), elements out of range read as zero.
// False when the driver has no cuTensorMapEncodeTiled or rejects the layout (the caller takes another path).
bool encode_tensor_map_3d(CUtensorMap* map, const void* base, bool bf16, const uint64_t dims[3],
                          const uint64_t strides[2], uint32_t box0, uint32_t box1);

// Blocks for a grid-stride loop over n items: enough to fill the device several times over, no more.
inline unsigned grid_for(int64_t n, int threads, int device) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

// Every tensor argument of an op must live on the op's device: checked before any launch.
void check_same_device(const char* op, Device device, const Tensor& t);

// Whether a kernel may read `t` before its pdl_wait(): its storage is marked constant (Storage::set_constant),
// so no kernel that may still be running writes it. An undefined tensor (no bias) counts as constant.
inline bool constant_input(const Tensor& t) { return !t.defined() || t.storage()->constant(); }

// Launches `kernel` with the programmatic-serialization attribute when `dependent` and enabled (a plain launch
// otherwise). The kernel must call pdl_wait() before touching memory an earlier kernel writes or reads; a
// kernel that reads an input before its wait (the weight prefetches of the one-row products) is launched as a
// dependent only when that input is constant_input.
template <class... Params, class... Args>
void launch_dependent_if(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, int device, const char* op, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  if (dependent && dependent_launch_enabled(device)) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    count_dependent_launch();
  }
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op);
}

// launch_dependent_if(true, ...): for kernels that read nothing before their pdl_wait().
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      int device, const char* op, Args&&... args) {
  launch_dependent_if(true, kernel, grid, block, smem, stream, device, op, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
