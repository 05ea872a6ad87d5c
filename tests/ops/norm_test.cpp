// rms_norm, add_rms_norm, silu_and_mul, rope_: against double-precision loops written here, and against
// values computed once with PyTorch 2.11 using Hugging Face's module formulas (pasted below).
#include <cmath>
#include <vector>

#include "kiln/nn.h"
#include "test_util.h"

namespace kiln::test {
namespace {

const DType kFloatDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

// Double reference of rms_norm over the last dim of x (any shape), weight [D].
Tensor rms_norm_ref(const Tensor& x, const Tensor& weight, double eps) {
  const auto xv = x.to_vector<double>();
  const auto wv = weight.to_vector<double>();
  const int64_t d = x.size(-1);
  std::vector<double> out(xv.size());
  for (size_t r = 0; d > 0 && r < xv.size() / d; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += xv[r * d + i] * xv[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t i = 0; i < d; ++i) out[r * d + i] = xv[r * d + i] * inv * wv[i];
  }
  return from_vector<double>(out, x.sizes());
}

TEST(RmsNorm, MatchesDoubleReferenceOnTransposedInput) {
  for (DType dt : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    // [64, 3, 5] transposed to [5, 3, 64]: the normalised dim is strided.
    Tensor x = random_tensor({64, 3, 5}, dt).permute({2, 1, 0});
    Tensor w = random_tensor({64}, dt, 0.5, 1.5);
    Tensor y = rms_norm(x, w, 1e-6);
    EXPECT_EQ(y.dtype(), dt);
    // Two roundings to a half type (normalised value, then the product): allow twice the tolerance.
    Tolerance tol = default_tolerance(dt);
    tol.rtol *= 2;
    EXPECT_TRUE(all_close(y, rms_norm_ref(x, w, 1e-6).to(dt), tol));
  }
}

TEST(RmsNorm, LargeInputRunsInParallelAndMatches) {
  Tensor x = random_tensor({300, 256}, DType::F32);
  Tensor w = random_tensor({256}, DType::F32);
  EXPECT_TRUE(all_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5).to(DType::F32)));
}

// torch: h = x.float(); h = h * rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6); (w * h.to(bf16)).to(bf16)
TEST(RmsNorm, MatchesHuggingFaceBf16Exactly) {
  Tensor x = from_vector<double>({0.5, -1.25, 3.0, 0.0078125, -2.5, 1.5, 0.75, -0.375, 100.0, -3.5, 0.125, 7.0,
                                  -64.0, 0.0, 2.25, 9.5},
                                 Shape{2, 8})
                 .to(DType::BF16);
  Tensor w = from_vector<double>({1.0, 0.5, 2.0, -1.5, 0.875, 1.25, 3.0, 0.0625}).to(DType::BF16);
  Tensor expected = from_vector<double>({0.31640625, -0.39453125, 3.796875, -0.007415771484375, -1.3828125, 1.1875,
                                         1.421875, -0.01483154296875, 2.375, -0.04150390625, 0.00592041015625,
                                         -0.2490234375, -1.328125, 0.0, 0.16015625, 0.0140380859375},
                                        Shape{2, 8})
                        .to(DType::BF16);
  EXPECT_TRUE(equal(rms_norm(x, w, 1e-6), expected));
  // An f32 weight: the product is in f32, then stored as bf16 (same values for this case in torch).
  EXPECT_TRUE(equal(rms_norm(x, w.to(DType::F32), 1e-6), expected));
}

TEST(RmsNorm, CastsToInputDtypeBeforeWeight) {
  // With an f32 weight on f16 x, HF rounds the normalised value to f16 before multiplying: reproduce it.
  Tensor x = random_tensor({4, 16}, DType::F16);
  Tensor w = random_tensor({16}, DType::F32);
  Tensor y = rms_norm(x, w, 1e-6);
  EXPECT_EQ(y.dtype(), DType::F16);
  Tensor unit = rms_norm(x, ones({16}, DType::F16), 1e-6);  // = hidden.to(f16) exactly
  Tensor expected = mul(unit.to(DType::F32), w).to(DType::F16);
  EXPECT_TRUE(equal(y, expected));
}

