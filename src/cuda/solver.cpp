// CUDA linear algebra (src/cuda/solver.h): cuSOLVER's 64-bit generic API per matrix of a batch, cuBLAS trsm,
// and the small-matrix kernels of solver_small.cu. Host code only.
#include "cuda/solver.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <mutex>
#include <vector>

#include "cuda/backend.h"
#include "cuda/launch.h"
#include "cuda/matmul.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

void check_solver(cusolverStatus_t s, const char* what) {
  if (s != CUSOLVER_STATUS_SUCCESS)
    throw Error(str("linalg: ", what, " failed: cuSOLVER status ", static_cast<int>(s),
                    s == CUSOLVER_STATUS_ALLOC_FAILED ? " (out of memory)" : ""));
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(str("linalg: ", what, " failed: cuBLAS status ", static_cast<int>(s)));
}

// ---- handles: one per (device, thread), given back to a pool when the thread ends (as cuBLAS's) ----------------
constexpr int kMaxDevices = 64;
struct Handle {
  cusolverDnHandle_t h = nullptr;
  cusolverDnParams_t params = nullptr;
};
struct Pool {
  std::mutex mu;
  std::vector<Handle> free[kMaxDevices];
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: thread_local destructors may run after statics
  return *p;
}
struct ThreadHandles {
  Handle handle[kMaxDevices];
  ~ThreadHandles() {
    std::lock_guard<std::mutex> lock(pool().mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (handle[d].h) pool().free[d].push_back(handle[d]);
  }
};
thread_local ThreadHandles t_handles;

// The calling thread's cuSOLVER handle for `device` (current), bound to the current stream.
Handle& solver_for(Device device) {
  KILN_CHECK(device.index >= 0 && device.index < kMaxDevices, "linalg: device index ", device.index, " out of range");
  Handle& h = t_handles.handle[device.index];
  if (!h.h) {
    {
      std::lock_guard<std::mutex> lock(pool().mu);
      if (!pool().free[device.index].empty()) {
        h = pool().free[device.index].back();
        pool().free[device.index].pop_back();
      }
    }
    if (!h.h) {
      Handle created;
      check_solver(cusolverDnCreate(&created.h), "cusolverDnCreate");
      check_solver(cusolverDnCreateParams(&created.params), "cusolverDnCreateParams");
      h = created;
    }
  }
  check_solver(cusolverDnSetStream(h.h, stream_of(device)), "cusolverDnSetStream");
  return h;
}

cudaDataType data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::C64: return CUDA_C_32F;
    default: throw Error(str("linalg: internal error: no cuSOLVER type for ", dtype_name(t)));
  }
}
cudaDataType real_type(DType t) { return t == DType::F64 ? CUDA_R_64F : CUDA_R_32F; }

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }
int64_t item_bytes(const Tensor& t) { return static_cast<int64_t>(itemsize(t.dtype())); }

// cuSOLVER's workspaces: the device one from kiln's allocator (alive until the enqueued calls are done: the
// allocator's frees are stream-ordered), the host one in a vector.
struct Workspace {
  Tensor device;
  std::vector<unsigned char> host;
  Workspace(Device dev, size_t device_bytes, size_t host_bytes)
      : device(empty({static_cast<int64_t>(std::max<size_t>(device_bytes, 1))}, DType::U8, dev)),
        host(std::max<size_t>(host_bytes, 1)) {}
  void* d() const { return device.data_ptr(); }
  size_t d_bytes() const { return static_cast<size_t>(device.numel()); }
  void* h() { return host.data(); }
  size_t h_bytes() const { return host.size(); }
};

int32_t* info_at(Tensor& info, int64_t i) { return info.data<int32_t>() + i; }

// cuBLAS's batched routines take an array of matrix pointers on the device: buf's matrices, `stride` elements apart.
Tensor pointer_array(const Tensor& buf, int64_t batch, int64_t stride) {
  Tensor host = empty({batch}, DType::I64);
  int64_t* p = host.data<int64_t>();
  const int64_t base = reinterpret_cast<int64_t>(buf.data_ptr()), bytes = stride * item_bytes(buf);
  for (int64_t i = 0; i < batch; ++i) p[i] = base + i * bytes;
  return host.to(buf.device());
}

