// grouped_mm, the MoE router and block, FP8 quantisation, scaled_mm and FP8 linear on the CPU, against
// plain-loop references in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "cpu/fp8_dot.h"
#include "kiln/nn.h"
#include "ops/linear_check.h"
#include "ops/moe_ref.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::all_close;
using test::random_tensor;
using test::throws_error;
using test::Tolerance;

std::vector<double> values(const Tensor& t) { return t.to(DType::F64).contiguous().to_vector<double>(); }

Tensor from_doubles(const std::vector<double>& v, const Shape& s, DType d) {
  return from_vector<double>(v, s).to(d);
}

Tensor offsets(const std::vector<int32_t>& v) { return from_vector<int32_t>(v); }

// out[m, n] = sum_k a[m, k] b[k, n] over the given index ranges, in double.
void ref_block(std::vector<double>& out, int64_t ldo, const std::vector<double>& a, int64_t lda,
               const std::vector<double>& b, int64_t ldb, int64_t a_off, int64_t b_off, int64_t o_off, int64_t m0,
               int64_t m1, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      double s = 0;
      for (int64_t k = k0; k < k1; ++k) s += a[a_off + m * lda + k] * b[b_off + k * ldb + n];
      out[o_off + m * ldo + n] = s;
    }
}

Tolerance mm_tol(DType d, int64_t K) {
  // f32 accumulation over K terms; half outputs round once.
  if (d == DType::F32) return {1e-5, 1e-5 * std::sqrt(static_cast<double>(K))};
  return test::default_tolerance(d);
}

class GroupedMm : public ::testing::TestWithParam<DType> {};

TEST_P(GroupedMm, TwoDByThreeDMatchesPerGroupProducts) {
  const DType d = GetParam();
  const int64_t M = 23, K = 19, N = 13;
  // Empty groups (0 rows), a group at the start and the last offset short of M (rows 21.. are zero).
  const std::vector<int32_t> ends = {0, 5, 5, 12, 21};
  const int64_t G = static_cast<int64_t>(ends.size());
  const Tensor a = random_tensor({M, K}, d), b = random_tensor({G, K, N}, d);
  const Tensor out = grouped_mm(a, b, offsets(ends));
  ASSERT_EQ(out.sizes(), (Shape{M, N}));
  const auto av = values(a), bv = values(b);
  std::vector<double> ref(static_cast<size_t>(M * N), 0.0);
  for (int64_t g = 0, start = 0; g < G; start = ends[g], ++g)
    ref_block(ref, N, av, K, bv, N, 0, g * K * N, 0, start, ends[g], 0, N, 0, K);
  EXPECT_TRUE(all_close(out, from_doubles(ref, {M, N}, d), mm_tol(d, K)));
}

TEST_P(GroupedMm, ThreeDByTwoDGroupsColumns) {
  const DType d = GetParam();
  const int64_t G = 3, M = 7, K = 11, N = 20;
  const std::vector<int32_t> ends = {6, 6, 17};
  const Tensor a = random_tensor({G, M, K}, d), b = random_tensor({K, N}, d);
  const Tensor out = grouped_mm(a, b, offsets(ends));
  ASSERT_EQ(out.sizes(), (Shape{M, N}));
  const auto av = values(a), bv = values(b);
  std::vector<double> ref(static_cast<size_t>(M * N), 0.0);
  for (int64_t g = 0, start = 0; g < G; start = ends[g], ++g)
    ref_block(ref, N, av, K, bv, N, g * M * K, 0, 0, 0, M, start, ends[g], 0, K);
  EXPECT_TRUE(all_close(out, from_doubles(ref, {M, N}, d), mm_tol(d, K)));
}

TEST_P(GroupedMm, TwoDByTwoDGroupsK) {
  const DType d = GetParam();
  const int64_t M = 6, K = 30, N = 9;
  const std::vector<int32_t> ends = {8, 8, 29};
  const int64_t G = 3;
  const Tensor a = random_tensor({M, K}, d), b = random_tensor({K, N}, d);
  const Tensor out = grouped_mm(a, b, offsets(ends));
  ASSERT_EQ(out.sizes(), (Shape{G, M, N}));
  const auto av = values(a), bv = values(b);
  std::vector<double> ref(static_cast<size_t>(G * M * N), 0.0);
  for (int64_t g = 0, start = 0; g < G; start = ends[g], ++g)
    ref_block(ref, N, av, K, bv, N, 0, 0, g * M * N, 0, M, 0, N, start, ends[g]);
  EXPECT_TRUE(all_close(out, from_doubles(ref, {G, M, N}, d), mm_tol(d, K)));
}

