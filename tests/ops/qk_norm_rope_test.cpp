// qk_norm_rope_append_ on the CPU: bit for bit the composition rms_norm, rms_norm, rope_, kv_cache_append_
// that it replaces (written below exactly as src/llm/model.cpp runs it), a double reference for the math,
// and the argument checks. The CUDA kernel is compared with both in tests/cuda/qk_norm_rope_test.cpp.
#include <cmath>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "ops/qk_norm_rope_case.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using namespace qk_rope;

// The layer's inputs with caches poisoned with NaN (so an element written by one side only shows).
struct Inputs : LayerInputs {
  Tensor k_cache, v_cache;
};

Inputs draw_with_caches(const Case& c) {
  Inputs in;
  static_cast<LayerInputs&>(in) = draw(c);
  in.k_cache = empty({1, c.hk, c.lmax, c.d}, c.dt);
  in.v_cache = empty({1, c.hk, c.lmax, c.d}, c.dt);
  poison(in.k_cache);
  poison(in.v_cache);
  return in;
}

// The four ops as run_layers calls them; returns q (normalised and rotated) and fills the caches.
Tensor composition(const Case& c, const Inputs& in, Tensor& k_cache, Tensor& v_cache) {
  const Tensor qkv = in.qkv.clone();
  Views x = split(qkv, c);
  Tensor q = x.q, k = x.k;
  if (c.q_normed) q = rms_norm(q, in.q_norm, kEps);
  if (c.k_normed) k = rms_norm(k, in.k_norm, kEps);
  rope_(q, k, in.positions, in.inv_freq, c.scaling);
  const Tensor k_new = k.view({1, c.t_len, c.hk, c.d}).transpose(1, 2);
  const Tensor v_new = x.v.view({1, c.t_len, c.hk, c.d}).transpose(1, 2);
  kv_cache_append_(k_cache, v_cache, k_new, v_new, in.at);
  return q;
}

void check_against_composition(const Case& c) {
  SCOPED_TRACE(describe(c));
  const Inputs in = draw_with_caches(c);
  Tensor kc_want = in.k_cache.clone(), vc_want = in.v_cache.clone();
  const Tensor q_want = composition(c, in, kc_want, vc_want);

  Tensor qkv = in.qkv.clone();
  Views x = split(qkv, c);
  Tensor k_cache = in.k_cache.clone(), v_cache = in.v_cache.clone();
  qk_norm_rope_append_(x.q, x.k, x.v, in.q_norm, in.k_norm, kEps, in.positions, in.inv_freq, c.scaling, k_cache,
                       v_cache, in.at);
  EXPECT_EQ(raw_bits(x.q), raw_bits(q_want));
  EXPECT_EQ(raw_bits(k_cache), raw_bits(kc_want));
  EXPECT_EQ(raw_bits(v_cache), raw_bits(vc_want));
  // k and v are read only: the rest of the buffer is bit for bit the input.
  const int64_t qs = c.hq * c.d;
  EXPECT_EQ(raw_bits(qkv.narrow(1, qs, qkv.size(1) - qs)), raw_bits(in.qkv.narrow(1, qs, qkv.size(1) - qs)));
}

TEST(QkNormRopeAppend, EqualsTheFourOpCompositionBitForBit) {
  for (DType dt : {DType::BF16, DType::F32, DType::F16})
    for (int64_t t_len : {1, 5})
      for (bool normed : {true, false}) {
        // Qwen3-like GQA, full rotation; the cache slot away from 0 and the last slot that fits.
        check_against_composition({dt, t_len, 8, 2, 64, 64, normed, normed, dt, DType::I64, 1.0, 16, 3});
        check_against_composition({dt, t_len, 4, 2, 128, 128, normed, normed, dt, DType::I32, 1.0, 9, 9 - t_len});
        // Partial rotary (channels past rotary_dim are only normalised) and YaRN-style scaling.
        check_against_composition({dt, t_len, 4, 1, 16, 8, normed, normed, dt, DType::I32, 1.25, 12, 0});
        check_against_composition({dt, t_len, 2, 2, 96, 32, normed, normed, dt, DType::I64, 0.75, 7, 1});
      }
}

