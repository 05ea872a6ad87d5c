// topk and sample against direct references written here (sorting, exact filtered distributions).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/philox.h"
#include "kiln/nn.h"
#include "test_util.h"

namespace kiln {
namespace {
using test::rng;
using test::throws_error;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- topk ------------------------------------------------------------------------------------------------

// Reference: a stable sort of the row's indices by value descending, NaN first.
std::vector<int64_t> sorted_indices(const std::vector<double>& row) {
  std::vector<int64_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const double x = row[a], y = row[b];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  return idx;
}

// Checks topk(x, k) against the reference; x is [rows, n] logically (any strides).
void check_topk(const Tensor& x, int64_t k) {
  SCOPED_TRACE(x.meta() + " k=" + std::to_string(k));
  auto [values, indices] = topk(x, k);
  const int64_t n = x.size(-1), rows = x.numel() / n;
  Shape expect_shape = x.sizes();
  expect_shape.back() = k;
  ASSERT_EQ(values.sizes(), expect_shape);
  ASSERT_EQ(indices.sizes(), expect_shape);
  ASSERT_EQ(values.dtype(), x.dtype());
  ASSERT_EQ(indices.dtype(), DType::I64);
  // Integers compared through int64 (exact); floats through double (exact for every float dtype).
  const bool integral = is_integral(x.dtype(), false);
  const std::vector<double> xd = x.to_vector<double>();
  const std::vector<int64_t> xi = integral ? x.to_vector<int64_t>() : std::vector<int64_t>{};
  const std::vector<uint64_t> xbits = test::raw_bits(x.contiguous()), vbits = test::raw_bits(values);
  const std::vector<int64_t> got = indices.to_vector<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> ref;
    if (integral) {
      ref.resize(n);
      std::iota(ref.begin(), ref.end(), int64_t{0});
      std::stable_sort(ref.begin(), ref.end(), [&](int64_t a, int64_t b) { return xi[r * n + a] > xi[r * n + b]; });
    } else {
      ref = sorted_indices(std::vector<double>(xd.begin() + r * n, xd.begin() + (r + 1) * n));
    }
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(got[r * k + j], ref[j]) << "row " << r << " position " << j;
      ASSERT_EQ(vbits[r * k + j], xbits[r * n + ref[j]]) << "row " << r << " position " << j;
    }
  }
}

const DType kTopkDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::F8E4M3, DType::I32,
                             DType::I64, DType::U8,  DType::I8,   DType::I16, DType::U64};

TEST(Topk, MatchesSortReferenceOnRandomInputs) {
  for (DType dt : kTopkDTypes) {
    const bool integral = is_integral(dt, false);
    Tensor x = integral ? test::random_int_tensor({5, 97}, dt, 0, 120) : test::random_tensor({5, 97}, dt, -4, 4);
    for (int64_t k : {1, 2, 13, 64}) check_topk(x, k);
  }
}

TEST(Topk, TiesGoToTheLowerIndexFirst) {
  for (DType dt : kTopkDTypes) {
    // Few distinct values: every row is full of ties, including at the k-th position.
    Tensor x = test::random_int_tensor({4, 150}, DType::I64, 0, 3).to(dt);
    for (int64_t k : {1, 5, 64}) check_topk(x, k);
  }
}

TEST(Topk, NaNCountsAsLargestAndSignedZerosTie) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    std::vector<double> v = {1.0, NAN, -0.0, 0.0, kInf, -kInf, NAN, 2.0, -0.0, 5e-324, -1.0, 0.0};
    Tensor x = from_vector<double>(v, Shape{1, 12}).to(dt);
    for (int64_t k : {1, 2, 3, 12}) check_topk(x, k);
    Tensor r = test::random_tensor({3, 80}, dt);
    Tensor nan = full({1}, NAN, dt);
    for (int i = 0; i < 20; ++i) r.select(0, i % 3).narrow(0, static_cast<int64_t>(rng()() % 80), 1).copy_(nan);
    for (int64_t k : {1, 7, 64}) check_topk(r, k);
  }
}

TEST(Topk, IntegerExtremes) {
  Tensor x = from_vector<int64_t>({INT64_MIN, INT64_MAX, 0, INT64_MAX - 1, -1, INT64_MIN + 1}, Shape{6});
  check_topk(x, 6);
  auto [v, i] = topk(x, 2);
  EXPECT_EQ(v.to_vector<int64_t>(), (std::vector<int64_t>{INT64_MAX, INT64_MAX - 1}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 3}));
}

