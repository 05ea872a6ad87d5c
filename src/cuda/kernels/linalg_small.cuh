// Device code of the one-launch inverse, determinant and solve of batches of small square matrices, row-major as
// the caller holds them (launchers: src/cuda/solver_fused.cu; src/cuda/solver.h says which sizes come here).
// Each kernel reads the contiguous batch [B, n, n] and writes its results and LAPACK's getrf `info` per matrix
// (the 1-based index of the first exactly-zero pivot of the LU with partial pivoting, 0 if none): no transposes,
// no second launch.
//
// Memory path (both kernels): a warp owns the matrices of one contiguous span of global memory and moves it
// through shared memory, consecutive lanes loading (and at the end storing) consecutive elements, so that every
// warp-wide access is 128 consecutive bytes (256 for 8-byte elements): the fewest sectors, L1 and L2 requests
// there are. A thread reading its own matrix from global memory instead touches 32 separate sectors
// per instruction (its neighbours' matrices are n * n elements away); float4 loads of its own matrix, possible
// only where a matrix is a multiple of 16 bytes (n = 2 and 4 in f32), still request twice the sectors that each
// instruction uses. In the staged copy, float4 loads would cover the same lines with fewer instructions, but
// each lane would then store four consecutive words into the padded shared copy, and those stores collide on
// banks; scalar stores of consecutive elements do not. In shared memory each thread's data sits at an odd
// stride, so the reads and writes of all lanes at one offset fall on 32 different banks. A warp issues all its
// loads before its first shared-memory store.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cuda/std/complex>

namespace kiln::cuda::kernels {

using cfloat = ::cuda::std::complex<float>;

// ---- arithmetic ---------------------------------------------------------------------------------------------

// The pivot's magnitude as LAPACK's i?amax measures it: |x| for reals, |re| + |im| for complex.
__device__ __forceinline__ float pivot_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double pivot_abs(double x) { return fabs(x); }
__device__ __forceinline__ float pivot_abs(cfloat x) { return fabsf(x.real()) + fabsf(x.imag()); }

template <class T>
__device__ __forceinline__ bool is_zero(T x) {
  return x == T(0);
}

// acc - x * y (reals: one rounding, an fma; complex: the textbook product, without C99's inf/NaN recovery, as
// LAPACK's Fortran).
__device__ __forceinline__ float msub(float acc, float x, float y) { return fmaf(-x, y, acc); }
__device__ __forceinline__ double msub(double acc, double x, double y) { return fma(-x, y, acc); }
__device__ __forceinline__ cfloat msub(cfloat acc, cfloat x, cfloat y) {
  return cfloat(fmaf(x.imag(), y.imag(), fmaf(-x.real(), y.real(), acc.real())),
                fmaf(-x.imag(), y.real(), fmaf(-x.real(), y.imag(), acc.imag())));
}
// x * y.
template <class T>
__device__ __forceinline__ T mul(T x, T y) {
  return msub(T(0), -x, y);
}

// x and y exchanged where `swap` holds. Written as selects, not as a branch: inside `if (p == r)` the compiler
// may index with p instead of the unrolled constant r, which moves the register arrays to local memory.
template <class T>
__device__ __forceinline__ void swap_if(bool swap, T& x, T& y) {
  const T t = x;
  x = swap ? y : x;
  y = swap ? t : y;
}

// ---- staging through shared memory --------------------------------------------------------------------------

// The shared-memory stride of an item of E elements: E rounded up to odd.
template <int E>
inline constexpr int kOddStride = E % 2 ? E : E + 1;

// `total` (<= 32 * E) consecutive elements of global memory in a warp's registers, E per lane: element e in lane
// e % 32. load() issues every load before store() writes any: the loads of the span are in flight together.
template <class T, int E>
struct WarpSpan {
  T v[E];
  __device__ __forceinline__ void load(const T* __restrict__ g, int total, int lane) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int e = i * 32 + lane;
      v[i] = e < total ? g[e] : T(0);
    }
  }
  // Element e to s[(e / E) * kOddStride<E> + e % E]: item j's elements at j * kOddStride<E>.
  __device__ __forceinline__ void store(T* s, int total, int lane) const {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int e = i * 32 + lane;
      if (e < total) s[(e / E) * kOddStride<E> + e % E] = v[i];
    }
  }
};

// The reverse of WarpSpan: items at stride kOddStride<E> in s to `total` consecutive elements of g.
template <class T, int E>
__device__ __forceinline__ void warp_store_span(const T* s, int total, T* __restrict__ g, int lane) {
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int e = i * 32 + lane;
    if (e < total) g[e] = s[(e / E) * kOddStride<E> + e % E];
  }
}

