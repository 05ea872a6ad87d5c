// CUDA FP8: quantisation and dequantisation launchers, the FP8 matrix-vector launcher (kernels in
// src/cuda/kernels/fp8.cuh) and the path choice of scaled_mm and linear(Fp8Weight). cuBLASLt is in fp8_lt.cpp.
#include "cuda/fp8.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/kernels/fp8.cuh"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

constexpr DTypeSet kActTypes = dset(DType::F32, DType::F16, DType::BF16);

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Fp8Path path_from_env() {
  const char* v = std::getenv("KILN_FP8_PATH");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return Fp8Path::Auto;
  if (std::strcmp(v, "gemv") == 0) return Fp8Path::Gemv;
  if (std::strcmp(v, "cublaslt") == 0) return Fp8Path::CublasLt;
  if (std::strcmp(v, "fallback") == 0) return Fp8Path::Fallback;
  throw Error(str("fp8: KILN_FP8_PATH=", v, " is not one of auto, gemv, cublaslt, fallback"));
}

std::atomic<Fp8Path>& forced_path() {
  static std::atomic<Fp8Path> p{path_from_env()};
  return p;
}

// ---- matrix-vector ---------------------------------------------------------------------------------------

// The arguments of one fp8_gemv_kernel launch that do not depend on the types.
struct GemvArgs {
  const void* x;
  int64_t ldx;
  const void* w;  // e4m3 [n, k]
  int64_t ldw, n;
  int k;
  const float* ws;
  int64_t bn, ws_sn, ws_sk;
  const float* xs;  // nullable
  int64_t xs_sm, xs_sk;
  int kblk;
  const void* bias;  // nullable
  void* y;
  int64_t ldy;
  bool vec;
  // The weights, their scales and the bias are constant (constant_input): the kernels prefetch them before
  // their dependent-launch wait, so they are launched as dependents only then.
  bool dependent;
};

