// The cases and inputs shared by the CPU and CUDA tests of qk_norm_rope_append_ (tests/ops/qk_norm_rope_test.cpp,
// tests/cuda/qk_norm_rope_test.cpp): one layer's fused qkv projection output, norms, positions and cache slot.
#pragma once

#include <string>
#include <vector>

#include "kiln/nn.h"
#include "test_util.h"

namespace kiln::test::qk_rope {

constexpr double kEps = 1e-6;

struct Case {
  DType dt;
  int64_t t_len, hq, hk, d, rot;
  bool q_normed, k_normed;
  DType w_dt;  // the norm weights' dtype
  DType pos_dt;
  double scaling;
  int64_t lmax, at;
};

inline std::string describe(const Case& c) {
  return std::string(dtype_name(c.dt)) + " T " + std::to_string(c.t_len) + " Hq " + std::to_string(c.hq) + " Hk " +
         std::to_string(c.hk) + " D " + std::to_string(c.d) + " rot " + std::to_string(c.rot) + " norms " +
         std::to_string(c.q_normed) + std::to_string(c.k_normed) + " w " + dtype_name(c.w_dt) + " pos " +
         dtype_name(c.pos_dt) + " scaling " + std::to_string(c.scaling) + " Lmax " + std::to_string(c.lmax) + " at " +
         std::to_string(c.at);
}

// Host inputs of one layer, drawn fresh: the fused qkv output [T, (Hq + 2 Hk) * D], norms, positions (large
// ones included, so the angle math and cosf's range reduction are exercised) and the cache slot.
struct LayerInputs {
  Tensor qkv, q_norm, k_norm, positions, inv_freq, at;
};

inline LayerInputs draw(const Case& c) {
  LayerInputs in;
  in.qkv = random_tensor({c.t_len, (c.hq + 2 * c.hk) * c.d}, c.dt, -3, 3);
  if (c.q_normed) in.q_norm = random_tensor({c.d}, c.w_dt, 0.25, 2);
  if (c.k_normed) in.k_norm = random_tensor({c.d}, c.w_dt, 0.25, 2);
  std::vector<int64_t> pos = random_int_tensor({c.t_len}, DType::I64, 0, 131071).to_vector<int64_t>();
  pos[0] = 30000 + pos[0] % 1000;
  in.positions = from_vector<int64_t>(pos).to(c.pos_dt);
  in.inv_freq = rope_inv_freq(c.rot, 1e6);
  in.at = from_vector<int32_t>({static_cast<int32_t>(c.at)});
  return in;
}

struct Views {
  Tensor q, k, v;
};
// q, k, v as the engine takes them from the fused buffer.
inline Views split(const Tensor& qkv, const Case& c) {
  const int64_t qs = c.hq * c.d, kvs = c.hk * c.d;
  return {qkv.narrow(1, 0, qs).view({c.t_len, c.hq, c.d}), qkv.narrow(1, qs, kvs).view({c.t_len, c.hk, c.d}),
          qkv.narrow(1, qs + kvs, kvs).view({c.t_len, c.hk, c.d})};
}

}  // namespace kiln::test::qk_rope