TEST(RmsNorm, ZeroRowsAndOneElementRows) {
  EXPECT_EQ(rms_norm(empty({0, 8}, DType::F32), ones({8}), 1e-6).sizes(), (Shape{0, 8}));
  // A row of zeros normalises to zeros (rsqrt(eps) * 0); a single element to about its sign.
  EXPECT_TRUE(equal(rms_norm(zeros({2, 4}), ones({4}), 1e-6), zeros({2, 4})));
  Tensor y = rms_norm(from_vector<float>({-3.f}, Shape{1, 1}), ones({1}), 0.0);
  EXPECT_EQ(y.item<float>(), -1.f);
}

TEST(RmsNorm, InvalidArgumentsThrow) {
  EXPECT_TRUE(throws_error([] { rms_norm(ones({2, 8}), ones({7}), 1e-6); }, {"rms_norm", "[8]", "float32[7]"}));
  EXPECT_TRUE(throws_error([] { rms_norm(ones({2, 8}), ones({1, 8}), 1e-6); }, {"rms_norm", "weight"}));
  EXPECT_TRUE(throws_error([] { rms_norm(ones({2, 8}, DType::I32), ones({8}), 1e-6); }, {"rms_norm", "int32"}));
  EXPECT_TRUE(throws_error([] { rms_norm(ones({}), ones({1}), 1e-6); }, {"rms_norm", "at least 1 dim"}));
}

TEST(AddRmsNorm, UpdatesResidualThenNormalises) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = random_tensor({3, 32}, dt);
    Tensor residual = random_tensor({3, 32}, dt);
    Tensor w = random_tensor({32}, dt);
    Tensor expected_res = add(residual, x);
    Tensor y = add_rms_norm(x, residual, w, 1e-6);
    EXPECT_TRUE(equal(residual, expected_res));
    EXPECT_TRUE(equal(y, rms_norm(expected_res, w, 1e-6)));
  }
}

TEST(AddRmsNorm, InvalidCallLeavesResidualUnchanged) {
  Tensor residual = ones({2, 8});
  Tensor x = ones({2, 8});
  EXPECT_TRUE(throws_error([&] { add_rms_norm(x, residual, ones({4}), 1e-6); }, {"add_rms_norm", "weight"}));
  EXPECT_TRUE(equal(residual, ones({2, 8})));
  EXPECT_TRUE(throws_error([&] { add_rms_norm(ones({2, 4}), residual, ones({8}), 1e-6); },
                           {"add_rms_norm", "float32[2, 4]", "float32[2, 8]"}));
}

TEST(SiluAndMul, MatchesDoubleReference) {
  for (DType dt : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor in = random_tensor({12, 3, 2}, dt, -6, 6).permute({1, 2, 0});  // [3, 2, 12], not contiguous
    Tensor out = silu_and_mul(in);
    ASSERT_EQ(out.sizes(), (Shape{3, 2, 6}));
    EXPECT_EQ(out.dtype(), dt);
    const auto v = in.to_vector<double>();
    std::vector<double> ref;
    for (size_t r = 0; r < 6; ++r)
      for (size_t i = 0; i < 6; ++i) {
        const double g = v[r * 12 + i], u = v[r * 12 + 6 + i];
        ref.push_back(g / (1 + std::exp(-g)) * u);
      }
    EXPECT_TRUE(all_close(out, from_vector<double>(ref, Shape{3, 2, 6}).to(dt)));
  }
}

