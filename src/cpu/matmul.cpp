#include "cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "cpu/clones.h"

namespace kiln::cpu {

namespace {

// How BLAS can read a rows x cols matrix with these element strides without a copy: row-major with unit
// inner stride (NoTrans), or the transpose of such a matrix (Trans). ld must be >= 1 and cover a row.
struct BlasView {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};
std::optional<BlasView> blas_view(int64_t srow, int64_t scol, int64_t rows, int64_t cols) {
  const int64_t c1 = std::max<int64_t>(cols, 1), r1 = std::max<int64_t>(rows, 1);
  if ((cols == 1 || scol == 1) && (rows == 1 || srow >= c1)) return BlasView{CblasNoTrans, rows == 1 ? c1 : srow};
  if ((rows == 1 || srow == 1) && (cols == 1 || scol >= r1)) return BlasView{CblasTrans, cols == 1 ? r1 : scol};
  return std::nullopt;
}

// Below this much work per matrix (n*m*k) a batch runs one matrix per thread: BLAS's own threads would
// spend more on start-up than they save on a tiny product.
constexpr int64_t kSmallGemm = 1 << 18;

template <class T>
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int n, int m, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else if constexpr (std::is_same_v<T, double>)
    cblas_dgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_cgemm(CblasRowMajor, ta, tb, n, m, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}

// c [1, m] = alpha a [1, k] op(b) [k, m] + beta c as one matrix-vector product: a gemm with one row packs
// all of op(b) first (OpenBLAS), which for a decode step's linear layers costs more than the product.
// x is a's row (elements incx apart), b as the BlasView describes it.
template <class T>
void blas_gemv_row(CBLAS_TRANSPOSE tb, int m, int k, T alpha, const T* x, int incx, const T* b, int ldb, T beta,
                   T* c) {
  // tb == NoTrans: b is k x m row-major, c = b^T x; Trans: b is stored m x k row-major, c = b x.
  const CBLAS_TRANSPOSE t = tb == CblasNoTrans ? CblasTrans : CblasNoTrans;
  // beta = 0 must ignore c's old contents (possibly NaN): some BLAS releases scale y by beta instead.
  if (beta == T(0)) std::fill_n(c, m, T(0));
  const int rows = tb == CblasNoTrans ? k : m, cols = tb == CblasNoTrans ? m : k;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemv(CblasRowMajor, t, rows, cols, alpha, b, ldb, x, incx, beta, c, 1);
  else if constexpr (std::is_same_v<T, double>)
    cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, b, ldb, x, incx, beta, c, 1);
  else
    cblas_cgemv(CblasRowMajor, t, rows, cols, &alpha, b, ldb, x, incx, &beta, c, 1);
}

template <class T>
T scalar_as(const Scalar& s) {
  if constexpr (std::is_same_v<T, Complex64>) return s.to_complex();
  else return static_cast<T>(s.to_double());
}

template <class T>
void gemm_blas(const Tensor& c, Tensor a, Tensor b, const Scalar& alpha_s, const Scalar& beta_s) {
  const int64_t B = c.size(0), n = c.size(1), m = c.size(2), k = a.size(2);
  KILN_CHECK(n <= INT_MAX && m <= INT_MAX && k <= INT_MAX, "matmul: sizes n=", n, ", m=", m, ", k=", k,
             " exceed what BLAS accepts (2^31 - 1)");
  auto va = blas_view(a.stride(1), a.stride(2), n, k);
  if (!va) {
    a = a.contiguous();
    va = blas_view(a.stride(1), a.stride(2), n, k);
  }
  auto vb = blas_view(b.stride(1), b.stride(2), k, m);
  if (!vb) {
    b = b.contiguous();
    vb = blas_view(b.stride(1), b.stride(2), k, m);
  }
  const T alpha = scalar_as<T>(alpha_s), beta = scalar_as<T>(beta_s);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* pc = static_cast<T*>(c.data_ptr());
  const int64_t sa = a.stride(0), sb = b.stride(0);
  auto one = [&](int64_t i) {
    if (n == 1 && k > 0) {
      // a's one row: contiguous (NoTrans) or one column of its stored transpose, lda apart (Trans).
      const int incx = va->trans == CblasNoTrans ? 1 : static_cast<int>(va->ld);
      blas_gemv_row<T>(vb->trans, static_cast<int>(m), static_cast<int>(k), alpha, pa + i * sa, incx, pb + i * sb,
                       static_cast<int>(vb->ld), beta, pc + i * n * m);
      return;
    }
    blas_gemm<T>(va->trans, vb->trans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha,
                 pa + i * sa, static_cast<int>(va->ld), pb + i * sb, static_cast<int>(vb->ld), beta, pc + i * n * m,
                 static_cast<int>(std::max<int64_t>(m, 1)));
  };
  if (B > 1 && n * m * std::max<int64_t>(k, 1) < kSmallGemm) {
    // One thread per matrix. The OpenMP build of OpenBLAS runs single-threaded inside a parallel region by
    // itself (and its openblas_set_num_threads would set OpenMP's own count: this region would get one
    // thread); another build's pool must be told not to add threads of its own.
    const bool shared_pool = openblas_get_parallel() == 2;
    const int blas_threads = openblas_get_num_threads();
    if (!shared_pool) openblas_set_num_threads(1);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B; ++i) one(i);
    if (!shared_pool) openblas_set_num_threads(blas_threads);
  } else {
    for (int64_t i = 0; i < B; ++i) one(i);
  }
}