int rows_template(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

// Warps per row group (split-K inside a block), as the bf16 GEMV (linear.cu): about 32 warps per SM in the
// grid (several activation rows; one row: below), and more warps per row only while each thread keeps at
// least two full unrolled steps (2 U chunks of 16 elements). With only "one chunk per thread" (the bf16
// kernel's floor) a 4096-wide FP8 row split 8 ways left every thread a single round trip of R loads and the
// blocks' start-up dominated: about 2.6 TB/s on the H200 against the bf16 kernel's 3.9.
// TUNE (H200, `kiln bench ops`): the same targets as the bf16 kernel; FP8 rows are half the bytes.
// KILN_FP8_GEMV_SPLIT=1|2|4|8 forces the split of every launch (a tuning knob for A/B runs; unset: the rule).
int forced_split() {
  static const int s = [] {
    const char* v = std::getenv("KILN_FP8_GEMV_SPLIT");
    if (!v || !*v) return 0;
    const int x = std::atoi(v);
    if ((x != 1 && x != 2 && x != 4 && x != 8) || std::strspn(v, "0123456789") != std::strlen(v))
      throw Error(str("fp8: KILN_FP8_GEMV_SPLIT=", v, " is not one of 1, 2, 4, 8"));
    return x;
  }();
  return s;
}

// One activation row (round_blocks > 0, the kernel shape's resident blocks per SM): the split doubles only
// while the grid stays within one round of resident warps (round_blocks x 8 per SM), so a grid that one more
// doubling would push past it keeps fewer, longer warps. On the H200 (2026-12-03, forced splits)
// that was faster at every such benchmark shape: K14336 x N4096 16.90 against 17.90 µs, K18944 x N3584 20.05
// against 20.99, K5120 x N5120 9.39 against 10.99, K25600 x N5120 37.37 against 39.18; the rule itself was
// measured on 2026-12-04.
int split_for(int64_t n, int64_t k, int rows_per_warp, int unroll, bool vec, int device, int round_blocks) {
  if (const int f = forced_split(); f > 0) return f;
  const int64_t groups = (n + rows_per_warp - 1) / rows_per_warp;
  const int64_t sms = multiprocessor_count(device);
  const int64_t units = vec ? k / 16 : k;
  auto more = [&](int split) {
    if (round_blocks > 0) return groups * split * 2 <= sms * kernels::kGemvWarps * round_blocks;
    return groups * split < sms * 32;
  };
  // Enough chunks per thread: two full unrolled steps; for one short row (K <= 1024, too short for that) three
  // quarters of the threads holding a chunk (K1024 x N1024 1.38 against 2.13 µs at split 2, K896 x N896 1.38
  // against 2.04; split 4 leaves half of them idle and was slower; 2026-12-04).
  auto enough = [&](int next) {
    if (round_blocks > 0 && k <= 1024) return 4 * units >= 3 * 32 * next;
    return units >= 32 * next * 2 * unroll;
  };
  int split = 1;
  while (split < kernels::kGemvWarps && more(split) && enough(2 * split)) split *= 2;
  return split;
}

// The shift that replaces the division by the scale block in the kernel: 30 when one block spans all of k
// (k < 2^30: every index shifts to block 0), log2(kblk) for a power of two, -1 (divide) otherwise.
int kshift_of(int kblk, int k) {
  if (kblk >= k) return 30;
  if ((kblk & (kblk - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < kblk) ++s;
  return s;
}

// The one-row kernel's shape (kernels/fp8.cuh, CFG): -1 (auto, the default) or a forced 0..8.
std::atomic<int>& gemv_config() {
  static std::atomic<int> c{[] {
    const char* v = std::getenv("KILN_FP8_GEMV_CONFIG");
    if (!v || !*v || std::strcmp(v, "auto") == 0) return -1;
    const int c = std::atoi(v);
    if (c < 0 || c >= kernels::kFp8GemvConfigs || std::strspn(v, "0123456789") != std::strlen(v))
      throw Error(str("fp8: KILN_FP8_GEMV_CONFIG=", v, " is not auto or one of 0..", kernels::kFp8GemvConfigs - 1));
    return c;
  }()};
  return c;
}

// The share of the resident-block slots that the grid of config CFG uses over its rounds, blocks / (rounds x
// slots): 1 when the grid is a whole number of full rounds (CFG's blocks per SM on every multiprocessor).
template <int CFG>
double round_fill(int64_t n, int64_t k, bool vec, int device) {
  constexpr int R = kernels::fp8_gemv_rows_per_warp<1, CFG>();
  const int split = split_for(n, k, R, kernels::fp8_gemv_unroll<1, BFloat16, CFG>(), vec, device,
                              kernels::fp8_gemv_min_blocks<CFG>());
  const int64_t per_block = static_cast<int64_t>(kernels::kGemvWarps / split) * R;
  const int64_t blocks = (n + per_block - 1) / per_block;
  const int64_t slots = static_cast<int64_t>(kernels::fp8_gemv_min_blocks<CFG>()) * multiprocessor_count(device);
  const int64_t rounds = (blocks + slots - 1) / slots;
  return static_cast<double>(blocks) / static_cast<double>(rounds * slots);
}

// Auto's shape for one row of 16-bit activations. Short rows (K <= 1024): 2 rows x 4 loads (config 1), so
// each thread still keeps 4 loads in flight over its few chunks. Layers under 32 MB in bf16 terms: 2 rows x 1
// load, pipelined, at four blocks per SM (config 4). Larger: 2 rows x 2 loads at four blocks per SM (config
// 3), unless its grid fills the last round of resident blocks clearly worse than config 2's (4 rows x 1 load).
// TUNE (H200, `kiln bench ops --filter '^linear_fp8/e4m3/M1/'`): configs 1-3 fitted on the 27 benchmark
// shapes (geomean 11.74 -> 10.02 µs against a single shape for all; 2026-12-03); config 4 was 5-18% faster
// than config 2 at all ten shapes with K > 1024 under 32 MB and slower than config 3 above it (2026-12-03).
// With the lean one-row loop (configs 2, 3 and 4 interleaved over four rounds on one H200, 2026-12-04)
// config 4 is 1-6% slower than config 3 above 32 MB but at K4096 x N4096 (5.54 against 5.78 µs), and config
// 2 ahead where this rule takes it (K5120 x N5120 8.54 against 9.89, K25600 x N5120 34.9 against 40.2). From
// 64 MB of FP8 weights config 3's shape takes the general loop (config 8): with the two loops interleaved over
// three rounds (2026-12-04, auto's configs) it was 1.3-6.4% faster at the five largest such layers (K5120 x N25600 36.10 against 38.40
// µs, K4096 x N128256 124.6 against 129.6) and 2.7% at K8192 x N8192, within 0.5% at K3584 x N18944 and
// K18944 x N3584, and 0.6-1.5% slower below 64 MB (K4096 x N14336, K14336 x N4096), where config 3 stays.
int auto_config(int64_t n, int64_t k, bool vec, int device) {
  if (!vec) return 0;
  if (k <= 1024) return 1;
  if (2 * n * k < (int64_t{32} << 20)) return 4;
  if (round_fill<3>(n, k, vec, device) < round_fill<2>(n, k, vec, device) - 0.02) return 2;
  return n * k >= (int64_t{64} << 20) ? kernels::kFp8GemvGeneralLoop : 3;
}

template <class X, class O, class B, int MT, int CFG = 0>
void launch_gemv_mt(const GemvArgs& g, int rows, int device, cudaStream_t stream) {
  KILN_CHECK(g.xs == nullptr || (std::is_same_v<X, Float8_e4m3fn>), "fp8 gemv: activation scales need e4m3 activations");
  // The 16-byte path offsets the scales along K in 32 bits; scale strides beyond that take the scalar path.
  const int64_t kblocks = (static_cast<int64_t>(g.k) + g.kblk - 1) / std::max(g.kblk, 1);
  const int64_t bound = INT_MAX / std::max<int64_t>(kblocks - 1, 1);
  const bool vec = g.vec && g.ws_sk >= 0 && g.xs_sk >= 0 && g.ws_sk <= bound && g.xs_sk <= bound;
  constexpr int R = kernels::fp8_gemv_rows_per_warp<MT, CFG>();
  const int split = split_for(g.n, g.k, R, kernels::fp8_gemv_unroll<MT, X, CFG>(), vec, device,
                              MT == 1 ? kernels::fp8_gemv_min_blocks<CFG>() : 0);
  const int64_t rows_per_block = static_cast<int64_t>(kernels::kGemvWarps / split) * R;
  const int64_t blocks = (g.n + rows_per_block - 1) / rows_per_block;
  KILN_CHECK(blocks <= INT_MAX, "fp8 gemv: N = ", g.n, " needs too many blocks");
  // A dependent launch when g.dependent: weights and their scales are prefetched before the wait for x
  // (kernels/pdl.cuh).
  launch_dependent_if(g.dependent, kernels::fp8_gemv_kernel<X, O, B, MT, CFG>, dim3(static_cast<unsigned>(blocks)),
                      dim3(kernels::kGemvThreads), 0, stream, device, "fp8 gemv", static_cast<const X*>(g.x), g.ldx,
                      rows, static_cast<const Float8_e4m3fn*>(g.w), g.ldw, g.n, g.k, g.ws, g.bn, g.ws_sn, g.ws_sk,
                      g.xs, g.xs_sm, g.xs_sk, g.kblk, kshift_of(g.kblk, g.k), static_cast<const B*>(g.bias),
                      static_cast<O*>(g.y), g.ldy, split, vec);
}

// The tensor-core kernel for one row of 16-bit activations (config 7, kernels::fp8_gemv_mma_kernel), when the
// operands fit it: false (nothing launched) otherwise. The split (warps per 8-row tile) is the one of 1, 2, 4,
// 8 whose grid best fills the resident-block slots (a round's share when the grid is under one round), each
// warp keeping at least two 64-wide steps; near ties go to the smaller split.
std::atomic<int64_t>& mma_launches() {
  static std::atomic<int64_t> n{0};
  return n;
}

template <class X, class O, class B>
bool launch_gemv_mma(const GemvArgs& g, int device, cudaStream_t stream) {
  constexpr int kStep = kernels::kFp8MmaStepK;
  constexpr size_t kMaxSmem = 96 << 10;  // the row as f16 and a float per piece of 64: K <= 47662
  const int64_t smem = 2 * static_cast<int64_t>(g.k) + 4 * (g.k / kStep);
  if (!g.vec || g.xs != nullptr || g.k == 0 || g.k % kStep != 0 || (g.kblk % kStep != 0 && g.kblk < g.k) ||
      smem > static_cast<int64_t>(kMaxSmem) || g.ws_sk < 0 || g.ws_sk > INT_MAX / std::max<int64_t>(g.k / kStep, 1))
    return false;
  // Pieces of the activation row with one scale each: 256, 128 or 64 activations, inside one weight-scale block.
  const int pshift = g.kblk >= g.k || g.kblk % 256 == 0 ? 8 : g.kblk % 128 == 0 ? 7 : 6;
  const int64_t steps = g.k / kStep;
  const int64_t per_sm = std::clamp<int64_t>((int64_t{228} << 10) / (smem + 2048), 1, 4);
  const int64_t slots = per_sm * multiprocessor_count(device);
  // Warps per tile: the split whose grid best fills the slots (by rounds when there is more than one, by the
  // share of slots used when there is less), more warps only where that gains 2% or more.
  int split = 1;
  double best = -1.0;
  for (int sp = 1; sp <= kernels::kFp8MmaWarps; sp *= 2) {
    if (sp > 1 && steps / sp < 2) break;
    const int64_t rows = static_cast<int64_t>(kernels::kFp8MmaWarps / sp) * kernels::kFp8MmaRows;
    const int64_t blocks = (g.n + rows - 1) / rows;
    const double fill = blocks >= slots ? static_cast<double>(blocks) / static_cast<double>((blocks + slots - 1) / slots * slots)
                                        : static_cast<double>(blocks) / static_cast<double>(slots);
    if (fill > best * 1.02) best = fill, split = sp;
  }
  const int64_t rows = static_cast<int64_t>(kernels::kFp8MmaWarps / split) * kernels::kFp8MmaRows;
  const int64_t blocks = (g.n + rows - 1) / rows;
  KILN_CHECK(blocks <= INT_MAX, "fp8 gemv: N = ", g.n, " needs too many blocks");
  auto kernel = kernels::fp8_gemv_mma_kernel<X, O, B>;
  // The attribute is set once per kernel and device: to the largest row this path takes, not this launch's.
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), kMaxSmem, device, "fp8 gemv");
  launch_dependent_if(g.dependent, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kernels::kFp8MmaThreads),
                      static_cast<size_t>(smem), stream, device, "fp8 gemv", static_cast<const X*>(g.x),
                      static_cast<const Float8_e4m3fn*>(g.w), g.ldw, g.n, g.k, g.ws, g.bn, g.ws_sn,
                      static_cast<int>(g.ws_sk), g.kblk, kshift_of(g.kblk, g.k), pshift, static_cast<const B*>(g.bias),
                      static_cast<O*>(g.y), split);
  mma_launches().fetch_add(1, std::memory_order_relaxed);
  return true;
}

