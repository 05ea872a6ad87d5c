// scaled_dot_product_attention, decode_attention, kv_cache_append_ and the paged-cache ops on the CPU against
// a direct double-precision transcription of PyTorch's math path, written here with its own broadcasting code.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "kiln/nn.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::all_close;
using test::random_tensor;
using test::throws_error;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Row-major offset in a contiguous tensor of shape s of the index `full` of the broadcast shape (right
// aligned); group > 1 maps the head dim (-3) h -> h / group (repeat_interleave).
int64_t offset_of(const Shape& s, const std::vector<int64_t>& full, int64_t group = 1) {
  int64_t o = 0;
  const size_t lead = full.size() - s.size();
  for (size_t a = 0; a < s.size(); ++a) {
    int64_t i = full[lead + a];
    if (s[a] == 1) i = 0;
    else if (group > 1 && a + 3 == s.size()) i /= group;
    o = o * s[a] + i;
  }
  return o;
}

Shape batch_shape(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); }

// PyTorch's math path in f64: scores = q k^T * scale (+ mask, causal tril top-left), _safe_softmax (rows of
// all -inf give 0), @ v.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask = std::nullopt,
                 bool causal = false, std::optional<double> scale = std::nullopt, bool gqa = false) {
  const auto qv = q.to(DType::F64).contiguous().to_vector<double>();
  const auto kv = k.to(DType::F64).contiguous().to_vector<double>();
  const auto vv = v.to(DType::F64).contiguous().to_vector<double>();
  std::vector<double> mv;
  if (mask) mv = mask->to(DType::F64).contiguous().to_vector<double>();
  const bool bool_mask = mask && mask->dtype() == DType::Bool;
  Shape kb = batch_shape(k), vb = batch_shape(v);
  int64_t gk = 1, gv = 1;
  if (gqa && q.size(-3) != k.size(-3)) {
    gk = q.size(-3) / k.size(-3);
    kb.back() = q.size(-3);
  }
  if (gqa && q.size(-3) != v.size(-3)) {
    gv = q.size(-3) / v.size(-3);
    vb.back() = q.size(-3);
  }
  const Shape batch = broadcast_shapes(broadcast_shapes(batch_shape(q), kb), vb);
  const int64_t lq = q.size(-2), lkv = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
  int64_t nbatch = 1;
  for (auto s : batch) nbatch *= s;
  std::vector<double> out(static_cast<size_t>(nbatch * lq * dv));
  std::vector<int64_t> idx(batch.size());
  std::vector<double> s(static_cast<size_t>(lkv));
  for (int64_t n = 0; n < nbatch; ++n) {
    for (int64_t r = n, a = static_cast<int64_t>(batch.size()) - 1; a >= 0; --a) {
      idx[a] = r % batch[a];
      r /= batch[a];
    }
    auto full = [&](int64_t x, int64_t y) {
      std::vector<int64_t> f = idx;
      f.push_back(x);
      f.push_back(y);
      return f;
    };
    for (int64_t i = 0; i < lq; ++i) {
      double m = kNegInf;
      const int64_t qo = offset_of(q.sizes(), full(i, 0));
      for (int64_t j = 0; j < lkv; ++j) {
        const int64_t ko = offset_of(k.sizes(), full(j, 0), gk);
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qv[qo + c] * kv[ko + c];
        double x = dot * sc;
        if (causal && j > i) x = kNegInf;
        if (mask) {
          const double mval = mv[offset_of(mask->sizes(), full(i, j))];
          if (bool_mask) x = mval != 0 ? x : kNegInf;
          else x += mval;
        }
        s[j] = x;
        m = std::isnan(x) || std::isnan(m) ? std::numeric_limits<double>::quiet_NaN() : std::max(m, x);
      }
      double* o = out.data() + (n * lq + i) * dv;
      if (std::isnan(m)) {  // a NaN score: softmax makes the row NaN (only all -inf rows become 0)
        for (int64_t c = 0; c < dv; ++c) o[c] = m;
        continue;
      }
      if (m == kNegInf) continue;  // zeros
      double sum = 0;
      for (int64_t j = 0; j < lkv; ++j) sum += std::exp(s[j] - m);
      for (int64_t j = 0; j < lkv; ++j) {
        const double p = std::exp(s[j] - m) / sum;
        if (p == 0) continue;
        const int64_t vo = offset_of(v.sizes(), full(j, 0), gv);
        for (int64_t c = 0; c < dv; ++c) o[c] += p * vv[vo + c];
      }
    }
  }
  Shape out_shape = batch;
  out_shape.push_back(lq);
  out_shape.push_back(dv);
  return from_vector<double>(out, out_shape);
}

