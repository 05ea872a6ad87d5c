// CUDA matrix products through cuBLAS (host code only). Operands cuBLAS cannot read in place are made
// contiguous with the backend's device copies.
//
// cuBLAS is column-major. A row-major [r, c] matrix with row stride ld is the column-major [c, r] matrix
// with leading dimension ld, i.e. its transpose; so the row-major C = A B is computed as the column-major
// C^T = B^T A^T: cuBLAS's "A" is our b, its "B" is our a, and its m, n are our m, n swapped. An operand
// stored transposed (unit stride along rows) is passed with CUBLAS_OP_T instead of being copied.
#include "core/copy.h"
#include "cuda/matmul.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cuda/launch.h"
#include "kiln/cuda_options.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(str("matmul: ", what, " failed: ", cublas_status_name(s), " (", static_cast<int>(s), ")"));
}

// ---- handles: one per (device, thread), created lazily ---------------------------------------------------
//
// A thread that ends gives its handles back to a process-wide pool instead of destroying them: destroying a
// handle synchronises the device and may run while the CUDA runtime is shutting down. The pool (and so the
// handles) lives until the process ends, as PyTorch's does.
constexpr int kMaxDevices = 64;

struct HandlePool {
  std::mutex mu;
  std::vector<cublasHandle_t> free[kMaxDevices];
};
HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool;  // never destroyed: thread_local destructors may run after statics
  return *pool;
}

struct ThreadHandles {
  cublasHandle_t handle[kMaxDevices] = {};
  // Workspaces of this thread's handles, per stream (see workspace_for).
  std::unordered_map<cudaStream_t, Tensor> workspace[kMaxDevices];
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (handle[d]) pool.free[d].push_back(handle[d]);
  }
};
thread_local ThreadHandles t_handles;

// The calling thread's handle for the current device (the caller holds a DeviceGuard for `device`).
cublasHandle_t handle_for(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "matmul: device index ", device, " out of range");
  cublasHandle_t& h = t_handles.handle[device];
  if (h) return h;
  {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.free[device].empty()) {
      h = pool.free[device].back();
      pool.free[device].pop_back();
    }
  }
  if (!h) {
    cublasHandle_t created = nullptr;
    check_cublas(cublasCreate(&created),
                 "cublasCreate (the first product on a thread must not be inside a graph capture)");
    h = created;
  }
  check_cublas(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  return h;
}

// cuBLAS's workspace: the size NVIDIA recommends for Hopper and newer (PyTorch uses the same), 4 MiB before.
size_t workspace_bytes(int device) {
  static std::once_flag once[kMaxDevices];
  static size_t bytes[kMaxDevices];
  std::call_once(once[device], [device] {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    bytes[device] = major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
  });
  return bytes[device];
}

// Workspace memory comes from kiln's caching allocator, so cuBLAS never calls cudaMalloc itself (which a
// graph capture forbids). Outside a capture each (thread, device, stream) keeps one workspace; during a
// capture a fresh one is taken for the call from the capture's private pool, which the graph keeps alive,
// so a replay never shares scratch memory with eager work on another stream. It is freed (stream-ordered)
// when the caller drops the returned tensor.
Tensor workspace_for(Device device, cudaStream_t stream) {
  const size_t bytes = workspace_bytes(device.index);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone) return empty({static_cast<int64_t>(bytes)}, DType::U8, device);
  Tensor& ws = t_handles.workspace[device.index][stream];
  if (!ws.defined()) ws = empty({static_cast<int64_t>(bytes)}, DType::U8, device);
  return ws;
}

// ---- layouts --------------------------------------------------------------------------------------------