// All M rows in launches of at most 16 (each reads the whole weight once).
template <class X, class O, class B>
void launch_gemv(GemvArgs g, int64_t m, int device, cudaStream_t stream) {
  for (int64_t m0 = 0; m0 < m; m0 += kernels::kGemvMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kernels::kGemvMaxRows, m - m0));
    GemvArgs s = g;
    s.x = static_cast<const X*>(g.x) + m0 * g.ldx;
    if (g.xs) s.xs = g.xs + m0 * g.xs_sm;
    s.y = static_cast<O*>(g.y) + m0 * g.ldy;
    switch (rows_template(rows)) {  // the one point where the row count becomes a template argument
      case 1:
        // Linear's decode case (16-bit activations, one row) may take another kernel shape (gemv_config).
        if constexpr (std::is_same_v<X, O> && !std::is_same_v<X, float>) {
          int c = gemv_config().load(std::memory_order_relaxed);
          if (c == 7 && launch_gemv_mma<X, O, B>(s, device, stream)) break;
          if (c < 0 || c == 7) c = auto_config(s.n, s.k, s.vec, device);
          switch (c) {
            case 1: launch_gemv_mt<X, O, B, 1, 1>(s, rows, device, stream); break;
            case 2: launch_gemv_mt<X, O, B, 1, 2>(s, rows, device, stream); break;
            case 3: launch_gemv_mt<X, O, B, 1, 3>(s, rows, device, stream); break;
            case 4: launch_gemv_mt<X, O, B, 1, 4>(s, rows, device, stream); break;
            case 5: launch_gemv_mt<X, O, B, 1, 5>(s, rows, device, stream); break;
            case 6: launch_gemv_mt<X, O, B, 1, 6>(s, rows, device, stream); break;
            case 8: launch_gemv_mt<X, O, B, 1, 8>(s, rows, device, stream); break;
            default: launch_gemv_mt<X, O, B, 1>(s, rows, device, stream); break;
          }
        } else {
          launch_gemv_mt<X, O, B, 1>(s, rows, device, stream);
        }
        break;
      case 2: launch_gemv_mt<X, O, B, 2>(s, rows, device, stream); break;
      case 4: launch_gemv_mt<X, O, B, 4>(s, rows, device, stream); break;
      case 8: launch_gemv_mt<X, O, B, 8>(s, rows, device, stream); break;
      default: launch_gemv_mt<X, O, B, 16>(s, rows, device, stream); break;
    }
  }
}

