// kiln::linalg (include/kiln/linalg.h): argument checks, batching and broadcasting, the layout LAPACK wants,
// torch.linalg's conventions and error messages. The factorisations run on the input's device: LAPACK on the
// CPU (src/cpu/linalg.cpp), cuSOLVER and kiln's small-matrix kernels on CUDA (src/cuda/solver.h), both with one
// contract (column-major buffers [B, cols, rows], 1-based int32 pivots, info per matrix).
#include "kiln/linalg.h"

#include <cmath>
#include <complex>
#include <limits>

#include "core/dispatch.h"
#include "cpu/linalg.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"
#if KILN_HAVE_CUDA
#include "cuda/solver.h"
#endif

namespace kiln::linalg {

namespace {

DType checked_dtype(const Tensor& A, const char* op) {
  const DType t = A.dtype();
  KILN_CHECK(t == DType::F32 || t == DType::F64 || t == DType::C64, op, ": expected float32, float64 or complex64, got ",
             A.meta());
  return t;
}

DType real_of(DType t) { return t == DType::C64 ? DType::F32 : t; }

double eps_of(DType t) {
  return real_of(t) == DType::F64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

void check_matrix(const Tensor& A, const char* op, bool square) {
  checked_dtype(A, op);
  KILN_CHECK(A.dim() >= 2, op, ": expected a matrix or a batch of matrices (at least 2 dims), got ", A.meta());
  KILN_CHECK(!square || A.size(-1) == A.size(-2), op, ": expected square matrices, got ", A.meta());
}

Shape batch_of(const Tensor& A) { return Shape(A.sizes().begin(), A.sizes().end() - 2); }

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape cat_shape(Shape a, std::initializer_list<int64_t> tail) {
  a.insert(a.end(), tail.begin(), tail.end());
  return a;
}

// A batch of matrices [..., rows, cols] as LAPACK's column-major buffer [B, cols, rows] on A's device: always a
// new tensor (the factorisation overwrites it; .contiguous() could return the caller's own memory).
Tensor to_colmajor(const Tensor& A) {
  const int64_t rows = A.size(-2), cols = A.size(-1);
  return A.reshape({count(batch_of(A)), rows, cols}).transpose(1, 2).clone();
}

// Back from a column-major buffer [B, cols, rows] to row-major [batch..., rows, cols] on `device`.
Tensor from_colmajor(const Tensor& buf, const Shape& batch, Device device) {
  const int64_t cols = buf.size(1), rows = buf.size(2);
  return buf.transpose(1, 2).contiguous().reshape(cat_shape(batch, {rows, cols})).to(device);
}

// info int32 [B] (on any device: this waits for it) -> the first failing batch element, if any.
std::optional<std::pair<int64_t, int32_t>> first_failure(const Tensor& info) {
  // On a device, one byte crosses first (whether any element failed); the whole array only when one did.
  if (!info.device().is_cpu() && info.numel() > 1 && !any(ne(info, Scalar(0))).cpu().data<bool>()[0]) return std::nullopt;
  const Tensor host = info.cpu().contiguous();
  const int32_t* p = host.data<int32_t>();
  for (int64_t i = 0; i < host.numel(); ++i)
    if (p[i] != 0) return std::make_pair(i, p[i]);
  return std::nullopt;
}

// A factorisation on the buffers' device (see the top of the file): cuda::solver_NAME or cpu::lapack_NAME.
#define KILN_SOLVER(t, name, ...)                                         \
  do {                                                                    \
    if ((t).is_cuda()) {                                                  \
      KILN_CUDA_SOLVER(name, __VA_ARGS__);                               \
    } else {                                                              \
      cpu::lapack_##name(__VA_ARGS__);                                    \
    }                                                                     \
  } while (0)
#if KILN_HAVE_CUDA
#define KILN_CUDA_SOLVER(name, ...) cuda::solver_##name(__VA_ARGS__)
#else
#define KILN_CUDA_SOLVER(name, ...) throw Error("linalg: this build has no CUDA backend")
#endif

std::string element(int64_t i, bool batched) { return batched ? str("(batch element ", i, ") ") : std::string(); }

// Values by dtype: the LU's diagonal, the pivots' parity, ... read on the host.
template <class F>
void visit_float(DType t, const char* op, F&& f) {
  visit_dtypes<dset(DType::F32, DType::F64, DType::C64)>(t, op, f);
}

// The permutation of a batch of 1-based pivots: perm[i] is the row of A that row i of L U comes from.
std::vector<int64_t> permutation(const int32_t* piv, int64_t k, int64_t m) {
  std::vector<int64_t> perm(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) perm[i] = i;
  for (int64_t i = 0; i < k; ++i) std::swap(perm[i], perm[piv[i] - 1]);
  return perm;
}

Tensor ex_info(const Tensor& info, const Shape& batch, Device device) { return info.reshape(batch).to(device); }

#if KILN_HAVE_CUDA
// Whether CUDA's fused kernels (src/cuda/solver.h) take A: square matrices they cover, a non-empty batch. They
// read the row-major batch as it is (made contiguous, not transposed) and write row-major results in one launch.
bool fused_cuda(const Tensor& A, int64_t max_n) {
  const int64_t n = A.size(-1);
  return A.is_cuda() && A.numel() > 0 && n <= max_n && cuda::fused_inverse_fits(A.dtype(), n);
}
#endif

// getrf over a batch: the column-major LU buffer [B, n, m], the pivots [B, min(m, n)] and info [B].
struct Factored {
  Tensor buf, piv, info;
  Shape batch;
  Device dev;
};
Factored factor_lu(const Tensor& A, const char* op, bool square) {
  check_matrix(A, op, square);
  Factored f;
  f.dev = A.device();
  f.batch = batch_of(A);
  const int64_t B = count(f.batch);
  f.buf = to_colmajor(A);
  f.piv = empty({B, std::min(A.size(-2), A.size(-1))}, DType::I32, f.dev);
  f.info = empty({B}, DType::I32, f.dev);
  KILN_SOLVER(f.buf, getrf, f.buf, f.piv, f.info);
  return f;
}

}  // namespace

// ---- LU ------------------------------------------------------------------------------------------------------

LUFactorEx lu_factor_ex(const Tensor& A, bool pivot, bool check_errors) {
  KILN_CHECK(pivot, "linalg.lu_factor: LU without pivoting is not available (pivot=False); it is not stable");
  const auto factor = [&]() -> LUFactorEx {
#if KILN_HAVE_CUDA
    // CUDA's block LU reads the row-major input and writes the row-major factor itself: one launch, no transposes.
    if (A.is_cuda() && A.dim() >= 2 && A.size(-1) == A.size(-2) && A.size(-1) > cuda::kSmallN &&
        cuda::lu_small_fits(A.dtype(), A.size(-1)) && A.numel() > 0) {
      check_matrix(A, "linalg.lu_factor", true);
      const Shape batch = batch_of(A);
      const int64_t B = count(batch), n = A.size(-1);
      Tensor lu = empty({B, n, n}, A.dtype(), A.device()), piv = empty({B, n}, DType::I32, A.device()),
             info = empty({B}, DType::I32, A.device());
      cuda::lu_block(A.reshape({B, n, n}).contiguous(), lu, piv, info, true);
      return {lu.reshape(A.sizes()), piv.reshape(cat_shape(batch, {n})), info.reshape(batch)};
    }
#endif
    Factored f = factor_lu(A, "linalg.lu_factor", false);
    return {from_colmajor(f.buf, f.batch, f.dev), f.piv.reshape(cat_shape(f.batch, {f.piv.size(1)})).to(f.dev),
            ex_info(f.info, f.batch, f.dev)};
  };
  LUFactorEx r = factor();
  if (check_errors)
    if (auto e = first_failure(r.info))
      throw Error(str("linalg.lu_factor_ex: ", element(e->first, r.info.numel() > 1), "U[", e->second - 1, ", ",
                      e->second - 1, "] is zero: the matrix is singular"));
  return r;
}

LUFactor lu_factor(const Tensor& A, bool pivot) {
  LUFactorEx r = lu_factor_ex(A, pivot, false);
  const Tensor& info = r.info;
  if (auto f = first_failure(info))
    throw Error(str("linalg.lu_factor: ", element(f->first, info.numel() > 1), "U[", f->second - 1, ", ", f->second - 1,
                    "] is zero, and lu_solve with it would divide by zero (lu_factor_ex returns the factorisation "
                    "with info instead)"));
  return {r.LU, r.pivots};
}

PLU lu(const Tensor& A, bool pivot) {
  LUFactorEx f = lu_factor_ex(A, pivot, false);
  const Device dev = A.device();
  const Shape batch = batch_of(A);
  const int64_t B = count(batch), m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  Tensor LU = f.LU.cpu().reshape({B, m, n}).contiguous();
  Tensor piv = f.pivots.cpu().reshape({B, k}).contiguous();
  Tensor P = zeros({B, m, m}, A.dtype()), L = zeros({B, m, k}, A.dtype()), U = zeros({B, k, n}, A.dtype());
  visit_float(A.dtype(), "linalg.lu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* lu = LU.data<T>();
    T *p = P.data<T>(), *l = L.data<T>(), *u = U.data<T>();
    const T one = T(1), zero = T(0);
    (void)zero;
    for (int64_t b = 0; b < B; ++b) {
      const T* a = lu + b * m * n;
      const auto perm = permutation(piv.data<int32_t>() + b * k, k, m);
      for (int64_t i = 0; i < m; ++i) p[b * m * m + perm[i] * m + i] = one;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) l[b * m * k + i * k + j] = i == j ? one : i > j ? a[i * n + j] : T(0);
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = i; j < n; ++j) u[b * k * n + i * n + j] = a[i * n + j];
    }
  });
  return {P.reshape(cat_shape(batch, {m, m})).to(dev), L.reshape(cat_shape(batch, {m, k})).to(dev),
          U.reshape(cat_shape(batch, {k, n})).to(dev)};
}

