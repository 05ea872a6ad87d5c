// topk and sample on CUDA against the CPU reference (both implement src/ops/sampling_math.h; the CPU side is
// tested against sorting and exact distributions in tests/ops/sampling_test.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "test_util.h"

namespace kiln {
namespace {
using test::rng;
using test::throws_error;

const Device kGpu = cuda_device(0);
constexpr float kInfF = std::numeric_limits<float>::infinity();

// Leaves freed blocks of these sizes full of 0xA5 bytes in the caching allocator, so that an output element
// the kernels fail to write reads as garbage rather than as a plausible zero.
void poison_cache(std::initializer_list<int64_t> bytes) {
  std::vector<Tensor> hold;
  for (int64_t b : bytes) {
    Tensor t = empty({std::max<int64_t>(b, 1)}, DType::U8, kGpu);
    t.fill_(0xA5);
    hold.push_back(t);
  }
}

// ---- topk --------------------------------------------------------------------------------------------------

// x_gpu: any layout on the GPU. The CPU reference runs on the same values.
void expect_topk_matches_cpu(const Tensor& x_gpu, int64_t k) {
  SCOPED_TRACE(x_gpu.meta() + " k=" + std::to_string(k));
  const Tensor x_cpu = x_gpu.to(kCPU);
  const int64_t rows = x_gpu.dim() == 0 ? 1 : x_gpu.numel() / x_gpu.size(-1);
  poison_cache({rows * k * static_cast<int64_t>(itemsize(x_gpu.dtype())), rows * k * 8});
  auto [v, i] = topk(x_gpu, k);
  auto [rv, ri] = topk(x_cpu, k);
  ASSERT_EQ(v.device(), kGpu);
  ASSERT_EQ(i.device(), kGpu);
  ASSERT_EQ(v.sizes(), rv.sizes());
  ASSERT_EQ(v.dtype(), x_gpu.dtype());
  ASSERT_EQ(i.dtype(), DType::I64);
  const std::vector<int64_t> gi = i.to(kCPU).to_vector<int64_t>(), ci = ri.to_vector<int64_t>();
  const std::vector<uint64_t> gv = test::raw_bits(v.to(kCPU)), cv = test::raw_bits(rv);
  int64_t bad = 0;
  for (size_t j = 0; j < gi.size(); ++j) {
    if (gi[j] != ci[j] || gv[j] != cv[j]) {
      if (bad++ < 5)
        ADD_FAILURE() << "row " << j / k << " position " << j % k << ": got index " << gi[j] << " (bits " << gv[j]
                      << "), expected " << ci[j] << " (bits " << cv[j] << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

const DType kDTypes[] = {DType::F32, DType::F16, DType::BF16};

TEST(CudaTopk, MatchesCpuOnRandomRowsOfManySizes) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDTypes) {
    // One chunk per row, several chunks, rows of exactly k, odd sizes, decode shapes.
    expect_topk_matches_cpu(test::random_tensor({3, 97}, dt, -4, 4, kGpu), 1);
    expect_topk_matches_cpu(test::random_tensor({3, 97}, dt, -4, 4, kGpu), 7);
    expect_topk_matches_cpu(test::random_tensor({3, 97}, dt, -4, 4, kGpu), 64);
    expect_topk_matches_cpu(test::random_tensor({5, 64}, dt, -4, 4, kGpu), 64);
    expect_topk_matches_cpu(test::random_tensor({6, 7}, dt, -4, 4, kGpu), 7);
    expect_topk_matches_cpu(test::random_tensor({2, 1}, dt, -4, 4, kGpu), 1);
    for (int64_t n : {1023, 1025, 4095, 4097, 10007}) expect_topk_matches_cpu(test::random_tensor({2, n}, dt, -4, 4, kGpu), 64);
    expect_topk_matches_cpu(test::random_tensor({1, 151936}, dt, -8, 8, kGpu), 1);
    expect_topk_matches_cpu(test::random_tensor({1, 151936}, dt, -8, 8, kGpu), 7);
    expect_topk_matches_cpu(test::random_tensor({1, 151936}, dt, -8, 8, kGpu), 64);
    expect_topk_matches_cpu(test::random_tensor({4, 128256}, dt, -8, 8, kGpu), 50);
    expect_topk_matches_cpu(test::random_tensor({1, 262144}, dt, -8, 8, kGpu), 64);
    expect_topk_matches_cpu(test::random_tensor({70, 3000}, dt, -8, 8, kGpu), 13);  // many rows
  }
}

TEST(CudaTopk, TiesGoToTheLowerIndexAcrossChunks) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDTypes) {
    // Few distinct values: the k-th value is shared by thousands of elements spread over every chunk.
    for (int64_t n : {150, 5000, 151936}) {
      Tensor x = test::random_int_tensor({3, n}, DType::I64, 0, 3, kGpu).to(dt);
      for (int64_t k : {1, 7, 64}) expect_topk_matches_cpu(x, k);
    }
    // All equal: indices 0..k-1.
    Tensor eq = full({2, 9000}, 1.5, dt, kGpu);
    auto [v, i] = topk(eq, 64);
    std::vector<int64_t> want(64);
    std::iota(want.begin(), want.end(), int64_t{0});
    const std::vector<int64_t> got = i.to(kCPU).to_vector<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + 64), want);
    EXPECT_EQ(std::vector<int64_t>(got.begin() + 64, got.end()), want);
  }
}