TEST_P(GroupedMm, BatchedThreeDByThreeD) {
  const DType d = GetParam();
  const int64_t G = 4, M = 5, K = 17, N = 6;
  const Tensor a = random_tensor({G, M, K}, d), b = random_tensor({G, N, K}, d).transpose(1, 2);  // strided b
  const Tensor out = grouped_mm(a, b, std::nullopt, DType::F32);
  EXPECT_EQ(out.dtype(), DType::F32);
  const auto av = values(a), bv = values(b);
  std::vector<double> ref(static_cast<size_t>(G * M * N), 0.0);
  for (int64_t g = 0; g < G; ++g) ref_block(ref, N, av, K, bv, N, g * M * K, g * K * N, g * M * N, 0, M, 0, N, 0, K);
  EXPECT_TRUE(all_close(out, from_vector<double>(ref, Shape{G, M, N}).to(DType::F32), mm_tol(DType::F32, K)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GroupedMm, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST(GroupedMmErrors, InvalidOffsetsAndShapes) {
  const Tensor a = random_tensor({10, 8}, DType::F32), b = random_tensor({3, 8, 4}, DType::F32);
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b, offsets({3, 2, 7})); }, {"offs[1] = 2", "non-decreasing"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b, offsets({3, 5, 11})); }, {"offs[2] = 11", "[0, 10]"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b, offsets({-1, 5, 7})); }, {"offs[0] = -1"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b, offsets({3, 5})); }, {"G = offs' length 2"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b, from_vector<int64_t>({3, 5, 7})); }, {"int32"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b); }, {"offs is required"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, b.to(DType::BF16), offsets({1, 2, 3})); }, {"one dtype"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(a, random_tensor({3, 7, 4}, DType::F32), offsets({1, 2, 3})); }, {"[G, K, N]"}));
  EXPECT_TRUE(throws_error([&] { grouped_mm(random_tensor({2, 3, 8}, DType::F32), random_tensor({2, 8, 4}, DType::F32),
                                            offsets({1, 2})); }, {"no offs"}));
}

// ---- router and MoE block ------------------------------------------------------------------------------------

struct RefRoute {
  std::vector<std::vector<int64_t>> experts;
  std::vector<std::vector<double>> weights;
};

// Double-precision router on the logits as x's dtype rounds them (the logits are a linear in x's dtype).
RefRoute ref_route(const Tensor& logits_in_xdtype, int64_t k, bool norm) {
  const int64_t T = logits_in_xdtype.size(0), E = logits_in_xdtype.size(1);
  const auto lv = values(logits_in_xdtype);
  RefRoute r;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(static_cast<size_t>(E));
    double mx = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, lv[t * E + e]);
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(lv[t * E + e] - mx);
    for (auto& v : p) v /= s;
    std::vector<int64_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return p[x] > p[y]; });
    idx.resize(static_cast<size_t>(k));
    std::vector<double> w;
    double ws = 0;
    for (int64_t e : idx) ws += p[e];
    for (int64_t e : idx) w.push_back(norm ? p[e] / ws : p[e]);
    r.experts.push_back(idx);
    r.weights.push_back(w);
  }
  return r;
}

TEST(MoeRoute, MatchesSoftmaxTopkAndRenormalisation) {
  for (bool norm : {true, false}) {
    const Tensor x = random_tensor({9, 32}, DType::F32), router = random_tensor({16, 32}, DType::F32, -0.5, 0.5);
    const MoeRouting r = moe_route(x, router, 4, norm);
    EXPECT_EQ(r.experts.dtype(), DType::I32);
    const RefRoute ref = ref_route(linear(x, router), 4, norm);
    const auto ev = values(r.experts), wv = values(r.weights);
    for (int64_t t = 0; t < 9; ++t)
      for (int64_t j = 0; j < 4; ++j) {
        EXPECT_EQ(ev[t * 4 + j], ref.experts[t][j]) << t << "," << j;
        EXPECT_NEAR(wv[t * 4 + j], ref.weights[t][j], 1e-6) << t << "," << j;
      }
  }
}

TEST(MoeRoute, TiesPickTheLowerExpert) {
  // Identical router rows: every expert ties; the top-k must be experts 0..k-1 with equal weights.
  const Tensor x = random_tensor({3, 8}, DType::F32);
  const Tensor router = random_tensor({1, 8}, DType::F32).expand({6, 8}).contiguous();
  const MoeRouting r = moe_route(x, router, 3, true);
  const auto ev = values(r.experts), wv = values(r.weights);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(ev[t * 3 + j], j);
      EXPECT_NEAR(wv[t * 3 + j], 1.0 / 3, 1e-6);
    }
}

// The dense computation of the selected experts, in double (tests/ops/moe_ref.h) on moe_route's routing
// (checked separately above). h_dtype: what h rounds to before the down projection (x's dtype unless given).
std::vector<double> ref_moe(const Tensor& x, const Tensor& router, const Tensor& gate_up, const Tensor& down,
                            int64_t k, bool norm, std::optional<DType> h_dtype = std::nullopt) {
  return test::moe_ref_routed(x, moe_route(x, router, k, norm), gate_up, down, h_dtype.value_or(x.dtype()));
}

struct MoeCase {
  int64_t T, H, I, E, k;
  bool norm;
  DType dtype;
};