// Integer products wrap modulo 2^bits, as PyTorch's CPU kernels do; accumulating in uint64 gives the same
// low bits without signed-overflow UB.
template <class T>
void gemm_int(const Tensor& c, const Tensor& a, const Tensor& b, const Scalar& alpha_s, const Scalar& beta_s) {
  const int64_t B = c.size(0), n = c.size(1), m = c.size(2), k = a.size(2);
  const uint64_t alpha = static_cast<uint64_t>(alpha_s.to_int64()), beta = static_cast<uint64_t>(beta_s.to_int64());
  const bool use_c = beta_s.to_int64() != 0;
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* pc = static_cast<T*>(c.data_ptr());
  const int64_t as0 = a.stride(0), as1 = a.stride(1), as2 = a.stride(2);
  const int64_t bs0 = b.stride(0), bs1 = b.stride(1), bs2 = b.stride(2);
  auto as_u = [](T v) { return static_cast<uint64_t>(static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(v)); };
#pragma omp parallel for schedule(static) if (B * n * m * std::max<int64_t>(k, 1) > (1 << 16))
  for (int64_t row = 0; row < B * n; ++row) {
    const int64_t bi = row / n, i = row % n;
    std::vector<uint64_t> acc(static_cast<size_t>(m), 0);
    for (int64_t p = 0; p < k; ++p) {
      const uint64_t av = as_u(pa[bi * as0 + i * as1 + p * as2]);
      const T* brow = pb + bi * bs0 + p * bs1;
      for (int64_t j = 0; j < m; ++j) acc[j] += av * as_u(brow[j * bs2]);
    }
    T* crow = pc + row * m;
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t prev = use_c ? beta * as_u(crow[j]) : 0;
      crow[j] = static_cast<T>(prev + alpha * acc[j]);
    }
  }
}

// On AVX2 + F16C CPUs two or more rows of a go to half_gemm_nt (cpu/f16c.cpp: tiles of 4 rows of a by 3 of b,
// b widened in registers) and one row to the one-row dot products. Elsewhere (or with KILN_HALF_GEMM=blas) up
// to kHalfInPlaceRows rows of a read b in place (each weight widened once per group of four rows) and more rows
// widen slices of b to f32 for one sgemm each.
constexpr int64_t kHalfInPlaceRows = 16;
// The f32 slice of b for the sgemm path: 16 MB.
constexpr int64_t kHalfSliceElems = int64_t{1} << 22;

// The f32 slice of b, kept per thread between products and never initialised: a fresh 16 MB vector per product
// would be zeroed and faulted in page by page each time.
float* half_slice_buffer(size_t n) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local size_t cap = 0;
  if (cap < n) {
    buf.reset();
    buf.reset(new float[n]);
    cap = n;
  }
  return buf.get();
}

#if KILN_F16C_KERNELS
// Whether half_gemm_nt takes the products of two or more rows (KILN_HALF_GEMM=blas: the older paths, for A/B runs).
bool half_gemm_in_registers() {
  static const bool yes = [] {
    const char* v = std::getenv("KILN_HALF_GEMM");
    return !(v != nullptr && std::string(v) == "blas");
  }();
  return yes;
}
#endif