// cuBLAS's batched LU family by dtype: f(getrf, getrs, getri, element type).
template <class F>
void visit_batched(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(cublasSgetrfBatched, cublasSgetrsBatched, cublasSgetriBatched, float{});
    case DType::F64: return f(cublasDgetrfBatched, cublasDgetrsBatched, cublasDgetriBatched, double{});
    case DType::C64: return f(cublasCgetrfBatched, cublasCgetrsBatched, cublasCgetriBatched, cuComplex{});
    default: throw Error(str(op, ": internal error: unexpected dtype ", dtype_name(t)));
  }
}

// Batches of mid-sized square matrices go to cuBLAS's batched LU (one call for the batch); single matrices and
// large ones to cuSOLVER, whose blocked per-matrix routines then fill the GPU.
bool batched_lu(int64_t batch, int64_t n) { return batch > 1 && n > kSmallN && n <= 512; }
// cuBLAS's batched LU picks complex pivots by |z|, not LAPACK's |re| + |im|: complex LU above kSmallComplexLuN
// goes to cuSOLVER, whose pivots are LAPACK's.
bool batched_getrf(DType t, int64_t batch, int64_t n) { return t != DType::C64 && batched_lu(batch, n); }

int checked_int(int64_t v, const char* what) {
  KILN_CHECK(v <= INT32_MAX, "linalg: ", what, " ", v, " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

}  // namespace

void solver_getrf(Tensor& a, Tensor& piv, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1), m = a.size(2), k = std::min(m, n);
  if (batch == 0) return;
  if (m == 0 || n == 0) {
    info.fill_(0);
    return;
  }
  // kiln's kernels for single matrices too: cuSOLVER's blocked LU launches several kernels per column block
  // (a single complex 64 x 64 LU took 0.14 ms there).
  if (m == n && lu_small_fits(a.dtype(), n)) return lu_small(a, piv, info);
  DeviceGuard guard(a.device());
  if (m == n && batched_getrf(a.dtype(), batch, n)) {
    Tensor ws;
    cublasHandle_t bh = blas_handle(a.device(), ws);
    const Tensor ptrs = pointer_array(a, batch, n * n);
    const int ni = static_cast<int>(n), bi = checked_int(batch, "batch");
    visit_batched(a.dtype(), "linalg.lu_factor", [&](auto getrf, auto, auto, auto tag) {
      using T = decltype(tag);
      check_blas(getrf(bh, ni, static_cast<T* const*>(ptrs.data_ptr()), ni, piv.data<int32_t>(), info.data<int32_t>(), bi),
                 "cublas?getrfBatched");
    });
    return;
  }
  Handle& h = solver_for(a.device());
  const cudaDataType t = data_type(a.dtype());
  size_t dbytes = 0, hbytes = 0;
  check_solver(cusolverDnXgetrf_bufferSize(h.h, h.params, m, n, t, a.data_ptr(), m, t, &dbytes, &hbytes),
               "cusolverDnXgetrf_bufferSize");
  Workspace ws(a.device(), dbytes, hbytes);
  Tensor piv64 = empty({batch, k}, DType::I64, a.device());
  const int64_t stride = m * n * item_bytes(a);
  for (int64_t i = 0; i < batch; ++i)
    check_solver(cusolverDnXgetrf(h.h, h.params, m, n, t, bytes_of(a) + i * stride, m, piv64.data<int64_t>() + i * k, t,
                                  ws.d(), ws.d_bytes(), ws.h(), ws.h_bytes(), info_at(info, i)),
                 "cusolverDnXgetrf");
  piv.copy_(piv64);
}

