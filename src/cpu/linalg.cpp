// Batched LAPACK and BLAS trsm on the CPU (src/cpu/linalg.h).
#include "cpu/linalg.h"

#include <cblas.h>

#include <complex>
#include <limits>
#include <vector>

#include "core/dispatch.h"

using cf = std::complex<float>;

// LAPACK's Fortran entry points (32-bit integers: Debian's OpenBLAS is LP64). Character arguments carry
// gfortran's hidden lengths at the end; OpenBLAS's own C implementations ignore them.
extern "C" {
void sgetrf_(const int*, const int*, float*, const int*, int*, int*);
void dgetrf_(const int*, const int*, double*, const int*, int*, int*);
void cgetrf_(const int*, const int*, cf*, const int*, int*, int*);
void sgetrs_(const char*, const int*, const int*, const float*, const int*, const int*, float*, const int*, int*, size_t);
void dgetrs_(const char*, const int*, const int*, const double*, const int*, const int*, double*, const int*, int*, size_t);
void cgetrs_(const char*, const int*, const int*, const cf*, const int*, const int*, cf*, const int*, int*, size_t);
void sgetri_(const int*, float*, const int*, const int*, float*, const int*, int*);
void dgetri_(const int*, double*, const int*, const int*, double*, const int*, int*);
void cgetri_(const int*, cf*, const int*, const int*, cf*, const int*, int*);
void spotrf_(const char*, const int*, float*, const int*, int*, size_t);
void dpotrf_(const char*, const int*, double*, const int*, int*, size_t);
void cpotrf_(const char*, const int*, cf*, const int*, int*, size_t);
void sgeqrf_(const int*, const int*, float*, const int*, float*, float*, const int*, int*);
void dgeqrf_(const int*, const int*, double*, const int*, double*, double*, const int*, int*);
void cgeqrf_(const int*, const int*, cf*, const int*, cf*, cf*, const int*, int*);
void sorgqr_(const int*, const int*, const int*, float*, const int*, const float*, float*, const int*, int*);
void dorgqr_(const int*, const int*, const int*, double*, const int*, const double*, double*, const int*, int*);
void cungqr_(const int*, const int*, const int*, cf*, const int*, const cf*, cf*, const int*, int*);
void sgesdd_(const char*, const int*, const int*, float*, const int*, float*, float*, const int*, float*, const int*,
             float*, const int*, int*, int*, size_t);
void dgesdd_(const char*, const int*, const int*, double*, const int*, double*, double*, const int*, double*,
             const int*, double*, const int*, int*, int*, size_t);
void cgesdd_(const char*, const int*, const int*, cf*, const int*, float*, cf*, const int*, cf*, const int*, cf*,
             const int*, float*, int*, int*, size_t);
void ssyevd_(const char*, const char*, const int*, float*, const int*, float*, float*, const int*, int*, const int*,
             int*, size_t, size_t);
void dsyevd_(const char*, const char*, const int*, double*, const int*, double*, double*, const int*, int*,
             const int*, int*, size_t, size_t);
void cheevd_(const char*, const char*, const int*, cf*, const int*, float*, cf*, const int*, float*, const int*, int*,
             const int*, int*, size_t, size_t);
}

