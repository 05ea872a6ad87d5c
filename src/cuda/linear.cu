// CUDA linear: the path choice (linear_path_for), the matrix-vector launcher (kernels in
// src/cuda/kernels/gemv.cuh) and the fallback to the matrix-product ops. cuBLASLt is in linear_lt.cpp.
#include "cuda/linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/dispatch.h"
#include "cuda/kernels/gemv.cuh"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

// The largest M the automatic choice sends to the matrix-vector kernel (see linear_path_for).
constexpr int64_t kGemvAutoMaxRows = 1;

bool is_linear_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

LinearPath path_from_env() {
  const char* v = std::getenv("KILN_LINEAR_PATH");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return LinearPath::Auto;
  if (std::strcmp(v, "gemv") == 0) return LinearPath::Gemv;
  if (std::strcmp(v, "cublaslt") == 0) return LinearPath::CublasLt;
  if (std::strcmp(v, "gemm") == 0) return LinearPath::Gemm;
  throw Error(str("linear: KILN_LINEAR_PATH=", v, " is not one of auto, gemv, cublaslt, gemm"));
}

std::atomic<LinearPath>& forced_path() {
  static std::atomic<LinearPath> p{path_from_env()};
  return p;
}

bool valid_split(long s) { return s == 0 || s == 1 || s == 2 || s == 4 || s == 8; }

std::atomic<int>& forced_split() {
  static std::atomic<int> s{[] {
    const char* v = std::getenv("KILN_GEMV_SPLIT");
    if (!v || !*v) return 0;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    KILN_CHECK(*end == '\0' && valid_split(x), "linear: KILN_GEMV_SPLIT=", v, " is not one of 0, 1, 2, 4, 8");
    return static_cast<int>(x);
  }()};
  return s;
}

// Activation rows per launch, rounded up to the instantiated counts (rows beyond M are masked).
int rows_template(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

// Warps per row group (split-K inside a block): doubled, up to 4, while the grid has fewer than 16 warps
// per SM and each thread of the group keeps at least one chunk of the row. At U * R = 4 16-byte loads in
// flight per thread, 16 warps hold 32 KB in flight per SM, which covers HBM latency (Little's law: ~4.8 TB/s
// x ~600 ns / 132 SMs ~ 22 KB).
// Measured on the H200 (2026-12-04, every split forced at the 27 one-row bf16 shapes): a rule of 32 warps
// per SM (up to 8) takes split 8 for N <= 1024, where 4 took 1-28% less
// time (K4864 x N896 3.80 against 5.04 µs, K8192 x N1024 5.24 against 6.23), and split 2 for 3584-4096
// rows, where 1 took 1-13% less (K2048 x N4096 5.18 against 5.88, K3584 x N3584 7.75 against 8.42). Split
// 8 was the fastest at none of the 27.
// Long rows in a grid whose last round of warps is less than half full: those few warps each stream whole long
// rows while most of the device idles, so such a grid doubles its split once more where each thread holds at
// least 64 chunks before (32 after) the doubling (K25600 x N5120: 63.3 µs at split 2 or 4 against 69.6 at 1, same measurement; the
// other 26 shapes do not meet the condition).
int split_for(int64_t n, int64_t k, int rows_per_warp, int vec_elems, bool vec, int device) {
  if (const int forced = forced_split().load(std::memory_order_relaxed); forced > 0) return forced;
  constexpr int kMaxSplit = 4;
  const int64_t groups = (n + rows_per_warp - 1) / rows_per_warp;
  const int64_t want_warps = static_cast<int64_t>(multiprocessor_count(device)) * 16;
  const int64_t units = vec ? k / vec_elems : k;  // what one thread reads per step
  int split = 1;
  while (split < kMaxSplit && groups * split < want_warps && units >= 32 * (2 * split)) split *= 2;
  const int64_t warps = groups * split;
  if (split < kMaxSplit && warps > want_warps && 2 * (warps % want_warps) < want_warps && units >= 32 * 64 * split)
    split *= 2;
  return split;
}

// The one-row 16-bit instances' register bound (kernels::gemv_kernel's MINB): 0 (the default: the rule in
// take_five_blocks), 4 (always the compiler's instance) or 5 (always the five-blocks one); KILN_GEMV_MINB=0|4|5
// sets the initial value.
std::atomic<int>& min_blocks() {
  static std::atomic<int> n{[] {
    const char* v = std::getenv("KILN_GEMV_MINB");
    if (!v || !*v || std::strcmp(v, "0") == 0) return 0;
    KILN_CHECK(std::strcmp(v, "4") == 0 || std::strcmp(v, "5") == 0, "linear: KILN_GEMV_MINB=", v,
               " is not 0, 4 or 5");
    return v[0] - '0';
  }()};
  return n;
}

// Resident blocks per SM of a kernel of kGemvThreads threads, asked once per kernel (one device kind per
// process).
template <auto Kernel>
int resident_blocks() {
  static const int b = [] {
    int n = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kernels::kGemvThreads, 0), "linear");
    return std::max(n, 1);
  }();
  return b;
}