TEST(CudaTopk, NaNCountsAsLargestAndSignedZerosTie) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDTypes) {
    std::vector<double> v = {1.0, NAN, -0.0, 0.0, INFINITY, -INFINITY, NAN, 2.0, -0.0, 1e-30, -1.0, 0.0};
    Tensor small = from_vector<double>(v, Shape{1, 12}).to(dt).to(kGpu);
    for (int64_t k : {1, 2, 3, 12}) expect_topk_matches_cpu(small, k);
    // NaNs scattered over long rows: fewer than k, and more than k.
    for (int nans : {5, 100}) {
      Tensor r = test::random_tensor({2, 20000}, dt, -3, 3);
      Tensor nan = full({1}, NAN, dt);
      for (int j = 0; j < nans; ++j) r.select(0, j % 2).narrow(0, static_cast<int64_t>(rng()() % 20000), 1).copy_(nan);
      for (int64_t k : {1, 7, 64}) expect_topk_matches_cpu(r.to(kGpu), k);
    }
    // Zeros of both signs only: ties in index order, bits kept.
    std::vector<float> zeros_host(12000);
    for (auto& x : zeros_host) x = (rng()() & 1) ? -0.0f : 0.0f;
    expect_topk_matches_cpu(from_vector<float>(zeros_host, Shape{2, 6000}).to(dt).to(kGpu), 64);
    // -inf rows.
    expect_topk_matches_cpu(full({2, 5000}, -INFINITY, dt, kGpu), 64);
  }
}

TEST(CudaTopk, NonContiguousAndUnalignedInputs) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDTypes) {
    Tensor big = test::random_tensor({3, 5001}, dt, -4, 4, kGpu);
    expect_topk_matches_cpu(big.narrow(1, 1, 4999), 64);                  // starts at element 1
    expect_topk_matches_cpu(test::random_tensor({300, 6}, dt, -4, 4, kGpu).t(), 64);  // strided rows
    expect_topk_matches_cpu(test::random_tensor({1, 3000}, dt, -4, 4, kGpu).expand({3, 3000}), 9);
    expect_topk_matches_cpu(test::random_tensor({2, 3, 700}, dt, -4, 4, kGpu).transpose(0, 1), 5);
  }
}

TEST(CudaTopk, ZeroDEmptyAndUnsupported) {
  KILN_REQUIRE_CUDA();
  auto [v, i] = topk(full({}, 3.5, DType::F32, kGpu), 1);
  EXPECT_EQ(v.dim(), 0);
  EXPECT_EQ(v.item<double>(), 3.5);
  EXPECT_EQ(i.item<int64_t>(), 0);
  auto [ve, ie] = topk(empty({0, 5}, DType::F32, kGpu), 3);
  EXPECT_EQ(ve.sizes(), (Shape{0, 3}));
  EXPECT_EQ(ie.sizes(), (Shape{0, 3}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({2, 10}, DType::F64, kGpu), 3); }, {"topk", "float64", "CUDA"}));
  EXPECT_TRUE(throws_error([&] { topk(zeros({2, 100}, DType::F32, kGpu), 65); }, {"topk", "k=65"}));
}

// ---- sample --------------------------------------------------------------------------------------------------

// Tokens of one call on the GPU and the CPU with generators at the same (seed, offset).
struct Pair {
  std::vector<int64_t> gpu, cpu;
};
Pair sample_both(const Tensor& logits_gpu, const SamplingParams& p, uint64_t seed, uint64_t offset) {
  Generator g(seed), c(seed);
  g.set_offset(offset);
  c.set_offset(offset);
  const int64_t rows = logits_gpu.dim() == 2 ? logits_gpu.size(0) : 1;
  poison_cache({rows * 8});
  Tensor tg = sample(logits_gpu, p, &g);
  Tensor tc = sample(logits_gpu.to(kCPU), p, &c);
  EXPECT_EQ(tg.device(), kGpu);
  EXPECT_EQ(tg.sizes(), tc.sizes());
  EXPECT_EQ(tg.dtype(), DType::I64);
  return {tg.to(kCPU).to_vector<int64_t>(), tc.to_vector<int64_t>()};
}