namespace kiln::cpu {

namespace {

// LAPACK's integers are 32-bit: every dimension and product that reaches it must fit.
int lapack_int(int64_t v, const char* what) {
  KILN_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "linalg: ", what, " = ", v,
             " exceeds LAPACK's 32-bit indices (at most 2^31 - 1)");
  return static_cast<int>(v);
}

template <class T>
struct Real {
  using type = T;
};
template <>
struct Real<cf> {
  using type = float;
};
template <class T>
using real_t = typename Real<T>::type;

// The element type kiln stores -> the one LAPACK takes.
template <class T>
struct Lapack;
template <>
struct Lapack<float> {
  using T = float;
};
template <>
struct Lapack<double> {
  using T = double;
};
template <>
struct Lapack<Complex64> {
  using T = cf;
};

// getrf and friends, selected by type.
void getrf(int m, int n, float* a, int lda, int* p, int* info) { sgetrf_(&m, &n, a, &lda, p, info); }
void getrf(int m, int n, double* a, int lda, int* p, int* info) { dgetrf_(&m, &n, a, &lda, p, info); }
void getrf(int m, int n, cf* a, int lda, int* p, int* info) { cgetrf_(&m, &n, a, &lda, p, info); }
void getrs(char t, int n, int k, const float* a, const int* p, float* b, int* info) { sgetrs_(&t, &n, &k, a, &n, p, b, &n, info, 1); }
void getrs(char t, int n, int k, const double* a, const int* p, double* b, int* info) { dgetrs_(&t, &n, &k, a, &n, p, b, &n, info, 1); }
void getrs(char t, int n, int k, const cf* a, const int* p, cf* b, int* info) { cgetrs_(&t, &n, &k, a, &n, p, b, &n, info, 1); }
void getri(int n, float* a, const int* p, float* w, int lw, int* info) { sgetri_(&n, a, &n, p, w, &lw, info); }
void getri(int n, double* a, const int* p, double* w, int lw, int* info) { dgetri_(&n, a, &n, p, w, &lw, info); }
void getri(int n, cf* a, const int* p, cf* w, int lw, int* info) { cgetri_(&n, a, &n, p, w, &lw, info); }
void potrf(char u, int n, float* a, int* info) { spotrf_(&u, &n, a, &n, info, 1); }
void potrf(char u, int n, double* a, int* info) { dpotrf_(&u, &n, a, &n, info, 1); }
void potrf(char u, int n, cf* a, int* info) { cpotrf_(&u, &n, a, &n, info, 1); }
void geqrf(int m, int n, float* a, float* tau, float* w, int lw, int* info) { sgeqrf_(&m, &n, a, &m, tau, w, &lw, info); }
void geqrf(int m, int n, double* a, double* tau, double* w, int lw, int* info) { dgeqrf_(&m, &n, a, &m, tau, w, &lw, info); }
void geqrf(int m, int n, cf* a, cf* tau, cf* w, int lw, int* info) { cgeqrf_(&m, &n, a, &m, tau, w, &lw, info); }
void orgqr(int m, int n, int k, float* a, const float* tau, float* w, int lw, int* info) { sorgqr_(&m, &n, &k, a, &m, tau, w, &lw, info); }
void orgqr(int m, int n, int k, double* a, const double* tau, double* w, int lw, int* info) { dorgqr_(&m, &n, &k, a, &m, tau, w, &lw, info); }
void orgqr(int m, int n, int k, cf* a, const cf* tau, cf* w, int lw, int* info) { cungqr_(&m, &n, &k, a, &m, tau, w, &lw, info); }

// Runs f(i) for every batch element: in parallel over the threads when there are several (each LAPACK call
// on one thread), else f(0) alone with OpenBLAS's threads.
template <class F>
void for_batch(int64_t batch, F&& f) {
  if (batch == 1) {
    f(0);
    return;
  }
  // Chunks of several matrices: a batch of 65536 tiny matrices would otherwise pay the scheduler per matrix.
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < batch; ++i) f(i);
}

// Per-thread workspace that grows to the largest size asked and is reused across the matrices of a batch
// (slot separates the buffers one routine needs at once).
template <class T>
T* scratch(size_t n, int slot = 0) {
  thread_local std::vector<T> buffers[3];
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

template <class F>
void dispatch(DType t, const char* op, F&& f) {
  visit_dtypes<dset(DType::F32, DType::F64, DType::C64)>(t, op, [&](auto tag) {
    using S = typename decltype(tag)::type;
    f(static_cast<typename Lapack<S>::T*>(nullptr));
  });
}

}  // namespace