class MoeForward : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeForward, EqualsDenseComputationOfSelectedExperts) {
  const MoeCase c = GetParam();
  const Tensor x = random_tensor({c.T, c.H}, c.dtype);
  const Tensor router = random_tensor({c.E, c.H}, c.dtype, -1, 1);
  const Tensor gate_up = random_tensor({c.E, 2 * c.I, c.H}, c.dtype, -0.3, 0.3);
  const Tensor down = random_tensor({c.E, c.H, c.I}, c.dtype, -0.3, 0.3);
  const Tensor out = moe_forward(x, router, gate_up, down, c.k, c.norm);
  ASSERT_EQ(out.sizes(), x.sizes());
  ASSERT_EQ(out.dtype(), c.dtype);
  const auto ref = ref_moe(x, router, gate_up, down, c.k, c.norm);
  // f32: accumulation order over H, I and k terms; half types: h's rounding is in the reference, the output
  // rounds once.
  const Tolerance tol = c.dtype == DType::F32 ? Tolerance{1e-5, 2e-5} : Tolerance{1.6e-2, 2e-3};
  EXPECT_TRUE(all_close(out, from_doubles(ref, {c.T, c.H}, c.dtype), tol));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeForward,
                         ::testing::Values(MoeCase{1, 32, 16, 8, 2, true, DType::F32},
                                           MoeCase{37, 24, 12, 6, 3, false, DType::F32},
                                           MoeCase{5, 16, 8, 1, 1, true, DType::F32},       // E = 1
                                           MoeCase{4, 16, 8, 4, 4, false, DType::F32},      // top_k = E
                                           MoeCase{64, 8, 4, 32, 2, true, DType::F32},      // most experts idle
                                           MoeCase{7, 40, 20, 8, 2, true, DType::BF16},
                                           MoeCase{3, 40, 20, 8, 8, false, DType::F16}));

TEST(MoeForwardErrors, ShapesAndDtypes) {
  const Tensor x = random_tensor({2, 16}, DType::F32), router = random_tensor({4, 16}, DType::F32);
  const Tensor gu = random_tensor({4, 16, 16}, DType::F32), dn = random_tensor({4, 16, 8}, DType::F32);
  EXPECT_NO_THROW(moe_forward(x, router, gu, dn, 2, true));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, gu, dn, 5, true); }, {"top_k"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, gu, random_tensor({4, 16, 9}, DType::F32), 2, true); },
                           {"gate_up [E, 2I, H]"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, gu.to(DType::BF16), dn, 2, true); }, {"dtype"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, random_tensor({3, 16}, DType::F32), gu, dn, 2, true); }, {"router_weight"}));
}

// ---- FP8 experts ---------------------------------------------------------------------------------------------

// FP8 values spread over the e4m3 range and f32 block scales [E, ceil(R / bn), ceil(K / bk)].
std::pair<Tensor, Tensor> random_fp8_stack(int64_t E, int64_t R, int64_t K, int64_t bn, int64_t bk) {
  const Tensor v = random_tensor({E, R, K}, DType::F32, -400, 400).to(DType::F8E4M3);
  const Tensor s = random_tensor({E, (R + bn - 1) / bn, (K + bk - 1) / bk}, DType::F32, 2e-4, 1e-3);
  return {v, s};
}

// value x scale per element in double, by plain loops: [E, R, K] f64.
Tensor dequant_ref(const Tensor& v, const Tensor& s, int64_t bn, int64_t bk) {
  const int64_t E = v.size(0), R = v.size(1), K = v.size(2);
  const auto vv = values(v), sv = values(s);
  std::vector<double> out(static_cast<size_t>(E * R * K));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k)
        out[(e * R + r) * K + k] = vv[(e * R + r) * K + k] * sv[(e * s.size(1) + r / bn) * s.size(2) + k / bk];
  return from_doubles(out, {E, R, K}, DType::F64);
}

