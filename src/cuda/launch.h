// Host-side helpers every CUDA launcher uses: the device guard, the current stream, launch checks, grid
// sizing. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

// Blocks for a grid-stride loop over n items: enough to fill the device several times over, no more.
inline unsigned grid_for(int64_t n, int threads, int device) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

// Every tensor argument of an op must live on the op's device: checked before any launch.
void check_same_device(const char* op, Device device, const Tensor& t);

}  // namespace kiln::cuda