TEST(CudaSample, GreedyIsArgmax) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDTypes) {
    for (Shape s : {Shape{1, 151936}, Shape{4, 128256}, Shape{3, 1000}, Shape{5, 7}, Shape{2, 1}, Shape{300, 50}}) {
      Tensor l = test::random_tensor(s, dt, -5, 5, kGpu);
      const Pair r = sample_both(l, {0.0, 40, 0.9, 0.1}, rng()(), 0);  // filters are irrelevant when greedy
      EXPECT_EQ(r.gpu, r.cpu) << dtype_name(dt) << " " << shape_str(s);
      EXPECT_EQ(r.gpu, argmax(l.to(kCPU), -1).to_vector<int64_t>()) << dtype_name(dt) << " " << shape_str(s);
    }
    // Ties for the maximum (first index wins, also across chunks), NaN counts as largest, -inf rows give 0.
    Tensor ties = test::random_int_tensor({3, 20000}, DType::I64, -3, 3, kGpu).to(dt);
    Pair r = sample_both(ties, {0.0}, 1, 0);
    EXPECT_EQ(r.gpu, r.cpu);
    Tensor x = test::random_tensor({3, 20000}, dt, -5, 5);
    x[0].narrow(0, 15000, 1).fill_(NAN);
    x[0].narrow(0, 17000, 1).fill_(NAN);
    x[1].fill_(-INFINITY);
    x[2].narrow(0, 19999, 1).fill_(INFINITY);
    const std::vector<int64_t> got = sample(x.to(kGpu), {0.0}).to(kCPU).to_vector<int64_t>();
    EXPECT_EQ(got, (std::vector<int64_t>{15000, 0, 19999}));
    // 1-d logits: a 0-d token.
    Tensor one = sample(x[2].to(kGpu), {0.0});
    EXPECT_EQ(one.dim(), 0);
    EXPECT_EQ(one.item<int64_t>(), 19999);
  }
}

// CPU and CUDA draw the same tokens for the same (seed, offset), except where the two backends' f32 sums
// of the draw round differently at a CDF step (top_p's kept set is defined on exact fixed-point sums, the
// same on both). The top_k <= 64 path adds in the CPU's order, so only the ~2^-28-per-element chance that
// double exp rounds to a different f32 remains: at most 0.5% of draws (+2) may differ. The general path adds
// W with a parallel scan where the CPU adds sequentially (the CPU's running sum at index i is off by
// ~sqrt(i) * 2^-24 relative): a draw differs when u * W falls within that error of a CDF step. With language-model-like logits (a few
// tokens hold nearly all the mass) that is < 1% of draws; at most 2% (+2) may differ. (On flat or Gaussian logits
// over 151936 tokens the CPU's own rounding error spans many small steps and agreement drops to ~90%.)
// max_rate: the mismatch rate allowed (0: every token equal); 2 more mismatches are allowed on top, so that a
// handful of draws cannot fail by chance at the rates above.
void expect_mostly_same_tokens(const Tensor& logits, const SamplingParams& p, int calls, double max_rate) {
  // Under compute-sanitizer a call over a large vocabulary takes seconds: one draw covers every kernel.
  if (test::under_gpu_sanitizer()) calls = 1;
  const uint64_t seed = rng()();
  int64_t same = 0, total = 0;
  for (int c = 0; c < calls; ++c) {
    const Pair r = sample_both(logits, p, seed, static_cast<uint64_t>(c) * 7 + 3);
    for (size_t j = 0; j < r.gpu.size(); ++j) {
      ASSERT_TRUE(r.gpu[j] >= 0 && r.gpu[j] < logits.size(-1)) << "token " << r.gpu[j] << " out of range";
      same += r.gpu[j] == r.cpu[j];
      ++total;
    }
  }
  const int64_t allowed = max_rate == 0 ? 0 : 2 + static_cast<int64_t>(std::ceil(max_rate * static_cast<double>(total)));
  EXPECT_LE(total - same, allowed) << same << " of " << total << " draws agree (temperature " << p.temperature
                                   << ", top_k " << p.top_k << ", top_p " << p.top_p << ", min_p " << p.min_p
                                   << ", " << logits.meta() << ")";
  ::testing::Test::RecordProperty("agreement", std::to_string(static_cast<double>(same) / static_cast<double>(total)));
}

// Logits shaped like a language model's: noise N(0, 2^2) and a few (up to 20) tokens per row 12..18 above
// it, which hold nearly all of the probability.
Tensor llm_logits(const Shape& s, DType dt, Device device = kGpu) {
  std::vector<float> v = randn(s, DType::F32, kCPU).to_vector<float>();
  const int64_t vocab = s.back(), rows = static_cast<int64_t>(v.size()) / vocab;
  std::uniform_real_distribution<double> boost(12.0, 18.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < vocab; ++i) v[r * vocab + i] *= 2.0f;
    for (int j = 0; j < 20; ++j) v[r * vocab + static_cast<int64_t>(rng()() % vocab)] += static_cast<float>(boost(rng()));
  }
  return from_vector<float>(v, s).to(dt).to(device);
}