// torch: (F.silu(x.float()[..., :3]) * x.float()[..., 3:]).to(bf16)
TEST(SiluAndMul, MatchesTorchBf16Exactly) {
  Tensor in = from_vector<double>({-3.0, -0.5, 0.0, 0.25, 1.0, 4.0, 2.0, -1.0, 0.5, 3.0, -2.0, 1.5}, Shape{2, 6})
                  .to(DType::BF16);
  Tensor expected =
      from_vector<double>({-0.03564453125, -0.1884765625, 0.0, 5.28125, 0.5390625, 0.466796875}, Shape{2, 3})
          .to(DType::BF16);
  EXPECT_TRUE(equal(silu_and_mul(in), expected));
}

TEST(SiluAndMul, EdgeValuesAndErrors) {
  // As torch's silu: x / (1 + exp(-x)), so silu(-inf) = -inf / inf = NaN and silu(-1000) = -0.
  Tensor in = from_vector<float>({-INFINITY, INFINITY, NAN, -1000.f, 2.f, 3.f, 1.f, 1.f}, Shape{8});
  auto out = silu_and_mul(in).to_vector<float>();
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.f);
  EXPECT_TRUE(std::signbit(out[3]));
  EXPECT_EQ(silu_and_mul(empty({0, 4})).sizes(), (Shape{0, 2}));
  EXPECT_TRUE(throws_error([] { silu_and_mul(ones({2, 5})); }, {"silu_and_mul", "even", "float32[2, 5]"}));
  EXPECT_TRUE(throws_error([] { silu_and_mul(ones({}, DType::F32)); }, {"silu_and_mul"}));
  EXPECT_TRUE(throws_error([] { silu_and_mul(ones({4}, DType::I64)); }, {"silu_and_mul", "int64"}));
}

// Double reference of rope on x [T, H, D] (half-split layout), angles from f32 pos * inv_freq as HF does.
Tensor rope_ref(const Tensor& x, const std::vector<int64_t>& pos, const std::vector<float>& inv, double scaling) {
  const int64_t t_len = x.size(0), heads = x.size(1), d = x.size(2), half = static_cast<int64_t>(inv.size());
  auto v = x.to_vector<double>();
  for (int64_t t = 0; t < t_len; ++t)
    for (int64_t j = 0; j < half; ++j) {
      const double angle = static_cast<double>(static_cast<float>(pos[t]) * inv[j]);
      const double c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
      for (int64_t h = 0; h < heads; ++h) {
        double* row = v.data() + (t * heads + h) * d;
        const double a = row[j], b = row[j + half];
        row[j] = a * c - b * s;
        row[j + half] = b * c + a * s;
      }
    }
  return from_vector<double>(v, x.sizes());
}

TEST(RopeInvFreq, MatchesHuggingFaceDefault) {
  // torch: 1.0 / (1e6 ** (torch.arange(0, 8, 2, dtype=torch.int64).float() / 8))
  Tensor expected = from_vector<double>({1.0, 0.03162277862429619, 0.0010000000474974513, 3.162277425872162e-05})
                        .to(DType::F32);
  EXPECT_TRUE(all_close(rope_inv_freq(8, 1e6), expected));
  EXPECT_TRUE(throws_error([] { rope_inv_freq(7, 1e4); }, {"rope_inv_freq", "even", "7"}));
  EXPECT_TRUE(throws_error([] { rope_inv_freq(8, 0.0); }, {"rope_inv_freq", "theta"}));
}