const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

TEST(Attention, BroadcastingBatchDimsMatchesReference) {
  struct Case {
    Shape q, k, v;
  };
  const Case cases[] = {
      {{1, 1, 64}, {2, 1, 1, 64}, {2, 1, 1, 64}},
      {{2, 3, 5, 16}, {1, 3, 7, 16}, {2, 1, 7, 8}},
      {{3, 5, 16}, {2, 1, 7, 16}, {7, 16}},
      {{5, 16}, {4, 7, 16}, {4, 7, 16}},
      {{2, 1, 4, 5, 16}, {3, 1, 7, 16}, {1, 3, 1, 7, 16}},
      {{4, 1, 3, 16}, {4, 6, 9, 16}, {1, 6, 9, 12}},
      {{2, 2, 2, 2, 2, 2, 3, 4, 8}, {1, 2, 1, 2, 1, 2, 3, 5, 8}, {5, 8}},  // 6 outer dims that do not coalesce
  };
  for (const auto& c : cases) {
    for (DType dt : kDtypes) {
      SCOPED_TRACE(str("q ", c.q, " k ", c.k, " v ", c.v, " ", dtype_name(dt)));
      const Tensor q = random_tensor(c.q, dt), k = random_tensor(c.k, dt), v = random_tensor(c.v, dt);
      const Tensor out = scaled_dot_product_attention(q, k, v);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(all_close(out, reference(q, k, v)));
    }
  }
}

TEST(Attention, NonContiguousAndOffsetInputs) {
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    // q as [B, L, H, D] transposed to [B, H, L, D]; k a slice starting at offset 1 of a wider last dim;
    // v with a column stride of 2.
    const Tensor q = random_tensor({2, 9, 3, 16}, dt).transpose(1, 2);
    const Tensor k = random_tensor({2, 3, 11, 17}, dt).narrow(-1, 1, 16);
    const Tensor v = random_tensor({2, 3, 11, 20}, dt).slice(-1, 0, 20, 2);
    const Tensor mask = random_tensor({9, 3, 11}, DType::F32).transpose(0, 1).unsqueeze(0);  // [1, 3, 9, 11]
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v), reference(q, k, v)));
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, mask), reference(q, k, v, mask)));
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, std::nullopt, true),
                          reference(q, k, v, std::nullopt, true)));
  }
}

TEST(Attention, GroupedQueryAttentionRatios) {
  for (int64_t ratio : {1, 2, 4, 8}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(str("ratio ", ratio, " ", dtype_name(dt)));
      const int64_t hq = 8, hkv = hq / ratio;
      const Tensor q = random_tensor({2, hq, 9, 32}, dt);
      const Tensor k = random_tensor({2, hkv, 13, 32}, dt), v = random_tensor({2, hkv, 13, 24}, dt);
      const Tensor out = scaled_dot_product_attention(q, k, v, std::nullopt, false, std::nullopt, true);
      EXPECT_TRUE(all_close(out, reference(q, k, v, std::nullopt, false, std::nullopt, true)));
      // Same as repeating the k/v heads explicitly (repeat_interleave) without GQA.
      std::vector<int64_t> rep;
      for (int64_t h = 0; h < hq; ++h) rep.push_back(h / ratio);
      const Tensor idx = from_vector<int64_t>(rep);
      const Tensor explicit_out =
          scaled_dot_product_attention(q, index_select(k, 1, idx), index_select(v, 1, idx));
      EXPECT_TRUE(test::equal(out, explicit_out));
      // Causal and a mask combine with the grouping.
      EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, std::nullopt, true, std::nullopt, true),
                            reference(q, k, v, std::nullopt, true, std::nullopt, true)));
    }
  }
  // Key and value head counts may differ (both divide Hq); a batch dim broadcasts alongside.
  const Tensor q = random_tensor({3, 8, 5, 16}, DType::F32);
  const Tensor k = random_tensor({1, 2, 7, 16}, DType::F32), v = random_tensor({3, 4, 7, 16}, DType::F32);
  const Tensor mask = random_tensor({8, 5, 7}, DType::F32);
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, mask, false, std::nullopt, true),
                        reference(q, k, v, mask, false, std::nullopt, true)));
}

