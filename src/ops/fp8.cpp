// FP8: quantisation with tensor-, row- and block-wise scales, scaled_mm (torch._scaled_mm's contract) and
// linear with an FP8 weight. CPU reference implementations here; CUDA tensors go to src/cuda/fp8.cu (with the
// reference composition of scaled_mm as the device's general fallback).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "cpu/moe.h"
#include "kiln/nn.h"
#if KILN_HAVE_CUDA
#include "cuda/fp8.h"
#endif

namespace kiln {

namespace {

constexpr DTypeSet kActTypes = dset(DType::F32, DType::F16, DType::BF16);

double fp8_max(DType t) { return t == DType::F8E4M3 ? 448.0 : 57344.0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void require_cpu(const char* op, const Tensor& t) {
  KILN_CHECK(!t.is_cuda(), op, ": no CUDA implementation in this build (input ", t.meta(), ")");
}

// The scale grid of a quantised [M, K] tensor: scales [sm, sk], group (bm x bk).
struct Grid {
  int64_t bm, bk, sm, sk;
};
Grid grid_of(int64_t M, int64_t K, ScaleRecipe r, bool activation, int64_t block) {
  switch (r) {
    case ScaleRecipe::TensorWise: return {std::max<int64_t>(M, 1), std::max<int64_t>(K, 1), 1, 1};
    case ScaleRecipe::RowWise: return {1, std::max<int64_t>(K, 1), M, 1};
    default:
      return activation ? Grid{1, block, M, ceil_div(K, block)} : Grid{block, block, ceil_div(M, block), ceil_div(K, block)};
  }
}

}  // namespace

const char* scale_recipe_name(ScaleRecipe r) {
  switch (r) {
    case ScaleRecipe::TensorWise: return "tensor-wise";
    case ScaleRecipe::RowWise: return "row-wise";
    default: return "block-wise";
  }
}

Fp8Tensor quantize_fp8(const Tensor& x, ScaleRecipe recipe, DType fp8_dtype, bool activation, int64_t block) {
  KILN_CHECK(x.dim() == 2 && (dset(x.dtype()) & kActTypes), "quantize_fp8: x must be a 2-d ", dtype_set_str(kActTypes),
             " tensor, got ", x.meta());
  KILN_CHECK(dset(fp8_dtype) & kFloat8Types, "quantize_fp8: fp8_dtype must be float8_e4m3fn or float8_e5m2, got ",
             dtype_name(fp8_dtype));
  KILN_CHECK(block >= 1 && block <= 65536, "quantize_fp8: block must be in [1, 65536], got ", block);
  const int64_t M = x.size(0), K = x.size(1);
  const Grid g = grid_of(M, K, recipe, activation, block);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    Fp8Tensor q{empty({M, K}, fp8_dtype, x.device()), empty({g.sm, g.sk}, DType::F32, x.device())};
    cuda::quantize_fp8(x, q.values, q.scales, g.bm, g.bk, recipe == ScaleRecipe::TensorWise);
    return q;
  }
#endif
  require_cpu("quantize_fp8", x);
  const Tensor xf = x.to(DType::F32).contiguous();
  const float* xp = xf.data<const float>();
  Tensor scales = empty({g.sm, g.sk}, DType::F32);
  Tensor q32 = empty({M, K}, DType::F32);
  float* sp = scales.data<float>();
  float* qp = q32.data<float>();
  const float fmax = static_cast<float>(fp8_max(fp8_dtype));
  for (int64_t i = 0; i < g.sm; ++i) {
    for (int64_t j = 0; j < g.sk; ++j) {
      const int64_t m0 = i * g.bm, m1 = std::min(M, m0 + g.bm), k0 = j * g.bk, k1 = std::min(K, k0 + g.bk);
      float amax = 0;
      bool finite = true;
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = k0; k < k1; ++k) {
          const float v = xp[m * K + k];
          finite &= std::isfinite(v);
          amax = std::max(amax, std::fabs(v));
        }
      const float s = !finite ? std::numeric_limits<float>::quiet_NaN() : amax == 0 ? 1.0f : amax / fmax;
      sp[i * g.sk + j] = s;
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = k0; k < k1; ++k) {
          const float v = xp[m * K + k] / s;
          qp[m * K + k] = v != v ? v : std::clamp(v, -fmax, fmax);
        }
    }
  }
  return Fp8Tensor{q32.to(fp8_dtype), scales};
}