// torch, HF layout in f32: q*cos + rotate_half(q)*sin with cos/sin of pos.float() * inv_freq, theta 1e6.
TEST(Rope, MatchesTorchReferenceCase) {
  // q = sin(arange(48).view(3, 2, 8) * 0.37 - 8) * 2;  k = cos(arange(24).view(3, 1, 8) * 0.61 + 1) * 3
  std::vector<float> qv, kv;
  for (int i = 0; i < 48; ++i) qv.push_back(std::sin(static_cast<float>(i) * 0.37f - 8.0f) * 2);
  for (int i = 0; i < 24; ++i) kv.push_back(std::cos(static_cast<float>(i) * 0.61f + 1.0f) * 3);
  const std::vector<double> q_f32 = {
      -1.978716492652893, -1.950041651725769, -1.657438039779663, -1.1405072212219238, -0.4692147970199585,
      0.2655836343765259, 0.9644374251365662, 1.5327582359313965, 1.893627643585205, 1.9982033967971802,
      1.8323320150375366, 1.4184625148773193, 0.8126112818717957, 0.09677699953317642, -0.632156491279602,
      -1.2755297422409058, -1.5782482624053955, -1.8841540813446045, -1.9483402967453003, -1.6499255895614624,
      1.3542015552520752, -0.7621331214904785, 0.2693486213684082, 0.9760940670967102, 1.7882113456726074,
      1.748307466506958, 1.9971386194229126, 1.826928973197937, -1.0785315036773682, 1.089003562927246,
      0.09314737468957901, -0.6447834372520447, 0.6345418691635132, -1.4858864545822144, -0.6986520290374756,
      -1.952085018157959, -1.9868078231811523, -1.4541791677474976, -1.9073925018310547, 0.23097170889377594,
      -0.9501847624778748, 1.2297314405441284, 0.3650088906288147, 1.9936655759811401, 1.841369867324829,
      1.687653660774231, 2.0262227058410645, 0.1326441764831543};
  const std::vector<double> k_f32 = {
      1.6209070682525635, -0.11758093535900116, -1.8136568069458008, -2.855539321899414, -2.867417812347412,
      -1.8450067043304443, -0.1570955216884613, 1.5874818563461304, -0.5098766684532166, 3.315164089202881,
      2.068513870239258, 0.4308088719844818, -3.028477430343628, -2.1449873447418213, -2.9698023796081543,
      -2.2449872493743896, -2.392885684967041, 0.8758211135864258, 2.0546486377716064, 3.0715391635894775,
      0.7806521058082581, 1.1688766479492188, 1.6503632068634033, -2.2405624389648438};
  const std::vector<double> q_bf16 = {
      -1.9765625, -1.953125, -1.65625, -1.140625, -0.46875, 0.265625, 0.96484375, 1.53125, 1.890625, 2.0,
      1.8359375, 1.421875, 0.8125, 0.0966796875, -0.6328125, -1.2734375, -1.5859375, -1.890625, -1.9453125,
      -1.6484375, 1.359375, -0.76171875, 0.26953125, 0.9765625, 1.78125, 1.75, 2.0, 1.828125, -1.078125,
      1.0859375, 0.0927734375, -0.64453125, 0.6328125, -1.484375, -0.69921875, -1.953125, -1.9921875, -1.453125,
      -1.90625, 0.2314453125, -0.94921875, 1.2265625, 0.361328125, 2.0, 1.84375, 1.6875, 2.03125, 0.1328125};
  const std::vector<double> k_bf16 = {
      1.6171875, -0.11767578125, -1.8125, -2.859375, -2.875, -1.84375, -0.1572265625, 1.5859375, -0.51171875,
      3.3125, 2.0625, 0.4296875, -3.03125, -2.140625, -2.96875, -2.25, -2.390625, 0.87109375, 2.046875, 3.078125,
      0.78515625, 1.171875, 1.6484375, -2.25};
  Tensor pos = from_vector<int64_t>({0, 5, 1000});
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = from_vector<float>(qv, Shape{3, 2, 8}).to(dt);
    Tensor k = from_vector<float>(kv, Shape{3, 1, 8}).to(dt);
    rope_(q, k, pos, 1e6);
    const bool f32 = dt == DType::F32;
    Tensor eq = from_vector<double>(f32 ? q_f32 : q_bf16, Shape{3, 2, 8}).to(dt);
    Tensor ek = from_vector<double>(f32 ? k_f32 : k_bf16, Shape{3, 1, 8}).to(dt);
    // f32: libm's sin/cos vs torch's vectorised ones may differ by an ulp; bf16 results can then round
    // either way, so allow one bf16 ulp (2^-8 relative) there rather than bit equality.
    EXPECT_TRUE(all_close(q, eq, f32 ? default_tolerance(dt) : Tolerance{8e-3, 1e-5}));
    EXPECT_TRUE(all_close(k, ek, f32 ? default_tolerance(dt) : Tolerance{8e-3, 1e-5}));
  }
}