Tensor lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left, bool adjoint) {
  check_matrix(LU, "linalg.lu_solve", true);
  check_matrix(B, "linalg.lu_solve", false);
  KILN_CHECK(B.dtype() == LU.dtype(), "linalg.lu_solve: LU and B must have one dtype, got ", LU.meta(), " and ", B.meta());
  KILN_CHECK(B.device() == LU.device() && pivots.device() == LU.device(), "linalg.lu_solve: LU ", LU.meta(), ", pivots ",
             pivots.meta(), " and B ", B.meta(), " must be on one device");
  const int64_t n = LU.size(-1);
  KILN_CHECK(pivots.dtype() == DType::I32 && pivots.dim() == LU.dim() - 1 && pivots.size(-1) == n,
             "linalg.lu_solve: pivots must be int32 [..., ", n, "] as lu_factor returns them, got ", pivots.meta());
  KILN_CHECK((left ? B.size(-2) : B.size(-1)) == n, "linalg.lu_solve: B ", B.meta(), " does not fit A [", n, ", ", n,
             "] on the ", left ? "left (B must be [..., n, k])" : "right (B must be [..., k, n])");
  const Device dev = LU.device();
  const Shape batch = broadcast_shapes(batch_of(LU), batch_of(B));
  const int64_t nb = count(batch);
  const Tensor lu_buf = to_colmajor(LU.expand(cat_shape(batch, {n, n})));
  const Tensor piv = pivots.expand(cat_shape(batch, {n})).reshape({nb, n}).contiguous();
  const bool cplx = B.dtype() == DType::C64;
  if (left) {
    // A X = B or A^H X = B: B's column-major buffer is B^T.
    Tensor b = to_colmajor(B.expand(cat_shape(batch, {n, B.size(-1)})));
    KILN_SOLVER(b, getrs, lu_buf, piv, b, adjoint ? (cplx ? 'C' : 'T') : 'N');
    return from_colmajor(b, batch, dev);
  }
  // X A = B  <=>  A^H X^H = B^H;  X A^H = B  <=>  A X^H = B^H. The column-major buffer of B^H [n, r] is conj(B)
  // in row-major order, and the solution's buffer is X^H's, i.e. conj(X) row-major.
  const int64_t r = B.size(-2);
  Tensor b = conj(B.expand(cat_shape(batch, {r, n}))).reshape({nb, r, n}).clone();
  KILN_SOLVER(b, getrs, lu_buf, piv, b, adjoint ? 'N' : (cplx ? 'C' : 'T'));
  return conj(b).reshape(cat_shape(batch, {r, n})).contiguous().to(dev);
}