TEST(Topk, NonContiguousAndBatchedInputs) {
  Tensor base = test::random_tensor({70, 6}, DType::F32);
  check_topk(base.t(), 64);                             // rows strided by 6
  check_topk(base.t().slice(1, 1, std::nullopt, 2), 9);  // and sliced
  check_topk(test::random_tensor({2, 3, 40}, DType::BF16).transpose(0, 1), 4);
  check_topk(test::random_tensor({1, 33}, DType::F16).expand({4, 33}), 33);  // stride-0 rows
  check_topk(test::random_tensor({3, 64}, DType::F32), 64);                  // k == size
}

TEST(Topk, ZeroDAndEmptyInputs) {
  auto [v, i] = topk(full({}, 3.5, DType::F32), 1);
  EXPECT_EQ(v.dim(), 0);
  EXPECT_EQ(i.dim(), 0);
  EXPECT_EQ(v.item<double>(), 3.5);
  EXPECT_EQ(i.item<int64_t>(), 0);
  auto [ve, ie] = topk(empty({0, 5}, DType::F32), 3);
  EXPECT_EQ(ve.sizes(), (Shape{0, 3}));
  EXPECT_EQ(ie.sizes(), (Shape{0, 3}));
}

TEST(Topk, InvalidArgumentsThrow) {
  Tensor x = zeros({2, 10}, DType::F32);
  EXPECT_TRUE(throws_error([&] { topk(x, 0); }, {"topk", "k=0", "1 <= k <= 64", "float32[2, 10]"}));
  EXPECT_TRUE(throws_error([&] { topk(x, 11); }, {"topk", "k=11", "(10)"}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({2, 100}, DType::F32), 65); }, {"topk", "k=65", "64"}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({3, 0}, DType::F32), 1); }, {"topk", "k=1"}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({4}, DType::Bool), 1); }, {"topk", "bool", "supported"}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({4}, DType::C64), 1); }, {"topk", "supported"}));
}

// ---- sample ----------------------------------------------------------------------------------------------

// The exact filtered distribution of one row, in double (the definition in ops/sampling_math.h).
std::vector<double> reference_probs(const std::vector<double>& l, const SamplingParams& p) {
  const int64_t v = static_cast<int64_t>(l.size());
  const double m = *std::max_element(l.begin(), l.end());
  std::vector<double> e(v);
  for (int64_t i = 0; i < v; ++i) e[i] = std::exp((l[i] - m) / p.temperature);
  std::vector<int64_t> order = sorted_indices(e);
  const int64_t kk = p.top_k > 0 ? std::min<int64_t>(p.top_k, v) : v;
  double s = 0;
  for (int64_t j = 0; j < kk; ++j) s += e[order[j]];
  int64_t n = kk;
  if (p.top_p < 1) {
    double c = 0;
    for (n = 0; n < kk;) {
      c += e[order[n++]];
      // The test's parameters must stay clear of the boundary, where f32 rounding decides.
      EXPECT_GT(std::fabs(c - p.top_p * s), 1e-4 * s) << "test distribution too close to the top_p boundary";
      if (c >= p.top_p * s) break;
    }
  }
  std::vector<double> q(v, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = order[j];
    if (e[i] >= p.min_p) q[i] = e[i];
  }
  const double w = std::accumulate(q.begin(), q.end(), 0.0);
  for (auto& x : q) x /= w;
  return q;
}

std::vector<int64_t> counts_of(const Tensor& tokens, int64_t v) {
  std::vector<int64_t> c(v, 0);
  for (int64_t t : tokens.to_vector<int64_t>()) {
    EXPECT_TRUE(t >= 0 && t < v) << "token " << t << " out of range";
    if (t >= 0 && t < v) ++c[t];
  }
  return c;
}

// Pearson's chi-square against probabilities q; tokens with q == 0 must never appear. The threshold is the
// chi-square quantile at p = 1e-6 for the degrees of freedom, so a correct sampler fails once in a million.
void expect_distribution(const std::vector<int64_t>& counts, const std::vector<double>& q) {
  const double kCritical[] = {0, 23.93, 27.63, 30.66, 33.38, 35.89};  // df 1..5, p = 1e-6
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  double chi2 = 0;
  int df = -1;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 after filtering but was drawn";
      continue;
    }
    ++df;
    const double expect = q[i] * total;
    chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
  }
  ASSERT_GE(df, 0);
  ASSERT_LE(df, 5);
  if (df == 0) return;
  EXPECT_LT(chi2, kCritical[df]) << "chi-square " << chi2 << " with " << df << " degrees of freedom";
}