TEST(CudaSample, TopKPathMatchesCpuTokensForTheSameSeed) {
  KILN_REQUIRE_CUDA();
  manual_seed(rng()());
  for (DType dt : kDTypes) {
    for (Shape s : {Shape{1, 151936}, Shape{4, 128256}, Shape{16, 5000}, Shape{64, 100}}) {
      Tensor l = llm_logits(s, dt);
      expect_mostly_same_tokens(l, {0.7, 20, 0.8, 0.0}, 25, 0.005);
      expect_mostly_same_tokens(l, {0.7, 50, 0.95, 0.0}, 25, 0.005);
      expect_mostly_same_tokens(l, {1.0, 64, 1.0, 0.05}, 25, 0.005);
      expect_mostly_same_tokens(l, {1.3, 1, 1.0, 0.0}, 5, 0.0);  // top_k 1: argmax
    }
    // Flat logits: e close together, many candidates near the k-th.
    expect_mostly_same_tokens(test::random_tensor({4, 30000}, dt, -1, 1, kGpu), {0.7, 40, 0.9, 0.0}, 25, 0.005);
  }
}

TEST(CudaSample, TopKTiesInEAmongDifferentLogitsFollowIndexOrder) {
  KILN_REQUIRE_CUDA();
  // Logits that differ by far less than e can resolve (|l| << T): many distinct logits share one e, so the
  // first top_k by (e desc, index asc) differ from the first top_k by logit, and the top_k path must take the
  // ties at the top_k-th e from the whole row. The CPU computes the same e, so the tokens must be identical.
  const int64_t rows = 32, v = 30000;
  std::vector<float> host(static_cast<size_t>(rows * v), -20.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < 300; ++j) host[static_cast<size_t>(r * v + static_cast<int64_t>(rng()() % v))] = 1e-9f * static_cast<float>(rng()() % 1000);
  Tensor l = from_vector<float>(host, Shape{rows, v}).to(kGpu);
  expect_mostly_same_tokens(l, {1.0, 20, 1.0, 0.0}, 20, 0.0);
  expect_mostly_same_tokens(l, {1.0, 64, 0.5, 0.0}, 20, 0.0);
  expect_mostly_same_tokens(l, {0.5, 7, 0.9, 0.0}, 20, 0.0);
  expect_mostly_same_tokens(l.to(DType::BF16), {0.01, 30, 0.95, 0.0}, 20, 0.0);
}

TEST(CudaSample, OtherPathsMatchCpuTokensForTheSameSeed) {
  KILN_REQUIRE_CUDA();
  manual_seed(rng()());
  for (DType dt : kDTypes) {
    // top_p alone: the chunked search for <= 64 rows, one block per row for 100 rows.
    for (Shape s : {Shape{1, 151936}, Shape{4, 32000}, Shape{16, 3000}, Shape{100, 3000}}) {
      Tensor l = llm_logits(s, dt);
      expect_mostly_same_tokens(l, {1.0, 0, 1.0, 0.0}, 25, 0.02);   // no filter: the chunk kernels
      expect_mostly_same_tokens(l, {0.8, 0, 1.0, 0.02}, 25, 0.02);  // min_p: the chunk kernels
      expect_mostly_same_tokens(l, {0.7, 0, 0.9, 0.0}, 25, 0.02);   // top_p
      expect_mostly_same_tokens(l, {1.0, 0, 0.5, 0.1}, 25, 0.02);   // top_p and min_p
      expect_mostly_same_tokens(l, {0.9, 200, 0.95, 0.0}, 25, 0.02);  // top_k above the fast path's 64
      expect_mostly_same_tokens(l, {0.6, 1000, 1.0, 0.0}, 25, 0.02);
    }
  }
}

// top_p's total over many tiny probabilities: e = (1, 0.9999, 20000 x 1e-8) totals 2.0001, so top_p = 0.5
// keeps two tokens on both backends (exact fixed-point sums; an f32 total dropped the tiny terms on the CPU
// and kept one). Both kept tokens are drawn and every draw matches the CPU's.
TEST(CudaSample, TopPCountsManyTinyProbabilitiesLikeTheCpu) {
  KILN_REQUIRE_CUDA();
  std::vector<float> v(20002, std::log(1e-8f));
  v[0] = 0.0f;
  v[1] = std::log(0.9999f);
  const Tensor l = from_vector<float>(v, Shape{1, 20002}).expand({64, 20002}).contiguous().to(kGpu);
  expect_mostly_same_tokens(l, {1.0, 0, 0.5, 0.0}, 10, 0.0);
  Generator g(rng()());
  const std::vector<int64_t> t = sample(l, {1.0, 0, 0.5, 0.0}, &g).to(kCPU).to_vector<int64_t>();
  EXPECT_GT(std::count(t.begin(), t.end(), 1), 0) << "the second token was never drawn";
  EXPECT_EQ(std::count(t.begin(), t.end(), 0) + std::count(t.begin(), t.end(), 1), 64);
}

