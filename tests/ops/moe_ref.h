// The MoE block in double for a given routing: the definition moe_forward implements, shared by the CPU tests
// (tests/ops/moe_test.cpp) and the CUDA tests (tests/cuda/moe_test.cpp).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "kblocks_random.h"

namespace kiln::test {

// w [N, K] quantised to the block format named f ("q8_0", "q4_0" or "q4_k"); "q5_k" and "q6_k" (which kiln
// does not quantise to) give random super-blocks of w's shape, seeded by w's first value: Q5_K values in about
// [0, 0.6], Q6_K ones within about 1.2 of 0.
inline BlockWeight quantize_block(const Tensor& w, const std::string& f) {
  if (f == "q5_k" || f == "q6_k") {
    const double first = w.to(kCPU, DType::F64).flatten().narrow(0, 0, 1).item<double>();
    const uint64_t seed = static_cast<uint64_t>(std::fabs(first) * 1e9) + static_cast<uint64_t>(w.numel());
    if (f == "q5_k") return random_q5k(w.size(0), w.size(1), seed, 1e-4f, 3e-4f);
    return random_q6k(w.size(0), w.size(1), seed, 1e-4f, 3e-4f);
  }
  if (f == "q4_k") return quantize_q4_k(w);
  if (f == "q4_0") return quantize_q4_0(w);
  return quantize_q8_0(w);
}

// A case of moe_forward over block experts: T tokens of H, E experts of I, top k, the formats of gate_up and down.
struct BlockMoeCase {
  int64_t T, H, I, E, k;
  const char *gate_up, *down;
  DType dtype;
  std::string name() const {
    return str("T ", T, " H ", H, " I ", I, " E ", E, " k ", k, " ", gate_up, "/", down, " ", dtype_name(dtype));
  }
  // Random experts (uniform in [-0.3, 0.3)) quantised to the case's formats, on the CPU.
  template <class Random>
  BlockExperts experts(Random random) const {
    return {quantize_block(random(Shape{E * 2 * I, H}), gate_up), quantize_block(random(Shape{E * H, I}), down), E};
  }
};

// out[t] = sum over t's slots j of weight(t, j) * down_e(h), h = silu(gate_e x_t) * (up_e x_t) rounded to
// h_dtype before the down projection (as moe_forward stores h); x [T, H], gate_up [E, 2I, H], down [E, H, I]
// on any device and in any float dtype, all arithmetic in double. Returns [T, H] row-major.
inline std::vector<double> moe_ref_routed(const Tensor& x, const MoeRouting& r, const Tensor& gate_up,
                                          const Tensor& down, DType h_dtype) {
  auto values = [](const Tensor& t) { return t.to(kCPU, DType::F64).contiguous().to_vector<double>(); };
  const int64_t T = x.size(0), H = x.size(1), I = down.size(2), k = r.experts.size(1);
  const auto xv = values(x), gv = values(gate_up), dv = values(down), ev = values(r.experts), wv = values(r.weights);
  std::vector<double> out(static_cast<size_t>(T * H), 0.0), h(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = static_cast<int64_t>(ev[t * k + j]);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) {
          g += gv[(e * 2 * I + i) * H + c] * xv[t * H + c];
          u += gv[(e * 2 * I + I + i) * H + c] * xv[t * H + c];
        }
        h[i] = g / (1 + std::exp(-g)) * u;
      }
      const auto hr = values(from_vector<double>(h).to(h_dtype));
      for (int64_t c = 0; c < H; ++c) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += dv[(e * H + c) * I + i] * hr[i];
        out[t * H + c] += wv[t * k + j] * y;
      }
    }
  return out;
}

}  // namespace kiln::test