TEST(MoeForwardFp8, EqualsDenseComputationWithDequantisedExperts) {
  struct Case {
    int64_t T, H, I, E, k, bn, bk;
    DType dtype;
  };
  for (const Case& c : {Case{1, 32, 16, 8, 2, 16, 16, DType::F32}, Case{9, 40, 20, 6, 3, 16, 8, DType::F32},  // ragged
                        Case{4, 64, 32, 4, 4, 32, 64, DType::F32}, Case{5, 48, 24, 8, 2, 16, 16, DType::BF16},
                        // large enough for the threaded paths: one token's rows spread, then a token per thread
                        Case{1, 256, 136, 8, 4, 128, 128, DType::F32}, Case{6, 256, 136, 8, 4, 128, 128, DType::BF16}}) {
    SCOPED_TRACE(str("T ", c.T, " H ", c.H, " I ", c.I, " E ", c.E, " k ", c.k, " blocks ", c.bn, "x", c.bk, " ",
                     dtype_name(c.dtype)));
    const Tensor x = random_tensor({c.T, c.H}, c.dtype);
    const Tensor router = random_tensor({c.E, c.H}, c.dtype, -1, 1);
    auto [gu, gus] = random_fp8_stack(c.E, 2 * c.I, c.H, c.bn, c.bk);
    auto [dn, dns] = random_fp8_stack(c.E, c.H, c.I, c.bn, c.bk);
    const Fp8Experts e{gu, gus, dn, dns, c.bn, c.bk};
    const Tensor out = moe_forward(x, router, e, c.k, true);
    ASSERT_EQ(out.sizes(), x.sizes());
    ASSERT_EQ(out.dtype(), c.dtype);
    const Tensor gu_ref = dequant_ref(gu, gus, c.bn, c.bk), dn_ref = dequant_ref(dn, dns, c.bn, c.bk);
    // The CPU FP8 path computes the experts in f32 (h too) on the routing of x's dtype.
    const auto ref = ref_moe(x, router, gu_ref, dn_ref, c.k, true, DType::F32);
    const Tolerance tol = c.dtype == DType::F32 ? Tolerance{1e-5, 2e-5} : Tolerance{1.6e-2, 2e-3};
    EXPECT_TRUE(all_close(out, from_doubles(ref, {c.T, c.H}, c.dtype), tol));
    // dequantize_fp8_experts: value x scale, rounded once to the dtype.
    auto [gd, dd] = dequantize_fp8_experts(e, DType::F32);
    EXPECT_TRUE(all_close(gd, gu_ref.to(DType::F32), Tolerance{0, 0}));
    EXPECT_TRUE(all_close(dd, dn_ref.to(DType::F32), Tolerance{0, 0}));
  }
}

TEST(MoeForwardFp8, BadScalesAndValuesAreErrors) {
  const Tensor x = random_tensor({2, 32}, DType::F32), router = random_tensor({4, 32}, DType::F32);
  auto [gu, gus] = random_fp8_stack(4, 32, 32, 16, 16);
  auto [dn, dns] = random_fp8_stack(4, 32, 16, 16, 16);
  EXPECT_NO_THROW(moe_forward(x, router, Fp8Experts{gu, gus, dn, dns, 16, 16}, 2, true));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, Fp8Experts{gu, gus, dn, dns, 16, 8}, 2, true); },
                           {"moe_forward", "scales must be f32"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, Fp8Experts{gu.to(DType::F32), gus, dn, dns, 16, 16}, 2, true); },
                           {"float8_e4m3fn"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, Fp8Experts{gu, gus.to(DType::F64), dn, dns, 16, 16}, 2, true); },
                           {"scales must be f32"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, Fp8Experts{gu, gus, dn, dns, 0, 16}, 2, true); },
                           {"blocks must be positive"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(random_tensor({2, 16}, DType::F32), router, Fp8Experts{gu, gus, dn, dns, 16, 16}, 2, true); },
                           {"moe_forward"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, Fp8Experts{gu, gus, dn, dns, 16, 16}, 5, true); }, {"top_k"}));
  EXPECT_TRUE(throws_error([&] { dequantize_fp8_experts(Fp8Experts{gu, gus, dn, dns, 16, 16}, DType::I32); },
                           {"dequantize_fp8_experts"}));
}

// ---- FP8 -----------------------------------------------------------------------------------------------------

TEST(Fp8, QuantiseRoundTripWithinHalfAnUlpOfTheScaledValue) {
  for (ScaleRecipe r : {ScaleRecipe::TensorWise, ScaleRecipe::RowWise, ScaleRecipe::BlockWise}) {
    for (bool act : {true, false}) {
      SCOPED_TRACE(std::string(scale_recipe_name(r)) + (act ? " activation" : " weight"));
      const Tensor x = random_tensor({150, 300}, DType::F32, -3, 3);
      const Fp8Tensor q = quantize_fp8(x, r, DType::F8E4M3, act, 128);
      EXPECT_EQ(q.values.dtype(), DType::F8E4M3);
      const Tensor back = dequantize_fp8(q, r, DType::F32, act, 128);
      // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 of each value, plus subnormal spacing of the scale.
      const auto xv = values(x), bv = values(back), sv = values(q.scales);
      const double smax = *std::max_element(sv.begin(), sv.end());
      for (size_t i = 0; i < xv.size(); ++i)
        ASSERT_LE(std::fabs(bv[i] - xv[i]), std::fabs(xv[i]) / 16 + smax * std::ldexp(1.0, -9)) << i;
      // Every group's largest magnitude maps to 448 (the scale is amax / 448).
      const auto qv = values(q.values.to(DType::F32));
      EXPECT_EQ(*std::max_element(qv.begin(), qv.end(), [](double a, double b) { return std::fabs(a) < std::fabs(b); }) ==
                    448.0 || *std::min_element(qv.begin(), qv.end()) == -448.0, true);
    }
  }
  const Fp8Tensor q = quantize_fp8(random_tensor({2, 300}, DType::BF16), ScaleRecipe::BlockWise, DType::F8E4M3, true, 128);
  EXPECT_EQ(q.scales.sizes(), (Shape{2, 3}));
  const Fp8Tensor w = quantize_fp8(random_tensor({200, 300}, DType::F32), ScaleRecipe::BlockWise, DType::F8E4M3, false, 128);
  EXPECT_EQ(w.scales.sizes(), (Shape{2, 3}));
  EXPECT_EQ(quantize_fp8(random_tensor({5, 7}, DType::F32), ScaleRecipe::RowWise).scales.sizes(), (Shape{5, 1}));
}

