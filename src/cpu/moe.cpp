#include "cpu/moe.h"

#include <vector>

#include "core/dispatch.h"
#include "cpu/loops.h"
#include "ops/math.h"
#include "ops/moe_math.h"

namespace kiln::cpu {

namespace {

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
  const bool parallel = T > 1 && T * k * I * H >= kParallelGrain;
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> xt(static_cast<size_t>(H)), acc(static_cast<size_t>(H), 0.0f);
    std::vector<X> h(static_cast<size_t>(I));
    for (int64_t c = 0; c < H; ++c) xt[static_cast<size_t>(c)] = convert<float>(xp[t * H + c]);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ep[t * k + j];
      const float w = convert<float>(wp[t * k + j]);
      const X* gu = gup + e * 2 * I * H;
      for (int64_t i = 0; i < I; ++i) {
        float g = 0, u = 0;
        const X* grow = gu + i * H;
        const X* urow = gu + (I + i) * H;
        for (int64_t c = 0; c < H; ++c) {
          g += convert<float>(grow[c]) * xt[static_cast<size_t>(c)];
          u += convert<float>(urow[c]) * xt[static_cast<size_t>(c)];
        }
        // The intermediate activation is stored in x's dtype, as the down projection reads it.
        h[static_cast<size_t>(i)] = convert<X>(moe_math::silu_mul(g, u));
      }
      const X* de = dp + e * H * I;
      for (int64_t c = 0; c < H; ++c) {
        float y = 0;
        for (int64_t i = 0; i < I; ++i) y += convert<float>(de[c * I + i]) * convert<float>(h[static_cast<size_t>(i)]);
        acc[static_cast<size_t>(c)] += w * y;
      }
    }
    for (int64_t c = 0; c < H; ++c) op[t * H + c] = convert<X>(acc[static_cast<size_t>(c)]);
  }
}

template <class F8, class X, class O>
void linear_fp8_kernel(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& scales, int64_t bn,
                       int64_t bk, const Tensor* bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const int64_t kb = scales.size(1);
  const X* xp = x.data<const X>();
  const F8* wp = w.data<const F8>();
  const float* sp = scales.data<const float>();
  O* op = out.data<O>();
  std::vector<float> bias_f(static_cast<size_t>(N), 0.0f);
  if (bias) {
    const Tensor b = bias->to(DType::F32).contiguous();
    for (int64_t n = 0; n < N; ++n) bias_f[static_cast<size_t>(n)] = b.data<const float>()[n];
  }
  const bool parallel = M * N * K >= kParallelGrain;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t n = 0; n < N; ++n) {
    const F8* wr = wp + n * K;
    const float* sr = sp + (n / bn) * kb;
    for (int64_t m = 0; m < M; ++m) {
      const X* xr = xp + m * K;
      float acc = 0;
      for (int64_t c = 0; c < K; ++c) acc += convert<float>(xr[c]) * (convert<float>(wr[c]) * sr[c / bk]);
      op[m * N + n] = convert<O>(acc + bias_f[static_cast<size_t>(n)]);
    }
  }
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
  // x and out share one dtype (the op's contract), so two dispatches: fp8 format x activation dtype.
  visit_dtypes<kFloat8Types>(w.dtype(), "linear(fp8)", [&](auto wtag) {
    using F8 = typename decltype(wtag)::type;
    visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "linear(fp8)", [&](auto xtag) {
      using X = typename decltype(xtag)::type;
      linear_fp8_kernel<F8, X, X>(out, x, w, scales, block_n, block_k, bias);
    });
  });
}

}  // namespace kiln::cpu