TEST(Rope, PartialRotaryOnStridedViewsOfOneBuffer) {
  for (DType dt : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t t_len = 5, hq = 4, hk = 2, d = 16, rot = 8;
    // A fused qkv buffer [T, Hq + 2 Hk, D]: q and k are slices along the head dim (strided in T).
    Tensor qkv = random_tensor({t_len, hq + 2 * hk, d}, dt);
    Tensor q = qkv.narrow(1, 0, hq), k = qkv.narrow(1, hq, hk);
    const Tensor q0 = q.clone(), k0 = k.clone(), v0 = qkv.narrow(1, hq + hk, hk).clone();
    const std::vector<int64_t> pos = {3, 0, 17, 4095, 70000};
    const double scaling = 1.25;
    Tensor inv = rope_inv_freq(rot, 1e4);
    rope_(q, k, from_vector<int64_t>(pos).to(DType::I32), inv, scaling);
    const auto inv_v = inv.to_vector<float>();
    // Rounding of the result to the dtype plus f32 angles (large positions amplify f32 sin/cos ulps).
    Tolerance tol = default_tolerance(dt);
    if (dt == DType::F32 || dt == DType::F64) tol = {1e-5, 1e-5};  // cos/sin are f32 even for f64 input
    EXPECT_TRUE(all_close(q.narrow(2, 0, rot), rope_ref(q0, pos, inv_v, scaling).narrow(2, 0, rot).to(dt), tol));
    EXPECT_TRUE(all_close(k.narrow(2, 0, rot), rope_ref(k0, pos, inv_v, scaling).narrow(2, 0, rot).to(dt), tol));
    // Channels past rotary_dim and the v heads are untouched, bit for bit.
    EXPECT_EQ(raw_bits(q.narrow(2, rot, d - rot)), raw_bits(q0.narrow(2, rot, d - rot)));
    EXPECT_EQ(raw_bits(k.narrow(2, rot, d - rot)), raw_bits(k0.narrow(2, rot, d - rot)));
    EXPECT_EQ(raw_bits(qkv.narrow(1, hq + hk, hk)), raw_bits(v0));
  }
}

TEST(Rope, TransposedHeadDimAndParallelSize) {
  // q [T, H, D] as a transpose of a [T, D, H] buffer: the rotated channels are strided; large enough to
  // run the token loop in parallel.
  const int64_t t_len = 300, h = 8, d = 32;
  Tensor q = random_tensor({t_len, d, h}, DType::F32).transpose(1, 2);
  Tensor k = random_tensor({t_len, 2, d}, DType::F32);
  const Tensor q0 = q.clone(), k0 = k.clone();
  std::vector<int64_t> pos(t_len);
  for (int64_t t = 0; t < t_len; ++t) pos[t] = t * 7;
  rope_(q, k, from_vector<int64_t>(pos), 1e4);
  const auto inv = rope_inv_freq(d, 1e4).to_vector<float>();
  EXPECT_TRUE(all_close(q, rope_ref(q0, pos, inv, 1.0).to(DType::F32), Tolerance{1e-5, 1e-5}));
  EXPECT_TRUE(all_close(k, rope_ref(k0, pos, inv, 1.0).to(DType::F32), Tolerance{1e-5, 1e-5}));
}