// How cuBLAS can read a row-major rows x cols matrix with these element strides without a copy (the same
// rule as the CPU's BLAS path): unit stride along a row (CUBLAS_OP_N in the transposed formulation) or
// along a column (CUBLAS_OP_T), with a leading dimension that covers the other extent.
struct MatView {
  cublasOperation_t op;
  int64_t ld;
};
std::optional<MatView> mat_view(int64_t srow, int64_t scol, int64_t rows, int64_t cols) {
  const int64_t c1 = std::max<int64_t>(cols, 1), r1 = std::max<int64_t>(rows, 1);
  if ((cols == 1 || scol == 1) && (rows == 1 || srow >= c1)) return MatView{CUBLAS_OP_N, rows == 1 ? c1 : srow};
  if ((rows == 1 || srow == 1) && (cols == 1 || scol >= r1)) return MatView{CUBLAS_OP_T, cols == 1 ? r1 : scol};
  return std::nullopt;
}

// The one element stride s with element i of the flattened dims [begin, end) at i * s, if there is one
// (size-1 dims are ignored; all-broadcast dims give 0; no dims, or all size 1, give 0 too).
std::optional<int64_t> collapsed_stride(const Tensor& t, int64_t begin, int64_t end) {
  std::optional<int64_t> stride;
  int64_t inner = 1;  // product of the sizes of the non-1 dims inside the current one
  for (int64_t d = end - 1; d >= begin; --d) {
    const int64_t size = t.size(d);
    if (size == 1) continue;
    if (!stride) stride = t.stride(d);
    else if (t.stride(d) != *stride * inner) return std::nullopt;
    inner *= size;
  }
  return stride.value_or(0);
}

// An operand as cuBLAS reads it: base pointer, per-matrix view and batch stride.
struct Operand {
  Tensor keep;  // the tensor the pointer belongs to (a contiguous copy when the original could not be read)
  MatView view;
  int64_t batch_stride;
};

Operand operand(const Tensor& t, int64_t rows, int64_t cols) {
  const int64_t nd = t.dim();
  auto view = mat_view(t.stride(nd - 2), t.stride(nd - 1), rows, cols);
  auto bs = collapsed_stride(t, 0, nd - 2);
  if (view && bs) return Operand{t, *view, *bs};
  Tensor c = t.contiguous();
  return Operand{c, *mat_view(c.stride(nd - 2), c.stride(nd - 1), rows, cols), *collapsed_stride(c, 0, nd - 2)};
}

bool is_zero(const Scalar& s) { return s.to_double() == 0.0 && s.to_complex().im == 0.f; }

// Alpha and beta as cuBLAS reads them for the compute type (host pointer mode).
union ScalarArg {
  float f;
  double d;
  cuComplex c;
};
ScalarArg scalar_arg(DType t, const Scalar& s) {
  ScalarArg r{};
  if (t == DType::F64) r.d = s.to_double();
  else if (t == DType::C64) r.c = make_cuComplex(s.to_complex().re, s.to_complex().im);
  else r.f = static_cast<float>(s.to_double());
  return r;
}

}  // namespace

Tensor blas_workspace(Device device, cudaStream_t stream) { return workspace_for(device, stream); }

