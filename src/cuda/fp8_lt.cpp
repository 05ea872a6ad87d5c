// scaled_mm through cuBLASLt FP8 (host code only): e4m3/e5m2 operands, f32 accumulation (no fast
// accumulation), out bf16/f16/f32, the scales read on the device (no host read), bias in the epilogue where
// cuBLASLt's type table allows it.
//
// cuBLASLt is column-major and its FP8 kernels want the "TN" layout. Row-major out [M, N] is column-major
// out^T [N, M] (ld N), so
//   out^T = b^T a^T:  A = b, which is column-major [K, N] (b.stride(0) == 1, ld = b.stride(1)), op T -> [N, K];
//                     B = a, row-major [M, K] = column-major [K, M] (ld = a.stride(0)), op N;
//                     A's scale is scale_b, B's scale is scale_a.
// Scale modes (cuBLAS >= 12.9 on sm_90, the header here has them):
//   tensor-wise: SCALAR_32F (one f32 each, device pointers);
//   row-wise:    OUTER_VEC_32F: a vector of N for A (scale_b) and of M for B (scale_a), contiguous;
//   block-wise:  BLK128x128_32F for A: one f32 per 128 x 128 block of b^T [N, K], stored [ceil(N/128)][K/128]
//                (scale_b^T, which is how checkpoints store weight_scale_inv), each row padded to a multiple
//                of 4 K blocks; VEC128_32F for B: one f32 per 1 x 128 block of a, stored outer-dimension-major
//                [K/128][M] (scale_a^T), M a multiple of 4. This is the layout torch._scaled_mm checks for
//                before it hands the scales to cuBLASLt (ScaledBlas.cpp, "outer-dim-major" 1 x 128 scales in
//                its tests). K must be a multiple of 128; other shapes take the other paths.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <unordered_map>

#include "cuda/fp8.h"
#include "cuda/launch.h"
#include "cuda/lt.h"
#include "cuda/linear.h"
#include "cuda/matmul.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(str("scaled_mm: ", what, " failed: cuBLAS status ", static_cast<int>(s)));
}

uint32_t alignment_of(std::initializer_list<uintptr_t> v) {
  uint32_t a = 256;
  for (uintptr_t x : v)
    while (a > 1 && x % a != 0) a /= 2;
  return a;
}

bool lt_type(DType t, cudaDataType_t& out) {
  switch (t) {
    case DType::F8E4M3: out = CUDA_R_8F_E4M3; return true;
    case DType::F8E5M2: out = CUDA_R_8F_E5M2; return true;
    case DType::F32: out = CUDA_R_32F; return true;
    case DType::F16: out = CUDA_R_16F; return true;
    case DType::BF16: out = CUDA_R_16BF; return true;
    default: return false;
  }
}

struct AlgoKey {
  int device;
  int64_t m, n, k, lda, ldb;
  int ta, tb, td, recipe;
  bool bias;
  uint32_t align_a, align_b, align_d;
  bool operator==(const AlgoKey&) const = default;
};
struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.device) << 40 | static_cast<uint64_t>(key.ta) << 30 |
        static_cast<uint64_t>(key.tb) << 20 | static_cast<uint64_t>(key.td) << 10 |
        static_cast<uint64_t>(key.recipe) << 1 | (key.bias ? 1 : 0));
    mix(static_cast<uint64_t>(key.align_a) << 32 | static_cast<uint64_t>(key.align_b) << 16 | key.align_d);
    return h;
  }
};
thread_local std::unordered_map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>, AlgoKeyHash> t_algos;

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what);
}

}  // namespace