// Whether a one-row grid of `blocks` takes the five-blocks-per-SM instance (`Five`) instead of the compiler's
// (`Usual`): where the grid fits one round of the five-blocks instance's resident slots but not of the usual
// one's. Then no block waits for a second round; elsewhere the five-blocks instance, which spills 8 bytes and
// shares each SM among more blocks, was as fast or slower.
// Measured on the H200 (2026-12-04, every one-row bf16 shape under both instances in one run): K896 x N4864 (608 blocks: two rounds of 528 slots or one of 660) 3.82 against 5.14 µs,
// K5120 x N5120 (640) 14.66 against 15.65; with more rounds no gain or a loss: K25600 x N5120 (1280 blocks)
// 64.86 against 64.20, K5120 x N25600 (3200) 66.20 against 62.50, K8192 x N28672 (3584) 115.18 against 107.49.
template <auto Usual, auto Five>
bool take_five_blocks(int64_t blocks, int device) {
  const int forced = min_blocks().load(std::memory_order_relaxed);
  if (forced != 0) return forced == 5;
  const int64_t sms = multiprocessor_count(device);
  return blocks > sms * resident_blocks<Usual>() && blocks <= sms * resident_blocks<Five>();
}

template <class T, int MT>
void launch_gemv(const T* x, int64_t ldx, int rows, const T* w, int64_t ldw, int64_t n, int k, const T* bias,
                 T* y, int64_t ldy, bool vec, bool dependent, int device, cudaStream_t stream) {
  constexpr int R = kernels::gemv_rows_per_warp<MT>();
  const int split = split_for(n, k, R, kernels::gemv_vec_elems<T>(), vec, device);
  const int64_t rows_per_block = static_cast<int64_t>(kernels::kGemvWarps / split) * R;
  const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
  KILN_CHECK(blocks <= INT_MAX, "linear: N = ", n, " needs too many blocks");
  // A dependent launch when the weight and bias are constant (constant_input): the kernel prefetches weights
  // before it waits for the kernel that wrote x.
  auto kernel = kernels::gemv_kernel<T, MT>;
  if constexpr (MT == 1 && !std::is_same_v<T, float>)
    if (take_five_blocks<kernels::gemv_kernel<T, 1>, kernels::gemv_kernel<T, 1, false, 5>>(blocks, device))
      kernel = kernels::gemv_kernel<T, 1, false, 5>;
  launch_dependent_if(dependent, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kernels::kGemvThreads), 0, stream,
                      device, "linear", x, ldx, rows, w, ldw, n, k, bias, y, ldy, split, vec);
}

}  // namespace