void lapack_getrf(Tensor& a, Tensor& piv, Tensor& info) {
  const int64_t batch = a.size(0);
  const int n = lapack_int(a.size(1), "columns"), m = lapack_int(a.size(2), "rows");
  const int64_t mn = std::min(m, n);
  int* p = piv.data<int32_t>();
  int* inf = info.data<int32_t>();
  dispatch(a.dtype(), "lu_factor", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* base = static_cast<T*>(a.data_ptr());
    for_batch(batch, [&](int64_t i) {
      if (m == 0 || n == 0) {
        inf[i] = 0;
        return;
      }
      getrf(m, n, base + i * int64_t(m) * n, m, p + i * mn, &inf[i]);
    });
  });
}

void lapack_getrs(const Tensor& lu, const Tensor& piv, Tensor& b, char trans) {
  const int64_t batch = b.size(0);
  const int n = lapack_int(lu.size(1), "n"), k = lapack_int(b.size(1), "right-hand sides");
  const int* p = piv.data<int32_t>();
  dispatch(b.dtype(), "lu_solve", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* A = static_cast<const T*>(lu.data_ptr());
    T* B = static_cast<T*>(b.data_ptr());
    const bool shared = lu.size(0) == 1;  // one factorisation for every right-hand side batch
    for_batch(batch, [&](int64_t i) {
      if (n == 0 || k == 0) return;
      int info = 0;
      const int64_t j = shared ? 0 : i;
      getrs(trans, n, k, A + j * int64_t(n) * n, p + j * n, B + i * int64_t(n) * k, &info);
    });
  });
}

void lapack_getri(Tensor& lu, const Tensor& piv, Tensor& info) {
  const int64_t batch = lu.size(0);
  const int n = lapack_int(lu.size(1), "n");
  const int* p = piv.data<int32_t>();
  int* inf = info.data<int32_t>();
  dispatch(lu.dtype(), "inv", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* A = static_cast<T*>(lu.data_ptr());
    if (n == 0) return;
    T query{};
    int qi = 0;
    getri(n, A, p, &query, -1, &qi);
    const int lw = std::max(1, static_cast<int>(std::real(query)));
    for_batch(batch, [&](int64_t i) {
      if (inf[i] != 0) return;  // singular: getrf already said so; getri would divide by the zero pivot
      getri(n, A + i * int64_t(n) * n, p + i * n, scratch<T>(static_cast<size_t>(lw)), lw, &inf[i]);
    });
  });
}

void lapack_potrf(Tensor& a, bool upper, Tensor& info) {
  const int64_t batch = a.size(0);
  const int n = lapack_int(a.size(1), "n");
  int* inf = info.data<int32_t>();
  dispatch(a.dtype(), "cholesky", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* A = static_cast<T*>(a.data_ptr());
    for_batch(batch, [&](int64_t i) {
      inf[i] = 0;
      if (n > 0) potrf(upper ? 'U' : 'L', n, A + i * int64_t(n) * n, &inf[i]);
    });
  });
}

void lapack_geqrf(Tensor& a, Tensor& tau) {
  const int64_t batch = a.size(0);
  const int n = lapack_int(a.size(1), "columns"), m = lapack_int(a.size(2), "rows");
  const int64_t mn = std::min(m, n);
  dispatch(a.dtype(), "qr", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* A = static_cast<T*>(a.data_ptr());
    T* t = static_cast<T*>(tau.data_ptr());
    if (m == 0 || n == 0) return;
    T query{};
    int qi = 0;
    geqrf(m, n, A, t, &query, -1, &qi);
    const int lw = std::max(1, static_cast<int>(std::real(query)));
    for_batch(batch, [&](int64_t i) {
      int info = 0;
      geqrf(m, n, A + i * int64_t(m) * n, t + i * mn, scratch<T>(static_cast<size_t>(lw)), lw, &info);
    });
  });
}