void solver_getrs(const Tensor& lu, const Tensor& piv, Tensor& b, char trans) {
  const int64_t batch = b.size(0), n = lu.size(1), nrhs = b.size(1);
  if (batch == 0 || n == 0 || nrhs == 0) return;
  if (n <= kSmallN) return lu_solve_small(lu, piv, b, trans);
  DeviceGuard guard(lu.device());
  if (batched_lu(batch, n)) {
    Tensor ws;
    cublasHandle_t bh = blas_handle(lu.device(), ws);
    const Tensor pa = pointer_array(lu, batch, n * n), pb = pointer_array(b, batch, n * nrhs);
    const cublasOperation_t op = trans == 'N' ? CUBLAS_OP_N : trans == 'T' ? CUBLAS_OP_T : CUBLAS_OP_C;
    const int ni = static_cast<int>(n), ki = checked_int(nrhs, "right-hand sides"), bi = checked_int(batch, "batch");
    int host_info = 0;
    visit_batched(lu.dtype(), "linalg.lu_solve", [&](auto, auto getrs, auto, auto tag) {
      using T = decltype(tag);
      check_blas(getrs(bh, op, ni, ki, static_cast<const T* const*>(pa.data_ptr()), ni, piv.data<int32_t>(),
                       static_cast<T* const*>(pb.data_ptr()), ni, &host_info, bi),
                 "cublas?getrsBatched");
    });
    KILN_CHECK(host_info == 0, "linalg.lu_solve: internal error: cublas?getrsBatched rejected argument ", -host_info);
    return;
  }
  Handle& h = solver_for(lu.device());
  const cudaDataType t = data_type(lu.dtype());
  const cublasOperation_t op = trans == 'N' ? CUBLAS_OP_N : trans == 'T' ? CUBLAS_OP_T : CUBLAS_OP_C;
  const Tensor piv64 = piv.to(DType::I64);
  Tensor status = empty({1}, DType::I32, lu.device());
  const int64_t lu_stride = n * n * item_bytes(lu), b_stride = n * nrhs * item_bytes(b);
  for (int64_t i = 0; i < batch; ++i)
    check_solver(cusolverDnXgetrs(h.h, h.params, op, n, nrhs, t, bytes_of(lu) + i * lu_stride, n,
                                  piv64.data<int64_t>() + i * n, t, bytes_of(b) + i * b_stride, n, status.data<int32_t>()),
                 "cusolverDnXgetrs");
}

void solver_getri(Tensor& lu, const Tensor& piv, Tensor& info) {
  const int64_t batch = lu.size(0), n = lu.size(1);
  if (batch == 0 || n == 0) return;
  if (n <= kSmallN) return inverse_small(lu, piv);
  if (batched_lu(batch, n)) {
    DeviceGuard guard(lu.device());
    Tensor ws;
    cublasHandle_t bh = blas_handle(lu.device(), ws);
    Tensor out = empty_like(lu), status = empty({batch}, DType::I32, lu.device());
    const Tensor pa = pointer_array(lu, batch, n * n), pc = pointer_array(out, batch, n * n);
    const int ni = static_cast<int>(n), bi = checked_int(batch, "batch");
    visit_batched(lu.dtype(), "linalg.inv", [&](auto, auto, auto getri, auto tag) {
      using T = decltype(tag);
      check_blas(getri(bh, ni, static_cast<const T* const*>(pa.data_ptr()), ni, piv.data<int32_t>(),
                       static_cast<T* const*>(pc.data_ptr()), ni, status.data<int32_t>(), bi),
                 "cublas?getriBatched");
    });
    lu.copy_(out);
    return;
  }
  // A^-1 = solve(A, I): getrs against the identity (cuSOLVER has no getri).
  Tensor x = eye(n, std::nullopt, lu.dtype(), lu.device()).expand({batch, n, n}).contiguous();
  solver_getrs(lu, piv, x, 'N');
  lu.copy_(x);
}

void solver_potrf(Tensor& a, bool upper, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1);
  if (batch == 0) return;
  if (n == 0) {
    info.fill_(0);
    return;
  }
  DeviceGuard guard(a.device());
  Handle& h = solver_for(a.device());
  const cudaDataType t = data_type(a.dtype());
  const cublasFillMode_t uplo = upper ? CUBLAS_FILL_MODE_UPPER : CUBLAS_FILL_MODE_LOWER;
  size_t dbytes = 0, hbytes = 0;
  check_solver(cusolverDnXpotrf_bufferSize(h.h, h.params, uplo, n, t, a.data_ptr(), n, t, &dbytes, &hbytes),
               "cusolverDnXpotrf_bufferSize");
  Workspace ws(a.device(), dbytes, hbytes);
  const int64_t stride = n * n * item_bytes(a);
  for (int64_t i = 0; i < batch; ++i)
    check_solver(cusolverDnXpotrf(h.h, h.params, uplo, n, t, bytes_of(a) + i * stride, n, t, ws.d(), ws.d_bytes(), ws.h(),
                                  ws.h_bytes(), info_at(info, i)),
                 "cusolverDnXpotrf");
}