// ---- Solves, inverses, determinants ---------------------------------------------------------------------------

Tensor solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left, bool unitriangular) {
  check_matrix(A, "linalg.solve_triangular", true);
  check_matrix(B, "linalg.solve_triangular", false);
  KILN_CHECK(B.dtype() == A.dtype(), "linalg.solve_triangular: A and B must have one dtype, got ", A.meta(), " and ",
             B.meta());
  KILN_CHECK(A.device() == B.device(), "linalg.solve_triangular: A ", A.meta(), " and B ", B.meta(),
             " must be on one device");
  const int64_t n = A.size(-1);
  KILN_CHECK((left ? B.size(-2) : B.size(-1)) == n, "linalg.solve_triangular: B ", B.meta(), " does not fit A ", A.meta(),
             left ? " on the left (B must be [..., n, k])" : " on the right (B must be [..., k, n])");
  const Device dev = A.device();
  const Shape batch = broadcast_shapes(batch_of(A), batch_of(B));
  const int64_t nb = count(batch);
  const Tensor a = A.expand(cat_shape(batch, {n, n})).reshape({nb, n, n}).contiguous();
  Tensor b = B.expand(cat_shape(batch, {B.size(-2), B.size(-1)})).reshape({nb, B.size(-2), B.size(-1)}).clone();
#if KILN_HAVE_CUDA
  if (b.is_cuda()) cuda::blas_trsm(a, b, left, upper, unitriangular);
  else
#endif
    cpu::blas_trsm(a, b, left, upper, unitriangular);
  return b.reshape(cat_shape(batch, {B.size(-2), B.size(-1)})).to(dev);
}

