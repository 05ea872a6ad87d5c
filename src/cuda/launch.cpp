// Host-side launch helpers declared in cuda/launch.h that need no device code.
#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "cuda/launch.h"

namespace kiln::cuda {

void set_max_dynamic_smem(const void* kernel, size_t bytes, int device, const char* op) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device})) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op);
  done.insert({kernel, device});
}

bool wgmma_available(int device) {
#if defined(KILN_HAVE_SM90A)
  static std::mutex mu;
  static std::set<std::pair<int, bool>> known;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, ok] : known)
    if (d == device) return ok;
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  const bool ok = major == 9 && minor == 0;
  known.insert({device, ok});
  return ok;
#else
  (void)device;
  return false;
#endif
}

}  // namespace kiln::cuda