// ---- n <= 4: one thread per matrix ------------------------------------------------------------------------------

enum class TinyOp : int { kInverse, kDet, kSolve };
inline constexpr int kTinyWarps = 4;  // warps per block; each warp takes 32 consecutive matrices

// One thread per matrix, the matrix in registers (N x N, every loop unrolled): LU with partial pivoting as
// LAPACK's getf2 (pivot: the first row of the largest pivot_abs in the column, so a NaN is chosen only where it
// is the first candidate; a zero pivot is recorded in info, its column left unscaled, and the factorisation goes
// on), then by `op`:
//   kInverse  out [B, N, N] = A^-1 as LAPACK's getri: inv(U), then X L = inv(U) from the right, then the column
//             interchanges in reverse; info [B]
//   kDet      out [B] = the product of U's diagonal, negated for an odd number of row interchanges
//   kSolve    out [B, N] = x with A x = b for b [B, N]; info [B]
// A singular matrix's inverse and solution hold whatever the divisions by its zero pivot give.
template <class T, int N>
__global__ void __launch_bounds__(32 * kTinyWarps)
    tiny_lu_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int32_t* __restrict__ info,
                   int64_t batch, TinyOp op) {
  constexpr int NN = N * N, SA = kOddStride<NN>, SB = kOddStride<N>;
  // Raw bytes: complex<float> has a constructor, which __shared__ variables may not.
  __shared__ __align__(16) unsigned char smem[kTinyWarps * 32 * (SA + SB) * sizeof(T)];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kTinyWarps + warp) * 32;
  if (first >= batch) return;  // the whole warp
  const int count = static_cast<int>(batch - first < 32 ? batch - first : 32);
  const bool live = lane < count;
  T* sa = reinterpret_cast<T*>(smem) + warp * 32 * (SA + SB);
  T* sb = sa + 32 * SA;
  {
    WarpSpan<T, NN> ga;
    WarpSpan<T, N> gb;
    ga.load(a + first * NN, count * NN, lane);
    if (op == TinyOp::kSolve) gb.load(b + first * N, count * N, lane);
    ga.store(sa, count * NN, lane);
    if (op == TinyOp::kSolve) gb.store(sb, count * N, lane);
  }
  __syncwarp();
  // From here each lane touches only its own item in sa / sb until the results are written out.
  T m[N][N];
#pragma unroll
  for (int r = 0; r < N; ++r)
#pragma unroll
    for (int c = 0; c < N; ++c) m[r][c] = live ? sa[lane * SA + r * N + c] : T(r == c ? 1 : 0);

  int piv[N];
  int zero_at = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    int p = k;
    auto best = pivot_abs(m[k][k]);
#pragma unroll
    for (int r = k + 1; r < N; ++r) {
      const auto v = pivot_abs(m[r][k]);
      if (v > best) {
        best = v;
        p = r;
      }
    }
    piv[k] = p;
#pragma unroll
    for (int r = k + 1; r < N; ++r)
#pragma unroll
      for (int c = 0; c < N; ++c) swap_if(p == r, m[k][c], m[r][c]);
    const T d = m[k][k];
    const bool zero = is_zero(d);
    if (zero && zero_at == 0) zero_at = k + 1;
#pragma unroll
    for (int r = k + 1; r < N; ++r) m[r][k] = zero ? m[r][k] : m[r][k] / d;
#pragma unroll
    for (int r = k + 1; r < N; ++r)
#pragma unroll
      for (int c = k + 1; c < N; ++c) m[r][c] = msub(m[r][c], m[r][k], m[k][c]);
  }

  if (op == TinyOp::kDet) {
    T det = m[0][0];
    bool odd = piv[0] != 0;
#pragma unroll
    for (int k = 1; k < N; ++k) {
      det = mul(det, m[k][k]);
      odd ^= piv[k] != k;
    }
    if (live) out[first + lane] = odd ? -det : det;
    return;
  }

  if (op == TinyOp::kSolve) {
    T x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = live ? sb[lane * SB + i] : T(0);
#pragma unroll
    for (int k = 0; k < N; ++k)  // P b: the interchanges in order
#pragma unroll
      for (int r = k + 1; r < N; ++r) swap_if(piv[k] == r, x[k], x[r]);
#pragma unroll
    for (int i = 1; i < N; ++i)  // L y = P b, unit diagonal
#pragma unroll
      for (int l = 0; l < i; ++l) x[i] = msub(x[i], m[i][l], x[l]);
#pragma unroll
    for (int i = N - 1; i >= 0; --i) {  // U x = y
#pragma unroll
      for (int l = i + 1; l < N; ++l) x[i] = msub(x[i], m[i][l], x[l]);
      x[i] = x[i] / m[i][i];
    }
    if (live) {
#pragma unroll
      for (int i = 0; i < N; ++i) sb[lane * SB + i] = x[i];
    }
    __syncwarp();
    warp_store_span<T, N>(sb, count * N, out + first * N, lane);
    if (live) info[first + lane] = zero_at;
    return;
  }

  // inv(U) in place (LAPACK's trti2, upper, non-unit): column j above the diagonal is
  // -inv(U)[0:j, 0:j] U[0:j, j] / U[j, j], rows in increasing order so each reads U's column j before it is overwritten.