TEST(Fp8, ZerosExtremeScalesAndNonFinite) {
  Tensor x = zeros({2, 4}, DType::F32);
  EXPECT_EQ(values(quantize_fp8(x, ScaleRecipe::RowWise).scales), (std::vector<double>{1.0, 1.0}));
  // Extreme magnitudes: tiny and huge rows keep their relative precision through the scale.
  x = from_vector<float>({1e-30f, -2e-30f, 3e-30f, 0.5e-30f, 1e30f, -3e30f, 2e30f, 1e29f}, Shape{2, 4});
  const Fp8Tensor q = quantize_fp8(x, ScaleRecipe::RowWise);
  EXPECT_TRUE(all_close(dequantize_fp8(q, ScaleRecipe::RowWise), x, Tolerance{1.0 / 16, 0}));
  // NaN or inf in a group: that group's scale is NaN, the others are unaffected.
  x = from_vector<float>({1, NAN, 2, 3, 1, 2, 3, 4, INFINITY, 0, 0, 0}, Shape{3, 4});
  const auto s = values(quantize_fp8(x, ScaleRecipe::RowWise).scales);
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_NEAR(s[1], 4.0 / 448, 1e-9);
  EXPECT_TRUE(std::isnan(s[2]));
  // e5m2 range.
  const Fp8Tensor q5 = quantize_fp8(random_tensor({3, 9}, DType::F32), ScaleRecipe::TensorWise, DType::F8E5M2);
  EXPECT_EQ(q5.values.dtype(), DType::F8E5M2);
  EXPECT_NEAR(values(amax(abs(q5.values.to(DType::F32))))[0], 57344.0, 0);
}

// (a * sa) @ (b * sb) in double from the dequantised operands.
std::vector<double> ref_scaled(const Tensor& a_deq, const Tensor& b_deq) {
  const int64_t M = a_deq.size(0), K = a_deq.size(1), N = b_deq.size(1);
  const auto av = values(a_deq), bv = values(b_deq);
  std::vector<double> out(static_cast<size_t>(M * N));
  ref_block(out, N, av, K, bv, N, 0, 0, 0, 0, M, 0, N, 0, K);
  return out;
}

TEST(ScaledMm, AllRecipesMatchDequantisedProduct) {
  const int64_t M = 17, K = 300, N = 140;
  for (ScaleRecipe r : {ScaleRecipe::TensorWise, ScaleRecipe::RowWise, ScaleRecipe::BlockWise}) {
    SCOPED_TRACE(scale_recipe_name(r));
    const Fp8Tensor a = quantize_fp8(random_tensor({M, K}, DType::F32), r, DType::F8E4M3, true, 128);
    // The weight W [N, K] quantised per output channel / 128x128 block, passed as W^T.
    const Fp8Tensor w = quantize_fp8(random_tensor({N, K}, DType::F32), r, DType::F8E4M3, false, 128);
    const Tensor sb = r == ScaleRecipe::RowWise ? w.scales.t() : r == ScaleRecipe::BlockWise ? w.scales.t() : w.scales;
    const Tensor bias = random_tensor({N}, DType::F32);
    for (DType od : {DType::F32, DType::BF16}) {
      const Tensor out = scaled_mm(a.values, w.values.t(), a.scales, sb, r, bias, od);
      ASSERT_EQ(out.sizes(), (Shape{M, N}));
      const Tensor ad = dequantize_fp8(a, r, DType::F64, true), wd = dequantize_fp8(w, r, DType::F64, false);
      auto ref = ref_scaled(ad, wd.t());
      const auto bv = values(bias);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) ref[m * N + n] += bv[n];
      // f32 sums against the exact product: within linear_close's bound (cancelling outputs included).
      EXPECT_TRUE(test::linear_close(out, from_doubles(ref, {M, N}, DType::F64), test::linear_abs_scale(ad, wd, bias),
                                     od, K));
    }
  }
  const Tensor a8 = random_tensor({4, 8}, DType::F32).to(DType::F8E4M3), b8 = random_tensor({8, 3}, DType::F32).to(DType::F8E4M3);
  EXPECT_TRUE(throws_error([&] { scaled_mm(a8, b8, ones({4, 1}), ones({1, 2}), ScaleRecipe::RowWise); }, {"[4, 1]", "[1, 3]"}));
  EXPECT_TRUE(throws_error([&] { scaled_mm(a8.to(DType::BF16), b8, ones({1}), ones({1}), ScaleRecipe::TensorWise); }, {"float8"}));
}