void lapack_orgqr(Tensor& q, const Tensor& tau, int64_t k64) {
  const int64_t batch = q.size(0);
  const int n = lapack_int(q.size(1), "columns"), m = lapack_int(q.size(2), "rows");
  const int k = lapack_int(k64, "reflectors");
  const int64_t taus = tau.size(1);
  dispatch(q.dtype(), "qr", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* Q = static_cast<T*>(q.data_ptr());
    const T* t = static_cast<const T*>(tau.data_ptr());
    if (m == 0 || n == 0) return;
    T query{};
    int qi = 0;
    orgqr(m, n, k, Q, t, &query, -1, &qi);
    const int lw = std::max(1, static_cast<int>(std::real(query)));
    for_batch(batch, [&](int64_t i) {
      int info = 0;
      orgqr(m, n, k, Q + i * int64_t(m) * n, t + i * taus, scratch<T>(static_cast<size_t>(lw)), lw, &info);
    });
  });
}

void lapack_gesdd(Tensor& a, Tensor& s, Tensor& u, Tensor& vt, char jobz, Tensor& info) {
  const int64_t batch = a.size(0);
  const int n = lapack_int(a.size(1), "columns"), m = lapack_int(a.size(2), "rows");
  const int mn = std::min(m, n), mx = std::max(m, n);
  const int ldu = std::max(1, m);
  const int ldvt = std::max(1, jobz == 'A' ? n : jobz == 'S' ? mn : 1);
  const int64_t u_size = jobz == 'N' ? 0 : int64_t(m) * (jobz == 'A' ? m : mn);
  const int64_t vt_size = jobz == 'N' ? 0 : int64_t(n) * (jobz == 'A' ? n : mn);
  int* inf = info.data<int32_t>();
  dispatch(a.dtype(), "svd", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using R = real_t<T>;
    T* A = static_cast<T*>(a.data_ptr());
    R* S = static_cast<R*>(s.data_ptr());
    T* U = jobz == 'N' ? nullptr : static_cast<T*>(u.data_ptr());
    T* VT = jobz == 'N' ? nullptr : static_cast<T*>(vt.data_ptr());
    if (mn == 0) {
      for (int64_t i = 0; i < batch; ++i) inf[i] = 0;
      return;
    }
    // Workspace from a query; rwork for the complex routine as LAPACK 3.7+ documents it.
    const int64_t lrwork = jobz == 'N' ? 7 * int64_t(mn)
                                       : std::max<int64_t>(5 * int64_t(mn) * mn + 5 * mn, 2 * int64_t(mx) * mn + 2 * int64_t(mn) * mn + mn);
    T query{};
    int qi = 0;
    std::vector<int> iwork_q(8 * static_cast<size_t>(mn));
    std::vector<R> rwork_q(std::is_same_v<T, cf> ? static_cast<size_t>(lrwork) : 1);
    T dummy_u{}, dummy_vt{};
    auto call = [&](T* a, R* s, T* u, T* vt, T* work, int lw, R* rwork, int* iwork, int* info) {
      if constexpr (std::is_same_v<T, float>)
        sgesdd_(&jobz, &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lw, iwork, info, 1);
      else if constexpr (std::is_same_v<T, double>)
        dgesdd_(&jobz, &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lw, iwork, info, 1);
      else
        cgesdd_(&jobz, &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lw, rwork, iwork, info, 1);
    };
    std::vector<R> s_q(static_cast<size_t>(mn));
    call(A, s_q.data(), U ? U : &dummy_u, VT ? VT : &dummy_vt, &query, -1, rwork_q.data(), iwork_q.data(), &qi);
    const int lw = std::max(1, static_cast<int>(std::real(query)));
    for_batch(batch, [&](int64_t i) {
      T du{}, dv{};
      call(A + i * int64_t(m) * n, S + i * mn, U ? U + i * u_size : &du, VT ? VT + i * vt_size : &dv,
           scratch<T>(static_cast<size_t>(lw)), lw, scratch<R>(std::is_same_v<T, cf> ? static_cast<size_t>(lrwork) : 1, 1),
           scratch<int>(8 * static_cast<size_t>(mn), 2), &inf[i]);
    });
  });
}