TEST(Sample, FollowsTheFilteredDistribution) {
  const std::vector<double> l = {1.0, 2.0, 0.5, -1.0, 1.5, 0.0};
  const int64_t draws = 60000;
  struct Case {
    SamplingParams p;
    const char* name;
  };
  const Case cases[] = {
      {{0.7, 0, 1.0, 0.0}, "temperature 0.7"},
      {{1.0, 0, 1.0, 0.0}, "temperature 1"},
      {{1.0, 3, 1.0, 0.0}, "top_k 3"},
      {{1.0, 0, 0.8, 0.0}, "top_p 0.8"},
      {{1.0, 0, 1.0, 0.3}, "min_p 0.3"},
      {{0.7, 5, 0.9, 0.1}, "all filters"},
      {{2.5, 6, 0.95, 0.05}, "hot, top_k = V"},
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    // bf16 rounds the logits: the reference uses the rounded values.
    Tensor row = from_vector<double>(l, Shape{1, 6}).to(dt);
    const std::vector<double> lr = row.to_vector<double>();
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Generator gen(rng()());
      // One call, many rows: every row draws from its own Philox counter (stride-0 rows too).
      Tensor tokens = sample(row.expand({draws, 6}), c.p, &gen);
      ASSERT_EQ(tokens.sizes(), (Shape{draws}));
      ASSERT_EQ(tokens.dtype(), DType::I64);
      expect_distribution(counts_of(tokens, 6), reference_probs(lr, c.p));
    }
  }
}

TEST(Sample, GreedyIsArgmaxWithFirstIndexOnTies) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    // Small integers: many ties for the maximum.
    Tensor logits = test::random_int_tensor({16, 50}, DType::I64, -3, 3).to(dt);
    Tensor tokens = sample(logits, {0.0, 5, 0.5, 0.5});  // filters are irrelevant when greedy
    const std::vector<double> v = logits.to_vector<double>();
    const std::vector<int64_t> got = tokens.to_vector<int64_t>();
    for (int64_t r = 0; r < 16; ++r) {
      int64_t best = 0;
      for (int64_t i = 1; i < 50; ++i)
        if (v[r * 50 + i] > v[r * 50 + best]) best = i;
      EXPECT_EQ(got[r], best) << dtype_name(dt) << " row " << r;
    }
    // 1-d logits give a 0-d token.
    Tensor one = sample(logits[3], {0.0});
    EXPECT_EQ(one.dim(), 0);
    EXPECT_EQ(one.item<int64_t>(), got[3]);
  }
  // NaN counts as the largest, as in torch.argmax; -inf rows are fine when greedy.
  Tensor x = from_vector<float>({1.f, NAN, 3.f, NAN}, Shape{4});
  EXPECT_EQ(sample(x, {0.0}).item<int64_t>(), 1);
  EXPECT_EQ(sample(full({5}, -kInf, DType::F32), {0.0}).item<int64_t>(), 0);
}

TEST(Sample, SameSeedGivesSameTokens) {
  Tensor logits = test::random_tensor({32, 1000}, DType::F32, -3, 3);
  const SamplingParams p{0.8, 50, 0.9, 0.02};
  const uint64_t seed = rng()();
  Generator a(seed), b(seed);
  Tensor t1 = sample(logits, p, &a), t2 = sample(logits, p, &b);
  EXPECT_TRUE(test::equal(t1, t2));
  EXPECT_EQ(a.offset(), 1u);
  // The next call uses the next offset: different draws (32 rows of ~50 candidates all equal: ~never).
  Tensor t3 = sample(logits, p, &a);
  EXPECT_FALSE(test::equal(t1, t3));
  // The default generator, reseeded, repeats itself; half logits sample as their f32 values do.
  Tensor h = logits.to(DType::F16);
  manual_seed(seed);
  Tensor d1 = sample(h, p);
  manual_seed(seed);
  Tensor d2 = sample(h.to(DType::F32), p);
  EXPECT_TRUE(test::equal(d1, d2));
}

TEST(Sample, MatchesTheDocumentedStream) {
  // With V = 2 and equal logits, token = (u >= 0.5) where u = (w0 >> 8) * 2^-24 of philox_element(seed,
  // offset, row): checks the counter layout the CUDA kernel must reproduce.
  const uint64_t seed = rng()();
  Generator gen(seed);
  gen.next_offset();
  gen.next_offset();
  const int64_t rows = 256;
  Tensor tokens = sample(zeros({rows, 2}, DType::F32), {1.0}, &gen);
  const std::vector<int64_t> got = tokens.to_vector<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float u = philox_uniform_float(philox_element(seed, 2, static_cast<uint64_t>(r)), 24);
    EXPECT_EQ(got[r], u >= 0.5f ? 1 : 0) << "row " << r;
  }
}