// Whether the 16-byte path can take rows of `bytes_per_elem`-byte activations at x (stride ldx elements) and
// e4m3 weights at w (stride ldw): k a multiple of 16, every row start 16-byte aligned, the scale block a
// whole number of chunks.
bool gemv_vec_ok(const void* x, int64_t ldx, size_t x_isz, const void* w, int64_t ldw, int64_t k, int64_t kblk) {
  return k % 16 == 0 && (kblk % 16 == 0 || kblk >= k) && aligned16(x) && (ldx * static_cast<int64_t>(x_isz)) % 16 == 0 &&
         aligned16(w) && ldw % 16 == 0;
}

// ---- linear(Fp8Weight) paths -----------------------------------------------------------------------------

void linear_gemv(const Tensor& y, const Tensor& x2, const Tensor& w, const Tensor& scales, int64_t bn, int64_t bk,
                 const Tensor* bias) {
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  const DType t = x2.dtype();
  const size_t isz = itemsize(t);
  const int64_t ldw = n > 1 ? w.stride(0) : k;
  Tensor xr = x2;
  int64_t ldx = m > 1 ? x2.stride(0) : k;
  if (x2.stride(1) != 1 && k > 1) {
    xr = x2.contiguous();
    ldx = k;
  }
  const int kblk = static_cast<int>(std::min<int64_t>(bk, std::max<int64_t>(k, 1)));
  const bool w_ok = k % 16 == 0 && aligned16(w.data_ptr()) && ldw % 16 == 0;
  // Misaligned activations are copied to a fresh (aligned) buffer: a few KB against a weight of MBs.
  if (w_ok && (!aligned16(xr.data_ptr()) || (ldx * static_cast<int64_t>(isz)) % 16 != 0)) {
    xr = xr.clone();
    ldx = k;
  }
  const bool vec = gemv_vec_ok(xr.data_ptr(), ldx, isz, w.data_ptr(), ldw, k, kblk);
  Tensor bias_c;
  if (bias) bias_c = bias->contiguous();
  const Device dev = y.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  GemvArgs g{xr.data_ptr(), ldx, w.data_ptr(), ldw, n, static_cast<int>(k), scales.data<const float>(), bn,
             scales.size(1), 1, nullptr, 0, 0, kblk, bias ? bias_c.data_ptr() : nullptr, y.data_ptr(), n, vec,
             constant_input(w) && constant_input(scales) && constant_input(bias_c)};
  visit_dtypes<kActTypes>(t, "linear(fp8)", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_gemv<T, T, T>(g, m, dev.index, stream);
  });
}

