#include <omp.h>

#include <iostream>

#include "commands.h"
#include "kiln/device.h"
#include "kiln/version.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln::cli {

int run_info(bool memory) {
  std::cout << "kiln " << kVersion << "\n";
  std::cout << "  build:        " << kBuildType << ", C++20, " << kCompiler << "\n";
  std::cout << "  cpu:          " << omp_get_max_threads() << " OpenMP threads, BLAS: OpenBLAS\n";
#if KILN_HAVE_CUDA
  std::cout << "  cuda backend: compiled in (architectures " << kCudaArchitectures << ")\n";
  const int n = cuda_device_count();
  if (n == 0) std::cout << "  cuda devices: none (" << cuda::unavailable_reason() << ")\n";
  for (int i = 0; i < n; ++i) std::cout << "  cuda:" << i << "\n";
#else
  std::cout << "  cuda backend: not compiled in (configure with KILN_CUDA=ON and a CUDA toolkit)\n";
#endif
  (void)memory;
  return 0;
}

}  // namespace kiln::cli