// ---- distributions (the CPU test's method: exact filtered probabilities, chi-square at p = 1e-6) ----------

std::vector<int64_t> sorted_indices(const std::vector<double>& row) {
  std::vector<int64_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  return idx;
}

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
      if (e[order[n - 1]] > 0)
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

void add_counts(const Tensor& tokens, std::vector<int64_t>& c) {
  const int64_t v = static_cast<int64_t>(c.size());
  for (int64_t t : tokens.to(kCPU).to_vector<int64_t>()) {
    EXPECT_TRUE(t >= 0 && t < v) << "token " << t << " out of range";
    if (t >= 0 && t < v) ++c[t];
  }
}

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

struct DistCase {
  SamplingParams p;
  const char* name;
};
const DistCase kDistCases[] = {
    {{0.7, 0, 1.0, 0.0}, "temperature 0.7"},       {{1.0, 0, 1.0, 0.0}, "temperature 1"},
    {{1.0, 3, 1.0, 0.0}, "top_k 3"},               {{1.0, 0, 0.8, 0.0}, "top_p 0.8"},
    {{1.0, 0, 1.0, 0.3}, "min_p 0.3"},             {{0.7, 5, 0.9, 0.1}, "all filters"},
    {{2.5, 6, 0.95, 0.05}, "hot, top_k = V"},      {{1.0, 100, 0.8, 0.0}, "top_k 100 > V"},
    {{0.7, 4, 0.9, 0.0}, "top_k 4, top_p 0.9"},
};

TEST(CudaSample, FollowsTheFilteredDistributionOnASmallVocabulary) {
  KILN_REQUIRE_CUDA();
  const std::vector<double> l = {1.0, 2.0, 0.5, -1.0, 1.5, 0.0};
  const bool stats = !test::under_gpu_sanitizer();
  const int64_t draws = stats ? 60000 : 512;
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor row = from_vector<double>(l, Shape{1, 6}).to(dt);
    const std::vector<double> lr = row.to_vector<double>();
    Tensor rows = row.expand({draws, 6}).to(kGpu);  // every row draws from its own Philox counter
    for (const DistCase& c : kDistCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Generator gen(rng()());
      std::vector<int64_t> counts(6, 0);
      add_counts(sample(rows, c.p, &gen), counts);
      if (stats) expect_distribution(counts, reference_probs(lr, c.p));
    }
  }
}

TEST(CudaSample, FollowsTheFilteredDistributionAcrossChunks) {
  KILN_REQUIRE_CUDA();
  // Six finite logits spread over a row of many chunks (the rest -inf, probability 0): the chunk merge, the
  // cross-chunk scan and the top_p searches all take part. 2000 rows take top_p through the one-block-per-row
  // path, 64 rows through the chunked search.
  const int64_t v = 20000;
  const int64_t at[6] = {0, 4095, 4096, 9999, 15000, 19999};
  const std::vector<double> l = {1.0, 2.0, 0.5, -1.0, 1.5, 0.0};
  std::vector<float> host(static_cast<size_t>(v), -kInfF);
  for (int j = 0; j < 6; ++j) host[static_cast<size_t>(at[j])] = static_cast<float>(l[j]);
  const bool stats = !test::under_gpu_sanitizer();
  // Under compute-sanitizer 100 rows take the one-block-per-row path as 2000 do, in a twentieth of the time.
  for (int64_t rows : {stats ? int64_t{2000} : int64_t{100}, int64_t{64}}) {
    const int64_t calls = stats ? (60000 + rows - 1) / rows : 1;
    Tensor logits = from_vector<float>(host, Shape{1, v}).expand({rows, v}).to(kGpu);
    for (const DistCase& c : kDistCases) {
      SCOPED_TRACE(std::string(c.name) + ", rows " + std::to_string(rows));
      Generator gen(rng()());
      std::vector<int64_t> full_counts(static_cast<size_t>(v), 0);
      for (int64_t k = 0; k < calls; ++k) add_counts(sample(logits, c.p, &gen), full_counts);
      std::vector<int64_t> counts(6);
      int64_t elsewhere = 0;
      for (int64_t i = 0; i < v; ++i) elsewhere += full_counts[i];
      for (int j = 0; j < 6; ++j) {
        counts[j] = full_counts[at[j]];
        elsewhere -= counts[j];
      }
      EXPECT_EQ(elsewhere, 0) << "tokens of -inf logits were drawn";
      if (stats) expect_distribution(counts, reference_probs(l, c.p));
    }
  }
}

