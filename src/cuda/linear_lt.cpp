// linear through cuBLASLt: one cublasLtMatmul computes x @ weight^T and adds the bias in its epilogue
// (host code only). Handles and workspace follow src/cuda/matmul.cpp: one handle per (thread, device),
// given back to a pool when the thread ends; the workspace is matmul's (kiln's allocator, graph-safe).
//
// cuBLASLt is column-major. Row-major y [M, N] is column-major y^T [N, M] (ld N), so
//   y^T = W x^T:   A = weight, stored column-major [K, N] with ld = weight's row stride, op T -> [N, K];
//                  B = x, stored column-major [K, M] with ld = x's row stride, op N;
//                  D = y^T [N, M], ld N; the bias vector runs along D's rows (N), as the epilogue wants.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cuda/launch.h"
#include "cuda/lt.h"
#include "cuda/linear.h"
#include "cuda/matmul.h"
#include "kiln/cuda_options.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(str("linear: ", what, " failed: cuBLAS status ", static_cast<int>(s)));
}

constexpr int kMaxDevices = 64;

struct LtPool {
  std::mutex mu;
  std::vector<cublasLtHandle_t> free[kMaxDevices];
};
LtPool& lt_pool() {
  static LtPool* pool = new LtPool;  // never destroyed: thread_local destructors may run after statics
  return *pool;
}

struct ThreadLtHandles {
  cublasLtHandle_t handle[kMaxDevices] = {};
  ~ThreadLtHandles() {
    LtPool& pool = lt_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (handle[d]) pool.free[d].push_back(handle[d]);
  }
};
thread_local ThreadLtHandles t_lt;

cublasLtHandle_t lt_handle_for(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "linear: device index ", device, " out of range");
  cublasLtHandle_t& h = t_lt.handle[device];
  if (h) return h;
  {
    LtPool& pool = lt_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.free[device].empty()) {
      h = pool.free[device].back();
      pool.free[device].pop_back();
    }
  }
  if (!h) {
    cublasLtHandle_t created = nullptr;
    check_lt(cublasLtCreate(&created), "cublasLtCreate");
    h = created;
  }
  return h;
}

// The largest power of two (<= 256) dividing every one of the byte quantities: what cuBLASLt may assume.
uint32_t alignment_of(std::initializer_list<uintptr_t> v) {
  uint32_t a = 256;
  for (uintptr_t x : v)
    while (a > 1 && x % a != 0) a /= 2;
  return a;
}

// Everything cuBLASLt's algorithm choice depends on for one call (the workspace size is fixed per device).
struct AlgoKey {
  int device;
  int64_t m, n, k, ldw, ldx;
  int dtype, compute;
  bool bias;
  uint32_t align_a, align_b, align_d, align_bias;
  bool operator==(const AlgoKey&) const = default;
};
struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {key.m, key.n, key.k, key.ldw, key.ldx}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.device) << 40 | static_cast<uint64_t>(key.dtype) << 20 |
        static_cast<uint64_t>(key.compute) << 1 | (key.bias ? 1 : 0));
    mix(static_cast<uint64_t>(key.align_a) << 48 | static_cast<uint64_t>(key.align_b) << 32 |
        static_cast<uint64_t>(key.align_d) << 16 | key.align_bias);
    return h;
  }
};
thread_local std::unordered_map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>, AlgoKeyHash> t_algos;

}  // namespace

void* lt_handle(int device) { return lt_handle_for(device); }