// The activations quantised to e4m3, then one cuBLASLt FP8 product: per 1 x 128 block against the weight's
// 128 x 128 block scales (the DeepSeek-V3 recipe), or per row against per-channel scales (a tensor-wise weight
// scale broadcast to a vector on the device). Changes the numerics: each activation is rounded to e4m3 (3
// mantissa bits, 2^-4 relative).
bool linear_cublaslt(const Tensor& y, const Tensor& x2, const Tensor& w, const Tensor& scales, int64_t bn, int64_t bk,
                     ScaleRecipe recipe, const Tensor* bias) {
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  const bool block = recipe == ScaleRecipe::BlockWise;
  if (w.dtype() != DType::F8E4M3 || (block && (bn != 128 || bk != 128))) return false;
  if (k == 0 || k % (block ? 128 : 16) != 0 || n % 16 != 0 || w.stride(1) != 1 || (n > 1 && w.stride(0) % 16 != 0))
    return false;
  // Block scales of the activations are stored M-major by cuBLASLt: M is padded to a multiple of 4 (16-byte
  // scale columns) with zero rows, which quantise to zeros with scale 1 and whose outputs are dropped.
  const int64_t mp = block ? (m + 3) / 4 * 4 : m;
  Tensor xp = x2;
  if (mp != m) {
    xp = zeros({mp, k}, x2.dtype(), x2.device());
    xp.narrow(0, 0, m).copy_(x2);
  }
  const Tensor yp = mp == m ? y : empty({mp, n}, y.dtype(), y.device());
  bool done;
  if (block) {
    const Fp8Tensor q = kiln::quantize_fp8(xp, ScaleRecipe::BlockWise, DType::F8E4M3, true, 128);
    // scaled_mm's contract: b = W^T [K, N], scale_b [K/128, N/128].
    done = scaled_mm_cublaslt(yp, q.values, w.t(), q.scales, scales.t(), ScaleRecipe::BlockWise, bias);
  } else {
    const Fp8Tensor q = kiln::quantize_fp8(xp, ScaleRecipe::RowWise, DType::F8E4M3, true, 128);
    const Tensor sb = recipe == ScaleRecipe::RowWise ? scales.reshape({1, n}) : scales.reshape({1, 1}).expand({1, n});
    done = scaled_mm_cublaslt(yp, q.values, w.t(), q.scales, sb, ScaleRecipe::RowWise, bias);
  }
  if (!done) return false;
  if (mp != m) Tensor(y).copy_(yp.narrow(0, 0, m));
  return true;
}