bool scaled_mm_cublaslt(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                        const Tensor& scale_b, ScaleRecipe recipe, const Tensor* bias) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  cudaDataType_t ta, tb, td;
  if (!lt_type(a.dtype(), ta) || !lt_type(b.dtype(), tb) || !lt_type(out.dtype(), td)) return false;
  if (a.dtype() == DType::F8E5M2 && b.dtype() == DType::F8E5M2) return false;  // no e5m2 x e5m2 FP8 kernels
  if (M == 0 || N == 0) return true;
  // FP8 tensor-core kernels: K and the leading dimensions multiples of 16 elements (bytes), 16-byte aligned
  // operands; N (cuBLAS's m) a multiple of 16 keeps the output rows aligned for every out dtype.
  const int64_t lda = M > 1 ? a.stride(0) : K, ldb = N > 1 ? b.stride(1) : K;
  if (K == 0 || K % 16 != 0 || N % 16 != 0 || a.stride(1) != 1 || b.stride(0) != 1 || lda < K || ldb < K ||
      lda % 16 != 0 || ldb % 16 != 0)
    return false;
  if (reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 != 0)
    return false;
  if (recipe == ScaleRecipe::BlockWise && (K % 128 != 0 || M % 4 != 0)) return false;

  // Scales in the layouts cuBLASLt reads (copies only where the given strides differ: a few KB).
  Tensor sa, sb;
  switch (recipe) {
    case ScaleRecipe::TensorWise: sa = scale_a, sb = scale_b; break;
    case ScaleRecipe::RowWise: sa = scale_a.reshape({M}).contiguous(), sb = scale_b.reshape({N}).contiguous(); break;
    default: {
      sa = scale_a.t().contiguous();
      // Rows of K/128 block scales padded to a multiple of 4 (16 bytes), as cuBLASLt reads them.
      const int64_t kb = K / 128, kb4 = (kb + 3) / 4 * 4;
      sb = scale_b.t();
      if (kb4 != kb) {
        Tensor padded = zeros({sb.size(0), kb4}, DType::F32, out.device());
        padded.narrow(1, 0, kb).copy_(sb);
        sb = padded;
      } else {
        sb = sb.contiguous();
      }
      break;
    }
  }
  // Vector and block scales are read in 16-byte pieces: a view that starts mid-way gets a fresh buffer.
  if (recipe != ScaleRecipe::TensorWise) {
    if (reinterpret_cast<uintptr_t>(sa.data_ptr()) % 16 != 0) sa = sa.clone();
    if (reinterpret_cast<uintptr_t>(sb.data_ptr()) % 16 != 0) sb = sb.clone();
  }
  // The epilogue adds a bias of D's type (bf16/f16; for f32 outputs cuBLASLt's FP8 table wants a bf16 bias).
  // Any other combination: the product into f32 scratch, then bias in f32 and one rounding, as the CPU.
  const bool epilogue_bias = bias && bias->dtype() == out.dtype() && out.dtype() != DType::F32;
  const bool via_f32 = bias && !epilogue_bias;
  Tensor d = via_f32 && out.dtype() != DType::F32 ? empty({M, N}, DType::F32, out.device()) : out;
  if (via_f32) td = CUDA_R_32F;
  Tensor bias_c;
  if (epilogue_bias) {
    bias_c = *bias;
    if (bias_c.stride(0) != 1 || reinterpret_cast<uintptr_t>(bias_c.data_ptr()) % 16 != 0) bias_c = bias_c.clone();
  }

  const Device dev = out.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  cublasLtHandle_t h = static_cast<cublasLtHandle_t>(lt_handle(dev.index));
  const Tensor ws = blas_workspace(dev, stream);
  const uint64_t ws_bytes = static_cast<uint64_t>(ws.numel());

  LtDescs ds;
  check_lt(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_attr(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "set TRANSA");
  set_attr(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "set TRANSB");
  const void* sa_ptr = sa.data_ptr();
  const void* sb_ptr = sb.data_ptr();
  set_attr(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sb_ptr, "set A_SCALE_POINTER");
  set_attr(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sa_ptr, "set B_SCALE_POINTER");
  if (recipe != ScaleRecipe::TensorWise) {
    const int32_t mode_a = recipe == ScaleRecipe::RowWise ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                          : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t mode_b = recipe == ScaleRecipe::RowWise ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                          : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    set_attr(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a, "set A_SCALE_MODE");
    set_attr(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b, "set B_SCALE_MODE");
  }
  if (epilogue_bias) {
    const void* bp = bias_c.data_ptr();
    set_attr(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, "set EPILOGUE");
    set_attr(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bp, "set BIAS_POINTER");
    set_attr(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, td, "set BIAS_DATA_TYPE");
  }
  check_lt(cublasLtMatrixLayoutCreate(&ds.a, tb, static_cast<uint64_t>(K), static_cast<uint64_t>(N), ldb),
           "cublasLtMatrixLayoutCreate(b)");
  check_lt(cublasLtMatrixLayoutCreate(&ds.b, ta, static_cast<uint64_t>(K), static_cast<uint64_t>(M), lda),
           "cublasLtMatrixLayoutCreate(a)");
  check_lt(cublasLtMatrixLayoutCreate(&ds.d, td, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N),
           "cublasLtMatrixLayoutCreate(out)");

  check_lt(cublasLtMatmulPreferenceCreate(&ds.pref), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)),
           "set MAX_WORKSPACE_BYTES");
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof(schemes)),
           "set REDUCTION_SCHEME_MASK");
  const uint32_t align_a = alignment_of({reinterpret_cast<uintptr_t>(b.data_ptr()), static_cast<uintptr_t>(ldb)});
  const uint32_t align_b = alignment_of({reinterpret_cast<uintptr_t>(a.data_ptr()), static_cast<uintptr_t>(lda)});
  const uint32_t align_d =
      alignment_of({reinterpret_cast<uintptr_t>(d.data_ptr()), static_cast<uintptr_t>(N) * itemsize(d.dtype())});
  for (auto [attr, v] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}})
    check_lt(cublasLtMatmulPreferenceSetAttribute(ds.pref, attr, &v, sizeof(v)), "set MIN_ALIGNMENT");

  const AlgoKey key{dev.index, M, N, K, lda, ldb, static_cast<int>(ta), static_cast<int>(tb), static_cast<int>(td),
                    static_cast<int>(recipe), epilogue_bias, align_a, align_b, align_d};
  auto it = t_algos.find(key);
  if (it == t_algos.end()) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &found);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    if (t_algos.size() >= 4096) t_algos.clear();
    it = t_algos.emplace(key, algo).first;
  }
  if (!it->second) return false;

  const float alpha = 1.f, beta = 0.f;
  check_lt(cublasLtMatmul(h, ds.op, &alpha, b.data_ptr(), ds.a, a.data_ptr(), ds.b, &beta, d.data_ptr(), ds.d,
                          d.data_ptr(), ds.d, &*it->second, ws.data_ptr(), ws_bytes, stream),
           "cublasLtMatmul");
  if (via_f32) Tensor(out).copy_(add(d, bias->to(DType::F32)));
  return true;
}

}  // namespace kiln::cuda