// ---- boundaries, reproducibility, graphs, errors ---------------------------------------------------------------

std::vector<int64_t> gpu_counts(const Tensor& logits_gpu, const SamplingParams& p, Generator& gen) {
  std::vector<int64_t> c(static_cast<size_t>(logits_gpu.size(-1)), 0);
  add_counts(sample(logits_gpu, p, &gen), c);
  return c;
}

TEST(CudaSample, TopPKeepsExactlyThePrefixThatReachesIt) {
  KILN_REQUIRE_CUDA();
  // Under compute-sanitizer fewer draws: every token that must appear still has p >= 0.2 over 256 draws or p >= 1/3
  // over 128, so the chance that one never does is below 1e-22.
  const bool san = test::under_gpu_sanitizer();
  const int64_t draws = san ? 256 : 4000;
  Generator gen(rng()());
  // A fifth token of probability 0 lets top_k = 4 take the fast path (top_k < V); top_k 0 and 5 (= V, off)
  // take the general one.
  for (int64_t top_k : {0, 4, 5}) {
    SCOPED_TRACE("top_k " + std::to_string(top_k));
    Tensor z = from_vector<float>({0.f, 0.f, 0.f, 0.f, -kInfF}, Shape{1, 5}).expand({draws, 5}).to(kGpu);
    // Four equal logits, each p exactly 0.25: top_p 0.5 is reached exactly by the first two (ties in index
    // order); the third must not be kept.
    auto c = gpu_counts(z, {1.0, top_k, 0.5, 0.0}, gen);
    EXPECT_GT(c[0], 0);
    EXPECT_GT(c[1], 0);
    EXPECT_EQ(c[2] + c[3] + c[4], 0);
    c = gpu_counts(z, {1.0, top_k, 0.5001, 0.0}, gen);
    EXPECT_GT(c[2], 0);
    EXPECT_EQ(c[3] + c[4], 0);
    // p = (0.3, 0.5, 0.2, 0, 0): top_p just below 0.8 keeps two tokens, just above keeps three.
    Tensor l = from_vector<double>({std::log(0.3), std::log(0.5), std::log(0.2), -INFINITY, -INFINITY}, Shape{1, 5})
                   .to(DType::F32);
    Tensor l5 = l.expand({draws, 5}).to(kGpu);
    c = gpu_counts(l5, {1.0, top_k, 0.799, 0.0}, gen);
    EXPECT_GT(c[0], 0);
    EXPECT_GT(c[1], 0);
    EXPECT_EQ(c[2], 0);
    c = gpu_counts(l5, {1.0, top_k, 0.801, 0.0}, gen);
    EXPECT_GT(c[2], 0);
    EXPECT_EQ(c[3] + c[4], 0);
    // A tiny top_p keeps only the most probable token; so do min_p = 1 and top_k = 1.
    EXPECT_EQ(gpu_counts(l5, {1.0, top_k, 1e-9, 0.0}, gen)[1], draws);
    EXPECT_EQ(gpu_counts(l5, {1.0, top_k, 1.0, 1.0}, gen)[1], draws);
    EXPECT_EQ(gpu_counts(l5, {3.0, 1, 1.0, 0.0}, gen)[1], draws);
  }
  // Equal logits in different chunks of long rows (the chunked top_p search ranks the ties at its threshold
  // across chunks by index): top_p 0.5 keeps exactly the first two, 0.5001 the third, never the fourth.
  {
    std::vector<float> host(8192, -kInfF);
    for (int64_t i : {100, 3000, 5000, 8000}) host[static_cast<size_t>(i)] = 0.0f;
    for (int64_t rows : {64, 100}) {  // chunked search; one block per row
      Tensor row = from_vector<float>(host, Shape{1, 8192}).expand({rows, 8192}).to(kGpu);
      std::vector<int64_t> c(8192, 0), c2(8192, 0);
      const int calls = san ? 2 : 40;
      for (int k = 0; k < calls; ++k) {
        add_counts(sample(row, {1.0, 0, 0.5, 0.0}, &gen), c);
        add_counts(sample(row, {1.0, 0, 0.5001, 0.0}, &gen), c2);
      }
      EXPECT_GT(c[100], 0);
      EXPECT_GT(c[3000], 0);
      EXPECT_EQ(c[100] + c[3000], calls * rows) << "rows " << rows;
      EXPECT_GT(c2[5000], 0);
      EXPECT_EQ(c2[100] + c2[3000] + c2[5000], calls * rows) << "rows " << rows;
    }
  }
  // Over a long row too, with the maximum in the last chunk.
  Tensor big = test::random_tensor({8, 151936}, DType::F32, -3, 3);
  big.select(1, 151935).fill_(10.0);
  Tensor bg = big.to(kGpu);
  for (SamplingParams p : {SamplingParams{1.0, 0, 1e-9, 0.0}, SamplingParams{1.0, 1, 1.0, 0.0},
                           SamplingParams{1.0, 0, 1.0, 1.0}, SamplingParams{0.5, 64, 1e-6, 0.0}}) {
    const std::vector<int64_t> t = sample(bg, p, &gen).to(kCPU).to_vector<int64_t>();
    for (int64_t x : t) EXPECT_EQ(x, 151935);
  }
}