Tensor dequantize_fp8(const Fp8Tensor& q, ScaleRecipe recipe, DType dtype, bool activation, int64_t block) {
  KILN_CHECK(q.values.dim() == 2 && (dset(q.values.dtype()) & kFloat8Types), "dequantize_fp8: values must be a ",
             "2-d float8 tensor, got ", q.values.meta());
  const int64_t M = q.values.size(0), K = q.values.size(1);
  const Grid g = grid_of(M, K, recipe, activation, block);
  KILN_CHECK(q.scales.dtype() == DType::F32 && q.scales.numel() == g.sm * g.sk, "dequantize_fp8: ",
             scale_recipe_name(recipe), " scales for ", q.values.meta(), " must be f32 [", g.sm, ", ", g.sk, "], got ",
             q.scales.meta());
  KILN_CHECK(q.scales.device() == q.values.device(), "dequantize_fp8: scales ", q.scales.meta(),
             " are not on the values' device ", q.values.device().str());
#if KILN_HAVE_CUDA
  if (q.values.is_cuda()) {
    const Tensor s = q.scales.reshape({g.sm, g.sk});
    // f32, f16 and bf16 written directly (the f32 product rounded once, as .to would); others through f32.
    const bool direct = dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
    Tensor out = empty({M, K}, direct ? dtype : DType::F32, q.values.device());
    cuda::dequantize_fp8(q.values, s, s.stride(0), s.stride(1), g.bm, g.bk, out);
    return direct ? out : out.to(dtype);
  }
#endif
  require_cpu("dequantize_fp8", q.values);
  const Tensor s = q.scales.reshape({g.sm, g.sk}).contiguous();
  Tensor v = q.values.to(DType::F32).contiguous();
  float* vp = v.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) vp[m * K + k] *= s.data<const float>()[(m / g.bm) * g.sk + k / g.bk];
  return v.to(dtype);
}

Tensor scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b, ScaleRecipe recipe,
                 const std::optional<Tensor>& bias, DType out_dtype) {
  KILN_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "scaled_mm: a must be [M, K] and b [K, N], got a ",
             a.meta(), ", b ", b.meta());
  KILN_CHECK((dset(a.dtype()) & kFloat8Types) && (dset(b.dtype()) & kFloat8Types), "scaled_mm: a and b must be float8, ",
             "got a ", a.meta(), ", b ", b.meta());
  KILN_CHECK(dset(out_dtype) & kActTypes, "scaled_mm: out_dtype must be ", dtype_set_str(kActTypes), ", got ",
             dtype_name(out_dtype));
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  Shape want_a, want_b;
  switch (recipe) {
    case ScaleRecipe::TensorWise: want_a = {1}; want_b = {1}; break;
    case ScaleRecipe::RowWise: want_a = {M, 1}; want_b = {1, N}; break;
    default: want_a = {M, ceil_div(K, 128)}; want_b = {ceil_div(K, 128), ceil_div(N, 128)}; break;
  }
  auto scale_ok = [](const Tensor& s, const Shape& want) {
    if (s.dtype() != DType::F32) return false;
    if (want.size() == 1) return s.numel() == 1;
    return s.sizes() == want;
  };
  KILN_CHECK(scale_ok(scale_a, want_a) && scale_ok(scale_b, want_b), "scaled_mm: ", scale_recipe_name(recipe),
             " scales for a ", a.meta(), " and b ", b.meta(), " must be f32 ", shape_str(want_a), " and ",
             shape_str(want_b), ", got scale_a ", scale_a.meta(), ", scale_b ", scale_b.meta());
  if (bias)
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == N && (dset(bias->dtype()) & kActTypes), "scaled_mm: bias must be [",
               N, "] f32/f16/bf16, got ", bias->meta());
  for (const Tensor* t : {&b, &scale_a, &scale_b})
    KILN_CHECK(t->device() == a.device(), "scaled_mm: ", t->meta(), " is not on a's device ", a.device().str());
  if (bias)
    KILN_CHECK(bias->device() == a.device(), "scaled_mm: bias ", bias->meta(), " is not on a's device ",
               a.device().str());