cublasHandle_t blas_handle(Device device, Tensor& ws) {
  const cudaStream_t stream = stream_of(device);
  cublasHandle_t h = handle_for(device.index);
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  ws = workspace_for(device, stream);
  check_cublas(cublasSetWorkspace(h, ws.data_ptr(), static_cast<size_t>(ws.numel())), "cublasSetWorkspace");
  return h;
}

Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& input, const Scalar& beta, const Scalar& alpha) {
  const Device dev = a.device();
  check_same_device("matmul", dev, b);
  if (input.defined()) check_same_device("matmul", dev, input);
  const DType t = a.dtype();
  KILN_CHECK(t == b.dtype() && (!input.defined() || input.dtype() == t), "matmul: dtypes differ: ", a.meta(),
             ", ", b.meta(), input.defined() ? str(", ", input.meta()) : std::string());
  KILN_CHECK(t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64 || t == DType::C64,
             "matmul: dtype ", dtype_name(t), " is not supported on CUDA (supported: f16, bf16, f32, f64, c64)");
  const int64_t nd = a.dim();
  KILN_CHECK(nd >= 2 && b.dim() == nd, "matmul: internal: operands ", a.meta(), " and ", b.meta());
  const int64_t n = a.size(-2), k = a.size(-1), m = b.size(-1);
  Shape out_shape(a.sizes().begin(), a.sizes().end() - 2);
  const int64_t batch = checked_numel(out_shape);
  out_shape.push_back(n);
  out_shape.push_back(m);
  DeviceGuard guard(dev);
  Tensor c = empty(out_shape, t, dev);
  if (c.numel() == 0) return c;
  const bool use_input = input.defined() && !is_zero(beta);
  if (k == 0) {
    // No products: beta * input, or zeros. cuBLAS is not asked to handle k = 0.
    if (use_input) {
      ::kiln::copy_tensor(c, input);
      mul_(c, beta);
    } else {
      c.zero_();
    }
    return c;
  }
  // cuBLAS accumulates onto C with its beta; with beta = 0 it does not read C (uninitialised here).
  if (use_input) ::kiln::copy_tensor(c, input);

  // [..., n, k] x [k, m] broadcast over b: one product of (batch * n) rows when a's rows fold into one stride.
  int64_t rows = n, count = batch;
  Operand A, B;
  auto b_bs = collapsed_stride(b, 0, nd - 2);
  auto a_rows = collapsed_stride(a, 0, nd - 1);
  auto fold_view = a_rows ? mat_view(*a_rows, a.stride(-1), batch * n, k) : std::nullopt;
  if (batch > 1 && b_bs && *b_bs == 0 && fold_view && fold_view->op == CUBLAS_OP_N &&
      mat_view(b.stride(-2), b.stride(-1), k, m)) {
    rows = batch * n;
    count = 1;
    A = Operand{a, *fold_view, 0};
    B = Operand{b, *mat_view(b.stride(-2), b.stride(-1), k, m), 0};
  } else {
    A = operand(a, n, k);
    B = operand(b, k, m);
  }

  const int64_t ldc = std::max<int64_t>(m, 1);
  cudaDataType_t dtype;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  switch (t) {
    case DType::F16: dtype = CUDA_R_16F; break;
    case DType::BF16: dtype = CUDA_R_16BF; break;
    case DType::F64: dtype = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; break;
    case DType::C64: dtype = CUDA_C_32F; break;
    default:
      dtype = CUDA_R_32F;
      if (allow_tf32()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const ScalarArg alpha_arg = scalar_arg(t, alpha), beta_arg = scalar_arg(t, use_input ? beta : Scalar(0));

  const cudaStream_t stream = stream_of(dev);
  cublasHandle_t h = handle_for(dev.index);
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
  const Tensor ws = workspace_for(dev, stream);
  check_cublas(cublasSetWorkspace(h, ws.data_ptr(), static_cast<size_t>(ws.numel())), "cublasSetWorkspace");
  // Full-precision f32 unless TF32 is allowed; split-K partial sums of half outputs reduced in f32 too.
  const int math = (allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  check_cublas(cublasSetMathMode(h, static_cast<cublasMath_t>(math)), "cublasSetMathMode");

  const void* pa = A.keep.data_ptr();
  const void* pb = B.keep.data_ptr();
  void* pc = c.data_ptr();
  // The _64 entry points take 64-bit sizes and leading dimensions, so no dimension needs to fit in int.
  if (count == 1) {
    check_cublas(cublasGemmEx_64(h, B.view.op, A.view.op, m, rows, k, &alpha_arg, pb, dtype, B.view.ld, pa, dtype,
                                 A.view.ld, &beta_arg, pc, dtype, ldc, compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx_64");
  } else {
    check_cublas(cublasGemmStridedBatchedEx_64(h, B.view.op, A.view.op, m, rows, k, &alpha_arg, pb, dtype,
                                               B.view.ld, B.batch_stride, pa, dtype, A.view.ld, A.batch_stride,
                                               &beta_arg, pc, dtype, ldc, n * m, count, compute,
                                               CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx_64");
  }
  return c;
}

}  // namespace kiln::cuda
