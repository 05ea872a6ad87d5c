#include <cuda_runtime.h>

#include "spin.h"

namespace kiln::test {

namespace {
__global__ void spin_kernel(long long cycles, int* dst, int value) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (dst) *dst = value;
}
}  // namespace

void spin_then_write(const Stream& stream, double ms, void* dst, int value) {
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, stream.device().index);
  const long long cycles = static_cast<long long>(ms * (khz > 0 ? khz : 1500000));
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle())>>>(cycles, static_cast<int*>(dst), value);
}

}  // namespace kiln::test