#if KILN_HAVE_CUDA
  if (a.is_cuda()) {
    if (std::optional<Tensor> out = cuda::scaled_mm(a, b, scale_a, scale_b, recipe, bias, out_dtype)) return *out;
    // Otherwise the reference composition below, on the device.
  }
#else
  require_cpu("scaled_mm", a);
#endif
  // Reference: dequantise both operands exactly (fp8 x f32 scale is exact in f32) and multiply in f32.
  const Tensor af = dequantize_fp8({a, scale_a}, recipe, DType::F32, true, 128);
  // b's scale grid is over [K, N] with 128 x 128 blocks (weights); as a [K, N] "weight" that is activation = false.
  Tensor bf;
  if (recipe == ScaleRecipe::RowWise) bf = mul(b.to(DType::F32), scale_b);
  else bf = dequantize_fp8({b.contiguous(), scale_b}, recipe, DType::F32, false, 128);
  Tensor out = mm(af, bf);
  if (bias) out = add(out, bias->to(DType::F32));
  return out.to(out_dtype);
}

Tensor linear(const Tensor& x, const Fp8Weight& w, const std::optional<Tensor>& bias) {
  KILN_CHECK(x.dim() >= 1 && (dset(x.dtype()) & kActTypes), "linear(fp8): x must be f32/f16/bf16 [..., K], got ",
             x.meta());
  KILN_CHECK(w.values.dim() == 2 && (dset(w.values.dtype()) & kFloat8Types), "linear(fp8): weight must be a float8 ",
             "[N, K] tensor, got ", w.values.meta());
  const int64_t N = w.values.size(0), K = w.values.size(1);
  KILN_CHECK(x.size(-1) == K, "linear(fp8): x ", x.meta(), " has K = ", x.size(-1), " but the weight ", w.values.meta(),
             " expects ", K);
  int64_t bn = 0, bk = 0;
  Shape grid;
  switch (w.recipe) {
    case ScaleRecipe::TensorWise: bn = std::max<int64_t>(N, 1); bk = std::max<int64_t>(K, 1); grid = {1, 1}; break;
    case ScaleRecipe::RowWise: bn = 1; bk = std::max<int64_t>(K, 1); grid = {N, 1}; break;
    default:
      KILN_CHECK(w.block_n >= 1 && w.block_k >= 1, "linear(fp8): block sizes must be positive, got ", w.block_n, "x", w.block_k);
      bn = w.block_n; bk = w.block_k; grid = {ceil_div(N, bn), ceil_div(K, bk)};
  }
  KILN_CHECK(w.scales.dtype() == DType::F32 && w.scales.numel() == grid[0] * grid[1], "linear(fp8): ",
             scale_recipe_name(w.recipe), " scales for weight ", w.values.meta(), " must be f32 with ", grid[0] * grid[1],
             " elements ", shape_str(grid), ", got ", w.scales.meta());
  if (bias)
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->dtype() == x.dtype(), "linear(fp8): bias must be [", N,
               "] in x's dtype, got ", bias->meta());
  for (const Tensor* t : {&w.values, &w.scales})
    KILN_CHECK(t->device() == x.device(), "linear(fp8): ", t->meta(), " is not on x's device ", x.device().str());
  if (bias)
    KILN_CHECK(bias->device() == x.device(), "linear(fp8): bias ", bias->meta(), " is not on x's device ",
               x.device().str());
  Shape out_shape = x.sizes();
  out_shape.back() = N;
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    const Tensor* bp = bias ? &*bias : nullptr;
    return cuda::linear_fp8(x.reshape({-1, K}), w.values, w.scales.reshape(grid).contiguous(), bn, bk, w.recipe, bp)
        .view(out_shape);
  }
#endif
  require_cpu("linear(fp8)", x);
  const Tensor x2 = x.reshape({-1, K}).contiguous();
  Tensor out = empty({x2.size(0), N}, x.dtype(), x.device());
  const Tensor bias_c = bias ? bias->contiguous() : Tensor();
  cpu::linear_fp8(out, x2, w.values.contiguous(), w.scales.reshape(grid).contiguous(), bn, bk, bias ? &bias_c : nullptr);
  return out.view(out_shape);
}

}  // namespace kiln