TEST(LinearFp8, BlockRowAndTensorScalesMatchDequantisedWeight) {
  const int64_t N = 200, K = 300;  // neither a multiple of the 128 block
  for (ScaleRecipe r : {ScaleRecipe::TensorWise, ScaleRecipe::RowWise, ScaleRecipe::BlockWise}) {
    for (DType d : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(scale_recipe_name(r)) + " " + dtype_name(d));
      const Fp8Tensor q = quantize_fp8(random_tensor({N, K}, DType::F32), r, DType::F8E4M3, false, 128);
      const Fp8Weight w{q.values, q.scales, r, 128, 128};
      const Tensor x = random_tensor({2, 3, K}, d);
      const Tensor bias = random_tensor({N}, d);
      const Tensor y = linear(x, w, bias);
      ASSERT_EQ(y.sizes(), (Shape{2, 3, N}));
      const Tensor wd = dequantize_fp8(q, r, DType::F64, false);
      const Tensor x2 = x.reshape({6, K});
      auto ref = ref_scaled(x2.to(DType::F64), wd.t());
      const auto bv = values(bias);
      for (int64_t m = 0; m < 6; ++m)
        for (int64_t n = 0; n < N; ++n) ref[m * N + n] += bv[n];
      // f32 sums against the exact product: within linear_close's bound (a random draw once gave an output
      // of 7.5e-6 from terms of size ~1, which a tolerance relative to the output alone cannot take).
      EXPECT_TRUE(test::linear_close(y.reshape({6, N}), from_doubles(ref, {6, N}, DType::F64),
                                     test::linear_abs_scale(x2, wd, bias), d, K));
    }
  }
  const Fp8Tensor q = quantize_fp8(random_tensor({8, 16}, DType::F32), ScaleRecipe::BlockWise, DType::F8E4M3, false, 4);
  EXPECT_TRUE(throws_error([&] { linear(random_tensor({1, 16}, DType::F32), Fp8Weight{q.values, q.scales, ScaleRecipe::BlockWise, 8, 8}); },
                           {"must be f32 with 2 elements [1, 2]"}));
  EXPECT_TRUE(throws_error([&] { linear(random_tensor({1, 15}, DType::F32), Fp8Weight{q.values, q.scales, ScaleRecipe::BlockWise, 4, 4}); },
                           {"K = 15"}));
}

// Every e4m3fn and e5m2 code through the CPU's in-place FP8 reading, SIMD and scalar: the row dequantisation
// gives code x scale bit for bit (NaN for NaN), and a one-hot row of x picks each code's exact value.
TEST(LinearFp8, EveryCodeReadsExactlyOnBothCpuPaths) {
  const bool simd_before = cpu::fp8_simd_enabled();
  for (bool simd : {true, false}) {
    cpu::fp8_set_simd_enabled(simd);
    for (bool e5m2 : {false, true}) {
      SCOPED_TRACE(str(simd ? "SIMD" : "scalar", e5m2 ? " e5m2" : " e4m3fn"));
      std::vector<uint8_t> codes(256 + 16 + 3);  // every code, then an unaligned tail
      for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 % 256 + (i >= 256 ? 1 : 0));
      for (int rep = 0; rep < 256; ++rep) codes[static_cast<size_t>(rep)] = static_cast<uint8_t>(rep);
      const int64_t n = static_cast<int64_t>(codes.size());
      const auto decode = [&](uint8_t c) { return e5m2 ? e5m2_bits_to_f32(c) : e4m3_bits_to_f32(c); };
      const float scale = 0.375f;
      std::vector<float> out(codes.size(), -1.f);
      cpu::fp8_dequantize_row(codes.data(), n, e5m2, scale, out.data());
      for (size_t i = 0; i < codes.size(); ++i) {
        const float want = decode(codes[i]) * scale;
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(out[i])) << "code " << int(codes[i]);
        else EXPECT_EQ(out[i], want) << "code " << int(codes[i]);
      }
      // One-hot rows of x (four at a time: the in-place product's row groups) against blocks of 48 codes. The
      // non-finite codes become 0 here (0 x inf would be NaN); what NaN does is checked below and in the
      // product test.
      std::vector<uint8_t> finite = codes;
      for (uint8_t& c : finite)
        if (!std::isfinite(decode(c))) c = 0;
      std::vector<float> x(4 * codes.size()), scales((codes.size() + 47) / 48, 1.f), dot(4);
      int checked = 0;
      for (size_t i = 0; i < codes.size(); i += 4) {
        std::fill(x.begin(), x.end(), 0.f);
        const int rows = static_cast<int>(std::min<size_t>(4, codes.size() - i));
        for (int r = 0; r < rows; ++r) x[r * codes.size() + i + r] = 1.f;
        cpu::fp8_dot_rows_scaled(x.data(), n, rows, finite.data(), scales.data(), n, 48, e5m2, dot.data());
        for (int r = 0; r < rows; ++r, ++checked)
          EXPECT_EQ(dot[r], decode(finite[i + r])) << "code " << int(finite[i + r]);
      }
      EXPECT_EQ(checked, n);
      // A NaN code anywhere in the row (e4m3fn: 0x7F and 0xFF) makes every row's dot NaN.
      if (!e5m2)
        for (uint8_t nan_code : {uint8_t{0x7F}, uint8_t{0xFF}}) {
          std::vector<uint8_t> with_nan = finite;
          with_nan[100] = nan_code;
          std::fill(x.begin(), x.end(), 1.f);
          cpu::fp8_dot_rows_scaled(x.data(), n, 3, with_nan.data(), scales.data(), n, 48, false, dot.data());
          for (int r = 0; r < 3; ++r) EXPECT_TRUE(std::isnan(dot[r])) << "code " << int(nan_code);
        }
    }
  }
  cpu::fp8_set_simd_enabled(simd_before);
}

