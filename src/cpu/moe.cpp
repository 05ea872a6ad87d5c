#include "cpu/moe.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "cpu/clones.h"
#include "cpu/fp8_dot.h"
#include "cpu/loops.h"
#include "ops/math.h"
#include "ops/moe_math.h"

namespace kiln::cpu {

namespace {

// The MoE block's loop over tokens. token(t, scratch) returns token t's activations in f32 (converted into
// scratch [H] when needed); gate_up_row(t, xt, h, j, i) sets h[j * I + i], expert j's activation i;
// down_row(t, h, c) writes output c. One token's rows are spread over the threads (decode); several tokens, one
// token per thread.
template <class Token, class GateUp, class Down>
void moe_token_loop(int64_t T, int64_t H, int64_t k, int64_t I, Token token, GateUp gate_up_row, Down down_row) {
  const bool big = k * I * H >= kParallelGrain;
  if (T == 1 || !big) {
    std::vector<float> scratch(static_cast<size_t>(H)), h(static_cast<size_t>(k * I));
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = token(t, scratch.data());
#pragma omp parallel for schedule(static) if (big)
      for (int64_t ji = 0; ji < k * I; ++ji) gate_up_row(t, xt, h.data(), ji / I, ji % I);
#pragma omp parallel for schedule(static) if (big)
      for (int64_t c = 0; c < H; ++c) down_row(t, h.data(), c);
    }
    return;
  }
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> scratch(static_cast<size_t>(H)), h(static_cast<size_t>(k * I));
    const float* xt = token(t, scratch.data());
    for (int64_t ji = 0; ji < k * I; ++ji) gate_up_row(t, xt, h.data(), ji / I, ji % I);
    for (int64_t c = 0; c < H; ++c) down_row(t, h.data(), c);
  }
}

// The MoE block over the experts in x's dtype: gate/up rows of the token's experts (simd_dot, each weight
// widened once), SiLU x up rounded to x's dtype (as the down projection reads it), then the down rows summed over
// the experts in router order.
template <class X>
void moe_experts_kernel(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                        const Tensor& gate_up, const Tensor& down) {
  const int64_t T = x.size(0), H = x.size(1), k = experts.size(1), I = down.size(2);
  const X* xp = x.data<const X>();
  const int32_t* ep = experts.data<const int32_t>();
  const X* wp = weights.data<const X>();
  const X* gup = gate_up.data<const X>();
  const X* dp = down.data<const X>();
  X* op = out.data<X>();
  // xt: the token in f32; h[j * I + i]: expert j's activation i, rounded to X.
  const auto gate_up_row = [&](int64_t t, const float* xt, float* h, int64_t j, int64_t i) {
    const X* gu = gup + static_cast<int64_t>(ep[t * k + j]) * 2 * I * H;
    const float g = simd_dot(xt, gu + i * H, H), u = simd_dot(xt, gu + (I + i) * H, H);
    h[j * I + i] = convert<float>(convert<X>(moe_math::silu_mul(g, u)));
  };
  const auto down_row = [&](int64_t t, const float* h, int64_t c) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const X* de = dp + static_cast<int64_t>(ep[t * k + j]) * H * I;
      acc += convert<float>(wp[t * k + j]) * simd_dot(h + j * I, de + c * I, I);
    }
    op[t * H + c] = convert<X>(acc);
  };
  const auto token = [&](int64_t t, float* xt) {
    for (int64_t c = 0; c < H; ++c) xt[c] = convert<float>(xp[t * H + c]);
    return static_cast<const float*>(xt);
  };
  moe_token_loop(T, H, k, I, token, gate_up_row, down_row);
}

// Up to this many rows of x, linear(x, Fp8Weight) reads the weight in place: each code is converted once per
// group of four rows and multiplied into them. More rows dequantise slices of the weight to f32 (value x scale,
// as the reference defines it) for one sgemm each.
constexpr int64_t kFp8InPlaceRows = 16;
// The f32 slice of the weight for the sgemm path: 16 MB.
constexpr int64_t kFp8SliceElems = int64_t{1} << 22;