#pragma unroll
  for (int j = 0; j < N; ++j) {
    m[j][j] = T(1) / m[j][j];
    const T ajj = -m[j][j];
#pragma unroll
    for (int i = 0; i < j; ++i) {
      T s = mul(m[i][i], m[i][j]);
#pragma unroll
      for (int l = i + 1; l < j; ++l) s = msub(s, -m[i][l], m[l][j]);
      m[i][j] = mul(s, ajj);
    }
  }
  // X L = inv(U), X's columns from the right (LAPACK's getri): column j of X is inv(U)'s column j minus
  // X[:, j+1:] L[j+1:, j].
#pragma unroll
  for (int j = N - 2; j >= 0; --j) {
    T w[N];
#pragma unroll
    for (int i = j + 1; i < N; ++i) {
      w[i] = m[i][j];
      m[i][j] = T(0);
    }
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int i = j + 1; i < N; ++i) m[r][j] = msub(m[r][j], m[r][i], w[i]);
  }
  // A^-1 = X P: the column interchanges in reverse order.
#pragma unroll
  for (int j = N - 2; j >= 0; --j)
#pragma unroll
    for (int q = j + 1; q < N; ++q)
#pragma unroll
      for (int r = 0; r < N; ++r) swap_if(piv[j] == q, m[r][j], m[r][q]);
  if (live) {
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int c = 0; c < N; ++c) sa[lane * SA + r * N + c] = m[r][c];
  }
  __syncwarp();
  warp_store_span<T, NN>(sa, count * NN, out + first * NN, lane);
  if (live) info[first + lane] = zero_at;
}

// ---- 5 <= n <= 16: Gauss-Jordan, a few lanes per matrix ---------------------------------------------------------

// Rows per lane: 4 (64 registers of a 16-wide f32 row block), 2 for 8-byte types (the same registers).
template <class T>
inline constexpr int kGjRows = sizeof(T) == 4 ? 4 : 2;
inline constexpr int kGjWarps = 4;  // warps per block

// x / d for 0 <= x < 2^16 and 2 <= d <= 2^16, given m = ceil(2^32 / d): exact there, since
// x * (m * d - 2^32) < 2^32.
__device__ __forceinline__ int small_div(int x, uint32_t m) {
  return static_cast<int>(__umulhi(static_cast<uint32_t>(x), m));
}