bool linear_cublaslt(const Tensor& y, const Tensor& x2, const Tensor& weight, const Tensor* bias) {
  const DType t = x2.dtype();
  const int64_t m = x2.size(0), k = x2.size(1), n = weight.size(0);
  cudaDataType_t dtype;
  switch (t) {
    case DType::F32: dtype = CUDA_R_32F; break;
    case DType::F16: dtype = CUDA_R_16F; break;
    case DType::BF16: dtype = CUDA_R_16BF; break;
    default: return false;
  }
  if (m == 0 || n == 0) return true;
  if (k == 0) return false;  // no product to run: the fallback writes bias or zeros
  // Column-major operands need unit inner stride and a leading dimension covering K.
  const int64_t ldw = n > 1 ? weight.stride(0) : k;
  if (weight.stride(1) != 1 || ldw < k) return false;
  Tensor xr = x2;
  int64_t ldx = m > 1 ? x2.stride(0) : k;
  if (x2.stride(1) != 1 || ldx < k) {
    xr = x2.contiguous();
    ldx = k;
  }
  Tensor bias_c;
  if (bias) {
    bias_c = *bias;
    // The epilogue reads the bias with vector loads where its alignment allows; give it a fresh buffer
    // when it is a strided or misaligned view (N elements: cheap).
    if (bias_c.stride(0) != 1 || reinterpret_cast<uintptr_t>(bias_c.data_ptr()) % 16 != 0) bias_c = bias_c.clone();
  }
  const Device dev = y.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  cublasLtHandle_t h = lt_handle_for(dev.index);
  const Tensor ws = blas_workspace(dev, stream);
  const uint64_t ws_bytes = static_cast<uint64_t>(ws.numel());

  // f32 accumulation; TF32 tensor cores for f32 inputs only when kiln allows them (as matmul does).
  const cublasComputeType_t compute =
      t == DType::F32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtDescs ds;
  check_lt(cublasLtMatmulDescCreate(&ds.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const void* bp = bias_c.data_ptr();
    check_lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
             "set EPILOGUE");
    check_lt(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)),
             "set BIAS_POINTER");
    // The bias dtype is left at its default, D's dtype, which the op layer requires of bias.
  }
  check_lt(cublasLtMatrixLayoutCreate(&ds.a, dtype, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldw),
           "cublasLtMatrixLayoutCreate(weight)");
  check_lt(cublasLtMatrixLayoutCreate(&ds.b, dtype, static_cast<uint64_t>(k), static_cast<uint64_t>(m), ldx),
           "cublasLtMatrixLayoutCreate(x)");
  check_lt(cublasLtMatrixLayoutCreate(&ds.d, dtype, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
           "cublasLtMatrixLayoutCreate(y)");

  check_lt(cublasLtMatmulPreferenceCreate(&ds.pref), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)),
           "set MAX_WORKSPACE_BYTES");
  // Split-K partial sums in f32 only, never in a half output type (matmul's
  // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION).
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof(schemes)),
           "set REDUCTION_SCHEME_MASK");
  const uintptr_t isz = itemsize(t);
  const uint32_t align_a = alignment_of({reinterpret_cast<uintptr_t>(weight.data_ptr()), ldw * isz});
  const uint32_t align_b = alignment_of({reinterpret_cast<uintptr_t>(xr.data_ptr()), ldx * isz});
  const uint32_t align_d = alignment_of({reinterpret_cast<uintptr_t>(y.data_ptr()), n * isz});
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                sizeof(align_a)),
           "set MIN_ALIGNMENT_A_BYTES");
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                sizeof(align_b)),
           "set MIN_ALIGNMENT_B_BYTES");
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                sizeof(align_d)),
           "set MIN_ALIGNMENT_C_BYTES");
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                sizeof(align_d)),
           "set MIN_ALIGNMENT_D_BYTES");

  // The heuristic query costs host time; its answer depends only on what the key holds, so it is asked once
  // per key and thread (a rejected key is remembered too).
  const uint32_t align_bias = bias ? alignment_of({reinterpret_cast<uintptr_t>(bias_c.data_ptr())}) : 0;
  const AlgoKey key{dev.index, m, n, k, ldw, ldx, static_cast<int>(t), static_cast<int>(compute), bias != nullptr,
                    align_a, align_b, align_d, align_bias};
  auto it = t_algos.find(key);
  if (it == t_algos.end()) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &found);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    if (t_algos.size() >= 4096) t_algos.clear();  // a bound, for processes that see endless shapes
    it = t_algos.emplace(key, algo).first;
  }
  if (!it->second) return false;  // e.g. an alignment no kernel takes

  const float alpha = 1.f, beta = 0.f;  // beta 0: y (uninitialised) is not read
  check_lt(cublasLtMatmul(h, ds.op, &alpha, weight.data_ptr(), ds.a, xr.data_ptr(), ds.b, &beta, y.data_ptr(),
                          ds.d, y.data_ptr(), ds.d, &*it->second, ws.data_ptr(), ws_bytes, stream),
           "cublasLtMatmul");
  return true;
}

}  // namespace kiln::cuda