SolveEx solve_ex(const Tensor& A, const Tensor& B, bool left, bool check_errors) {
  check_matrix(A, "linalg.solve", true);
  KILN_CHECK(B.dtype() == A.dtype(), "linalg.solve: A and B must have one dtype, got ", A.meta(), " and ", B.meta());
  // B is a vector (or a batch of them) when it is 1-d, or A's batch shape plus n: torch.linalg.solve's rule.
  const bool vector = B.dim() == 1 || (B.dim() == A.dim() - 1 && B.sizes() == Shape(A.sizes().begin(), A.sizes().end() - 1));
  auto check = [&](const Tensor& info_any) {
    if (!check_errors) return;
    const Tensor& info = info_any;
    if (auto e = first_failure(info))
      throw Error(str("linalg.solve_ex: ", element(e->first, info.numel() > 1), "the matrix is singular"));
  };
#if KILN_HAVE_CUDA
  // One vector per matrix, batches equal (no broadcast), n <= 4: one thread per system, one launch.
  if (left && vector && B.dim() == A.dim() - 1 && B.device() == A.device() && fused_cuda(A, cuda::kTinyN)) {
    const Shape batch = batch_of(A);
    const int64_t nb = count(batch), n = A.size(-1);
    Tensor x = empty({nb, n}, A.dtype(), A.device()), info = empty({nb}, DType::I32, A.device());
    cuda::solve_tiny(A.reshape({nb, n, n}).contiguous(), B.reshape({nb, n}).contiguous(), x, info);
    check(info);
    return {x.reshape(B.sizes()), info.reshape(batch)};
  }
#endif
  const Tensor Bm = vector ? B.unsqueeze(left ? -1 : -2) : B;
  LUFactorEx f = lu_factor_ex(A, true, false);
  check(f.info);
  Tensor X = lu_solve(f.LU, f.pivots, Bm, left, false);
  return {vector ? X.squeeze(left ? -1 : -2) : X, f.info};
}

Tensor solve(const Tensor& A, const Tensor& B, bool left) {
  SolveEx r = solve_ex(A, B, left, false);
  const Tensor& info = r.info;
  if (auto e = first_failure(info))
    throw Error(str("linalg.solve: ", element(e->first, info.numel() > 1),
                    "the solver failed because the input matrix is singular (U[", e->second - 1, ", ", e->second - 1,
                    "] is zero)"));
  return r.result;
}

