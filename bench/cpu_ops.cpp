// kiln_cpu_ops_bench: the CPU's decode and prefill products at model shapes, timed on this machine (the GPU's
// operators are timed by `kiln bench ops`). Fresh random data; each case runs once to warm up, then the median
// of --repeats runs is reported with the rate of weight bytes it implies.
//   build/bench/kiln_cpu_ops_bench [--repeats N] [--filter SUBSTRING]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cpu/fp8_dot.h"
#include "cpu/matmul.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"

using namespace kiln;

namespace {

double median_ms(const std::function<void()>& f, int repeats) {
  f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor uniform(const Shape& s, DType d, double lo, double hi) {
  Tensor t = empty(s, DType::F32);
  uniform_(t, lo, hi);
  return t.to(d);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 9;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--filter SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  std::printf("%s; FP8 SIMD path: %s; %d repeats (median)\n\n", cpu::blas_description().c_str(),
              cpu::fp8_simd_available() ? "yes" : "no", repeats);
  std::printf("| case | ms | weight GB/s |\n| --- | ---: | ---: |\n");
  const auto run = [&](const std::string& name, double weight_bytes, const std::function<void()>& f) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    const double ms = median_ms(f, repeats);
    std::printf("| %s | %.3f | %.1f |\n", name.c_str(), ms, weight_bytes / ms / 1e6);
    std::fflush(stdout);
  };

  // linear: bf16 and FP8 (128 x 128 block scales, as FP8 checkpoints store them) at 8B-class layer shapes.
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {4096, 14336}, {14336, 4096}}) {
    const Tensor w = uniform({n, k}, DType::F32, -1, 1);
    const Tensor wb = w.to(DType::BF16);
    const Fp8Tensor q = quantize_fp8(w, ScaleRecipe::BlockWise, DType::F8E4M3, false, 128);
    const Fp8Weight wf{q.values, q.scales, ScaleRecipe::BlockWise, 128, 128};
    for (int64_t m : {1, 4, 64}) {
      const Tensor x = uniform({m, k}, DType::BF16, -1, 1);
      const std::string shape = "K" + std::to_string(k) + " x N" + std::to_string(n) + " M" + std::to_string(m);
      run("linear bf16 " + shape, 2.0 * n * k, [&] { linear(x, wb); });
      run("linear fp8 " + shape, 1.0 * n * k, [&] { linear(x, wf); });
    }
  }

  // Weight-only integer formats at Qwen3-0.6B's shapes (H 1024, I 3072, q 2048, the 151,936-row lm_head),
  // the one-row products of a decode step and a 128-row prefill slice, against bf16.
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 2048}, {1024, 6144}, {3072, 1024}, {1024, 151936}}) {
    const Tensor w = uniform({n, k}, DType::F32, -1, 1);
    const Tensor wb = w.to(DType::BF16);
    const Q8Weight q8 = quantize_q8_0(w);
    const Q4KWeight q4k = quantize_q4_k(w);
    // Q6_K has no quantiser here (GGUF files bring it): random bytes are valid blocks; d set small.
    Tensor q6b = uniform({n, k / 256 * 210}, DType::F32, 0, 255.99).to(DType::U8);
    for (int64_t i = 0; i < n * (k / 256); ++i) {
      const uint16_t h = f32_to_f16_bits(1e-3f);
      std::memcpy(q6b.data<uint8_t>() + i * 210 + 208, &h, 2);
    }
    const Q6KWeight q6k{q6b};
    for (int64_t m : {1, 16, 17, 128}) {
      if (m > 1 && n > 100000) continue;
      const Tensor x = uniform({m, k}, DType::BF16, -1, 1);
      const std::string shape = "K" + std::to_string(k) + " x N" + std::to_string(n) + " M" + std::to_string(m);
      run("linear bf16 " + shape, 2.0 * n * k, [&] { linear(x, wb); });
      if (m > 1) {
        const Tensor xf = x.to(DType::F32), xh = x.to(DType::F16), wh = w.to(DType::F16);
        run("linear f32 " + shape, 4.0 * n * k, [&] { linear(xf, w); });
        run("linear f16 " + shape, 2.0 * n * k, [&] { linear(xh, wh); });
      }
      run("linear q8_0 " + shape, 34.0 / 32 * n * k, [&] { linear(x, q8); });
      run("linear q4_k " + shape, 144.0 / 256 * n * k, [&] { linear(x, q4k); });
      run("linear q6_k " + shape, 210.0 / 256 * n * k, [&] { linear(x, q6k); });
    }
  }

  // The MoE block at Qwen3-30B-A3B's layer (128 experts, top 8, H 2048, I 768): bf16 and FP8 experts.
  const int64_t E = 128, H = 2048, I = 768, top_k = 8;
  const Tensor router = uniform({E, H}, DType::BF16, -1, 1);
  const Fp8Tensor gu = quantize_fp8(uniform({E * 2 * I, H}, DType::F32, -1, 1), ScaleRecipe::BlockWise,
                                    DType::F8E4M3, false, 128);
  const Fp8Tensor dn = quantize_fp8(uniform({E * H, I}, DType::F32, -1, 1), ScaleRecipe::BlockWise, DType::F8E4M3,
                                    false, 128);
  const Fp8Experts fe{gu.values.view({E, 2 * I, H}), gu.scales.view({E, 2 * I / 128, H / 128}),
                      dn.values.view({E, H, I}), dn.scales.view({E, H / 128, I / 128}), 128, 128};
  const auto [gub, dnb] = dequantize_fp8_experts(fe, DType::BF16);
  for (int64_t t : {1, 16}) {
    const Tensor x = uniform({t, H}, DType::BF16, -1, 1);
    // Bytes of the selected experts' weights (at most top_k x T distinct experts).
    const double experts = static_cast<double>(std::min<int64_t>(E, top_k * t)) * 3 * H * I;
    const std::string shape = "E128 top8 H2048 I768 T" + std::to_string(t);
    run("moe bf16 " + shape, 2.0 * experts, [&] { moe_forward(x, router, gub, dnb, top_k, true); });
    run("moe fp8 " + shape, experts, [&] { moe_forward(x, router, fe, top_k, true); });
  }
  return 0;
}