template <class T>
void gemm_half_kernel(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta) {
  const int64_t B = c.size(0), n = c.size(1), m = c.size(2), k = a.size(2);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  float* pc = c.data<float>();
  const int64_t sa = a.stride(0), sar = a.stride(1), sb = b.stride(0), sbm = b.stride(2);
  const int64_t sc = c.stride(0), ldc = c.stride(1);  // c may be a block of columns of a wider matrix
  const std::unique_ptr<float[]> x(new float[static_cast<size_t>(n * k)]);  // every element written below
  for (int64_t bi = 0; bi < B; ++bi) {
#pragma omp parallel for schedule(static) if (n * k > (1 << 16))
    for (int64_t r = 0; r < n; ++r) simd_widen(pa + bi * sa + r * sar, k, x.get() + r * k);
    const float* xp = x.get();
    float* cb = pc + bi * sc;
    const T* base = pb + bi * sb;
#if KILN_F16C_KERNELS
    if (n >= 2 && k > 0 && have_f16c() && half_gemm_in_registers()) {
      // Blocks of 48 weight rows (16 tiles of three) handed to the threads as they finish (the cores of a shared
      // machine do not run at one speed); every block meets all n rows of x.
      const int64_t blocks = (m + 47) / 48;
      const bool bf = std::is_same_v<T, BFloat16>;
#pragma omp parallel for schedule(dynamic) if (n * m * k > (1 << 16))
      for (int64_t blk = 0; blk < blocks; ++blk)
        half_gemm_nt(bf, n, k, xp, k, reinterpret_cast<const uint16_t*>(base), sbm, blk * 48,
                     std::min(m, blk * 48 + 48), cb, ldc, alpha, beta);
      continue;
    }
#endif
    if (n <= kHalfInPlaceRows || k == 0) {
#pragma omp parallel for schedule(static) if (m * k > (1 << 16))
      for (int64_t j = 0; j < m; ++j) {
        // simd_dot_rows has AVX2 clones (cpu/clones.h): the portable build's SSE2 loop converted and summed too
        // slowly to keep up with memory.
        float d[4];
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
          const int64_t rows = std::min<int64_t>(4, n - r0);
          const T* w = base + j * sbm;
          switch (rows) {
            case 1: simd_dot_rows<1>(xp + r0 * k, k, w, k, d); break;
            case 2: simd_dot_rows<2>(xp + r0 * k, k, w, k, d); break;
            case 3: simd_dot_rows<3>(xp + r0 * k, k, w, k, d); break;
            default: simd_dot_rows<4>(xp + r0 * k, k, w, k, d); break;
          }
          for (int64_t r = 0; r < rows; ++r) {
            float& out = cb[(r0 + r) * ldc + j];
            out = beta == 0.f ? alpha * d[r] : beta * out + alpha * d[r];  // beta 0: c is not read (BLAS's rule)
          }
        }
      }
      continue;
    }
    const int64_t slice = std::clamp<int64_t>(kHalfSliceElems / std::max<int64_t>(k, 1), 1, m);
    float* const wf = half_slice_buffer(static_cast<size_t>(slice * k));
    for (int64_t j0 = 0; j0 < m; j0 += slice) {
      const int64_t rows = std::min(slice, m - j0);
#pragma omp parallel for schedule(static) if (rows * k > (1 << 16))
      for (int64_t r = 0; r < rows; ++r) simd_widen(base + (j0 + r) * sbm, k, wf + r * k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
                  static_cast<int>(k), alpha, xp, static_cast<int>(k), wf, static_cast<int>(k), beta, cb + j0,
                  static_cast<int>(ldc));
    }
  }
}
}  // namespace


bool gemm_half_takes(const Tensor& a, const Tensor& b) {
  return a.dim() == 3 && a.dtype() == b.dtype() && (a.dtype() == DType::BF16 || a.dtype() == DType::F16) &&
         (a.size(2) <= 1 || a.stride(2) == 1) && (b.size(1) <= 1 || b.stride(1) == 1);
}

void gemm_half(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta) {
  if (c.numel() == 0) return;
#if KILN_HAVE_DNNL
  const int64_t done = c.size(1) > kHalfInPlaceRows ? dnnl_gemm_half(c, a, b, alpha, beta) : 0;
  if (done == c.size(2)) return;
  const Tensor cr = c.narrow(2, done, c.size(2) - done), br = b.narrow(2, done, c.size(2) - done);
#else
  const Tensor &cr = c, &br = b;
#endif
  if (a.dtype() == DType::BF16) gemm_half_kernel<BFloat16>(cr, a, br, alpha, beta);
  else gemm_half_kernel<Half>(cr, a, br, alpha, beta);
}

std::string blas_description() {
  std::string config = openblas_get_config();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  switch (openblas_get_parallel()) {
    case 0: return config + " (single-threaded)";
    case 1: return config + " (its own threads)";
    case 2: return config + " (OpenMP threads)";
    default: return config;
  }
}

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Scalar& alpha, const Scalar& beta) {
  if (c.numel() == 0) return;
  visit_dtypes<dset(DType::F32, DType::F64, DType::C64) | kIntTypes>(c.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      gemm_int<T>(c, a, b, alpha, beta);
    } else {
      if (beta.to_double() == 0.0 && beta.to_complex().im == 0.f) Tensor(c).zero_();  // beta = 0 ignores NaN in c
      if (a.size(2) == 0) {
        // k = 0: only beta * c remains; done here rather than trusting every BLAS with k = 0.
        const T bv = scalar_as<T>(beta);
        T* pc = static_cast<T*>(c.data_ptr());
        for (int64_t i = 0; i < c.numel(); ++i) {
          if constexpr (std::is_same_v<T, Complex64>)
            pc[i] = Complex64(pc[i].re * bv.re - pc[i].im * bv.im, pc[i].re * bv.im + pc[i].im * bv.re);
          else pc[i] = pc[i] * bv;
        }
        return;
      }
      gemm_blas<T>(c, a, b, alpha, beta);
    }
  });
}

}  // namespace kiln::cpu