TEST(Sample, TopPKeepsExactlyThePrefixThatReachesIt) {
  const int64_t draws = 4000;
  Generator gen(rng()());
  // Four equal logits: each p is exactly 0.25, so top_p = 0.5 is reached exactly by the first two tokens
  // (ties in index order) and the third must not be kept.
  auto c = counts_of(sample(zeros({draws, 4}, DType::F32), {1.0, 0, 0.5, 0.0}, &gen), 4);
  EXPECT_GT(c[0], 0);
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[2] + c[3], 0);
  // Just above 0.5 the third token joins.
  c = counts_of(sample(zeros({draws, 4}, DType::F32), {1.0, 0, 0.5001, 0.0}, &gen), 4);
  EXPECT_GT(c[2], 0);
  EXPECT_EQ(c[3], 0);
  // p = (0.5, 0.3, 0.2): top_p just below 0.8 keeps two tokens, just above keeps three.
  Tensor l = from_vector<double>({std::log(0.3), std::log(0.5), std::log(0.2)}, Shape{1, 3}).to(DType::F32);
  c = counts_of(sample(l.expand({draws, 3}), {1.0, 0, 0.799, 0.0}, &gen), 3);
  EXPECT_GT(c[0], 0);
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[2], 0);
  c = counts_of(sample(l.expand({draws, 3}), {1.0, 0, 0.801, 0.0}, &gen), 3);
  EXPECT_GT(c[2], 0);
  // Many tiny probabilities count toward S: e = (1, 0.9999, 20000 x 1e-8) totals 2.0001, so top_p = 0.5 asks
  // for 1.00005 and keeps two tokens. (A sequential f32 total, largest first, drops every 1e-8 and kept one.)
  {
    std::vector<double> tiny(20002, std::log(1e-8));
    tiny[0] = 0.0;
    tiny[1] = std::log(0.9999);
    c = counts_of(sample(from_vector<double>(tiny, Shape{1, 20002}).to(DType::F32).expand({draws / 4, 20002}),
                         {1.0, 0, 0.5, 0.0}, &gen),
                  20002);
    EXPECT_GT(c[0], 0);
    EXPECT_GT(c[1], 0);
    EXPECT_EQ(c[0] + c[1], draws / 4);
  }
  // A tiny top_p still keeps one token: the most probable.
  c = counts_of(sample(l.expand({draws, 3}), {1.0, 0, 1e-9, 0.0}, &gen), 3);
  EXPECT_EQ(c[1], draws);
  // min_p = 1 keeps only the maximum; top_k = 1 likewise.
  EXPECT_EQ(counts_of(sample(l.expand({draws, 3}), {1.0, 0, 1.0, 1.0}, &gen), 3)[1], draws);
  EXPECT_EQ(counts_of(sample(l.expand({draws, 3}), {3.0, 1, 1.0, 0.0}, &gen), 3)[1], draws);
}

TEST(Sample, OnlyFiniteTokenIsAlwaysChosen) {
  std::vector<float> v(37, -std::numeric_limits<float>::infinity());
  v[23] = -5.0f;
  Tensor l = from_vector<float>(v, Shape{1, 37});
  Generator gen(rng()());
  for (SamplingParams p : {SamplingParams{1.0}, SamplingParams{0.3, 4, 0.2, 0.5}, SamplingParams{50.0, 0, 1.0, 1.0},
                           SamplingParams{0.0}}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor tokens = sample(l.to(dt).expand({500, 37}), p, &gen);
      EXPECT_EQ(counts_of(tokens, 37)[23], 500) << "temperature " << p.temperature << " " << dtype_name(dt);
    }
  }
}

TEST(Sample, RowsDrawIndependently) {
  // Two equally likely tokens: pairs of rows agree half the time if their draws are independent.
  const int64_t rows = 20000;
  Generator gen(rng()());
  const std::vector<int64_t> t = sample(zeros({rows, 2}, DType::F32), {1.0}, &gen).to_vector<int64_t>();
  int64_t same = 0, ones = 0;
  for (int64_t r = 0; r + 1 < rows; r += 2) same += t[r] == t[r + 1];
  for (int64_t x : t) ones += x;
  // 6 standard deviations (binomial): cannot flake.
  EXPECT_NEAR(same, rows / 4.0, 6 * std::sqrt(rows / 2 * 0.25));
  EXPECT_NEAR(ones, rows / 2.0, 6 * std::sqrt(rows * 0.25));
  // Rows with different logits draw from their own distributions.
  Tensor mixed = from_vector<float>({0.f, -INFINITY, -INFINITY, 0.f, 0.f, 0.f}, Shape{3, 2});
  const std::vector<int64_t> m = sample(mixed, {1.0}, &gen).to_vector<int64_t>();
  EXPECT_EQ(m[0], 0);
  EXPECT_EQ(m[1], 1);
}