TEST(Attention, BoolAndFloatMasksBroadcast) {
  const int64_t b = 2, h = 3, lq = 17, lkv = 23, d = 16;
  const Shape mask_shapes[] = {{lq, lkv}, {b, 1, lq, lkv}, {1, h, lq, lkv}, {lkv}, {b, h, 1, lkv}, {h, lq, 1}, {}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor q = random_tensor({b, h, lq, d}, dt), k = random_tensor({b, h, lkv, d}, dt);
    const Tensor v = random_tensor({b, h, lkv, d}, dt);
    for (const auto& ms : mask_shapes) {
      SCOPED_TRACE(str(dtype_name(dt), " mask ", ms));
      const Tensor bmask = gt(random_tensor(ms, DType::F32, 0, 1), 0.3);
      EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, bmask), reference(q, k, v, bmask)));
      const Tensor fmask = random_tensor(ms, DType::F32, -3, 3);
      EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, fmask), reference(q, k, v, fmask)));
      const Tensor qmask = random_tensor(ms, dt, -3, 3);  // a mask in q's dtype
      EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, qmask), reference(q, k, v, qmask)));
      // -inf entries in a float mask behave as false in a bool one.
      const Tensor inf_mask = where(bmask, zeros({}, DType::F32), full({}, -INFINITY, DType::F32));
      EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, inf_mask),
                            scaled_dot_product_attention(q, k, v, bmask), test::Tolerance{0, 0}));
    }
  }
}

TEST(Attention, CausalIsTopLeftAlignedForAnyLengths) {
  const std::pair<int64_t, int64_t> lens[] = {{1, 1},   {17, 17}, {5, 100}, {100, 5}, {1, 257},
                                              {257, 1}, {100, 100}, {257, 257}, {33, 64}};
  for (auto [lq, lkv] : lens) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(str("Lq ", lq, " Lkv ", lkv, " ", dtype_name(dt)));
      const Tensor q = random_tensor({1, 2, lq, 32}, dt), k = random_tensor({1, 2, lkv, 32}, dt);
      const Tensor v = random_tensor({1, 2, lkv, 48}, dt);
      const Tensor out = scaled_dot_product_attention(q, k, v, std::nullopt, true);
      EXPECT_TRUE(all_close(out, reference(q, k, v, std::nullopt, true)));
      // Equals an explicit tril(ones(Lq, Lkv)) bool mask: exactly in f32 (f64 rows); in bf16 within one
      // rounding of the output (2^-7 relative), since blocks of 16-bit rows take f32 BLAS products whose key
      // count differs (the causal block stops at its last visible key, the masked one runs over all keys),
      // so the f32 sums can differ in their last bits and, rarely, round to neighbouring bf16 values. Those
      // last bits are relative to the terms (|p v| <= 1), not to the sum: an output that cancels to about
      // 1e-6 can differ by a few of its own ulps (seen once: 4.947e-6 against 5.007e-6), hence an absolute
      // 2^-20 as well. A misaligned causal mask differs by far more.
      std::vector<uint8_t> tril(static_cast<size_t>(lq * lkv));
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t j = 0; j < lkv; ++j) tril[i * lkv + j] = j <= i;
      const Tensor mask = from_vector<uint8_t>(tril, Shape{lq, lkv}).to(DType::Bool);
      const test::Tolerance exact =
          dt == DType::F32 ? test::Tolerance{0, 0} : test::Tolerance{1.0 / 128, 1.0 / (1 << 20)};
      EXPECT_TRUE(all_close(out, scaled_dot_product_attention(q, k, v, mask), exact));
    }
  }
}