InvEx inv_ex(const Tensor& A, bool check_errors) {
  check_matrix(A, "linalg.inv", true);
  auto check = [&](const Tensor& info) {
    if (!check_errors) return;
    if (auto e = first_failure(info))
      throw Error(str("linalg.inv_ex: ", element(e->first, info.numel() > 1), "the diagonal element ", e->second,
                      " is zero: the matrix is singular"));
  };
#if KILN_HAVE_CUDA
  if (fused_cuda(A, cuda::kFusedInvN)) {
    const Shape batch = batch_of(A);
    const int64_t nb = count(batch), n = A.size(-1);
    Tensor out = empty({nb, n, n}, A.dtype(), A.device()), info = empty({nb}, DType::I32, A.device());
    cuda::inverse_fused(A.reshape({nb, n, n}).contiguous(), out, info);
    check(info);
    return {out.reshape(A.sizes()), info.reshape(batch)};
  }
#endif
  Factored f = factor_lu(A, "linalg.inv", true);
  KILN_SOLVER(f.buf, getri, f.buf, f.piv, f.info);
  check(f.info);
  return {from_colmajor(f.buf, f.batch, f.dev), ex_info(f.info, f.batch, f.dev)};
}

Tensor inv(const Tensor& A) {
  InvEx r = inv_ex(A, false);
  const Tensor& info = r.info;
  if (auto e = first_failure(info))
    throw Error(str("linalg.inv: ", element(e->first, info.numel() > 1), "the diagonal element ", e->second,
                    " is zero, the inversion could not be completed because the input matrix is singular"));
  return r.inverse;
}

SlogDet slogdet(const Tensor& A) {
  Factored f = factor_lu(A, "linalg.slogdet", true);
  const Device dev = f.dev;
  const Shape batch = f.batch;
  const int64_t B = count(batch), n = A.size(-1);
#if KILN_HAVE_CUDA
  if (f.buf.is_cuda()) {
    Tensor sign = empty({B}, A.dtype(), dev), logabs = empty({B}, real_of(A.dtype()), dev);
    cuda::slogdet_from_lu(f.buf, f.piv, sign, logabs);
    return {sign.reshape(batch), logabs.reshape(batch)};
  }
#endif
  // U's diagonal [B, n] and the pivots.
  const Tensor buf = f.buf.as_strided({B, n}, {n * n, n + 1}).contiguous(), piv = f.piv;
  Tensor sign = empty({B}, A.dtype()), logabs = empty({B}, real_of(A.dtype()));
  visit_float(A.dtype(), "linalg.slogdet", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* lu = buf.data<T>();
    const int32_t* pv = piv.data<int32_t>();
    for (int64_t b = 0; b < B; ++b) {
      // The diagonal of U, the pivots' parity.
      double log_sum = 0;
      std::complex<double> phase(1, 0);
      bool zero = false;
      for (int64_t i = 0; i < n; ++i) {
        const T d = lu[b * n + i];
        std::complex<double> z;
        if constexpr (std::is_same_v<T, Complex64>) z = {d.re, d.im};
        else z = {static_cast<double>(d), 0};
        const double mag = std::abs(z);
        if (mag == 0) zero = true;
        else {
          log_sum += std::log(mag);
          phase *= z / mag;
        }
        if (pv[b * n + i] != i + 1) phase = -phase;
      }
      if (zero) {
        phase = 0;
        log_sum = -std::numeric_limits<double>::infinity();
      }
      if constexpr (std::is_same_v<T, Complex64>) sign.data<T>()[b] = Complex64(static_cast<float>(phase.real()), static_cast<float>(phase.imag()));
      else sign.data<T>()[b] = static_cast<T>(phase.real());
      if constexpr (std::is_same_v<T, double>) logabs.data<double>()[b] = log_sum;
      else logabs.data<float>()[b] = static_cast<float>(log_sum);
    }
  });
  return {sign.reshape(batch).to(dev), logabs.reshape(batch).to(dev)};
}

Tensor det(const Tensor& A) {
  check_matrix(A, "linalg.det", true);
#if KILN_HAVE_CUDA
  // n <= 4: the product of the LU's pivots in one launch, one thread per matrix.
  if (fused_cuda(A, cuda::kTinyN)) {
    const Shape batch = batch_of(A);
    const int64_t nb = count(batch), n = A.size(-1);
    Tensor d = empty({nb}, A.dtype(), A.device());
    cuda::det_tiny(A.reshape({nb, n, n}).contiguous(), d);
    return d.reshape(batch);
  }
#endif
  SlogDet s = slogdet(A);
  return mul(s.sign, exp(s.logabsdet).to(A.dtype()));
}