// linear(x, Fp8Weight) on the CPU: rows read in place (up to 16 rows of x, in groups of four) and sliced
// dequantisation + sgemm (more rows), e4m3fn and e5m2 weights drawn over all finite codes (subnormals and the
// extremes included), blocks that are not a multiple of 16 wide, on both the SIMD and the scalar path; a NaN
// weight code makes its output column NaN and leaves the others finite.
TEST(LinearFp8, InPlaceAndSlicedPathsMatchTheExactProduct) {
  const bool simd_before = cpu::fp8_simd_enabled();
  std::uniform_int_distribution<int> code(0, 255);
  for (bool simd : {true, false})
    for (DType wt : {DType::F8E4M3, DType::F8E5M2})
      for (int64_t M : {1, 3, 16, 17, 40})
        for (const auto& [K, bk] : std::vector<std::pair<int64_t, int64_t>>{{300, 48}, {256, 128}, {77, 16}}) {
          cpu::fp8_set_simd_enabled(simd);
          const int64_t N = 37, bn = 8;
          SCOPED_TRACE(str(simd ? "SIMD " : "scalar ", dtype_name(wt), " M ", M, " K ", K, " block ", bn, "x", bk));
          std::vector<float> wv(static_cast<size_t>(N * K));
          for (float& v : wv) {
            do {
              const uint8_t c = static_cast<uint8_t>(code(test::rng()));
              v = wt == DType::F8E5M2 ? e5m2_bits_to_f32(c) : e4m3_bits_to_f32(c);
            } while (!std::isfinite(v));
          }
          const Tensor w = from_vector<float>(wv, Shape{N, K}).to(wt);  // exact: every value is a code's
          const Tensor scales = random_tensor({(N + bn - 1) / bn, (K + bk - 1) / bk}, DType::F32, 1e-3, 4e-3);
          const Fp8Weight fw{w, scales, ScaleRecipe::BlockWise, bn, bk};
          const Tensor x = random_tensor({M, K}, DType::F32), bias = random_tensor({N}, DType::F32);
          const Tensor y = linear(x, fw, bias);
          // The exact product in double from the real weights (code x block scale).
          const auto sv = values(scales);
          std::vector<double> wd(wv.size());
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < K; ++k)
              wd[n * K + k] = double(wv[n * K + k]) * sv[(n / bn) * scales.size(1) + k / bk];
          const Tensor wdt = from_doubles(wd, {N, K}, DType::F64);
          auto ref = ref_scaled(x.to(DType::F64), wdt.t());
          const auto bv = values(bias);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) ref[m * N + n] += bv[n];
          EXPECT_TRUE(test::linear_close(y, from_doubles(ref, {M, N}, DType::F64), test::linear_abs_scale(x, wdt, bias),
                                         DType::F32, K));
          if (wt == DType::F8E4M3) {
            // One NaN code in weight row 5: that output column only.
            Tensor wn = w.clone();
            wn.narrow(0, 5, 1).narrow(1, K / 2, 1).copy_(from_vector<float>({NAN}, Shape{1, 1}));
            const auto yn = values(linear(x, Fp8Weight{wn, scales, ScaleRecipe::BlockWise, bn, bk}));
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n)
                EXPECT_EQ(std::isnan(yn[m * N + n]), n == 5) << "row " << m << " column " << n;
          }
        }
  cpu::fp8_set_simd_enabled(simd_before);
}

// The sgemm path over a weight wider than one 16 MB f32 slice (three slices): the same product.
TEST(LinearFp8, SlicedPathAcrossSeveralSlices) {
  const int64_t M = 17, K = 14336, N = 700;
  const Fp8Tensor q = quantize_fp8(random_tensor({N, K}, DType::F32), ScaleRecipe::BlockWise, DType::F8E4M3, false, 128);
  const Fp8Weight w{q.values, q.scales, ScaleRecipe::BlockWise, 128, 128};
  const Tensor x = random_tensor({M, K}, DType::BF16), bias = random_tensor({N}, DType::BF16);
  const Tensor wd = dequantize_fp8(q, ScaleRecipe::BlockWise, DType::F64, false);
  auto ref = ref_scaled(x.to(DType::F64), wd.t());
  const auto bv = values(bias);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) ref[m * N + n] += bv[n];
  EXPECT_TRUE(test::linear_close(linear(x, w, bias), from_doubles(ref, {M, N}, DType::F64),
                                 test::linear_abs_scale(x, wd, bias), DType::BF16, K));
}