// The inverse of each n x n matrix (n <= G, G = 8 or 16) by Gauss-Jordan elimination with partial pivoting, in
// place in registers. L = G / R lanes hold a matrix (R = kGjRows<T>), lane q of its group rows q, q + L, ...,
// G columns each (those past n stay zero and feed nothing); a warp holds 32 / L consecutive matrices.
//
// Step k picks the pivot among the rows not yet pivots exactly as LU with partial pivoting does (their entries
// are LU's Schur complement, computed with LU's multipliers l = a[r][k] / pivot; LU's row order is tracked in
// `pos` for its tie-break, the first row in that order) so the pivots and `info` are getrf's. The pivot row is
// broadcast from its lane; every other row r becomes a[r] - l * pivot row, with -l in column k; the pivot row
// keeps its values, with 1 in column k, and its scale 1 / pivot is kept aside in sigma (the rows' true values
// are sigma * stored; a row's stored update does not depend on its own sigma). After n steps the row chosen at
// step i holds, scaled by sigma, row i of A^-1 with column k of the store at column pk(k) (the row chosen at
// step k, 4 bits of `chosen` each).
template <class T, int G>
__global__ void __launch_bounds__(32 * kGjWarps)
    gauss_jordan_kernel(const T* __restrict__ a, T* __restrict__ out, int32_t* __restrict__ info, int n,
                        uint32_t div_n, uint32_t div_nn, int64_t batch) {
  constexpr int R = kGjRows<T>, L = G / R, M = 32 / L;
  constexpr int kBatchLoads = 2048 / (32 * static_cast<int>(sizeof(T)));  // 2 KiB of a warp's loads in flight
  using Mag = decltype(pivot_abs(T()));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kGjWarps + warp) * M;
  if (first >= batch) return;  // the whole warp
  const int count = static_cast<int>(batch - first < M ? batch - first : M);
  const int nn = n * n, total = count * nn;
  // A lane's R rows at a stride of R * n + 1 (odd) elements; the region is reused for the result, matrix-major
  // (M * n * n <= 32 * (R * n + 1) since n <= G).
  const int ls = R * n + 1;
  T* s = reinterpret_cast<T*>(smem_raw) + warp * 32 * ls;
  {
    const T* g = a + first * nn;
    for (int base = 0; base < total; base += 32 * kBatchLoads) {
      T v[kBatchLoads];
#pragma unroll
      for (int u = 0; u < kBatchLoads; ++u) {
        const int e = base + u * 32 + lane;
        v[u] = e < total ? g[e] : T(0);
      }
#pragma unroll
      for (int u = 0; u < kBatchLoads; ++u) {
        const int e = base + u * 32 + lane;
        if (e < total) {
          const int mat = small_div(e, div_nn), rem = e - mat * nn;
          const int r = small_div(rem, div_n), c = rem - r * n;
          s[(mat * L + r % L) * ls + (r / L) * n + c] = v[u];
        }
      }
    }
  }
  __syncwarp();
  const int gq = lane % L, group_lane0 = lane - gq, mat = lane / L;
  const bool live = mat < count;
  T S[R][G];
  T sigma[R];
  int pos[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = gq + L * i;
    pos[i] = r;
    sigma[i] = T(1);
#pragma unroll
    for (int c = 0; c < G; ++c)  // a matrix past the batch's end is the identity: no divisions by zero
      S[i][c] = live && r < n && c < n ? s[lane * ls + i * n + c] : T(!live && r == c ? 1 : 0);
  }
  __syncwarp();  // every lane has its rows: the region may be overwritten

  uint64_t chosen = 0;
  int zero_at = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    if (k >= n) break;  // n is the same for the whole grid
    // The pivot: the largest pivot_abs among the rows not yet pivots (pos >= k), the first in LU's order on ties;
    // a NaN counts as the largest in position k and the smallest elsewhere (i?amax keeps its first element and
    // takes a later one only when strictly larger).
    Mag best = Mag(-2);
    int best_key = INT_MAX;  // pos * 32 + row
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = gq + L * i;
      if (r < n && pos[i] >= k) {
        Mag v = pivot_abs(S[i][k]);
        if (v != v) v = pos[i] == k ? Mag(INFINITY) : Mag(-1);
        const int key = pos[i] * 32 + r;
        if (v > best || (v == best && key < best_key)) {
          best = v;
          best_key = key;
        }
      }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off /= 2) {
      const Mag ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int ok = __shfl_xor_sync(0xffffffffu, best_key, off);
      if (ob > best || (ob == best && ok < best_key)) {
        best = ob;
        best_key = ok;
      }
    }
    const int w = best_key & 31, w_pos = best_key >> 5, wq = w % L, wi = w / L;
    chosen |= static_cast<uint64_t>(w) << (4 * k);
    T prow[G];
#pragma unroll
    for (int c = 0; c < G; ++c) {
      T x = S[0][c];
#pragma unroll
      for (int i = 1; i < R; ++i) x = wi == i ? S[i][c] : x;
      prow[c] = __shfl_sync(0xffffffffu, x, group_lane0 + wq);
    }
    const T v = prow[k];
    if (is_zero(v) && zero_at == 0) zero_at = k + 1;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const bool is_pivot = gq == wq && wi == i;
      const T l = (is_pivot ? T(0) : S[i][k]) / v;
#pragma unroll
      for (int c = 0; c < G; ++c)
        if (c != k) S[i][c] = msub(S[i][c], l, prow[c]);
      S[i][k] = is_pivot ? T(1) : -l;
      sigma[i] = is_pivot ? T(1) / v : sigma[i];
      pos[i] = is_pivot ? k : (pos[i] == k ? w_pos : pos[i]);
    }
  }

  // A^-1[pos][pk(c)] = sigma * S[c], through the region (matrix-major) to global memory.
  if (live) {
    T* img = s + mat * nn;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (gq + L * i >= n) continue;
#pragma unroll
      for (int c = 0; c < G; ++c)
        if (c < n) img[pos[i] * n + static_cast<int>((chosen >> (4 * c)) & 15)] = mul(sigma[i], S[i][c]);
    }
  }
  __syncwarp();
  T* o = out + first * nn;
  for (int e = lane; e < total; e += 32) o[e] = s[e];
  if (live && gq == 0) info[first + mat] = zero_at;
}

}  // namespace kiln::cuda::kernels