TEST(QkNormRopeAppend, OneNormOnlyAndF32WeightsForHalfInputs) {
  for (DType dt : {DType::BF16, DType::F16}) {
    check_against_composition({dt, 3, 4, 2, 64, 64, true, false, dt, DType::I64, 1.0, 8, 2});
    check_against_composition({dt, 3, 4, 2, 64, 64, false, true, dt, DType::I64, 1.0, 8, 2});
    // f32 weights: the product with the weight is taken in f32 (promote_types), as rms_norm does.
    check_against_composition({dt, 2, 4, 2, 64, 48, true, true, DType::F32, DType::I32, 1.0, 8, 5});
  }
  check_against_composition({DType::F64, 2, 4, 2, 32, 32, true, true, DType::F64, DType::I64, 1.0, 4, 1});
}

// A double-precision reference of one head row: RMSNorm (weight or none), then the half-split rotation of the
// first `rot` channels with f32 angles (as HF: positions.float() * inv_freq in f32).
std::vector<double> head_ref(const std::vector<double>& x, const std::vector<double>* w, int64_t pos,
                             const std::vector<float>& inv, double scaling, double eps) {
  const size_t d = x.size(), half = inv.size();
  std::vector<double> y = x;
  if (w) {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (size_t i = 0; i < d; ++i) y[i] = x[i] * r * (*w)[i];
  }
  std::vector<double> out = y;
  for (size_t j = 0; j < half; ++j) {
    const float angle = static_cast<float>(pos) * inv[j];
    const double cs = std::cos(static_cast<double>(angle)) * scaling,
                 sn = std::sin(static_cast<double>(angle)) * scaling;
    out[j] = y[j] * cs - y[j + half] * sn;
    out[j + half] = y[j + half] * cs + y[j] * sn;
  }
  return out;
}

TEST(QkNormRopeAppend, MatchesDoubleReferenceInF32) {
  const Case c{DType::F32, 4, 4, 2, 64, 48, true, true, DType::F32, DType::I64, 1.0, 10, 6};
  SCOPED_TRACE(describe(c));
  const Inputs in = draw_with_caches(c);
  Tensor qkv = in.qkv.clone();
  Views x = split(qkv, c);
  Tensor k_cache = in.k_cache.clone(), v_cache = in.v_cache.clone();
  qk_norm_rope_append_(x.q, x.k, x.v, in.q_norm, in.k_norm, kEps, in.positions, in.inv_freq, c.scaling, k_cache,
                       v_cache, in.at);
  const auto inv = in.inv_freq.to_vector<float>();
  const auto pos = in.positions.to_vector<int64_t>();
  const auto wq = in.q_norm.to_vector<double>(), wk = in.k_norm.to_vector<double>();
  const Views x0 = split(in.qkv, c);
  std::vector<double> q_ref, k_ref;
  for (int64_t t = 0; t < c.t_len; ++t) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const auto r = head_ref(x0.q.select(0, t).select(0, h).to_vector<double>(), &wq, pos[t], inv, 1.0, kEps);
      q_ref.insert(q_ref.end(), r.begin(), r.end());
    }
  }
  for (int64_t h = 0; h < c.hk; ++h)
    for (int64_t t = 0; t < c.t_len; ++t) {
      const auto r = head_ref(x0.k.select(0, t).select(0, h).to_vector<double>(), &wk, pos[t], inv, 1.0, kEps);
      k_ref.insert(k_ref.end(), r.begin(), r.end());
    }
  // f32 rounding at the norm, the weight product and the rotation; cos/sin of angles up to 40000 rad.
  const Tolerance tol{1e-5, 1e-5};
  EXPECT_TRUE(all_close(x.q, from_vector<double>(q_ref, Shape{c.t_len, c.hq, c.d}).to(DType::F32), tol));
  EXPECT_TRUE(all_close(k_cache.narrow(2, c.at, c.t_len),
                        from_vector<double>(k_ref, Shape{1, c.hk, c.t_len, c.d}).to(DType::F32), tol));
  EXPECT_TRUE(equal(v_cache.narrow(2, c.at, c.t_len), x0.v.unsqueeze(0).transpose(1, 2).contiguous()));
  // Slots outside [at, at + T) keep their poison.
  const auto kv = k_cache.narrow(2, 0, c.at).to_vector<double>();
  for (double e : kv) ASSERT_TRUE(std::isnan(e));
}