TEST(Rope, SixteenBitRowsGiveTheElementwiseBits) {
  // Contiguous f16 / bf16 heads are widened a row at a time; heads with a strided head dim are rotated element
  // by element. Both round rope_pair's f32 result once: the same bits, serial and parallel (T * H * D past the
  // threads' grain).
  for (DType dt : {DType::F16, DType::BF16}) {
    for (int64_t t_len : {3, 300}) {
      SCOPED_TRACE(str(dtype_name(dt), " T ", t_len));
      const int64_t h = 8, d = 32;
      Tensor q = random_tensor({t_len, h, d}, dt, -4, 4), k = random_tensor({t_len, 2, d}, dt, -4, 4);
      Tensor qs = q.transpose(1, 2).contiguous().transpose(1, 2), ks = k.transpose(1, 2).contiguous().transpose(1, 2);
      ASSERT_NE(qs.stride(2), 1);
      std::vector<int64_t> pos(static_cast<size_t>(t_len));
      for (int64_t t = 0; t < t_len; ++t) pos[t] = t * 13 + 5;
      rope_(q, k, from_vector<int64_t>(pos), 1e6);
      rope_(qs, ks, from_vector<int64_t>(pos), 1e6);
      EXPECT_EQ(raw_bits(q), raw_bits(qs.contiguous()));
      EXPECT_EQ(raw_bits(k), raw_bits(ks.contiguous()));
    }
  }
}

TEST(Rope, ZeroTokensIsANoOp) {
  Tensor q = empty({0, 2, 8}), k = empty({0, 1, 8});
  rope_(q, k, empty({0}, DType::I64), 1e4);
  EXPECT_EQ(q.sizes(), (Shape{0, 2, 8}));
}

TEST(Rope, InvalidArgumentsThrow) {
  Tensor q = ones({3, 2, 8}), k = ones({3, 1, 8});
  Tensor pos = from_vector<int64_t>({0, 1, 2});
  Tensor k6 = ones({3, 1, 6});
  EXPECT_TRUE(throws_error([&] { rope_(q, k6, pos, 1e4); }, {"rope_", "head dim", "float32[3, 1, 6]"}));
  Tensor k2 = ones({2, 1, 8});
  EXPECT_TRUE(throws_error([&] { rope_(q, k2, pos, 1e4); }, {"rope_", "token count", "float32[2, 1, 8]"}));
  EXPECT_TRUE(throws_error([&] { rope_(q, k, from_vector<int64_t>({0, 1}), 1e4); }, {"rope_", "positions", "[3]"}));
  EXPECT_TRUE(throws_error([&] { rope_(q, k, from_vector<float>({0, 1, 2}), 1e4); }, {"rope_", "i32 or i64"}));
  EXPECT_TRUE(throws_error([&] { rope_(q, k, pos, ones({5}), 1.0); }, {"rope_", "rotary_dim", "10", "8"}));
  Tensor q7 = ones({3, 2, 7}), k7 = ones({3, 1, 7});
  EXPECT_TRUE(throws_error([&] { rope_(q7, k7, pos, 1e4); }, {"rope_", "even"}));
  Tensor q2 = ones({3, 16});
  EXPECT_TRUE(throws_error([&] { rope_(q2, k, pos, 1e4); }, {"rope_", "[T, H, D]"}));
  Tensor qi = ones({3, 2, 8}, DType::I32);
  EXPECT_TRUE(throws_error([&] { rope_(qi, k, pos, 1e4); }, {"rope_", "int32[3, 2, 8]"}));
  // Nothing was modified by the failed calls.
  EXPECT_TRUE(equal(q, ones({3, 2, 8})));
  EXPECT_TRUE(throws_error([&] { rope_(q, q, pos, 1e4); }, {"rope_", "same memory"}));
}

TEST(Rope, ExpandedViewsAreRejected) {
  Tensor q = ones({3, 1, 8}).expand({3, 4, 8}), k = ones({3, 1, 8});
  EXPECT_TRUE(throws_error([&] { rope_(q, k, from_vector<int64_t>({0, 1, 2}), 1e4); }, {"rope_", "expanded"}));
}

}  // namespace
}  // namespace kiln::test