// 16-bit inputs in blocks of 8 or more query rows take f32 through BLAS (cpu/attention.cpp block_f32): the
// same semantics as the f64 rows on fully masked rows (bool and float), a NaN query row, and an inf value
// at a key no row attends (it must contribute nothing: that block falls back to the f64 rows).
// 16-bit inputs: blocks of 8 or more query rows run in f32 through BLAS, fewer rows (decode) one at a time in
// f32; both keep the f64 rows' edge cases.
TEST(Attention, SixteenBitRowBlocksKeepTheEdgeCases) {
  for (int64_t lq : {40, 5})
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(str(dtype_name(dt), " lq ", lq));
    const int64_t b = 2, lkv = 50, d = 16;
    const int64_t r0 = std::min<int64_t>(3, lq - 1), r1 = std::min<int64_t>(35, lq - 1);
    const int64_t r9 = std::min<int64_t>(9, lq - 2), r20 = std::min<int64_t>(20, lq - 1);
    const Tensor q = random_tensor({b, lq, d}, dt), k = random_tensor({b, lkv, d}, dt);
    const Tensor v = random_tensor({b, lkv, d}, dt, 1, 2);
    Tensor mask = gt(random_tensor({b, lq, lkv}, DType::F32, 0, 1), 0.3);
    mask.select(0, 0).select(0, r0).fill_(false);
    mask.select(0, 1).select(0, r1).fill_(false);
    const Tensor out = scaled_dot_product_attention(q, k, v, mask);
    EXPECT_TRUE(all_close(out, reference(q, k, v, mask)));
    EXPECT_TRUE(test::equal(out.select(0, 0).select(0, r0), zeros({d}, dt)));
    EXPECT_TRUE(test::equal(out.select(0, 1).select(0, r1), zeros({d}, dt)));
    Tensor fmask = zeros({lq, lkv}, DType::F32);
    fmask.select(0, r9).fill_(-INFINITY);
    const Tensor out2 = scaled_dot_product_attention(q, k, v, fmask);
    EXPECT_TRUE(test::equal(out2.select(1, r9), zeros({b, d}, dt)));
    EXPECT_TRUE(all_close(out2, reference(q, k, v, fmask)));
    // An inf value at key 7, which no row attends: finite outputs, as the reference.
    Tensor vinf = v.clone();
    vinf.select(1, 7).fill_(INFINITY);
    Tensor mask7 = mask.clone();
    mask7.select(2, 7).fill_(false);
    const Tensor out3 = scaled_dot_product_attention(q, k, vinf, mask7);
    EXPECT_TRUE(all_close(out3, reference(q, k, vinf, mask7)));
    EXPECT_FALSE(std::isnan(sum(out3.to(DType::F32)).item<float>()));
    // A NaN in one query row: that row is NaN (as PyTorch's), the others are not touched.
    Tensor qnan = q.clone();
    qnan.select(0, 1).select(0, r20).select(0, 0).fill_(NAN);
    const Tensor out4 = scaled_dot_product_attention(qnan, k, v, std::nullopt, true);
    EXPECT_TRUE(all_close(out4, reference(qnan, k, v, std::nullopt, true)));
    const std::vector<float> nan_row = out4.select(0, 1).select(0, r20).to(DType::F32).to_vector<float>();
    for (float x : nan_row) EXPECT_TRUE(std::isnan(x));
  }
}

TEST(Attention, FullyMaskedRowsAreZero) {
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = random_tensor({2, 6, 16}, dt), k = random_tensor({2, 9, 16}, dt);
    const Tensor v = random_tensor({2, 9, 16}, dt, 1, 2);  // no row of v averages to 0 by chance
    Tensor mask = gt(random_tensor({2, 6, 9}, DType::F32, 0, 1), 0.5);
    mask.select(0, 0).select(0, 2).fill_(false);
    mask.select(0, 1).select(0, 5).fill_(false);
    const Tensor out = scaled_dot_product_attention(q, k, v, mask);
    EXPECT_TRUE(all_close(out, reference(q, k, v, mask)));
    EXPECT_TRUE(test::equal(out.select(0, 0).select(0, 2), zeros({16}, dt)));
    EXPECT_TRUE(test::equal(out.select(0, 1).select(0, 5), zeros({16}, dt)));
    // A float mask of all -inf on a row: the same.
    Tensor fmask = zeros({6, 9}, dt);
    fmask.select(0, 3).fill_(-INFINITY);
    const Tensor out2 = scaled_dot_product_attention(q, k, v, fmask);
    EXPECT_TRUE(test::equal(out2.select(1, 3), zeros({2, 16}, dt)));
    EXPECT_TRUE(all_close(out2, reference(q, k, v, fmask)));
  }
  // No keys at all: every row is fully masked.
  const Tensor out = scaled_dot_product_attention(random_tensor({2, 3, 8}, DType::F32),
                                                  random_tensor({2, 0, 8}, DType::F32),
                                                  random_tensor({2, 0, 5}, DType::F32));
  EXPECT_TRUE(test::equal(out, zeros({2, 3, 5}, DType::F32)));
  // No queries: an empty result.
  EXPECT_EQ(scaled_dot_product_attention(random_tensor({2, 0, 8}, DType::F32), random_tensor({2, 4, 8}, DType::F32),
                                         random_tensor({2, 4, 5}, DType::F32))
                .sizes(),
            (Shape{2, 0, 5}));
}