void solver_geqrf(Tensor& a, Tensor& tau) {
  const int64_t batch = a.size(0), n = a.size(1), m = a.size(2), k = std::min(m, n);
  if (batch == 0 || k == 0) return;
  DeviceGuard guard(a.device());
  Handle& h = solver_for(a.device());
  const cudaDataType t = data_type(a.dtype());
  size_t dbytes = 0, hbytes = 0;
  check_solver(cusolverDnXgeqrf_bufferSize(h.h, h.params, m, n, t, a.data_ptr(), m, t, tau.data_ptr(), t, &dbytes,
                                           &hbytes),
               "cusolverDnXgeqrf_bufferSize");
  Workspace ws(a.device(), dbytes, hbytes);
  Tensor status = empty({1}, DType::I32, a.device());
  const int64_t stride = m * n * item_bytes(a), tau_stride = k * item_bytes(tau);
  for (int64_t i = 0; i < batch; ++i)
    check_solver(cusolverDnXgeqrf(h.h, h.params, m, n, t, bytes_of(a) + i * stride, m, t, bytes_of(tau) + i * tau_stride,
                                  t, ws.d(), ws.d_bytes(), ws.h(), ws.h_bytes(), status.data<int32_t>()),
                 "cusolverDnXgeqrf");
}

void solver_orgqr(Tensor& q, const Tensor& tau, int64_t k) {
  const int64_t batch = q.size(0), cols = q.size(1), m = q.size(2);
  if (batch == 0 || cols == 0 || m == 0) return;
  KILN_CHECK(m <= INT32_MAX && cols <= INT32_MAX, "linalg.qr: matrices of more than 2^31 rows or columns are not "
             "supported on CUDA (cuSOLVER's orgqr takes 32-bit sizes), got ", m, " x ", cols);
  DeviceGuard guard(q.device());
  Handle& h = solver_for(q.device());
  const int mi = static_cast<int>(m), ni = static_cast<int>(cols), ki = static_cast<int>(k);
  Tensor status = empty({1}, DType::I32, q.device());
  const int64_t stride = m * cols, tau_stride = tau.size(1);
  int lwork = 0;
  auto run = [&](auto bufsize, auto call, auto* qp, auto* tp) {
    using T = std::remove_pointer_t<decltype(qp)>;
    check_solver(bufsize(h.h, mi, ni, ki, qp, mi, tp, &lwork), "cusolverDn?orgqr_bufferSize");
    Tensor work = empty({std::max(lwork, 1) * static_cast<int64_t>(sizeof(T))}, DType::U8, q.device());
    for (int64_t i = 0; i < batch; ++i)
      check_solver(call(h.h, mi, ni, ki, qp + i * stride, mi, tp + i * tau_stride, static_cast<T*>(work.data_ptr()),
                        lwork, status.data<int32_t>()),
                   "cusolverDn?orgqr");
  };
  switch (q.dtype()) {
    case DType::F32:
      return run(cusolverDnSorgqr_bufferSize, cusolverDnSorgqr, q.data<float>(), tau.data<float>());
    case DType::F64:
      return run(cusolverDnDorgqr_bufferSize, cusolverDnDorgqr, q.data<double>(), tau.data<double>());
    case DType::C64:
      return run(cusolverDnCungqr_bufferSize, cusolverDnCungqr, static_cast<cuComplex*>(q.data_ptr()),
                 static_cast<const cuComplex*>(tau.data_ptr()));
    default: throw Error(str("linalg.qr: internal error: unexpected dtype ", q.meta()));
  }
}

namespace {

// cuSOLVER's Jacobi SVD by dtype: f(gesvdj, gesvdj_bufferSize, gesvdjBatched, gesvdjBatched_bufferSize, T, R).
template <class F>
void visit_gesvdj(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(cusolverDnSgesvdj, cusolverDnSgesvdj_bufferSize, cusolverDnSgesvdjBatched,
               cusolverDnSgesvdjBatched_bufferSize, float{}, float{});
    case DType::F64:
      return f(cusolverDnDgesvdj, cusolverDnDgesvdj_bufferSize, cusolverDnDgesvdjBatched,
               cusolverDnDgesvdjBatched_bufferSize, double{}, double{});
    case DType::C64:
      return f(cusolverDnCgesvdj, cusolverDnCgesvdj_bufferSize, cusolverDnCgesvdjBatched,
               cusolverDnCgesvdjBatched_bufferSize, cuComplex{}, float{});
    default: throw Error(str("linalg.svd: internal error: unexpected dtype ", dtype_name(t)));
  }
}