TEST(CudaSample, TopKEqualToTheVocabularyIsOff) {
  KILN_REQUIRE_CUDA();
  Tensor l = test::random_tensor({6, 50}, DType::F32, -2, 2, kGpu);
  const uint64_t seed = rng()();
  for (double top_p : {1.0, 0.9}) {
    Generator a(seed), b(seed);
    EXPECT_TRUE(test::equal(sample(l, {0.8, 50, top_p, 0.0}, &a), sample(l, {0.8, 0, top_p, 0.0}, &b)));
    EXPECT_TRUE(test::equal(sample(l, {0.8, 500, top_p, 0.0}, &a), sample(l, {0.8, 0, top_p, 0.0}, &b)));
  }
}

TEST(CudaSample, MatchesTheDocumentedStream) {
  KILN_REQUIRE_CUDA();
  // Two equally likely tokens: token = (u >= 0.5), u = (w0 >> 8) * 2^-24 of philox_element(seed, offset, row).
  // Through the general path (no filter) and the top_k path ({0, 0, -inf} with top_k 2).
  const uint64_t seed = rng()();
  const int64_t rows = 256;
  Tensor two = zeros({rows, 2}, DType::F32, kGpu);
  Tensor three = from_vector<float>({0.f, 0.f, -kInfF}, Shape{1, 3}).expand({rows, 3}).to(kGpu);
  for (int path = 0; path < 2; ++path) {
    Generator gen(seed);
    gen.set_offset(2);
    const std::vector<int64_t> got = (path == 0 ? sample(two, {1.0}, &gen) : sample(three, {1.0, 2}, &gen))
                                         .to(kCPU)
                                         .to_vector<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const float u = philox_uniform_float(philox_element(seed, 2, static_cast<uint64_t>(r)), 24);
      EXPECT_EQ(got[r], u >= 0.5f ? 1 : 0) << "path " << path << " row " << r;
    }
  }
}

TEST(CudaSample, SameSeedGivesSameTokens) {
  KILN_REQUIRE_CUDA();
  Tensor logits = test::random_tensor({32, 1000}, DType::F32, -3, 3, kGpu);
  for (SamplingParams p : {SamplingParams{0.8, 50, 0.9, 0.02}, SamplingParams{0.8, 0, 0.9, 0.0}}) {
    const uint64_t seed = rng()();
    Generator a(seed), b(seed);
    Tensor t1 = sample(logits, p, &a), t2 = sample(logits, p, &b);
    EXPECT_TRUE(test::equal(t1, t2));
    EXPECT_EQ(a.offset(), 1u);
    EXPECT_FALSE(test::equal(t1, sample(logits, p, &a)));
    manual_seed(seed);
    Tensor d1 = sample(logits.to(DType::F16), p);
    manual_seed(seed);
    Tensor d2 = sample(logits.to(DType::F16).to(DType::F32), p);
    EXPECT_TRUE(test::equal(d1, d2));
  }
}

TEST(CudaSample, NonContiguousLogitsAndEmptyBatch) {
  KILN_REQUIRE_CUDA();
  Tensor base = test::random_tensor({5, 3001}, DType::BF16, -2, 2, kGpu).narrow(1, 1, 3000);  // unaligned rows
  const uint64_t seed = rng()();
  for (SamplingParams p : {SamplingParams{0.9, 10, 0.95, 0.0}, SamplingParams{0.9, 0, 0.95, 0.0}}) {
    Generator a(seed), b(seed);
    EXPECT_TRUE(test::equal(sample(base, p, &a), sample(base.contiguous(), p, &b)));
  }
  Tensor e = sample(empty({0, 10}, DType::F32, kGpu), {1.0});
  EXPECT_EQ(e.sizes(), (Shape{0}));
}

