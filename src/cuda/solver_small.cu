// Batched LU (n <= 64; complex n <= 128), inverse and LU solves (n <= 32) of small square matrices: a warp (n <= 32)
// or a block per matrix, the matrix in shared memory, the whole batch in one launch. cuSOLVER's per-matrix routines launch several kernels per
// matrix, which dominates for the batches of tiny systems that graphics, robotics and per-head attention
// math produce.
//
// Buffers are column-major, as LAPACK's (src/cuda/solver.h): element (r, c) of matrix b at b * n * n + c * n + r.
#include <math_constants.h>

#include <cuda/std/complex>
#include <cuda/std/limits>

#include "cuda/kernels/linalg_small.cuh"
#include "cuda/launch.h"
#include "cuda/solver.h"

namespace kiln::cuda {

namespace {

using cfloat = ::cuda::std::complex<float>;

template <class T> struct DeviceType { using type = T; };
template <> struct DeviceType<Complex64> { using type = cfloat; };

// The pivot's magnitude as LAPACK's i?amax measures it: |x| for reals, |re| + |im| for complex.
__device__ inline float pivot_abs(float x) { return fabsf(x); }
__device__ inline double pivot_abs(double x) { return fabs(x); }
__device__ inline float pivot_abs(cfloat x) { return fabsf(x.real()) + fabsf(x.imag()); }

template <class T> __device__ inline bool is_zero(T x) { return x == T(0); }

constexpr int kWarps = 4;  // matrices per block

// The pivot row of column k, read from `col` (the column's first element) by one warp whose lane l holds rows
// l, l + 32, ... (RPL of them): the first row >= k of the largest magnitude (ties: the lower index, as i?amax),
// the same in every lane; k when every candidate is NaN (LAPACK's i?amax keeps the first).
template <class T, int RPL>
__device__ int warp_pivot(const T* col, int k, int n, int lane) {
  using R = decltype(pivot_abs(T()));
  R best = R(-1);
  int where = n;
#pragma unroll
  for (int j = 0; j < RPL; ++j) {
    const int r = lane + 32 * j;
    if (r >= k && r < n) {
      const R v = pivot_abs(col[r]);
      if (v > best) {
        best = v;
        where = r;
      }
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const R ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int ow = __shfl_xor_sync(0xffffffffu, where, off);
    if (ob > best || (ob == best && ow < where)) {
      best = ob;
      where = ow;
    }
  }
  return where < n ? where : k;
}

// LU with partial pivoting of each matrix in place, one warp per matrix (W per block), n <= 32 RPL: lane l holds
// rows l, l + 32, ... during the pivot search and the elimination, and columns l, l + 32, ... during the row
// swaps. Pivots are 1-based; info is the first zero pivot's 1-based index (0: none), as getrf.
template <class T, int RPL, int W>
__global__ void __launch_bounds__(32 * W) lu_small_kernel(T* __restrict__ a, int32_t* __restrict__ piv,
                                                          int32_t* __restrict__ info, int n, int64_t batch) {
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * W + warp;
  if (b >= batch) return;
  T* s = reinterpret_cast<T*>(smem_raw) + warp * n * n;
  T* g = a + b * n * n;
  for (int i = lane; i < n * n; i += 32) s[i] = g[i];
  __syncwarp();
  int first_zero = 0;
  for (int k = 0; k < n; ++k) {
    const int p = warp_pivot<T, RPL>(s + k * n, k, n, lane);
    if (lane == 0) piv[b * n + k] = p + 1;
    const T pivot = s[k * n + p];
    __syncwarp();
    if (is_zero(pivot)) {
      // LAPACK records the first zero pivot and goes on; the column below it is zero, so nothing to eliminate.
      if (first_zero == 0) first_zero = k + 1;
      continue;
    }
    if (p != k) {
#pragma unroll
      for (int j = 0; j < RPL; ++j) {
        const int c = lane + 32 * j;
        if (c < n) {
          const T t = s[c * n + k];
          s[c * n + k] = s[c * n + p];
          s[c * n + p] = t;
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < RPL; ++j) {
      const int r = lane + 32 * j;
      if (r > k && r < n) {
        const T l = s[k * n + r] / pivot;
        s[k * n + r] = l;
        for (int c = k + 1; c < n; ++c) s[c * n + r] -= l * s[c * n + k];
      }
    }
    __syncwarp();
  }
  for (int i = lane; i < n * n; i += 32) g[i] = s[i];
  if (lane == 0) info[b] = first_zero;
}

// LU with partial pivoting of one matrix per block of G R threads, 32 < n <= R, the matrix in shared memory with
// an odd column stride (the row swaps then read across columns without bank conflicts). For each column k, warp 0
// finds the pivot, swaps the rows and scales the multipliers by the pivot's reciprocal (as LAPACK's getf2); then
// thread t updates row t % R in the columns c > k with c = t / R (mod G): the multiplier stays in a register, the
// pivot row's entry is a broadcast, and consecutive threads touch consecutive rows. Two block barriers per column.
// `in` and `out` (the same buffer, or two) are column-major, or row-major with `row_major` (no transposes around
// the kernel). Pivots and info as getrf's.
template <class T, int R, int G>
__global__ void __launch_bounds__(G * R) lu_block_kernel(const T* in, T* out, int32_t* __restrict__ piv,
                                                          int32_t* __restrict__ info, int n, bool row_major) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ int zero_pivot;
  T* s = reinterpret_cast<T*>(smem_raw);
  const int ld = n | 1;
  const int64_t b = blockIdx.x;
  const T* gi = in + b * n * n;
  T* go = out + b * n * n;
  int32_t* pv = piv + b * n;
  // Element i of the buffer is (i % n, i / n) column-major, (i / n, i % n) row-major.
  const auto at = [&](int i) -> T& { return row_major ? s[(i % n) * ld + i / n] : s[(i / n) * ld + i % n]; };
  for (int i = threadIdx.x; i < n * n; i += G * R) at(i) = gi[i];
  const int lane = threadIdx.x % 32, r = threadIdx.x % R, cg = threadIdx.x / R;
  int first_zero = 0;
  __syncthreads();
  for (int k = 0; k < n; ++k) {
    if (threadIdx.x < 32) {
      const int p = warp_pivot<T, R / 32>(s + k * ld, k, n, lane);
      const T pivot = s[k * ld + p];
      const bool zero = is_zero(pivot);
      __syncwarp();
      if (zero) {
        // The column below is zero: LAPACK records the first zero pivot and goes on, nothing to eliminate.
        if (first_zero == 0) first_zero = k + 1;
      } else {
        if (p != k) {
          for (int c = lane; c < n; c += 32) {
            const T t = s[c * ld + k];
            s[c * ld + k] = s[c * ld + p];
            s[c * ld + p] = t;
          }
          __syncwarp();  // the swap of column k's rows k and p lands before the scaling reads them
        }
        // LAPACK's getf2 scales by the reciprocal unless the pivot is so small that the reciprocal overflows.
        using Real = decltype(pivot_abs(T()));
        if (pivot_abs(pivot) >= ::cuda::std::numeric_limits<Real>::min()) {
          const T rcp = T(1) / pivot;
          for (int row = k + 1 + lane; row < n; row += 32) s[k * ld + row] = s[k * ld + row] * rcp;
        } else {
          for (int row = k + 1 + lane; row < n; row += 32) s[k * ld + row] = s[k * ld + row] / pivot;
        }
      }
      if (lane == 0) {
        pv[k] = p + 1;
        zero_pivot = zero;
      }
    }
    __syncthreads();
    if (!zero_pivot && r > k && r < n) {
      const T l = s[k * ld + r];
      int c = k + 1 + ((cg - k - 1) & (G - 1));
      for (; c + 3 * G < n; c += 4 * G) {
        T x0 = s[c * ld + r], x1 = s[(c + G) * ld + r], x2 = s[(c + 2 * G) * ld + r], x3 = s[(c + 3 * G) * ld + r];
        x0 = kernels::msub(x0, l, s[c * ld + k]);
        x1 = kernels::msub(x1, l, s[(c + G) * ld + k]);
        x2 = kernels::msub(x2, l, s[(c + 2 * G) * ld + k]);
        x3 = kernels::msub(x3, l, s[(c + 3 * G) * ld + k]);
        s[c * ld + r] = x0;
        s[(c + G) * ld + r] = x1;
        s[(c + 2 * G) * ld + r] = x2;
        s[(c + 3 * G) * ld + r] = x3;
      }
      for (; c < n; c += G) s[c * ld + r] = kernels::msub(s[c * ld + r], l, s[c * ld + k]);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n * n; i += G * R) go[i] = at(i);
  if (threadIdx.x == 0) info[b] = first_zero;
}

// Solves op(A) x = rhs for one right-hand side in place, given A's LU (column-major, n x n) and 1-based pivots.
// x is reached through `at(i)`; `lu(r, c)` reads the factor. trans: 0 A, 1 A^T, 2 A^H.
template <class T, class X, class LU>
__device__ void lu_solve_one(int n, const int32_t* pv, int trans, X&& at, LU&& lu) {
  if (trans == 0) {
    for (int k = 0; k < n; ++k) {  // P x
      const int p = pv[k] - 1;
      if (p != k) {
        const T t = at(k);
        at(k) = at(p);
        at(p) = t;
      }
    }
    for (int i = 1; i < n; ++i) {  // L y = x, unit diagonal
      T acc = at(i);
      for (int l = 0; l < i; ++l) acc -= lu(i, l) * at(l);
      at(i) = acc;
    }
    for (int i = n - 1; i >= 0; --i) {  // U z = y
      T acc = at(i);
      for (int l = i + 1; l < n; ++l) acc -= lu(i, l) * at(l);
      at(i) = acc / lu(i, i);
    }
    return;
  }
  // A^T = U^T L^T P^T (A^H likewise with conjugates): U^T y = x, L^T z = y, then x = P z (swaps in reverse).
  auto f = [trans](T v) {
    if constexpr (std::is_same_v<T, cfloat>) return trans == 2 ? ::cuda::std::conj(v) : v;
    else return v;
  };
  for (int i = 0; i < n; ++i) {
    T acc = at(i);
    for (int l = 0; l < i; ++l) acc -= f(lu(l, i)) * at(l);
    at(i) = acc / f(lu(i, i));
  }
  for (int i = n - 2; i >= 0; --i) {
    T acc = at(i);
    for (int l = i + 1; l < n; ++l) acc -= f(lu(l, i)) * at(l);
    at(i) = acc;
  }
  for (int k = n - 1; k >= 0; --k) {
    const int p = pv[k] - 1;
    if (p != k) {
      const T t = at(k);
      at(k) = at(p);
      at(p) = t;
    }
  }
}

// The inverse from the LU in place: lane j solves A x = e_j into column j of a padded shared copy (stride
// n + 1 keeps the lanes on different banks), then the block writes the result over the LU.
template <class T>
__global__ void __launch_bounds__(32 * kWarps) inverse_small_kernel(T* __restrict__ a, const int32_t* __restrict__ piv,
                                                                    int n, int64_t batch) {
  extern __shared__ unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (b >= batch) return;
  T* s = reinterpret_cast<T*>(smem_raw) + warp * (n * n + n * (n + 1));
  T* x = s + n * n;
  T* g = a + b * n * n;
  const int32_t* pv = piv + b * n;
  for (int i = lane; i < n * n; i += 32) s[i] = g[i];
  __syncwarp();
  if (lane < n) {
    T* col = x + lane * (n + 1);
    for (int i = 0; i < n; ++i) col[i] = T(i == lane ? 1 : 0);
    lu_solve_one<T>(n, pv, 0, [col](int i) -> T& { return col[i]; },
                    [s, n](int r, int c) { return s[c * n + r]; });
  }
  __syncwarp();
  for (int i = lane; i < n * n; i += 32) g[i] = x[(i / n) * (n + 1) + i % n];
}

// LU solves: one thread per (matrix, right-hand side); rhs b [batch, k, n] (column-major n x k).
template <class T>
__global__ void lu_solve_small_kernel(const T* __restrict__ lu, const int32_t* __restrict__ piv, T* __restrict__ rhs,
                                      int n, int64_t k, int64_t batch, int trans) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= batch * k) return;
  const int64_t b = t / k;
  T* x = rhs + t * n;
  const T* f = lu + b * n * n;
  lu_solve_one<T>(n, piv + b * n, trans, [x](int i) -> T& { return x[i]; },
                  [f, n](int r, int c) { return f[c * n + r]; });
}

// sign and log|det| of each matrix from its LU: the diagonal's magnitudes summed as logs and phases multiplied,
// in double; each row swap flips the sign; a zero on the diagonal gives sign 0 and log -inf.
template <class T, class R>
__global__ void slogdet_kernel(const T* __restrict__ lu, const int32_t* __restrict__ piv, T* __restrict__ sign,
                               R* __restrict__ logabs, int64_t n, int64_t batch) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const T* a = lu + b * n * n;
  double log_sum = 0, re = 1, im = 0;
  bool zero = false;
  for (int64_t i = 0; i < n; ++i) {
    const T d = a[i * n + i];
    double dr, di = 0;
    if constexpr (std::is_same_v<T, cfloat>) {
      dr = d.real();
      di = d.imag();
    } else {
      dr = static_cast<double>(d);
    }
    const double mag = hypot(dr, di);
    if (mag == 0) {
      zero = true;
    } else {
      log_sum += log(mag);
      const double pr = dr / mag, pi = di / mag, nr = re * pr - im * pi;
      im = re * pi + im * pr;
      re = nr;
    }
    if (piv[b * n + i] != i + 1) {
      re = -re;
      im = -im;
    }
  }
  if (zero) {
    re = im = 0;
    log_sum = -CUDART_INF;
  }
  if constexpr (std::is_same_v<T, cfloat>) sign[b] = cfloat(static_cast<float>(re), static_cast<float>(im));
  else sign[b] = static_cast<T>(re);
  logabs[b] = static_cast<R>(log_sum);
}

template <class F>
void visit(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::C64: return f(cfloat{});
    default: throw Error(str(op, ": internal error: unexpected dtype ", dtype_name(t)));
  }
}

}  // namespace