// The exact definition (the CPU's): the weight dequantised to f32 in slices of rows (bounded scratch), f32
// products on cuBLAS (no TF32 unless allowed globally), bias added in f32, one rounding to x's dtype.
void linear_fallback(const Tensor& y, const Tensor& x2, const Tensor& w, const Tensor& scales, int64_t bn, int64_t bk,
                     const Tensor* bias) {
  const int64_t k = x2.size(1), n = w.size(0);
  const Tensor xf = x2.to(DType::F32);
  const Tensor bf = bias ? bias->to(DType::F32) : Tensor();
  // Slices of whole scale rows (so a slice's row r has scale row n0 / bn + r / bn), about 128 MB of f32 each; a
  // single scale row (tensor-wise) is broadcast instead.
  const bool one_row = scales.size(0) == 1;
  int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 25) / std::max<int64_t>(k, 1));
  if (!one_row) chunk = std::max<int64_t>(bn, chunk / bn * bn);
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    const int64_t nc = std::min(chunk, n - n0);
    Tensor wd = empty({nc, k}, DType::F32, y.device());
    const Tensor ws = one_row ? scales : scales.narrow(0, n0 / bn, scales.size(0) - n0 / bn);
    dequantize_fp8(w.narrow(0, n0, nc), ws, one_row ? 0 : ws.stride(0), ws.stride(1), bn, bk, wd);
    Tensor yc = mm(xf, wd.t());
    if (bias) yc = add(yc, bf.narrow(0, n0, nc));
    y.narrow(1, n0, nc).copy_(yc);
  }
}

}  // namespace

void set_fp8_gemv_config(int c) {
  KILN_CHECK(c >= -1 && c < kernels::kFp8GemvConfigs, "fp8: gemv config ", c, " is not -1 (auto) or one of 0..",
             kernels::kFp8GemvConfigs - 1);
  gemv_config().store(c, std::memory_order_relaxed);
}
int fp8_gemv_config() { return gemv_config().load(std::memory_order_relaxed); }
int64_t fp8_gemv_mma_launches() { return mma_launches().load(std::memory_order_relaxed); }

const char* fp8_path_name(Fp8Path p) {
  switch (p) {
    case Fp8Path::Auto: return "auto";
    case Fp8Path::Gemv: return "gemv";
    case Fp8Path::CublasLt: return "cublaslt";
    case Fp8Path::Fallback: return "fallback";
  }
  return "?";
}

void set_forced_fp8_path(Fp8Path p) { forced_path().store(p, std::memory_order_relaxed); }
Fp8Path forced_fp8_path() { return forced_path().load(std::memory_order_relaxed); }

// ---- quantisation ------------------------------------------------------------------------------------------

void quantize_fp8(const Tensor& x, const Tensor& values, const Tensor& scales, int64_t bm, int64_t bk, bool tensor_wise) {
  const int64_t M = x.size(0), K = x.size(1);
  const Device dev = x.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  const int64_t sx0 = x.stride(0), sx1 = x.stride(1);
  visit_dtypes<kActTypes>(x.dtype(), "quantize_fp8", [&](auto xtag) {
    using X = typename decltype(xtag)::type;
    visit_dtypes<kFloat8Types>(values.dtype(), "quantize_fp8", [&](auto ftag) {
      using F8 = typename decltype(ftag)::type;
      const float fmax = values.dtype() == DType::F8E4M3 ? 448.f : 57344.f;
      const X* xp = static_cast<const X*>(x.data_ptr());
      F8* qp = static_cast<F8*>(values.data_ptr());
      float* sp = scales.data<float>();
      if (tensor_wise) {
        const int64_t n = M * K;
        const int64_t want = (n + kernels::kQuantThreads - 1) / kernels::kQuantThreads;
        const int parts = static_cast<int>(std::min<int64_t>(want, int64_t{4} * multiprocessor_count(dev.index)));
        Tensor partial = empty({std::max(parts, 1)}, DType::F32, dev);
        if (parts > 0) {
          kernels::fp8_amax_partial_kernel<X><<<parts, kernels::kQuantThreads, 0, stream>>>(xp, sx0, sx1, M, K,
                                                                                               partial.data<float>());
          check_launch("quantize_fp8");
        }
        kernels::fp8_quantize_tensor_kernel<X, F8><<<grid_for(n, kernels::kQuantThreads, dev.index),
                                                     kernels::kQuantThreads, 0, stream>>>(
            xp, sx0, sx1, M, K, partial.data<const float>(), parts, fmax, qp, sp);
        check_launch("quantize_fp8");
        return;
      }
      const int64_t groups = scales.numel();
      if (groups == 0) return;
      const int64_t sk = scales.size(1);
      const int64_t per_block = kernels::kQuantThreads / 32;
      const int64_t blocks = (groups + per_block - 1) / per_block;
      KILN_CHECK(blocks <= INT_MAX, "quantize_fp8: ", groups, " groups need too many blocks");
      kernels::fp8_quantize_groups_kernel<X, F8><<<static_cast<unsigned>(blocks), kernels::kQuantThreads, 0, stream>>>(
          xp, sx0, sx1, M, K, bm, bk, sk, groups, fmax, qp, sp);
      check_launch("quantize_fp8");
    });
  });
}