struct GesvdjParams {
  gesvdjInfo_t p = nullptr;
  GesvdjParams() { check_solver(cusolverDnCreateGesvdjInfo(&p), "cusolverDnCreateGesvdjInfo"); }
  ~GesvdjParams() { cusolverDnDestroyGesvdjInfo(p); }
};

}  // namespace

// Jacobi SVD (as torch on CUDA): one gesvdjBatched call for batches of matrices up to 32 x 32, gesvdj per matrix
// otherwise. cuSOLVER returns V; the caller's buffer holds V^H, so V lands in a scratch buffer first.
void solver_gesvd(Tensor& a, Tensor& s, Tensor& u, Tensor& vt, char jobz, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1), m = a.size(2), k = std::min(m, n);
  if (batch == 0) return;
  if (k == 0) {
    info.fill_(0);
    return;
  }
  const int mi = checked_int(m, "rows"), ni = checked_int(n, "columns");
  DeviceGuard guard(a.device());
  Handle& h = solver_for(a.device());
  const cusolverEigMode_t job = jobz == 'N' ? CUSOLVER_EIG_MODE_NOVECTOR : CUSOLVER_EIG_MODE_VECTOR;
  const bool batched = batch > 1 && m <= 32 && n <= 32;
  // U [B, ucols, m] and V [B, vcols, n], column-major: full for the batched routine, else as jobz asks.
  const int64_t ucols = batched || jobz == 'A' ? m : k, vcols = batched || jobz == 'A' ? n : k;
  const bool own_u = batched || jobz == 'N';
  Tensor U = own_u ? empty({batch, ucols, m}, a.dtype(), a.device()) : u;
  Tensor V = empty({batch, vcols, n}, a.dtype(), a.device());
  GesvdjParams params;
  visit_gesvdj(a.dtype(), [&](auto gesvdj, auto gesvdj_size, auto gesvdj_batched, auto gesvdj_batched_size, auto tag,
                              auto rtag) {
    using T = decltype(tag);
    using R = decltype(rtag);
    T* A = static_cast<T*>(a.data_ptr());
    R* S = static_cast<R*>(s.data_ptr());
    T* Up = static_cast<T*>(U.data_ptr());
    T* Vp = static_cast<T*>(V.data_ptr());
    int lwork = 0;
    if (batched) {
      const int bi = checked_int(batch, "batch");
      check_solver(gesvdj_batched_size(h.h, job, mi, ni, A, mi, S, Up, mi, Vp, ni, &lwork, params.p, bi),
                   "cusolverDn?gesvdjBatched_bufferSize");
      Tensor work = empty({std::max(lwork, 1) * static_cast<int64_t>(sizeof(T))}, DType::U8, a.device());
      check_solver(gesvdj_batched(h.h, job, mi, ni, A, mi, S, Up, mi, Vp, ni, static_cast<T*>(work.data_ptr()), lwork,
                                  info.data<int32_t>(), params.p, bi),
                   "cusolverDn?gesvdjBatched");
      return;
    }
    const int econ = jobz == 'A' ? 0 : 1;
    check_solver(gesvdj_size(h.h, job, econ, mi, ni, A, mi, S, Up, mi, Vp, ni, &lwork, params.p),
                 "cusolverDn?gesvdj_bufferSize");
    Tensor work = empty({std::max(lwork, 1) * static_cast<int64_t>(sizeof(T))}, DType::U8, a.device());
    for (int64_t i = 0; i < batch; ++i)
      check_solver(gesvdj(h.h, job, econ, mi, ni, A + i * m * n, mi, S + i * k, Up + i * ucols * m, mi, Vp + i * vcols * n,
                          ni, static_cast<T*>(work.data_ptr()), lwork, info_at(info, i), params.p),
                   "cusolverDn?gesvdj");
  });
  if (jobz == 'N') return;
  const int64_t cols = jobz == 'A' ? m : k, rows = jobz == 'A' ? n : k;
  if (own_u) u.copy_(U.narrow(1, 0, cols));
  // vt [B, n, rows] holds V^H column-major: vt[b][j][i] = conj(V(j, i)) = conj(V[b][i][j]).
  vt.copy_(conj(V.narrow(1, 0, rows)).transpose(1, 2));
}