CholeskyEx cholesky_ex(const Tensor& A, bool upper, bool check_errors) {
  check_matrix(A, "linalg.cholesky", true);
  const Device dev = A.device();
  const Shape batch = batch_of(A);
  const int64_t B = count(batch);
  Tensor buf = to_colmajor(A);
  Tensor info = empty({B}, DType::I32, dev);
  KILN_SOLVER(buf, potrf, buf, /*upper=*/false, info);  // the lower triangle of A (column-major 'L')
  if (check_errors) {
    if (auto e = first_failure(info))
      throw Error(str("linalg.cholesky_ex: ", element(e->first, B > 1), "the leading minor of order ", e->second,
                      " is not positive-definite"));
  }
  Tensor L = tril(from_colmajor(buf, batch, dev));
  if (upper) L = conj(L).transpose(-2, -1).contiguous();
  return {L, ex_info(info, batch, dev)};
}

Tensor cholesky(const Tensor& A, bool upper) {
  CholeskyEx r = cholesky_ex(A, upper, false);
  const Tensor& info = r.info;
  if (auto e = first_failure(info))
    throw Error(str("linalg.cholesky: ", element(e->first, info.numel() > 1),
                    "the factorization could not be completed because the input is not positive-definite (the "
                    "leading minor of order ", e->second, " is not positive-definite)"));
  return r.L;
}

// ---- QR, SVD, eigh ---------------------------------------------------------------------------------------------

QR qr(const Tensor& A, std::string_view mode) {
  check_matrix(A, "linalg.qr", false);
  KILN_CHECK(mode == "reduced" || mode == "complete" || mode == "r", "linalg.qr: mode must be 'reduced', 'complete' or "
             "'r', got '", mode, "'");
  const Device dev = A.device();
  const Shape batch = batch_of(A);
  const int64_t B = count(batch), m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  Tensor buf = to_colmajor(A);
  Tensor tau = empty({B, k}, A.dtype(), dev);
  KILN_SOLVER(buf, geqrf, buf, tau);
  const Tensor full = from_colmajor(buf, batch, dev);  // R above the diagonal, reflectors below
  const bool complete = mode == "complete";
  Tensor R = triu(complete ? full : full.narrow(-2, 0, k)).contiguous();
  if (mode == "r") return {empty({0}, A.dtype(), dev), R};
  const int64_t qcols = complete ? m : k;
  // Q's column-major buffer: the first qcols columns of the factored matrix (zeros past its n columns).
  Tensor q = zeros({B, qcols, m}, A.dtype(), dev);
  q.narrow(1, 0, std::min(qcols, n)).copy_(buf.narrow(1, 0, std::min(qcols, n)));
  KILN_SOLVER(q, orgqr, q, tau, k);
  return {from_colmajor(q, batch, dev), R};
}