TEST(Attention, LargeLogitsStayFinite) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    // Scores of magnitude ~1e4 (f16 inputs up to 100): a softmax without the max shift overflows.
    const double mag = dt == DType::F16 ? 100 : 300;
    const Tensor q = random_tensor({2, 2, 7, 16}, dt, -mag, mag), k = random_tensor({2, 2, 31, 16}, dt, -mag, mag);
    const Tensor v = random_tensor({2, 2, 31, 16}, dt);
    const Tensor out = scaled_dot_product_attention(q, k, v);
    EXPECT_TRUE(all(isfinite(out)).item<bool>());
    EXPECT_TRUE(all_close(out, reference(q, k, v)));
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, std::nullopt, true, 1.0),
                          reference(q, k, v, std::nullopt, true, 1.0)));
  }
}

TEST(Attention, ExplicitScaleAndHeadDimsDiffer) {
  const Tensor q = random_tensor({2, 4, 10, 24}, DType::F32), k = random_tensor({2, 4, 12, 24}, DType::F32);
  const Tensor v = random_tensor({2, 4, 12, 40}, DType::F32);
  for (double scale : {0.0, 0.05, 1.0, -0.3}) {
    SCOPED_TRACE(scale);
    EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, std::nullopt, false, scale),
                          reference(q, k, v, std::nullopt, false, scale)));
  }
  EXPECT_EQ(scaled_dot_product_attention(q, k, v).sizes(), (Shape{2, 4, 10, 40}));
}

TEST(Attention, ErrorsNameTheProblem) {
  const Tensor q = random_tensor({2, 4, 5, 16}, DType::F32), k = random_tensor({2, 4, 6, 16}, DType::F32);
  const Tensor v = random_tensor({2, 4, 6, 16}, DType::F32);
  auto sdpa = [](auto&&... a) { return scaled_dot_product_attention(a...); };
  EXPECT_TRUE(throws_error([&] { sdpa(q, k.to(DType::BF16), v); }, {"one dtype", "bfloat16"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q.to(DType::I32), k.to(DType::I32), v.to(DType::I32)); }, {"f16, bf16"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k.narrow(-1, 0, 8), v); }, {"head dim"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k, v.narrow(-2, 0, 5)); }, {"sequence length"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k, v, zeros({5, 6}), true); }, {"is_causal"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k.narrow(1, 0, 3), v.narrow(1, 0, 3), std::nullopt, false, std::nullopt, true); },
                           {"multiple", "4", "3"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k.narrow(1, 0, 3), v.narrow(1, 0, 3)); }, {"broadcast"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k, v, zeros({5, 7})); }, {"attn_mask", "[2, 4, 5, 6]"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k, v, zeros({3, 2, 4, 5, 6})); }, {"attn_mask"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q, k, v, zeros({5, 6}, DType::I32)); }, {"attn_mask", "bool"}));
  EXPECT_TRUE(throws_error([&] { sdpa(q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16), zeros({5, 6}, DType::F16)); },
                           {"attn_mask", "bool"}));
  EXPECT_TRUE(throws_error([&] { sdpa(random_tensor({16}, DType::F32), k, v); }, {"2-d"}));
  EXPECT_TRUE(throws_error([&] {
    sdpa(random_tensor({2, 2, 2, 2, 2, 2, 2, 1, 4, 8}, DType::F32),
         random_tensor({1, 2, 1, 2, 1, 2, 1, 1, 5, 8}, DType::F32), random_tensor({5, 8}, DType::F32));
  }, {"coalesce"}));
  EXPECT_TRUE(throws_error([&] { sdpa(random_tensor({5, 16}, DType::F32), k, v, std::nullopt, false, std::nullopt, true); },
                           {"enable_gqa"}));
}

// ---- decode ----