void lu_small(Tensor& a, Tensor& piv, Tensor& info) {
  const int n = static_cast<int>(a.size(1));
  const int64_t batch = a.size(0);
  if (batch == 0 || n == 0) return;
  if (n > kSmallN) return lu_block(a, a, piv, info, false);
  DeviceGuard guard(a.device());
  visit(a.dtype(), "linalg.lu_factor", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel, int warps, int rows) {
      // The attribute is set once per kernel: to what the largest n it takes needs.
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), sizeof(T) * warps * rows * rows, a.device().index,
                           "linalg.lu_factor");
      const unsigned blocks = static_cast<unsigned>((batch + warps - 1) / warps);
      kernel<<<blocks, 32 * warps, sizeof(T) * warps * n * n, stream_of(a.device())>>>(
          static_cast<T*>(a.data_ptr()), piv.data<int32_t>(), info.data<int32_t>(), n, batch);
    };
    launch(&lu_small_kernel<T, 1, kWarps>, kWarps, 32);
  });
  check_launch("linalg.lu_factor");
}

void lu_block(const Tensor& in, Tensor& out, Tensor& piv, Tensor& info, bool row_major) {
  const int n = static_cast<int>(in.size(1));
  const int64_t batch = in.size(0);
  KILN_CHECK(n > kSmallN && lu_small_fits(in.dtype(), n), "linalg.lu_factor: internal error: no block LU for n = ", n);
  if (batch == 0) return;
  DeviceGuard guard(in.device());
  visit(in.dtype(), "linalg.lu_factor", [&](auto tag) {
    using T = decltype(tag);
    KILN_CHECK(batch <= INT32_MAX, "linalg.lu_factor: a batch of ", batch, " matrices exceeds one launch");
    auto block = [&](auto kernel, int rows, int threads) {
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), sizeof(T) * rows * (rows | 1), in.device().index,
                           "linalg.lu_factor");
      kernel<<<static_cast<unsigned>(batch), threads, sizeof(T) * n * (n | 1), stream_of(in.device())>>>(
          static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), piv.data<int32_t>(),
          info.data<int32_t>(), n, row_major);
    };
    if (n <= 64) return block(&lu_block_kernel<T, 64, 4>, 64, 256);
    if constexpr (std::is_same_v<T, cfloat>) return block(&lu_block_kernel<T, 128, 4>, 128, 512);
    throw Error(str("linalg.lu_factor: internal error: no LU kernel for ", n, " x ", n, " real matrices"));
  });
  check_launch("linalg.lu_factor");
}