namespace {

void check_finite(const Tensor& A, const char* op) {
  Tensor bad = logical_not(isfinite(A));
  if (!bad.numel()) return;
  const Tensor per = any(bad.reshape({count(batch_of(A)), A.size(-2) * A.size(-1)}), {1}).cpu().contiguous();
  const bool* p = per.data<bool>();
  for (int64_t i = 0; i < per.numel(); ++i)
    if (p[i])
      throw Error(str(op, ": ", element(i, per.numel() > 1), "the input contains non-finite values (NaN or inf); the "
                      "decomposition is not defined for it"));
}

SVD svd_impl(const Tensor& A, char jobz, const char* op) {
  check_matrix(A, op, false);
  const Device dev = A.device();
  check_finite(A, op);
  const Shape batch = batch_of(A);
  const int64_t B = count(batch), m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  Tensor buf = to_colmajor(A);
  Tensor s = empty({B, k}, real_of(A.dtype()), dev);
  Tensor u = jobz == 'N' ? Tensor() : empty({B, jobz == 'A' ? m : k, m}, A.dtype(), dev);
  Tensor vt = jobz == 'N' ? Tensor() : empty({B, n, jobz == 'A' ? n : k}, A.dtype(), dev);
  Tensor info = empty({B}, DType::I32, dev);
#if KILN_HAVE_CUDA
  if (buf.is_cuda()) cuda::solver_gesvd(buf, s, u, vt, jobz, info);
  else
#endif
    cpu::lapack_gesdd(buf, s, u, vt, jobz, info);
  if (auto e = first_failure(info))
    throw Error(str(op, ": ", element(e->first, B > 1), "the algorithm failed to converge (LAPACK gesdd info ",
                    e->second, ")"));
  SVD r;
  r.S = s.reshape(cat_shape(batch, {k})).to(dev);
  if (jobz != 'N') {
    r.U = from_colmajor(u, batch, dev);
    r.Vh = from_colmajor(vt, batch, dev);
  }
  return r;
}

// The tolerance below which singular values (or eigenvalue magnitudes) count as zero, per batch element.
Tensor tolerance(const Tensor& largest, DType t, int64_t m, int64_t n, std::optional<double> atol, std::optional<double> rtol) {
  double r;
  if (rtol) r = *rtol;
  else r = (atol && *atol > 0) ? 0.0 : eps_of(t) * static_cast<double>(std::max(m, n));
  Tensor tol = mul(largest, Scalar(r));
  return atol ? maximum(tol, full_like(tol, Scalar(*atol))) : tol;
}

}  // namespace

SVD svd(const Tensor& A, bool full_matrices) { return svd_impl(A, full_matrices ? 'A' : 'S', "linalg.svd"); }

Tensor svdvals(const Tensor& A) { return svd_impl(A, 'N', "linalg.svdvals").S; }

namespace {
Eigh eigh_impl(const Tensor& A, std::string_view UPLO, bool vectors, const char* op) {
  check_matrix(A, op, true);
  KILN_CHECK(UPLO == "L" || UPLO == "U", op, ": UPLO must be 'L' or 'U', got '", UPLO, "'");
  const Device dev = A.device();
  check_finite(A, op);
  const Shape batch = batch_of(A);
  const int64_t B = count(batch), n = A.size(-1);
  Tensor buf = to_colmajor(A);
  Tensor w = empty({B, n}, real_of(A.dtype()), dev);
  Tensor info = empty({B}, DType::I32, dev);
  KILN_SOLVER(buf, syevd, buf, w, vectors, UPLO == "U", info);
  if (auto e = first_failure(info))
    throw Error(str(op, ": ", element(e->first, B > 1), "the algorithm failed to converge (LAPACK info ", e->second, ")"));
  Eigh r;
  r.eigenvalues = w.reshape(cat_shape(batch, {n})).to(dev);
  if (vectors) r.eigenvectors = from_colmajor(buf, batch, dev);
  return r;
}
}  // namespace

Eigh eigh(const Tensor& A, std::string_view UPLO) { return eigh_impl(A, UPLO, true, "linalg.eigh"); }

Tensor eigvalsh(const Tensor& A, std::string_view UPLO) { return eigh_impl(A, UPLO, false, "linalg.eigvalsh").eigenvalues; }

Tensor pinv(const Tensor& A, std::optional<double> atol, std::optional<double> rtol, bool hermitian) {
  check_matrix(A, "linalg.pinv", hermitian);
  const Device dev = A.device();
  const int64_t m = A.size(-2), n = A.size(-1);
  if (hermitian) {
    Eigh e = eigh_impl(A, "L", true, "linalg.pinv");
    const Tensor &w = e.eigenvalues, &V = e.eigenvectors;
    Tensor mag = abs(w);
    Tensor tol = tolerance(amax(mag, {-1}, true), A.dtype(), m, n, atol, rtol);
    Tensor inv_w = where(gt(mag, tol), reciprocal(w), Scalar(0.0));
    Tensor Vs = mul(V, inv_w.unsqueeze(-2).to(V.dtype()));
    return matmul(Vs, conj(V).transpose(-2, -1));
  }
  SVD s = svd_impl(A, 'S', "linalg.pinv");
  const Tensor &S = s.S, &U = s.U, &Vh = s.Vh;
  if (S.size(-1) == 0) return zeros(cat_shape(batch_of(A), {n, m}), A.dtype(), dev);
  Tensor tol = tolerance(amax(S, {-1}, true), A.dtype(), m, n, atol, rtol);
  Tensor inv_s = where(gt(S, tol), reciprocal(S), Scalar(0.0));
  Tensor V = conj(Vh).transpose(-2, -1);
  return matmul(mul(V, inv_s.unsqueeze(-2).to(V.dtype())), conj(U).transpose(-2, -1));
}