TEST(QkNormRopeAppend, SeparateBuffersStridedCachesAndOtherVDim) {
  // q with a strided head dim, k and v from separate buffers, v wider than k (Dv != D), caches stored
  // position-major ([1, Lmax, Hk, D] seen as [1, Hk, Lmax, D]) and converted to f32 by the append.
  for (DType cache_dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(cache_dt));
    const int64_t t_len = 3, hq = 4, hk = 2, d = 32, dv = 48, lmax = 6;
    const Tensor q0 = random_tensor({t_len, d, hq}, DType::BF16).transpose(1, 2);
    const Tensor k0 = random_tensor({t_len, hk, d}, DType::BF16);
    const Tensor v0 = random_tensor({t_len, hk, dv}, DType::BF16);
    const Tensor wq = random_tensor({d}, DType::BF16, 0.5, 1.5), wk = random_tensor({d}, DType::BF16, 0.5, 1.5);
    const Tensor pos = from_vector<int32_t>({7, 100, 31000}), inv = rope_inv_freq(d, 1e4);
    const Tensor at = from_vector<int32_t>({2});
    Tensor kc0 = empty({1, lmax, hk, d}, cache_dt).transpose(1, 2),
           vc0 = empty({1, lmax, hk, dv}, cache_dt).transpose(1, 2);
    poison(kc0);
    poison(vc0);

    Tensor qw = rms_norm(q0, wq, kEps), kw = rms_norm(k0, wk, kEps);
    rope_(qw, kw, pos, inv, 1.0);
    Tensor kc_want = kc0.clone(), vc_want = vc0.clone();
    kv_cache_append_(kc_want, vc_want, kw.unsqueeze(0).transpose(1, 2), v0.unsqueeze(0).transpose(1, 2), at);

    Tensor q = q0.clone().transpose(1, 2).contiguous().transpose(1, 2);  // the same strided layout as q0
    Tensor k_cache = empty({1, lmax, hk, d}, cache_dt).transpose(1, 2),
           v_cache = empty({1, lmax, hk, dv}, cache_dt).transpose(1, 2);
    poison(k_cache);
    poison(v_cache);
    qk_norm_rope_append_(q, k0, v0, wq, wk, kEps, pos, inv, 1.0, k_cache, v_cache, at);
    EXPECT_EQ(raw_bits(q), raw_bits(qw));
    EXPECT_EQ(raw_bits(k_cache), raw_bits(kc_want));
    EXPECT_EQ(raw_bits(v_cache), raw_bits(vc_want));
  }
}

TEST(QkNormRopeAppend, QOverlappingKReadsEveryInputBeforeWritingQ) {
  // k is q's head 1 (the same memory): the result is that of k's values before the call.
  for (bool normed : {true, false}) {
    SCOPED_TRACE(normed ? "norms" : "no norms");
    const Tensor q0 = random_tensor({2, 3, 16}, DType::F32);
    const Tensor w = random_tensor({16}, DType::F32, 0.5, 1.5);
    const Tensor wn = normed ? w : Tensor();
    const Tensor v = random_tensor({2, 1, 16}, DType::F32);
    const Tensor pos = from_vector<int64_t>({4, 5}), inv = rope_inv_freq(16, 1e4), at = from_vector<int32_t>({0});

    Tensor q_want = q0.clone();
    Tensor kc_want = zeros({1, 1, 4, 16}), vc_want = zeros({1, 1, 4, 16});
    qk_norm_rope_append_(q_want, q0.narrow(1, 1, 1).clone(), v, wn, wn, kEps, pos, inv, 1.0, kc_want, vc_want, at);

    Tensor q = q0.clone();
    Tensor k_cache = zeros({1, 1, 4, 16}), v_cache = zeros({1, 1, 4, 16});
    qk_norm_rope_append_(q, q.narrow(1, 1, 1), v, wn, wn, kEps, pos, inv, 1.0, k_cache, v_cache, at);
    EXPECT_EQ(raw_bits(q), raw_bits(q_want));
    EXPECT_EQ(raw_bits(k_cache), raw_bits(kc_want));
    EXPECT_EQ(raw_bits(v_cache), raw_bits(vc_want));
  }
}