template <class X>
void linear_fp8_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& scales, int64_t bn,
                       int64_t bk, const Tensor* bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const int64_t kb = scales.size(1);
  const bool e5m2 = w.dtype() == DType::F8E5M2;
  const X* xp = x.data<const X>();
  const uint8_t* wp = static_cast<const uint8_t*>(w.data_ptr());
  const float* sp = scales.data<const float>();
  X* op = out.data<X>();
  std::vector<float> xf(static_cast<size_t>(M * K)), bias_f(static_cast<size_t>(N), 0.0f);
  for (int64_t i = 0; i < M * K; ++i) xf[static_cast<size_t>(i)] = convert<float>(xp[i]);
  if (bias) {
    const Tensor b = bias->to(DType::F32).contiguous();
    for (int64_t n = 0; n < N; ++n) bias_f[static_cast<size_t>(n)] = b.data<const float>()[n];
  }
  if (M <= kFp8InPlaceRows || K == 0) {
#pragma omp parallel for schedule(static) if (N * K >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      float acc[4];
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, M - m0));
        fp8_dot_rows_scaled(xf.data() + m0 * K, K, rows, wp + n * K, sp + (n / bn) * kb, K, bk, e5m2, acc);
        for (int r = 0; r < rows; ++r) op[(m0 + r) * N + n] = convert<X>(acc[r] + bias_f[static_cast<size_t>(n)]);
      }
    }
    return;
  }
  const int64_t slice = std::clamp<int64_t>(kFp8SliceElems / std::max<int64_t>(K, 1), 1, N);
  std::vector<float> wf(static_cast<size_t>(slice * K)), yf(static_cast<size_t>(M * slice));
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t R = std::min(slice, N - n0);
#pragma omp parallel for schedule(static) if (R * K >= kParallelGrain)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t n = n0 + r;
      for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += bk)
        fp8_dequantize_row(wp + n * K + k0, std::min(bk, K - k0), e5m2, sp[(n / bn) * kb + b], wf.data() + r * K + k0);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(R),
                static_cast<int>(K), 1.0f, xf.data(), static_cast<int>(K), wf.data(), static_cast<int>(K), 0.0f,
                yf.data(), static_cast<int>(R));
#pragma omp parallel for schedule(static) if (M * R >= kParallelGrain)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < R; ++r)
        op[m * N + n0 + r] = convert<X>(yf[static_cast<size_t>(m * R + r)] + bias_f[static_cast<size_t>(n0 + r)]);
  }
}

// moe_experts_kernel with e4m3 experts read in place (only the selected experts, each code converted as
// it is used, its block's scale applied per block) on f32 activations, SiLU x up kept in f32.
void moe_experts_fp8_kernel(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                            const Tensor& gate_up, const Tensor& gu_scales, const Tensor& down,
                            const Tensor& dn_scales, int64_t bn, int64_t bk) {
  const int64_t T = x.size(0), H = x.size(1), k = experts.size(1), I = down.size(2);
  const float* xp = x.data<const float>();
  const int32_t* ep = experts.data<const int32_t>();
  const float* wp = weights.data<const float>();
  const uint8_t* gup = static_cast<const uint8_t*>(gate_up.data_ptr());
  const uint8_t* dp = static_cast<const uint8_t*>(down.data_ptr());
  const float* gsp = gu_scales.data<const float>();
  const float* dsp = dn_scales.data<const float>();
  const int64_t gs_rows = gu_scales.size(1), gs_cols = gu_scales.size(2);
  const int64_t ds_rows = dn_scales.size(1), ds_cols = dn_scales.size(2);
  float* op = out.data<float>();
  // h[j * I + i]: expert j's activation i for the token.
  const auto gate_up_row = [&](int64_t t, const float* xt, float* h, int64_t j, int64_t i) {
    const int64_t e = ep[t * k + j];
    const uint8_t* gu = gup + e * 2 * I * H;
    const float* sc = gsp + e * gs_rows * gs_cols;
    float g, u;
    fp8_dot_rows_scaled(xt, 0, 1, gu + i * H, sc + (i / bn) * gs_cols, H, bk, false, &g);
    fp8_dot_rows_scaled(xt, 0, 1, gu + (I + i) * H, sc + ((I + i) / bn) * gs_cols, H, bk, false, &u);
    h[j * I + i] = moe_math::silu_mul(g, u);
  };
  const auto down_row = [&](int64_t t, const float* h, int64_t c) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ep[t * k + j];
      float y;
      fp8_dot_rows_scaled(h + j * I, 0, 1, dp + (e * H + c) * I, dsp + (e * ds_rows + c / bn) * ds_cols, I, bk,
                          false, &y);
      acc += wp[t * k + j] * y;
    }
    op[t * H + c] = acc;
  };
  moe_token_loop(T, H, k, I, [&](int64_t t, float*) { return xp + t * H; }, gate_up_row, down_row);
}

}  // namespace

void moe_experts(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                 const Tensor& gate_up, const Tensor& down) {
  if (out.numel() == 0) return;
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "moe_forward", [&](auto tag) {
    moe_experts_kernel<typename decltype(tag)::type>(out, x, experts, weights, gate_up, down);
  });
}

void linear_fp8(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& scales, int64_t block_n,
                int64_t block_k, const Tensor* bias) {
  if (out.numel() == 0) return;
  KILN_CHECK(dset(w.dtype()) & kFloat8Types, "linear(fp8): weight must be float8, got ", w.meta());
  // x and out share one dtype (the op's contract); the weight format is a run-time choice inside.
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "linear(fp8)", [&](auto xtag) {
    using X = typename decltype(xtag)::type;
    linear_fp8_kernel<X>(out, x, w, scales, block_n, block_k, bias);
  });
}

void moe_experts_fp8(const Tensor& out, const Tensor& x, const Tensor& experts, const Tensor& weights,
                     const Tensor& gate_up, const Tensor& gate_up_scales, const Tensor& down,
                     const Tensor& down_scales, int64_t block_n, int64_t block_k) {
  if (out.numel() == 0) return;
  moe_experts_fp8_kernel(out, x, experts, weights, gate_up, gate_up_scales, down, down_scales, block_n, block_k);
}

}  // namespace kiln::cpu