// decode_attention of sequence b equals sdpa over the first lengths[b] cache positions with the query rows
// aligned to the end (query t sees positions <= lengths[b] - Lq + t).
Tensor decode_reference(const Tensor& q, const Tensor& kc, const Tensor& vc, const std::vector<int32_t>& lens) {
  std::vector<Tensor> outs;
  const int64_t lq = q.size(2), hq = q.size(1), hkv = kc.size(1);
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t n = lens[b];
    std::vector<uint8_t> m(static_cast<size_t>(lq * n));
    for (int64_t t = 0; t < lq; ++t)
      for (int64_t j = 0; j < n; ++j) m[t * n + j] = j <= n - lq + t;
    const Tensor mask = from_vector<uint8_t>(m, Shape{lq, n}).to(DType::Bool);
    outs.push_back(reference(q.select(0, b), kc.select(0, b).narrow(1, 0, n), vc.select(0, b).narrow(1, 0, n), mask,
                             false, std::nullopt, hq != hkv));
  }
  return stack(outs, 0);
}

TEST(DecodeAttention, MatchesMaskedReferenceWithPerSequenceLengths) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t lq : {1, 3, 8}) {
      SCOPED_TRACE(str(dtype_name(dt), " Lq ", lq));
      const int64_t b = 3, hq = 8, hkv = 2, lmax = 130, d = 32, dv = 16;
      const Tensor q = random_tensor({b, lq, hq, d}, dt).transpose(1, 2);  // [B, Hq, Lq, D], strided
      const Tensor kc = random_tensor({b, hkv, lmax, d}, dt), vc = random_tensor({b, hkv, lmax, dv}, dt);
      const std::vector<int32_t> lens = {static_cast<int32_t>(lq), 100, 130};
      const Tensor out = decode_attention(q, kc, vc, from_vector<int32_t>(lens));
      EXPECT_TRUE(all_close(out, decode_reference(q, kc, vc, lens)));
    }
  }
  // A length shorter than Lq: the early query rows see nothing and give 0; length 0 gives all 0.
  const Tensor q = random_tensor({2, 2, 4, 8}, DType::F32);
  const Tensor kc = random_tensor({2, 1, 10, 8}, DType::F32), vc = random_tensor({2, 1, 10, 8}, DType::F32, 1, 2);
  const Tensor out = decode_attention(q, kc, vc, from_vector<int32_t>({2, 0}));
  EXPECT_TRUE(test::equal(out.select(0, 0).narrow(1, 0, 2), zeros({2, 2, 8}, DType::F32)));
  EXPECT_TRUE(test::equal(out.select(0, 1), zeros({2, 4, 8}, DType::F32)));
  EXPECT_TRUE(all_close(out.select(0, 0).narrow(1, 2, 2),
                        decode_reference(q.narrow(2, 2, 2), kc, vc, {2, 2}).select(0, 0)));
}

TEST(DecodeAttention, EqualsCausalPrefillWhenTheCacheIsFull) {
  // Lq = Lkv = length: bottom-right and top-left alignment coincide.
  const Tensor q = random_tensor({2, 4, 6, 16}, DType::F32), kc = random_tensor({2, 2, 6, 16}, DType::F32);
  const Tensor vc = random_tensor({2, 2, 6, 16}, DType::F32);
  EXPECT_TRUE(all_close(decode_attention(q, kc, vc, from_vector<int32_t>({6, 6})),
                        scaled_dot_product_attention(q, kc, vc, std::nullopt, true, std::nullopt, true)));
}

TEST(DecodeAttention, AppendThenDecode) {
  for (DType cache_dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(cache_dt));
    const int64_t b = 2, hkv = 2, hq = 4, lmax = 20, d = 16, t = 3;
    Tensor kc = random_tensor({b, hkv, lmax, d}, cache_dt), vc = random_tensor({b, hkv, lmax, d}, cache_dt);
    const Tensor k0 = kc.clone(), v0 = vc.clone();
    const Tensor kn = random_tensor({b, hkv, t, d}, DType::F32), vn = random_tensor({b, t, hkv, d}, DType::F32).transpose(1, 2);
    const std::vector<int32_t> pos = {5, 17};
    kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>(pos));
    for (int64_t i = 0; i < b; ++i) {
      EXPECT_TRUE(test::equal(kc.select(0, i).narrow(1, pos[i], t), kn.select(0, i).to(cache_dt)));
      EXPECT_TRUE(test::equal(vc.select(0, i).narrow(1, pos[i], t), vn.select(0, i).to(cache_dt)));
      // Nothing else changed.
      EXPECT_TRUE(test::equal(kc.select(0, i).narrow(1, 0, pos[i]), k0.select(0, i).narrow(1, 0, pos[i])));
      const int64_t rest = lmax - pos[i] - t;
      EXPECT_TRUE(test::equal(vc.select(0, i).narrow(1, pos[i] + t, rest), v0.select(0, i).narrow(1, pos[i] + t, rest)));
    }
    const Tensor q = random_tensor({b, hq, t, d}, cache_dt);
    const std::vector<int32_t> lens = {8, 20};
    EXPECT_TRUE(all_close(decode_attention(q, kc, vc, from_vector<int32_t>(lens)), decode_reference(q, kc, vc, lens)));
  }
}