TEST(QkNormRopeAppend, AtOutOfRangeThrowsBeforeAnythingIsWritten) {
  const Case c{DType::BF16, 3, 4, 2, 16, 16, true, true, DType::BF16, DType::I64, 1.0, 8, 0};
  for (int32_t at : {-1, 6, 7, 1 << 30}) {
    SCOPED_TRACE(at);
    Inputs in = draw_with_caches(c);
    in.at = from_vector<int32_t>({at});
    Tensor qkv = in.qkv.clone();
    Views x = split(qkv, c);
    Tensor k_cache = in.k_cache.clone(), v_cache = in.v_cache.clone();
    EXPECT_TRUE(throws_error(
        [&] {
          qk_norm_rope_append_(x.q, x.k, x.v, in.q_norm, in.k_norm, kEps, in.positions, in.inv_freq, 1.0, k_cache,
                               v_cache, in.at);
        },
        {"qk_norm_rope_append_", "at = " + std::to_string(at), "Lmax = 8", "0 <= at <= 5"}));
    EXPECT_EQ(raw_bits(qkv), raw_bits(in.qkv));
    EXPECT_EQ(raw_bits(k_cache), raw_bits(in.k_cache));
    EXPECT_EQ(raw_bits(v_cache), raw_bits(in.v_cache));
  }
  // The last slot range that fits: at = Lmax - T.
  check_against_composition({DType::BF16, 3, 4, 2, 16, 16, true, true, DType::BF16, DType::I64, 1.0, 8, 5});
}

TEST(QkNormRopeAppend, ZeroTokensIsANoOp) {
  Tensor q = empty({0, 4, 16}), k = empty({0, 2, 16}), v = empty({0, 2, 16});
  Tensor k_cache = zeros({1, 2, 4, 16}), v_cache = zeros({1, 2, 4, 16});
  qk_norm_rope_append_(q, k, v, ones({16}), ones({16}), kEps, empty({0}, DType::I64), rope_inv_freq(16, 1e4), 1.0,
                       k_cache, v_cache, from_vector<int32_t>({4}));
  EXPECT_TRUE(equal(k_cache, zeros({1, 2, 4, 16})));
  EXPECT_TRUE(equal(v_cache, zeros({1, 2, 4, 16})));
}