TEST(Sample, NonContiguousLogitsAndEmptyBatch) {
  Tensor base = test::random_tensor({50, 8}, DType::F32, -2, 2);
  const uint64_t seed = rng()();
  Generator a(seed), b(seed);
  Tensor t1 = sample(base.t(), {0.9, 10, 0.95, 0.0}, &a);
  Tensor t2 = sample(base.t().contiguous(), {0.9, 10, 0.95, 0.0}, &b);
  EXPECT_TRUE(test::equal(t1, t2));
  Tensor e = sample(empty({0, 10}, DType::F32), {1.0});
  EXPECT_EQ(e.sizes(), (Shape{0}));
}

TEST(Sample, OffsetCounterOverloadFollowsTheGeneratorStream) {
  Tensor logits = test::random_tensor({8, 300}, DType::F32, -3, 3);
  const SamplingParams p{0.9, 20, 0.9, 0.0};
  const uint64_t seed = rng()();
  Tensor counter = from_vector<int64_t>({7}, Shape{1});
  Generator gen(seed);
  gen.set_offset(7);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(test::equal(sample(logits, p, seed, counter), sample(logits, p, &gen)));
  EXPECT_EQ(counter.item<int64_t>(), 10);
  (void)sample(empty({0, 300}, DType::F32), p, seed, counter);  // an empty batch still takes an offset
  EXPECT_EQ(counter.item<int64_t>(), 11);
  EXPECT_TRUE(throws_error([&] { sample(logits, p, seed, from_vector<int32_t>({0}, Shape{1})); }, {"sample", "offset"}));
  EXPECT_TRUE(throws_error([&] { sample(logits, p, seed, zeros({2}, DType::I64)); }, {"sample", "offset"}));
}

TEST(Sample, InvalidArgumentsThrow) {
  Tensor l = zeros({2, 5}, DType::F32);
  EXPECT_TRUE(throws_error([&] { sample(l, {-0.5}); }, {"sample", "temperature", "-0.5"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {NAN}); }, {"sample", "temperature"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {kInf}); }, {"sample", "temperature"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, -1}); }, {"sample", "top_k", "-1"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, 0, 0.0}); }, {"sample", "top_p", "(0, 1]"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, 0, 1.5}); }, {"sample", "top_p", "1.5"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, 0, NAN}); }, {"sample", "top_p"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, 0, 1.0, -0.1}); }, {"sample", "min_p", "[0, 1]"}));
  EXPECT_TRUE(throws_error([&] { sample(l, {1.0, 0, 1.0, 1.5}); }, {"sample", "min_p"}));
  EXPECT_TRUE(throws_error([&] { sample(zeros({2, 5}, DType::I32), {1.0}); }, {"sample", "int32", "float32"}));
  EXPECT_TRUE(throws_error([&] { sample(zeros({2, 5}, DType::F64), {1.0}); }, {"sample", "float64"}));
  EXPECT_TRUE(throws_error([&] { sample(zeros({2, 2, 5}, DType::F32), {1.0}); }, {"sample", "[B, V]"}));
  EXPECT_TRUE(throws_error([&] { sample(zeros({}, DType::F32), {1.0}); }, {"sample", "[B, V]"}));
  EXPECT_TRUE(throws_error([&] { sample(zeros({3, 0}, DType::F32), {1.0}); }, {"sample", "at least one"}));
  // A row whose distribution is undefined (NaN, +inf, all -inf) when sampling at temperature > 0.
  Tensor bad = zeros({3, 4}, DType::F32);
  bad[1].narrow(0, 2, 1).fill_(NAN);
  EXPECT_TRUE(throws_error([&] { sample(bad, {1.0}); }, {"sample", "row 1", "NaN"}));
  EXPECT_TRUE(throws_error([&] { sample(full({2, 3}, -kInf, DType::F32), {0.5}); }, {"sample", "-inf"}));
  Tensor pinf = zeros({1, 3}, DType::F32);
  pinf[0].narrow(0, 0, 1).fill_(kInf);
  EXPECT_TRUE(throws_error([&] { sample(pinf, {1.0}); }, {"sample", "row 0", "+inf"}));
}

}  // namespace
}  // namespace kiln