bool linear_silu_mul_gemv(const Tensor& y, const Tensor& x2, const Tensor& weight) {
  const DType t = x2.dtype();
  const int64_t m = x2.size(0), k = x2.size(1), n2 = weight.size(0), n = n2 / 2;
  if (!is_linear_dtype(t) || m != 1 || n2 % 2 != 0 || k >= (int64_t{1} << 30)) return false;
  if ((x2.stride(1) != 1 && k > 1) || (weight.stride(1) != 1 && k > 1)) return false;
  if (n == 0) return true;
  const Device dev = y.device();
  const int64_t isz = static_cast<int64_t>(itemsize(t));
  const int vec_elems = static_cast<int>(16 / isz);
  const int64_t ldw = weight.stride(0);
  const bool vec = k % vec_elems == 0 && aligned16(weight.data_ptr()) && (ldw * isz) % 16 == 0 &&
                   aligned16(x2.data_ptr());
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(t, "linear_silu_and_mul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // One output per warp group (its gate and up rows): R = 2 weight rows per group.
    const int split = split_for(n, k, 1, kernels::gemv_vec_elems<T>(), vec, dev.index);
    const int64_t per_block = kernels::kGemvWarps / split;
    const int64_t blocks = (n + per_block - 1) / per_block;
    KILN_CHECK(blocks <= INT_MAX, "linear_silu_and_mul: N = ", n, " needs too many blocks");
    auto kernel = kernels::gemv_kernel<T, 1, true>;
    if constexpr (!std::is_same_v<T, float>)
      if (take_five_blocks<kernels::gemv_kernel<T, 1, true>, kernels::gemv_kernel<T, 1, true, 5>>(blocks, dev.index))
        kernel = kernels::gemv_kernel<T, 1, true, 5>;
    launch_dependent_if(constant_input(weight), kernel, dim3(static_cast<unsigned>(blocks)),
                        dim3(kernels::kGemvThreads), 0, stream, dev.index, "linear_silu_and_mul",
                        static_cast<const T*>(x2.data_ptr()), k, 1, static_cast<const T*>(weight.data_ptr()), ldw, n,
                        static_cast<int>(k), static_cast<const T*>(nullptr), static_cast<T*>(y.data_ptr()), n, split,
                        vec);
  });
  return true;
}

const char* linear_path_name(LinearPath p) {
  switch (p) {
    case LinearPath::Auto: return "auto";
    case LinearPath::Gemv: return "gemv";
    case LinearPath::CublasLt: return "cublaslt";
    case LinearPath::Gemm: return "gemm";
  }
  return "?";
}

// The path per shape. Decode (M <= 16 rows) is bandwidth bound: the weight is read once and the matrix-vector
// kernel reads it at close to copy speed with nothing else to do. Past 16 rows the f32 FMAs per weight byte
// of a CUDA-core kernel grow with M and tensor cores (cuBLASLt) win.
// TUNE (H200 benchmark, `kiln bench ops`, forcing each path with set_forced_linear_path): the crossover
// M per (N, K) and dtype. At M = 8..16 a CUDA-core kernel does 8..16 FMAs per bf16 weight element, near the
// H200's FP32 rate at full HBM bandwidth, so cuBLASLt may win there for large layers; for small layers
// (N * K of a few MB) launch latency dominates and the GEMV kernel should stay.
// Measured on the H200 (bf16, graph-replayed, 2026-12-02): the
// matrix-vector kernel beats cuBLASLt by 1.27x (geometric mean over the 27 decode shapes) at M = 1, but
// at M = 2 it reached 0.46-0.90x, at M = 4 0.81-0.90x and at M = 16 0.33-0.41x of cuBLASLt, whose
// tensor-core kernels stay memory-bound at those M while the GEMV's per-row f32 work and registers grow.
// So: GEMV for M = 1, cuBLASLt from M = 2.
LinearPath linear_path_for(int64_t m, int64_t n, int64_t k, DType dtype) {
  if (!is_linear_dtype(dtype)) return LinearPath::Gemm;
  return m <= kGemvAutoMaxRows ? LinearPath::Gemv : LinearPath::CublasLt;
}

void set_forced_linear_path(LinearPath p) { forced_path().store(p, std::memory_order_relaxed); }
void set_gemv_split(int split) {
  KILN_CHECK(valid_split(split), "set_gemv_split: expected 0, 1, 2, 4 or 8, got ", split);
  forced_split().store(split, std::memory_order_relaxed);
}
int gemv_split() { return forced_split().load(std::memory_order_relaxed); }
void set_gemv_min_blocks(int n) {
  KILN_CHECK(n == 0 || n == 4 || n == 5, "set_gemv_min_blocks: expected 0, 4 or 5, got ", n);
  min_blocks().store(n, std::memory_order_relaxed);
}
int gemv_min_blocks() { return min_blocks().load(std::memory_order_relaxed); }
LinearPath forced_linear_path() { return forced_path().load(std::memory_order_relaxed); }