TEST(CudaSample, DeviceOffsetCounterDrawsAnewOnEveryGraphReplay) {
  KILN_REQUIRE_CUDA();
  const Tensor logits_cpu = llm_logits({4, 128256}, DType::BF16, kCPU);
  const Tensor logits = logits_cpu.to(kGpu);
  const uint64_t seed = rng()();
  const SamplingParams p{0.7, 40, 0.9, 0.0};
  Tensor counter = from_vector<int64_t>({5}, Shape{1}).to(kGpu);
  const Tensor coins = zeros({256, 2}, DType::F32, kGpu);  // fair coins: replays must differ
  Stream s = Stream::create(kGpu);
  Graph g;
  Tensor out, frozen, greedy, flips, top_p;
  Generator host_gen(seed);
  const SamplingParams top_p_only{0.8, 0, 0.9, 0.0};  // the chunked top_p search (with its memset)
  g.capture(s, [&] {
    out = sample(logits, p, seed, counter);
    frozen = sample(logits, p, &host_gen);  // host offset 0, fixed into the graph at capture
    greedy = sample(logits, {0.0}, seed, counter);
    flips = sample(coins, {1.0}, seed, counter);
    top_p = sample(logits, top_p_only, seed, counter);
  });
  synchronize(kGpu);
  EXPECT_EQ(counter.to(kCPU).to_vector<int64_t>()[0], 5) << "capture must not run the kernels";
  std::vector<std::vector<int64_t>> seen;
  for (int rep = 0; rep < 3; ++rep) {
    g.replay();
    s.synchronize();
    // Four calls take offsets from the counter per replay; the first of replay `rep` took 5 + 4 rep.
    EXPECT_EQ(counter.to(kCPU).to_vector<int64_t>()[0], 5 + 4 * (rep + 1));
    Generator ref(seed);
    ref.set_offset(5 + 4 * rep);
    EXPECT_EQ(out.to(kCPU).to_vector<int64_t>(), sample(logits_cpu, p, &ref).to_vector<int64_t>()) << "replay " << rep;
    Generator ref0(seed);
    EXPECT_EQ(frozen.to(kCPU).to_vector<int64_t>(), sample(logits_cpu, p, &ref0).to_vector<int64_t>());
    EXPECT_EQ(greedy.to(kCPU).to_vector<int64_t>(), argmax(logits_cpu, -1).to_vector<int64_t>());
    Generator ref2(seed);
    ref2.set_offset(7 + 4 * rep);
    const std::vector<int64_t> f = flips.to(kCPU).to_vector<int64_t>();
    EXPECT_EQ(f, sample(coins.to(kCPU), {1.0}, &ref2).to_vector<int64_t>());
    seen.push_back(f);
    // The GPU is deterministic: the replayed top_p draw equals an eager one at the same offset.
    Generator ref3(seed);
    ref3.set_offset(8 + 4 * rep);
    EXPECT_EQ(top_p.to(kCPU).to_vector<int64_t>(), sample(logits, top_p_only, &ref3).to(kCPU).to_vector<int64_t>());
  }
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_NE(seen[1], seen[2]);
  // Eager use, and an empty batch still takes an offset.
  Tensor c2 = from_vector<int64_t>({0}, Shape{1}).to(kGpu);
  (void)sample(empty({0, 10}, DType::F32, kGpu), p, seed, c2);
  (void)sample(logits, p, seed, c2);
  EXPECT_EQ(c2.to(kCPU).to_vector<int64_t>()[0], 2);
  EXPECT_TRUE(throws_error([&] { sample(logits, p, seed, from_vector<int64_t>({0}, Shape{1})); },
                           {"sample", "offset"}));
}

TEST(CudaSample, UndefinedRowIsReportedAtTheNextSynchronisation) {
  KILN_REQUIRE_CUDA();
  for (SamplingParams p : {SamplingParams{1.0, 20, 0.9, 0.0}, SamplingParams{1.0, 0, 0.9, 0.0},
                           SamplingParams{0.7, 0, 1.0, 0.0}, SamplingParams{1.0, 200, 1.0, 0.05}}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE("top_k " + std::to_string(p.top_k) + " kind " + std::to_string(kind));
      Tensor bad = test::random_tensor({3, 9000}, DType::F32, -2, 2);
      if (kind == 0) bad[1].narrow(0, 8000, 1).fill_(NAN);
      if (kind == 1) bad[1].narrow(0, 17, 1).fill_(INFINITY);
      if (kind == 2) bad[1].fill_(-INFINITY);
      Tensor bg = bad.to(kGpu);
      Tensor t;
      ASSERT_NO_THROW(t = sample(bg, p));  // asynchronous: no error at the call
      EXPECT_TRUE(throws_error([&] { (void)t.to(kCPU); }, {"sample", "row 1", "NaN, +inf or only -inf"}));
      // The record is cleared: the next good call works.
      Tensor good = sample(test::random_tensor({3, 9000}, DType::F32, -2, 2, kGpu), p);
      ASSERT_NO_THROW((void)good.to(kCPU));
    }
  }
  // Greedy accepts every row (NaN counts as largest, as torch.argmax does).
  Tensor nan = full({2, 5000}, NAN, DType::F32, kGpu);
  EXPECT_EQ(sample(nan, {0.0}).to(kCPU).to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace kiln