Tensor matrix_rank(const Tensor& A, std::optional<double> atol, std::optional<double> rtol, bool hermitian) {
  check_matrix(A, "linalg.matrix_rank", hermitian);
  const int64_t m = A.size(-2), n = A.size(-1);
  Tensor vals = hermitian ? abs(eigh_impl(A, "L", false, "linalg.matrix_rank").eigenvalues)
                          : svd_impl(A, 'N', "linalg.matrix_rank").S;
  if (vals.size(-1) == 0) return zeros(batch_of(A), DType::I64, A.device());
  Tensor tol = tolerance(amax(vals, {-1}, true), A.dtype(), m, n, atol, rtol);
  return sum(gt(vals, tol), {-1});
}

// ---- Norms ------------------------------------------------------------------------------------------------------

Tensor vector_norm(const Tensor& x, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  KILN_CHECK(is_floating(x.dtype()) || is_complex(x.dtype()), "linalg.vector_norm: expected a floating or complex "
             "dtype, got ", x.meta());
  return norm(x.dtype() == DType::C64 ? abs(x) : x, ord, dims, keepdim);
}

Tensor matrix_norm(const Tensor& A, std::string_view ord, bool keepdim) {
  check_matrix(A, "linalg.matrix_norm", false);
  if (ord == "fro") return vector_norm(A, 2.0, {-2, -1}, keepdim);
  KILN_CHECK(ord == "nuc", "linalg.matrix_norm: ord must be 'fro', 'nuc' or a number (inf, -inf, 1, -1, 2, -2), got '",
             ord, "'");
  Tensor r = sum(svdvals(A), {-1});
  return keepdim ? r.unsqueeze(-1).unsqueeze(-1) : r;
}

Tensor matrix_norm(const Tensor& A, double ord, bool keepdim) {
  check_matrix(A, "linalg.matrix_norm", false);
  const double inf = std::numeric_limits<double>::infinity();
  KILN_CHECK(ord == inf || ord == -inf || ord == 1 || ord == -1 || ord == 2 || ord == -2,
             "linalg.matrix_norm: ord must be 'fro', 'nuc', inf, -inf, 1, -1, 2 or -2, got ", ord);
  Tensor r;
  if (ord == 2 || ord == -2) {
    Tensor s = svdvals(A);
    r = ord == 2 ? amax(s, {-1}) : amin(s, {-1});
  } else {
    // 1: the largest column sum of |A|; inf: the largest row sum.
    Tensor a = abs(A);
    Tensor sums = sum(a, {(ord == 1 || ord == -1) ? int64_t{-2} : int64_t{-1}});
    r = ord > 0 ? amax(sums, {-1}) : amin(sums, {-1});
  }
  return keepdim ? r.unsqueeze(-1).unsqueeze(-1) : r;
}

Tensor cond(const Tensor& A, std::optional<double> p) {
  check_matrix(A, "linalg.cond", false);
  if (!p || *p == 2 || *p == -2) {
    Tensor s = svdvals(A);
    Tensor big = amax(s, {-1}), small = amin(s, {-1});
    return (p && *p == -2) ? div(small, big) : div(big, small);
  }
  check_matrix(A, "linalg.cond", true);
  InvEx i = inv_ex(A, false);
  // A singular matrix has an infinite condition number (its inverse's norm): inf where info != 0.
  Tensor c = mul(matrix_norm(A, *p), matrix_norm(i.inverse, *p));
  return where(ne(i.info, 0), full_like(c, std::numeric_limits<double>::infinity()), c);
}

Tensor cond(const Tensor& A, std::string_view p) {
  check_matrix(A, "linalg.cond", true);
  InvEx i = inv_ex(A, false);
  Tensor c = mul(matrix_norm(A, p), matrix_norm(i.inverse, p));
  return where(ne(i.info, 0), full_like(c, std::numeric_limits<double>::infinity()), c);
}

}  // namespace kiln::linalg