TEST(DecodeAttention, ErrorsNameTheProblem) {
  const Tensor q = random_tensor({2, 4, 1, 16}, DType::F32);
  Tensor kc = random_tensor({2, 2, 8, 16}, DType::F32), vc = random_tensor({2, 2, 8, 16}, DType::F32);
  EXPECT_TRUE(throws_error([&] { decode_attention(q, kc, vc, from_vector<int32_t>({3, 9})); }, {"lengths[1] = 9", "[0, 8]"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q, kc, vc, from_vector<int32_t>({3, -1})); }, {"lengths[1] = -1"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q, kc, vc, from_vector<int64_t>({3, 3})); }, {"i32"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q, kc, vc, from_vector<int32_t>({3})); }, {"i32 [2]"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q.narrow(1, 0, 3), kc, vc, from_vector<int32_t>({3, 3})); },
                           {"multiple"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q.squeeze(2), kc, vc, from_vector<int32_t>({3, 3})); }, {"[B, Hq, Lq, D]"}));
  EXPECT_TRUE(throws_error([&] { decode_attention(q.to(DType::BF16), kc, vc, from_vector<int32_t>({3, 3})); }, {"one dtype"}));
  const Tensor kn = random_tensor({2, 2, 3, 16}, DType::F32), vn = random_tensor({2, 2, 3, 16}, DType::F32);
  const Tensor k0 = kc.clone();
  EXPECT_TRUE(throws_error([&] { kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>({0, 6})); },
                           {"positions[1] = 6", "Lmax = 8"}));
  EXPECT_TRUE(test::equal(kc, k0));  // nothing written
  EXPECT_TRUE(throws_error([&] { kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>({-1, 0})); }, {"positions[0] = -1"}));
  EXPECT_TRUE(throws_error([&] { kv_cache_append_(kc, vc, kn.narrow(3, 0, 8), vn, from_vector<int32_t>({0, 0})); },
                           {"shapes do not match"}));
  EXPECT_TRUE(throws_error([&] { kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>({0, 0}).to(DType::I64)); },
                           {"i32"}));
}


// ---- paged caches ----

// Sequence b's cache [B, Hkv, W * S, D] made of the blocks its row of the table names, in order.
Tensor cache_of_blocks(const Tensor& pool, const std::vector<std::vector<int32_t>>& table) {
  std::vector<Tensor> seqs;
  for (const std::vector<int32_t>& row : table) {
    std::vector<Tensor> blocks;
    for (int32_t blk : row) blocks.push_back(pool.select(0, blk));
    seqs.push_back(cat(blocks, 0).transpose(0, 1));
  }
  return stack(seqs, 0);
}

Tensor table_tensor(const std::vector<std::vector<int32_t>>& table) {
  std::vector<int32_t> flat;
  for (const auto& row : table) flat.insert(flat.end(), row.begin(), row.end());
  return from_vector<int32_t>(flat, Shape{static_cast<int64_t>(table.size()), static_cast<int64_t>(table[0].size())});
}

TEST(PagedAttention, MatchesTheReferenceOverEachSequencesBlocks) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t lq : {1, 3}) {
      SCOPED_TRACE(str(dtype_name(dt), " Lq ", lq));
      const int64_t nb = 9, s = 16, hkv = 2, hq = 6, d = 32, dv = 16;
      const Tensor kp = random_tensor({nb, s, hkv, d}, dt), vp = random_tensor({nb, s, hkv, dv}, dt);
      // Blocks out of order, one shared by two sequences, unused entries 0.
      const std::vector<std::vector<int32_t>> table = {{4, 0, 0}, {7, 2, 5}, {3, 2, 8}};
      const std::vector<int32_t> lens = {5, 48, 17};
      const Tensor q = random_tensor({3, lq, hq, d}, dt).transpose(1, 2);
      const Tensor out = paged_decode_attention(q, kp, vp, table_tensor(table), from_vector<int32_t>(lens));
      EXPECT_TRUE(all_close(out, decode_reference(q, cache_of_blocks(kp, table), cache_of_blocks(vp, table), lens)));
    }
  }
}

