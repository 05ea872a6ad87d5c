#include <omp.h>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "kiln/device.h"
#include "kiln/runtime.h"
#include "cpu/matmul.h"
#if KILN_HAVE_DNNL
#include "cpu/conv.h"
#endif
#include "kiln/version.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif
#if KILN_HAVE_CUDNN
#include "cuda/conv.h"
#endif

namespace kiln::cli {

namespace {
std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}
std::string version_str(int v) {
  return v ? std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10) : "unknown";
}
}  // namespace

int run_info(bool memory) {
  std::cout << "kiln " << kVersion << "\n";
  std::cout << "  build:        " << kBuildType << ", C++20, " << kCompiler << "\n";
  std::cout << "  cpu:          " << omp_get_max_threads() << " OpenMP threads, BLAS: " << kiln::cpu::blas_description()
            << "\n";
#if KILN_HAVE_DNNL
  std::cout << "  cpu conv:     " << kiln::cpu::dnnl_description() << "\n";
  std::cout << "  cpu bf16 mm:  " << kiln::cpu::dnnl_gemm_half_description() << "\n";
#else
  std::cout << "  cpu conv:     im2col + BLAS (built without oneDNN)\n";
  std::cout << "  cpu bf16 mm:  weights widened to f32 for BLAS above 16 rows (built without oneDNN)\n";
#endif
#if KILN_HAVE_CUDA
  std::cout << "  cuda backend: compiled in (architectures " << kCudaArchitectures << ", runtime "
            << version_str(cuda_runtime_version()) << ", driver " << version_str(cuda_driver_version()) << ")\n";
#if KILN_HAVE_CUDNN
  std::cout << "  cuda conv:    " << cuda::cudnn_description() << "\n";
#else
  std::cout << "  cuda conv:    im2col (built without cuDNN's headers)\n";
#endif
  const int n = cuda_device_count();
  if (n == 0) std::cout << "  cuda devices: none (" << cuda::unavailable_reason() << ")\n";
  for (int i = 0; i < n; ++i) {
    const Device d = cuda_device(i);
    try {
      const DeviceProperties p = device_properties(d);
      std::cout << "  " << d << ":       " << p.name << ", compute capability " << p.major << "." << p.minor << ", "
                << p.multiprocessors << " SMs, " << gib(p.total_memory) << ", L2 " << p.l2_bytes / (1024 * 1024)
                << " MiB" << (p.kernels_compiled ? "" : "  [no kernels compiled for this architecture]") << "\n";
      if (memory) {
        const MemoryStats m = memory_stats(d);
        std::cout << "    memory: tensors " << gib(m.allocated) << " (peak " << gib(m.allocated_peak)
                  << "), allocator reserved " << gib(m.reserved) << " (peak " << gib(m.reserved_peak)
                  << "), driver in use " << gib(m.driver_used) << " (peak " << gib(m.driver_used_peak) << ") of "
                  << gib(m.device_total) << "\n";
      }
    } catch (const Error& e) {
      std::cout << "  " << d << ": unusable: " << e.what() << "\n";
    }
  }
#else
  std::cout << "  cuda backend: not compiled in (configure with KILN_CUDA=ON and a CUDA toolkit)\n";
  (void)memory;
#endif
  return 0;
}

}  // namespace kiln::cli