void dequantize_fp8(const Tensor& v, const Tensor& scales, int64_t ss0, int64_t ss1, int64_t bm, int64_t bk,
                    const Tensor& out) {
  const int64_t M = v.size(0), K = v.size(1);
  if (M * K == 0) return;
  const Device dev = v.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  visit_dtypes<kFloat8Types>(v.dtype(), "dequantize_fp8", [&](auto tag) {
    using F8 = typename decltype(tag)::type;
    visit_dtypes<kActTypes>(out.dtype(), "dequantize_fp8", [&](auto otag) {
      using O = typename decltype(otag)::type;
      kernels::fp8_dequantize_kernel<F8, O><<<grid_for(M * K, kernels::kQuantThreads, dev.index),
                                             kernels::kQuantThreads, 0, stream>>>(
          static_cast<const F8*>(v.data_ptr()), v.stride(0), v.stride(1), M, K, scales.data<const float>(), bm, bk,
          ss0, ss1, static_cast<O*>(out.data_ptr()));
      check_launch("dequantize_fp8");
    });
  });
}

// ---- scaled_mm ---------------------------------------------------------------------------------------------

std::optional<Tensor> scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                                ScaleRecipe recipe, const std::optional<Tensor>& bias, DType out_dtype, Fp8Path path,
                                Fp8Path* taken) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (path == Fp8Path::Auto) path = forced_fp8_path();
  if (path == Fp8Path::Fallback) return std::nullopt;
  const Device dev = a.device();
  Tensor out = empty({M, N}, out_dtype, dev);
  if (M == 0 || N == 0) {
    if (taken) *taken = path == Fp8Path::Auto ? Fp8Path::CublasLt : path;
    return out;
  }
  const Tensor* bp = bias ? &*bias : nullptr;
  // One row: the matrix-vector kernel reads the weight b^T once (H200, 2026-12-03: tensor-wise on par with
  // cuBLASLt, row-wise 1.6-2.2x faster). More rows: cuBLASLt (at M = 16 the kernel was 5.5x slower tensor-
  // wise, 3.3x row-wise), or the kernel for up to 16 rows where cuBLASLt declines the operands.
  if (path == Fp8Path::Auto) {
    if (M > 1 && a.stride(1) == 1 && b.stride(0) == 1 && scaled_mm_cublaslt(out, a, b, scale_a, scale_b, recipe, bp)) {
      if (taken) *taken = Fp8Path::CublasLt;
      return out;
    }
    path = M <= kernels::kGemvMaxRows ? Fp8Path::Gemv : Fp8Path::CublasLt;
  }
  if (path == Fp8Path::Gemv && a.dtype() == DType::F8E4M3 && b.dtype() == DType::F8E4M3 &&
      (a.stride(1) == 1 || K <= 1) && (b.stride(0) == 1 || K <= 1) && K < (int64_t{1} << 30)) {
    // b^T [N, K] is the weight: row j starts at b + j * b.stride(1).
    const int64_t ldw = N > 1 ? b.stride(1) : K;
    Tensor ar = a;
    int64_t lda = M > 1 ? a.stride(0) : K;
    // Misaligned rows of a are copied to an aligned buffer (M x K bytes) when the weight can take 16-byte loads.
    if (K % 16 == 0 && aligned16(b.data_ptr()) && ldw % 16 == 0 && (!aligned16(a.data_ptr()) || lda % 16 != 0)) {
      ar = a.clone();
      lda = K;
    }
    GemvArgs g{};
    g.x = ar.data_ptr();
    g.ldx = lda;
    g.w = b.data_ptr();
    g.ldw = ldw;
    g.n = N;
    g.k = static_cast<int>(K);
    const Tensor& sa = scale_a;
    const Tensor& sb = scale_b;
    g.ws = sb.data<const float>();
    g.xs = sa.data<const float>();
    switch (recipe) {
      case ScaleRecipe::TensorWise:
        g.bn = std::max<int64_t>(N, 1), g.ws_sn = 0, g.ws_sk = 0, g.xs_sm = 0, g.xs_sk = 0;
        g.kblk = static_cast<int>(std::max<int64_t>(K, 1));
        break;
      case ScaleRecipe::RowWise:
        g.bn = 1, g.ws_sn = sb.stride(1), g.ws_sk = 0, g.xs_sm = sa.stride(0), g.xs_sk = 0;
        g.kblk = static_cast<int>(std::max<int64_t>(K, 1));
        break;
      default:
        g.bn = 128, g.ws_sn = sb.stride(1), g.ws_sk = sb.stride(0), g.xs_sm = sa.stride(0), g.xs_sk = sa.stride(1);
        g.kblk = 128;
        break;
    }
    g.vec = gemv_vec_ok(ar.data_ptr(), lda, 1, b.data_ptr(), ldw, K, g.kblk);
    const Tensor bias_f = bias ? bias->to(DType::F32).contiguous() : Tensor();
    g.bias = bias ? bias_f.data_ptr() : nullptr;
    g.y = out.data_ptr();
    g.ldy = N;
    g.dependent = constant_input(b) && constant_input(sb) && constant_input(bias_f);
    DeviceGuard guard(dev);
    const cudaStream_t stream = stream_of(dev);
    visit_dtypes<kActTypes>(out_dtype, "scaled_mm", [&](auto tag) {
      using O = typename decltype(tag)::type;
      launch_gemv<Float8_e4m3fn, O, float>(g, M, dev.index, stream);
    });
    if (taken) *taken = Fp8Path::Gemv;
    return out;
  }
  if (path != Fp8Path::Fallback && a.stride(1) == 1 && b.stride(0) == 1 &&
      scaled_mm_cublaslt(out, a, b, scale_a, scale_b, recipe, bp)) {
    if (taken) *taken = Fp8Path::CublasLt;
    return out;
  }
  return std::nullopt;
}

