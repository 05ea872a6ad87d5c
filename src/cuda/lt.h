// cuBLASLt helpers shared by the bf16/f16/f32 linear (linear_lt.cpp) and the FP8 paths (fp8_lt.cpp). Host
// code; include from CUDA-backend sources only.
#pragma once

#include <cublasLt.h>

namespace kiln::cuda {

// RAII for the descriptors of one cuBLASLt call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace kiln::cuda