bool linear_gemv(const Tensor& y, const Tensor& x2, const Tensor& weight, const Tensor* bias) {
  const DType t = x2.dtype();
  const int64_t m = x2.size(0), k = x2.size(1), n = weight.size(0);
  if (!is_linear_dtype(t) || (x2.stride(1) != 1 && k > 1) || (weight.stride(1) != 1 && k > 1)) return false;
  // Chunk indices are int inside the kernel (k < 2^30 keeps every sum of them in range).
  if (k >= (int64_t{1} << 30)) return false;
  if (m == 0 || n == 0) return true;
  const Device dev = y.device();
  Tensor bias_c;
  if (bias) bias_c = bias->contiguous();
  const int64_t isz = static_cast<int64_t>(itemsize(t));
  const int vec_elems = static_cast<int>(16 / isz);
  const bool k_vec = k % vec_elems == 0;
  const int64_t ldw = n > 1 ? weight.stride(0) : k;
  const bool w_vec = aligned16(weight.data_ptr()) && (ldw * isz) % 16 == 0;
  Tensor xr = x2;
  int64_t ldx = m > 1 ? x2.stride(0) : k;
  // Misaligned activations are copied to a fresh (aligned) buffer: a few KB against a weight of MBs, and
  // the weight stays on the vector path. Pointless when the weight cannot take it.
  if (k_vec && w_vec && (!aligned16(x2.data_ptr()) || (ldx * isz) % 16 != 0)) {
    xr = x2.clone();
    ldx = k;
  }
  const bool vec = k_vec && w_vec && aligned16(xr.data_ptr()) && (ldx * isz) % 16 == 0;
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  const int64_t ldy = n;
  const bool dep = constant_input(weight) && constant_input(bias_c);  // launch_gemv
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(t, "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(xr.data_ptr());
    const T* wp = static_cast<const T*>(weight.data_ptr());
    const T* bp = bias ? static_cast<const T*>(bias_c.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    // Launches of at most 16 activation rows; each reads the whole weight.
    for (int64_t m0 = 0; m0 < m; m0 += kernels::kGemvMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kernels::kGemvMaxRows, m - m0));
      const T* xm = xp + m0 * ldx;
      T* ym = yp + m0 * ldy;
      const int kk = static_cast<int>(k);
      switch (rows_template(rows)) {  // the one point where the row count becomes a template argument
        case 1: launch_gemv<T, 1>(xm, ldx, rows, wp, ldw, n, kk, bp, ym, ldy, vec, dep, dev.index, stream); break;
        case 2: launch_gemv<T, 2>(xm, ldx, rows, wp, ldw, n, kk, bp, ym, ldy, vec, dep, dev.index, stream); break;
        case 4: launch_gemv<T, 4>(xm, ldx, rows, wp, ldw, n, kk, bp, ym, ldy, vec, dep, dev.index, stream); break;
        case 8: launch_gemv<T, 8>(xm, ldx, rows, wp, ldw, n, kk, bp, ym, ldy, vec, dep, dev.index, stream); break;
        default: launch_gemv<T, 16>(xm, ldx, rows, wp, ldw, n, kk, bp, ym, ldy, vec, dep, dev.index, stream); break;
      }
    }
  });
  return true;
}

Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias, LinearPath path,
              LinearPath* taken) {
  const int64_t k = x.size(-1), n = weight.size(0);
  Shape out_shape = x.sizes();
  out_shape.back() = n;
  const Tensor x2 = x.reshape({-1, k});
  const int64_t m = x2.size(0);
  if (path == LinearPath::Auto) path = forced_linear_path();
  if (path == LinearPath::Auto) path = linear_path_for(m, n, k, x.dtype());
  const Tensor* b = bias ? &*bias : nullptr;
  if (path != LinearPath::Gemm && is_linear_dtype(x.dtype())) {
    // Both kernels read x's rows with a unit inner stride; anything else is copied (x is small here).
    const Tensor xr = x2.stride(1) == 1 || k <= 1 ? x2 : x2.contiguous();
    Tensor y = empty({m, n}, x.dtype(), x.device());
    const bool done = path == LinearPath::Gemv ? linear_gemv(y, xr, weight, b) : linear_cublaslt(y, xr, weight, b);
    if (done) {
      if (taken) *taken = path;
      return y.view(out_shape);
    }
  }
  if (taken) *taken = LinearPath::Gemm;
  const Tensor y = bias ? addmm(*bias, x2, weight.t()) : mm(x2, weight.t());
  return y.view(out_shape);
}

}  // namespace kiln::cuda