// ---- linear(Fp8Weight) -----------------------------------------------------------------------------------

Tensor linear_fp8(const Tensor& x2, const Tensor& w, const Tensor& scales, int64_t bn, int64_t bk, ScaleRecipe recipe,
                  const Tensor* bias, Fp8Path path, Fp8Path* taken) {
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  Tensor y = empty({m, n}, x2.dtype(), x2.device());
  if (m == 0 || n == 0) {
    if (taken) *taken = path;
    return y;
  }
  if (path == Fp8Path::Auto) path = forced_fp8_path();
  const bool gemv_ok = w.dtype() == DType::F8E4M3 && (w.stride(1) == 1 || k <= 1) && k < (int64_t{1} << 30);
  if (path == Fp8Path::Auto) {
    // Past 16 rows: cuBLASLt on quantised activations; where it cannot run, the matrix-vector kernel up to 64
    // rows (4 reads of an FP8 weight cost less than the f32 dequantisation), the f32 fallback beyond.
    // TUNE (H200, `kiln bench ops`): the crossover M.
    path = m <= kernels::kGemvMaxRows ? Fp8Path::Gemv : Fp8Path::CublasLt;
  }
  if (path == Fp8Path::CublasLt && linear_cublaslt(y, x2, w, scales, bn, bk, recipe, bias)) {
    if (taken) *taken = Fp8Path::CublasLt;
    return y;
  }
  if (path == Fp8Path::CublasLt) path = gemv_ok && m <= 64 ? Fp8Path::Gemv : Fp8Path::Fallback;
  if (path == Fp8Path::Gemv && gemv_ok) {
    linear_gemv(y, x2, w, scales, bn, bk, bias);
    if (taken) *taken = Fp8Path::Gemv;
    return y;
  }
  linear_fallback(y, x2, w, scales, bn, bk, bias);
  if (taken) *taken = Fp8Path::Fallback;
  return y;
}

}  // namespace kiln::cuda