void inverse_small(Tensor& lu, const Tensor& piv) {
  const int n = static_cast<int>(lu.size(1));
  const int64_t batch = lu.size(0);
  if (batch == 0 || n == 0) return;
  DeviceGuard guard(lu.device());
  visit(lu.dtype(), "linalg.inv", [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = sizeof(T) * kWarps * (n * n + n * (n + 1));
    // The attribute is set once per kernel: to what the largest n takes.
    const size_t most = sizeof(T) * kWarps * (kSmallN * kSmallN + kSmallN * (kSmallN + 1));
    set_max_dynamic_smem(reinterpret_cast<const void*>(&inverse_small_kernel<T>), most, lu.device().index, "linalg.inv");
    const unsigned blocks = static_cast<unsigned>((batch + kWarps - 1) / kWarps);
    inverse_small_kernel<T><<<blocks, 32 * kWarps, smem, stream_of(lu.device())>>>(
        static_cast<T*>(lu.data_ptr()), piv.data<int32_t>(), n, batch);
  });
  check_launch("linalg.inv");
}

void lu_solve_small(const Tensor& lu, const Tensor& piv, Tensor& b, char trans) {
  const int n = static_cast<int>(lu.size(1));
  const int64_t batch = b.size(0), k = b.size(1);
  if (batch == 0 || k == 0 || n == 0) return;
  DeviceGuard guard(lu.device());
  const int tr = trans == 'N' ? 0 : trans == 'T' ? 1 : 2;
  visit(lu.dtype(), "linalg.lu_solve", [&](auto tag) {
    using T = decltype(tag);
    const int threads = 128;
    const int64_t blocks = (batch * k + threads - 1) / threads;
    lu_solve_small_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream_of(lu.device())>>>(
        static_cast<const T*>(lu.data_ptr()), piv.data<int32_t>(), static_cast<T*>(b.data_ptr()), n, k, batch, tr);
  });
  check_launch("linalg.lu_solve");
}

void slogdet_from_lu(const Tensor& lu, const Tensor& piv, Tensor& sign, Tensor& logabs) {
  const int64_t batch = lu.size(0), n = lu.size(1);
  if (batch == 0) return;
  DeviceGuard guard(lu.device());
  visit(lu.dtype(), "linalg.slogdet", [&](auto tag) {
    using T = decltype(tag);
    const int threads = 128;
    const unsigned blocks = static_cast<unsigned>((batch + threads - 1) / threads);
    if constexpr (std::is_same_v<T, double>)
      slogdet_kernel<T, double><<<blocks, threads, 0, stream_of(lu.device())>>>(
          lu.data<double>(), piv.data<int32_t>(), sign.data<double>(), logabs.data<double>(), n, batch);
    else
      slogdet_kernel<T, float><<<blocks, threads, 0, stream_of(lu.device())>>>(
          static_cast<const T*>(lu.data_ptr()), piv.data<int32_t>(), static_cast<T*>(sign.data_ptr()),
          logabs.data<float>(), n, batch);
  });
  check_launch("linalg.slogdet");
}

}  // namespace kiln::cuda