// ---- experts in block formats ----------------------------------------------------------------------------------

// Block experts against the dense computation with the same experts dequantised (the plain-loop reference in
// double): they differ only by the activations' 8-bit quantisation (x and SiLU x up, per row and block of 32).
// Each token's output is also the one it gets alone (a token's rows are quantised on their own: grouping the
// tokens per expert changes only the order of the kernels' f32 sums, which differs between row counts).
TEST(MoeForwardBlocks, MatchesTheDequantisedExperts) {
  using Case = test::BlockMoeCase;
  for (const Case& c : {Case{1, 64, 32, 8, 2, "q8_0", "q8_0", DType::F32}, Case{9, 64, 64, 6, 3, "q4_0", "q8_0", DType::F32},
                        Case{5, 256, 256, 4, 2, "q4_k", "q4_k", DType::F32}, Case{7, 256, 32, 8, 8, "q4_k", "q4_0", DType::BF16},
                        Case{12, 64, 32, 16, 2, "q8_0", "q4_0", DType::F16}, Case{3, 256, 256, 4, 2, "q5_k", "q6_k", DType::F32}}) {
    SCOPED_TRACE(c.name());
    // x and the router drawn again until every token's k-th and (k+1)-th router logits (in double) are 0.05 or
    // more apart: the experts a token takes then do not hang on the rounding of 16-bit logits, which sums in
    // another order may round the other way.
    Tensor x, router;
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 100) << "no draw with separated router logits";
      x = random_tensor({c.T, c.H}, c.dtype);
      router = random_tensor({c.E, c.H}, c.dtype, -1, 1);
      if (c.k == c.E) break;
      const std::vector<double> l = matmul(x.to(DType::F64), router.to(DType::F64).t()).to_vector<double>();
      bool separated = true;
      for (int64_t t = 0; t < c.T && separated; ++t) {
        std::vector<double> row(l.begin() + t * c.E, l.begin() + (t + 1) * c.E);
        std::sort(row.begin(), row.end(), std::greater<double>());
        separated = row[c.k - 1] - row[c.k] >= 0.05;
      }
      if (separated) break;
    }
    const BlockExperts e = c.experts([](const Shape& s) { return random_tensor(s, DType::F32, -0.3, 0.3); });
    EXPECT_EQ(std::string(format_name(e.gate_up)), c.gate_up);
    const Tensor out = moe_forward(x, router, e, c.k, true);
    ASSERT_EQ(out.sizes(), x.sizes());
    ASSERT_EQ(out.dtype(), c.dtype);
    const Tensor gu = dequantize(e.gate_up).view({c.E, 2 * c.I, c.H}), dn = dequantize(e.down).view({c.E, c.H, c.I});
    const auto ref = ref_moe(x, router, gu.to(c.dtype), dn.to(c.dtype), c.k, true);
    const Tensor r = from_doubles(ref, {c.T, c.H}, DType::F64);
    const double scale = amax(abs(r)).item<double>(), diff = amax(abs(sub(out.to(DType::F64), r))).item<double>();
    EXPECT_GT(scale, 0.05);
    EXPECT_LT(diff, 0.03 * scale);
    for (int64_t t = 0; t < c.T; ++t) {
      const Tensor alone = moe_forward(x.narrow(0, t, 1), router, e, c.k, true);
      EXPECT_TRUE(all_close(alone, out.narrow(0, t, 1), Tolerance{1e-4, 1e-4 * scale})) << "token " << t;
    }
  }
}

TEST(MoeForwardBlocks, BadShapesAreErrors) {
  const Tensor x = random_tensor({2, 64}, DType::F32), router = random_tensor({4, 64}, DType::F32);
  const BlockWeight gu = quantize_q8_0(random_tensor({4 * 64, 64}, DType::F32));
  const BlockWeight dn = quantize_q8_0(random_tensor({4 * 64, 32}, DType::F32));
  EXPECT_NO_THROW(moe_forward(x, router, BlockExperts{gu, dn, 4}, 2, true));
  EXPECT_EQ(moe_forward(x.narrow(0, 0, 0), router, BlockExperts{gu, dn, 4}, 2, true).sizes(), (Shape{0, 64}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, BlockExperts{gu, dn, 3}, 2, true); }, {"moe_forward", "E = 3"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, BlockExperts{gu, dn, 0}, 2, true); }, {"num_experts"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, BlockExperts{gu, gu, 4}, 2, true); }, {"I = 32"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(random_tensor({2, 32}, DType::F32), router, BlockExperts{gu, dn, 4}, 2, true); },
                           {"H = 32"}));
  EXPECT_TRUE(throws_error([&] { moe_forward(x, router, BlockExperts{gu, dn, 4}, 5, true); }, {"top_k"}));
  EXPECT_TRUE(throws_error([&] { narrow_rows(gu, 250, 8); }, {"narrow_rows", "q8_0"}));
}

}  // namespace
}  // namespace kiln