void solver_syevd(Tensor& a, Tensor& w, bool vectors, bool upper, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1);
  if (batch == 0) return;
  if (n == 0) {
    info.fill_(0);
    return;
  }
  DeviceGuard guard(a.device());
  Handle& h = solver_for(a.device());
  const cudaDataType t = data_type(a.dtype()), r = real_type(a.dtype());
  const cusolverEigMode_t job = vectors ? CUSOLVER_EIG_MODE_VECTOR : CUSOLVER_EIG_MODE_NOVECTOR;
  const cublasFillMode_t uplo = upper ? CUBLAS_FILL_MODE_UPPER : CUBLAS_FILL_MODE_LOWER;
  size_t dbytes = 0, hbytes = 0;
  check_solver(cusolverDnXsyevd_bufferSize(h.h, h.params, job, uplo, n, t, a.data_ptr(), n, r, w.data_ptr(), t, &dbytes,
                                           &hbytes),
               "cusolverDnXsyevd_bufferSize");
  Workspace ws(a.device(), dbytes, hbytes);
  const int64_t stride = n * n * item_bytes(a), w_stride = n * item_bytes(w);
  for (int64_t i = 0; i < batch; ++i)
    check_solver(cusolverDnXsyevd(h.h, h.params, job, uplo, n, t, bytes_of(a) + i * stride, n, r, bytes_of(w) + i * w_stride,
                                  t, ws.d(), ws.d_bytes(), ws.h(), ws.h_bytes(), info_at(info, i)),
                 "cusolverDnXsyevd");
}

// Row-major B (rows x cols) is column-major B^T: A X = B is X^T A^T = B^T (cuBLAS side right) and X A = B is
// A^T X^T = B^T (side left); row-major A is column-major A^T, whose upper triangle is A's lower one.
void blas_trsm(const Tensor& a, Tensor& b, bool left, bool upper, bool unit) {
  const int64_t batch = b.size(0), rows = b.size(1), cols = b.size(2), n = a.size(1);
  if (batch == 0 || rows == 0 || cols == 0) return;
  DeviceGuard guard(b.device());
  Tensor ws;
  cublasHandle_t h = blas_handle(b.device(), ws);
  const cublasSideMode_t side = left ? CUBLAS_SIDE_RIGHT : CUBLAS_SIDE_LEFT;
  const cublasFillMode_t uplo = upper ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER;
  const cublasDiagType_t diag = unit ? CUBLAS_DIAG_UNIT : CUBLAS_DIAG_NON_UNIT;
  const bool shared = a.size(0) == 1;
  const int64_t a_stride = shared ? 0 : n * n, b_stride = rows * cols;
  for (int64_t i = 0; i < batch; ++i) {
    switch (b.dtype()) {
      case DType::F32: {
        const float one = 1;
        check_blas(cublasStrsm_64(h, side, uplo, CUBLAS_OP_N, diag, cols, rows, &one, a.data<float>() + i * a_stride, n,
                                  b.data<float>() + i * b_stride, cols),
                   "cublasStrsm");
        break;
      }
      case DType::F64: {
        const double one = 1;
        check_blas(cublasDtrsm_64(h, side, uplo, CUBLAS_OP_N, diag, cols, rows, &one, a.data<double>() + i * a_stride, n,
                                  b.data<double>() + i * b_stride, cols),
                   "cublasDtrsm");
        break;
      }
      case DType::C64: {
        const cuComplex one{1, 0};
        check_blas(cublasCtrsm_64(h, side, uplo, CUBLAS_OP_N, diag, cols, rows, &one,
                                  static_cast<const cuComplex*>(a.data_ptr()) + i * a_stride, n,
                                  static_cast<cuComplex*>(b.data_ptr()) + i * b_stride, cols),
                   "cublasCtrsm");
        break;
      }
      default: throw Error(str("linalg.solve_triangular: internal error: unexpected dtype ", b.meta()));
    }
  }
}

}  // namespace kiln::cuda