void lapack_syevd(Tensor& a, Tensor& w, bool vectors, bool upper, Tensor& info) {
  const int64_t batch = a.size(0);
  const int n = lapack_int(a.size(1), "n");
  const char jobz = vectors ? 'V' : 'N', uplo = upper ? 'U' : 'L';
  int* inf = info.data<int32_t>();
  dispatch(a.dtype(), "eigh", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using R = real_t<T>;
    T* A = static_cast<T*>(a.data_ptr());
    R* W = static_cast<R*>(w.data_ptr());
    if (n == 0) {
      for (int64_t i = 0; i < batch; ++i) inf[i] = 0;
      return;
    }
    auto call = [&](T* a, R* w, T* work, int lw, R* rwork, int lrw, int* iwork, int liw, int* info) {
      if constexpr (std::is_same_v<T, float>)
        ssyevd_(&jobz, &uplo, &n, a, &n, w, work, &lw, iwork, &liw, info, 1, 1);
      else if constexpr (std::is_same_v<T, double>)
        dsyevd_(&jobz, &uplo, &n, a, &n, w, work, &lw, iwork, &liw, info, 1, 1);
      else
        cheevd_(&jobz, &uplo, &n, a, &n, w, work, &lw, rwork, &lrw, iwork, &liw, info, 1, 1);
    };
    T query{};
    R rquery{};
    int iquery = 0, qi = 0;
    std::vector<R> wq(static_cast<size_t>(n));
    call(A, wq.data(), &query, -1, &rquery, -1, &iquery, -1, &qi);
    const int lw = std::max(1, static_cast<int>(std::real(query)));
    const int lrw = std::max(1, static_cast<int>(rquery));
    const int liw = std::max(1, iquery);
    for_batch(batch, [&](int64_t i) {
      call(A + i * int64_t(n) * n, W + i * n, scratch<T>(static_cast<size_t>(lw)), lw,
           scratch<R>(static_cast<size_t>(lrw), 1), lrw, scratch<int>(static_cast<size_t>(liw), 2), liw, &inf[i]);
    });
  });
}

void blas_trsm(const Tensor& a, Tensor& b, bool left, bool upper, bool unit) {
  const int64_t batch = b.size(0);
  const int rows = lapack_int(b.size(1), "rows"), cols = lapack_int(b.size(2), "columns");
  const int n = lapack_int(a.size(1), "n");
  const bool shared = a.size(0) == 1;
  const auto side = left ? CblasLeft : CblasRight;
  const auto uplo = upper ? CblasUpper : CblasLower;
  const auto diag = unit ? CblasUnit : CblasNonUnit;
  if (rows == 0 || cols == 0) return;
  dispatch(b.dtype(), "solve_triangular", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* A = static_cast<const T*>(a.data_ptr());
    T* B = static_cast<T*>(b.data_ptr());
    for_batch(batch, [&](int64_t i) {
      const T* ai = A + (shared ? 0 : i) * int64_t(n) * n;
      T* bi = B + i * int64_t(rows) * cols;
      if constexpr (std::is_same_v<T, float>)
        cblas_strsm(CblasRowMajor, side, uplo, CblasNoTrans, diag, rows, cols, 1.0f, ai, n, bi, cols);
      else if constexpr (std::is_same_v<T, double>)
        cblas_dtrsm(CblasRowMajor, side, uplo, CblasNoTrans, diag, rows, cols, 1.0, ai, n, bi, cols);
      else {
        const cf one(1.0f, 0.0f);
        cblas_ctrsm(CblasRowMajor, side, uplo, CblasNoTrans, diag, rows, cols, &one, ai, n, bi, cols);
      }
    });
  });
}

}  // namespace kiln::cpu