TEST(QkNormRopeAppend, InvalidArgumentsThrowAndChangeNothing) {
  const int64_t t_len = 2, d = 8;
  const Tensor q0 = random_tensor({t_len, 4, d}, DType::F32);
  Tensor q = q0.clone();
  const Tensor k = random_tensor({t_len, 2, d}, DType::F32), v = random_tensor({t_len, 2, d}, DType::F32);
  const Tensor w = ones({d}), pos = from_vector<int64_t>({0, 1}), inv = rope_inv_freq(d, 1e4);
  const Tensor at = from_vector<int32_t>({0});
  Tensor kc = zeros({1, 2, 4, d}), vc = zeros({1, 2, 4, d});
  auto call = [&](Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& wq, const Tensor& pos_,
                  const Tensor& inv_, Tensor& kc_, Tensor& vc_, const Tensor& at_) {
    return [&, wq] { qk_norm_rope_append_(q_, k_, v_, wq, w, kEps, pos_, inv_, 1.0, kc_, vc_, at_); };
  };
  const Tensor k6 = ones({t_len, 2, 6}), k3 = ones({3, 2, d}), v1 = ones({t_len, 1, d}), q2 = ones({t_len, 4 * d});
  EXPECT_TRUE(
      throws_error(call(q, k6, v, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "head dim", "float32[2, 2, 6]"}));
  EXPECT_TRUE(throws_error(call(q, k3, v, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "token count"}));
  EXPECT_TRUE(
      throws_error(call(q, k, v1, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "Hk = 2", "float32[2, 1, 8]"}));
  Tensor q2m = q2;
  EXPECT_TRUE(throws_error(call(q2m, k, v, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "[T, Hq, D]"}));
  Tensor kc_bad = zeros({1, 3, 4, d}), vc_i = zeros({1, 2, 4, d}, DType::I32), vc_l = zeros({1, 2, 5, d});
  EXPECT_TRUE(throws_error(call(q, k, v, w, pos, inv, kc_bad, vc, at),
                           {"qk_norm_rope_append_", "k_cache [1, 2, Lmax, 8]", "float32[1, 3, 4, 8]"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, pos, inv, kc, vc_l, at), {"qk_norm_rope_append_", "one Lmax"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, pos, inv, kc, vc_i, at), {"qk_norm_rope_append_", "int32[1, 2, 4, 8]"}));
  EXPECT_TRUE(throws_error(call(q, k, v, ones({6}), pos, inv, kc, vc, at), {"qk_norm_rope_append_", "q_norm", "[8]"}));
  EXPECT_TRUE(
      throws_error(call(q, k, v, ones({d}, DType::I32), pos, inv, kc, vc, at), {"qk_norm_rope_append_", "q_norm"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, from_vector<int64_t>({0}), inv, kc, vc, at),
                           {"qk_norm_rope_append_", "positions", "[2]"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, from_vector<float>({0, 1}), inv, kc, vc, at),
                           {"qk_norm_rope_append_", "i32 or i64"}));
  EXPECT_TRUE(
      throws_error(call(q, k, v, w, pos, ones({5}), kc, vc, at), {"qk_norm_rope_append_", "rotary_dim", "10", "8"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, pos, inv, kc, vc, from_vector<int64_t>({0})),
                           {"qk_norm_rope_append_", "at must be i32 [1]"}));
  EXPECT_TRUE(throws_error(call(q, k, v, w, pos, inv, kc, vc, from_vector<int32_t>({0, 0})),
                           {"qk_norm_rope_append_", "at must be i32 [1]"}));
  // Caches sharing memory with q / k or with each other, an expanded q, an undefined required tensor.
  Tensor big = zeros({1, 2, 8, d});
  Tensor kc_view = big.narrow(2, 0, 4), vc_view = big.narrow(2, 2, 4), vc_other = big.narrow(2, 4, 4);
  EXPECT_TRUE(
      throws_error(call(q, k, v, w, pos, inv, kc_view, vc_view, at), {"qk_norm_rope_append_", "must not overlap"}));
  Tensor qa = big.select(0, 0).narrow(1, 0, t_len).transpose(0, 1).narrow(1, 0, 2);  // [T, 2, D] inside big
  EXPECT_TRUE(throws_error(call(qa, k.narrow(1, 0, 2), v, w, pos, inv, kc_view, vc_other, at),
                           {"qk_norm_rope_append_", "q must not share memory"}));
  Tensor q_exp = ones({t_len, 1, d}).expand({t_len, 4, d});
  EXPECT_TRUE(throws_error(call(q_exp, k, v, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "expanded"}));
  const Tensor none;
  EXPECT_TRUE(throws_error(call(q, none, v, w, pos, inv, kc, vc, at), {"qk_norm_rope_append_", "defined"}));
  // None of the failed calls changed anything.
  EXPECT_EQ(raw_bits(q), raw_bits(q0));
  EXPECT_TRUE(equal(kc, zeros({1, 2, 4, d})));
  EXPECT_TRUE(equal(vc, zeros({1, 2, 4, d})));
  EXPECT_TRUE(equal(big, zeros({1, 2, 8, d})));
  // The disjoint halves of one buffer are valid caches.
  Tensor kc_want = zeros({1, 2, 4, d}), vc_want = zeros({1, 2, 4, d});
  Tensor q_want = q0.clone();
  qk_norm_rope_append_(q_want, k, v, w, w, kEps, pos, inv, 1.0, kc_want, vc_want, at);
  qk_norm_rope_append_(q, k, v, w, w, kEps, pos, inv, 1.0, kc_view, vc_other, at);
  EXPECT_EQ(raw_bits(q), raw_bits(q_want));
  EXPECT_EQ(raw_bits(kc_view), raw_bits(kc_want));
  EXPECT_EQ(raw_bits(vc_other), raw_bits(vc_want));
}

}  // namespace
}  // namespace kiln::test