TEST(PagedAttention, AppendWritesEachRowToItsSlot) {
  const int64_t nb = 5, s = 16, hkv = 3, d = 8, dv = 4;
  Tensor kp = random_tensor({nb, s, hkv, d}, DType::F32), vp = random_tensor({nb, s, hkv, dv}, DType::BF16);
  const Tensor k0 = kp.clone(), v0 = vp.clone();
  const Tensor kn = random_tensor({4, hkv, d}, DType::F32), vn = random_tensor({4, hkv, dv}, DType::F32);
  const std::vector<int32_t> slots = {17, 0, 79, 40};
  paged_kv_append_(kp, vp, kn, vn, from_vector<int32_t>(slots));
  Tensor ke = k0.clone(), ve = v0.clone();
  for (int64_t t = 0; t < 4; ++t) {
    const int64_t blk = slots[t] / s, row = slots[t] % s;
    ke.select(0, blk).select(0, row).copy_(kn.select(0, t));
    ve.select(0, blk).select(0, row).copy_(vn.select(0, t));  // converted to the pool's bf16
  }
  EXPECT_TRUE(test::equal(kp, ke));
  EXPECT_TRUE(test::equal(vp, ve));
}

TEST(PagedAttention, ErrorsNameTheProblemAndWriteNothing) {
  Tensor kp = random_tensor({4, 16, 2, 8}, DType::F32), vp = random_tensor({4, 16, 2, 8}, DType::F32);
  const Tensor k0 = kp.clone();
  const Tensor kn = random_tensor({2, 2, 8}, DType::F32), vn = random_tensor({2, 2, 8}, DType::F32);
  EXPECT_TRUE(throws_error([&] { paged_kv_append_(kp, vp, kn, vn, from_vector<int32_t>({3, 64})); },
                           {"paged_kv_append_", "slots[1] = 64", "64 slots"}));
  EXPECT_TRUE(throws_error([&] { paged_kv_append_(kp, vp, kn, vn, from_vector<int32_t>({-1, 0})); }, {"slots[0] = -1"}));
  EXPECT_TRUE(test::equal(kp, k0));
  EXPECT_TRUE(throws_error([&] { paged_kv_append_(kp, vp, kn, vn, from_vector<int32_t>({1})); }, {"i32 [2]"}));
  EXPECT_TRUE(throws_error([&] { paged_kv_append_(kp, vp, kn.narrow(2, 0, 4), vn, from_vector<int32_t>({0, 1})); },
                           {"k_new [T, Hkv, D]"}));
  Tensor strided = random_tensor({4, 16, 2, 16}, DType::F32).narrow(3, 0, 8);
  EXPECT_TRUE(throws_error([&] { paged_kv_append_(strided, vp, kn, vn, from_vector<int32_t>({0, 1})); }, {"contiguous"}));
  const Tensor q = random_tensor({2, 4, 1, 8}, DType::F32);
  const Tensor lens = from_vector<int32_t>({3, 20});
  EXPECT_TRUE(throws_error([&] { paged_decode_attention(q, kp, vp, table_tensor({{0, 1}, {2, 4}}), lens); },
                           {"block_table[1, 1] = 4", "0 <= block < 4"}));
  EXPECT_TRUE(throws_error([&] { paged_decode_attention(q, kp, vp, table_tensor({{0, 1}, {2, 3}}), from_vector<int32_t>({3, 33})); },
                           {"lengths[1] = 33"}));
  EXPECT_TRUE(throws_error([&] { paged_decode_attention(q, kp, vp, table_tensor({{0, 1}}), lens); }, {"i32 [2, W]"}));
  EXPECT_TRUE(throws_error([&] { paged_decode_attention(q.narrow(1, 0, 3), kp, vp, table_tensor({{0, 1}, {2, 3}}), lens); },
                           {"multiple"}));
}

}  // namespace
}  // namespace kiln
