// Speculative decoding (kiln/llm/generate.h: SpeculativeOptions): the verify step against plain decode, prompt
// lookup's drafts, greedy output identical to plain greedy decoding with every drafter on every reference
// checkpoint, and sampled output with the model's distribution (two-sample chi-square against plain sampling).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "kiln/llm/generate.h"
#include "kiln/llm/model.h"
#include "llm/speculative.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

const std::vector<std::string> kModels = {"qwen3-tiny", "qwen3-moe-tiny", "llama-tiny", "qwen3-tiny-fp8"};

std::string dir_of(const std::string& name) { return std::string(KILN_TEST_DATA_DIR) + "/models/" + name; }

Model load(const std::string& name, Device dev, DType dtype, int64_t ctx) {
  ModelOptions o;
  o.device = dev;
  o.dtype = dtype;
  o.max_context = ctx;
  return load_model(dir_of(name), o);
}

std::vector<int64_t> run(Model& m, const std::vector<int64_t>& prompt, int64_t n, const SamplingParams& params,
                         uint64_t seed, const SpeculativeOptions& spec = {}, GenerateStats* stats = nullptr) {
  GenerateOptions g;
  g.max_new_tokens = n;
  g.sampling = params;
  g.seed = seed;
  g.speculative = spec;
  return generate(m, prompt, g, stats);
}

const SamplingParams kGreedy{0.0, 0, 1.0, 0.0};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(PromptLookup, ProposesWhatFollowedTheLatestOccurrenceOfTheLongestSuffix) {
  // "1 2" occurs at 0 and 4; the latest earlier one (4) is followed by 9 5.
  EXPECT_EQ(lookup_drafts({1, 2, 3, 4, 1, 2, 9, 5, 7, 1, 2}, 2, 2), (std::vector<int64_t>{9, 5}));
  // Not enough tokens after the latest: the earlier one with k after it.
  EXPECT_EQ(lookup_drafts({1, 2, 3, 4, 1, 2, 9, 5, 7, 1, 2}, 2, 4), (std::vector<int64_t>{9, 5, 7, 1}));
  // The longest suffix wins over a later shorter one: "7 1 2" occurs once before, at 2.
  EXPECT_EQ(lookup_drafts({5, 5, 7, 1, 2, 8, 3, 1, 2, 4, 7, 1, 2}, 3, 3), (std::vector<int64_t>{8, 3, 1}));
  // With n = 1 only the last token is matched: its latest occurrence is at 7.
  EXPECT_EQ(lookup_drafts({5, 5, 7, 1, 2, 8, 3, 1, 2, 4, 7, 1, 2}, 1, 3), (std::vector<int64_t>{4, 7, 1}));
  // A run that reaches the end of the context proposes what there is.
  EXPECT_EQ(lookup_drafts({3, 3, 3}, 2, 4), (std::vector<int64_t>{3}));
  // Nothing to match.
  EXPECT_TRUE(lookup_drafts({1, 2, 3}, 3, 4).empty());
  EXPECT_TRUE(lookup_drafts({1}, 3, 4).empty());
  EXPECT_TRUE(lookup_drafts({}, 3, 4).empty());
}

// verify(tokens) gives the logits plain decode steps give, and rewind forgets the positions after it.
TEST(Verify, EqualsDecodeStepsAndRewindForgets) {
  const test::Tolerance kTol{1e-4, 1e-4};
  for (const bool cuda : {false, true}) {
    SCOPED_TRACE(cuda);
    if (cuda && !cuda_available()) continue;
    Model m = load("qwen3-tiny", cuda ? cuda_device() : kCPU, DType::F32, 32);
    const std::vector<int64_t> prompt{3, 14, 15, 92, 65}, more{35, 89, 79, 32};
    m.prefill(prompt);
    std::vector<Tensor> steps;
    for (int64_t t : more) steps.push_back(m.step(t).to(kCPU).clone());
    m.reset();
    m.prefill(prompt);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass after a rewind (on CUDA: a replay of the graph)
      const Tensor v = m.verify(more).to(kCPU);
      ASSERT_EQ(v.sizes(), (Shape{4, m.config().vocab_size}));
      EXPECT_EQ(m.position(), 9);
      for (size_t i = 0; i < more.size(); ++i) EXPECT_TRUE(test::all_close(v.select(0, static_cast<int64_t>(i)), steps[i], kTol)) << "token " << i;
      m.rewind(5);
    }
    // After a rewind into the verified tokens, a step continues from there.
    m.verify({35, 89});
    m.rewind(6);
    EXPECT_TRUE(test::all_close(m.step(89).to(kCPU), steps[1], kTol));
    EXPECT_TRUE(test::throws_error([&] { m.rewind(8); }, {"rewind: position 8 is not in [0, 7]"}));
    EXPECT_TRUE(test::throws_error([&] { m.verify(std::vector<int64_t>(26, 1)); }, {"exceed the context of 32"}));
    EXPECT_TRUE(test::throws_error([&] { m.verify({1, 384}); }, {"outside the vocabulary"}));
    EXPECT_TRUE(test::throws_error([&] { m.verify({}); }, {"no tokens"}));
    EXPECT_EQ(m.position(), 7);
  }
}

// Greedy speculative output is plain greedy output, token for token, with prompt lookup and with draft models
// that agree with the model (itself in bf16) and that do not (another checkpoint), at several draft lengths;
// the drafts are both accepted and rejected.
class SpeculativeGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGreedy, EqualsPlainGreedy) {
  const int64_t n = 48;
  Model m = load(GetParam(), kCPU, DType::F32, 128);
  Model self_bf16 = load(GetParam(), kCPU, DType::BF16, 128);
  Model other = load(GetParam() == "llama-tiny" ? "qwen3-tiny" : "llama-tiny", kCPU, DType::F32, 128);
  // A prompt that repeats itself, so that lookup finds drafts, and one that does not.
  const std::vector<std::vector<int64_t>> prompts = {{10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10, 20},
                                                     {7, 300, 12, 5, 91, 222, 17}};
  int64_t drafted = 0, accepted = 0;
  for (const auto& prompt : prompts) {
    const std::vector<int64_t> plain = run(m, prompt, n, kGreedy, 0);
    for (int64_t k : {1, 3, 8}) {
      for (int drafter = 0; drafter < 3; ++drafter) {
        SCOPED_TRACE(testing::Message() << "prompt " << prompt.size() << " k " << k << " drafter " << drafter);
        SpeculativeOptions spec;
        spec.num_draft = k;
        if (drafter == 0) spec.lookup = 3;
        else spec.draft = drafter == 1 ? &self_bf16 : &other;
        GenerateStats st;
        EXPECT_EQ(run(m, prompt, n, kGreedy, 0, spec, &st), plain);
        EXPECT_GT(st.verify_steps, 0);
        EXPECT_LE(st.accepted, st.drafted);
        drafted += st.drafted;
        accepted += st.accepted;
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeGreedy, ::testing::ValuesIn(kModels), [](const auto& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
});

// Plain greedy decoding step by step, with the gap between the two largest logits at each step, in units of
// bf16's spacing at the largest (2^(e - 7) for a value in [2^e, 2^(e + 1))).
std::vector<int64_t> greedy_with_gaps(Model& m, const std::vector<int64_t>& prompt, int64_t n, std::vector<float>& gaps) {
  m.reset();
  Tensor logits = m.prefill(prompt);
  std::vector<int64_t> out;
  gaps.clear();
  for (int64_t i = 0; i < n; ++i) {
    const auto [v, idx] = topk(logits.to(kCPU).to(DType::F32), 2);
    const float top = v.data<float>()[0];
    gaps.push_back((top - v.data<float>()[1]) / std::ldexp(1.f, std::ilogb(std::max(std::fabs(top), 1e-30f)) - 7));
    out.push_back(idx.data<int64_t>()[0]);
    if (i + 1 < n) logits = m.step(out.back());
  }
  return out;
}

// On CUDA, verify steps as captured graphs. In f32 the output is plain greedy output. In bf16 the verify step's
// few-row products round differently from the one-row decode kernels (another split of K, and the decode step's
// gate/up product is not rounded before its SiLU), so the two may resolve a near-tie differently: the output
// must equal plain greedy output up to the first step where plain decoding's top-2 gap is at most 2 steps of
// bf16 at the top logit (a tie at the precision the logits are computed in); the reference checkpoints'
// random weights have such near-ties (one at a gap of exactly one step, 0.0625 at a logit of 8 to 16).
TEST(SpeculativeGreedyCuda, EqualsPlainGreedy) {
  KILN_REQUIRE_CUDA();
  for (const DType dt : {DType::F32, DType::BF16}) {
    for (const std::string& name : kModels) {
      SCOPED_TRACE(name + " " + dtype_name(dt));
      Model m = load(name, cuda_device(), dt, 128);
      Model draft = load(name == "llama-tiny" ? "qwen3-tiny" : "llama-tiny", cuda_device(), dt, 128);
      const std::vector<int64_t> prompt{10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10, 20};
      std::vector<float> gaps;
      const std::vector<int64_t> plain = greedy_with_gaps(m, prompt, 64, gaps);
      EXPECT_EQ(run(m, prompt, 64, kGreedy, 0), plain);
      auto check = [&](const std::vector<int64_t>& got, const std::string& what) {
        size_t same = 0;
        while (same < got.size() && got[same] == plain[same]) ++same;
        if (same == plain.size()) return;
        if (dt == DType::F32) ADD_FAILURE() << what << " differs from plain greedy at step " << same;
        else EXPECT_LE(gaps[same], 2.f) << what << " differs at step " << same << " where the top-2 gap is " << gaps[same]
                                        << " bf16 steps";
      };
      for (int64_t k : {2, 4, 8}) {
        SpeculativeOptions lookup;
        lookup.lookup = 3;
        lookup.num_draft = k;
        check(run(m, prompt, 64, kGreedy, 0, lookup), "lookup k " + std::to_string(k));
        SpeculativeOptions with_draft;
        with_draft.draft = &draft;
        with_draft.num_draft = k;
        check(run(m, prompt, 64, kGreedy, 0, with_draft), "draft k " + std::to_string(k));
      }
    }
  }
}

// The upper 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi2_999(double df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

using Counts = std::map<std::vector<int64_t>, int>;

// Two-sample chi-square over the cells either sample reached: sum (a - b)^2 / (a + b) for equal sizes, and the
// 0.999 quantile of its distribution when both samples come from one distribution.
std::pair<double, double> chi_square(const Counts& a, const Counts& b) {
  std::map<std::vector<int64_t>, std::pair<int, int>> cells;
  for (const auto& [k, v] : a) cells[k].first += v;
  for (const auto& [k, v] : b) cells[k].second += v;
  // Cells with fewer than 10 draws in both samples together are pooled into one.
  double stat = 0;
  int pooled_a = 0, pooled_b = 0, used = 0;
  for (const auto& [k, ab] : cells) {
    if (ab.first + ab.second < 10) {
      pooled_a += ab.first, pooled_b += ab.second;
      continue;
    }
    stat += std::pow(ab.first - ab.second, 2.0) / (ab.first + ab.second);
    ++used;
  }
  if (pooled_a + pooled_b > 0) {
    stat += std::pow(pooled_a - pooled_b, 2.0) / (pooled_a + pooled_b);
    ++used;
  }
  EXPECT_GE(used, 4) << "too few cells for the test to say anything";
  return {stat, chi2_999(used - 1)};
}

void expect_same_distribution(const Counts& a, const Counts& b) {
  const auto [stat, limit] = chi_square(a, b);
  EXPECT_LT(stat, limit);
}

// Sampled speculative decoding draws from the model's distribution: the frequencies of the tokens it makes
// after the first (the verify steps' work) match plain sampling's. The model is qwen3-tiny's shape with random
// weights whose output layer is scaled up, so that its distributions are peaked like a trained model's (the
// reference checkpoints' are nearly uniform, which would leave the acceptance rule little to do); the draft
// model is the same with that layer scaled less (a flatter q: its drafts are mostly kept, some refused). The
// test's power: plain sampling at temperature 0.8 fails it against 1.0.
TEST(SpeculativeSampling, KeepsTheModelsDistribution) {
  const ModelConfig c = load_config(dir_of("qwen3-tiny"));
  ModelOptions o;
  o.max_context = 64;
  ModelWeights w = random_weights(c, kCPU, DType::F32, 5);
  ModelWeights wd = w;
  wd.lm_head.weight = w.lm_head.weight * 5.0;
  w.lm_head.weight = w.lm_head.weight * 8.0;
  Model m(c, std::move(w), o), draft(c, std::move(wd), o);
  // The prompt is the model's own sampled continuation of a start: the next tokens often follow an earlier
  // occurrence, so lookup's drafts are likely without being certain.
  const SamplingParams params{1.0, 4, 1.0, 0.0};
  std::vector<int64_t> prompt{10, 20, 30, 40};
  const std::vector<int64_t> cont = run(m, prompt, 20, params, 7);
  prompt.insert(prompt.end(), cont.begin(), cont.end());
  // Under the sanitizers (ten times slower) a few draws check the path's memory safety; the statistics are the
  // normal build's.
  const int draws = kSanitized ? 40 : 1200;
  auto tail = [](const std::vector<int64_t>& t) { return std::vector<int64_t>(t.begin() + 1, t.end()); };
  Counts plain, cooler, lookup, drafted;
  GenerateStats sl, sd, st;
  for (int s = 0; s < draws; ++s) {
    ++plain[tail(run(m, prompt, 4, params, 1000 + s))];
    ++cooler[tail(run(m, prompt, 4, SamplingParams{0.8, 4, 1.0, 0.0}, 1000 + s))];
    SpeculativeOptions a;
    a.lookup = 2;
    a.num_draft = 2;
    ++lookup[tail(run(m, prompt, 4, params, 500000 + s, a, &st))];
    sl.drafted += st.drafted, sl.accepted += st.accepted;
    SpeculativeOptions b;
    b.draft = &draft;
    b.num_draft = 2;
    ++drafted[tail(run(m, prompt, 4, params, 900000 + s, b, &st))];
    sd.drafted += st.drafted, sd.accepted += st.accepted;
  }
  if (kSanitized) GTEST_SKIP() << "the statistics need more draws than a sanitizer build runs in time";
  // Both drafters' proposals were kept and refused often enough for the rule to matter.
  EXPECT_GT(sl.accepted, sl.drafted / 10);
  EXPECT_LT(sl.accepted, sl.drafted * 9 / 10);
  EXPECT_GT(sd.accepted, sd.drafted / 2);
  EXPECT_LT(sd.accepted, sd.drafted * 19 / 20);
  const auto [stat, limit] = chi_square(plain, cooler);
  EXPECT_GT(stat, limit) << "the test cannot tell temperature 1.2 from 1.5";
  {
    SCOPED_TRACE("prompt lookup");
    expect_same_distribution(plain, lookup);
  }
  {
    SCOPED_TRACE("draft model");
    expect_same_distribution(plain, drafted);
  }
}

TEST(Speculative, BadOptionsAreRefusedBeforeAnythingRuns) {
  Model m = load("qwen3-tiny", kCPU, DType::F32, 32);
  GenerateOptions g;
  g.max_new_tokens = 4;
  g.speculative.lookup = 2;
  g.speculative.num_draft = 16;
  EXPECT_TRUE(test::throws_error([&] { generate(m, {1, 2}, g); }, {"num_draft must be in [1, 15], got 16"}));
  g.speculative.num_draft = 0;
  EXPECT_TRUE(test::throws_error([&] { generate(m, {1, 2}, g); }, {"num_draft must be in [1, 15], got 0"}));
  g.speculative.num_draft = 4;
  g.speculative.draft = &m;
  EXPECT_TRUE(test::throws_error([&] { generate(m, {1, 2}, g); }, {"not both"}));
  g.speculative.lookup = 0;
  EXPECT_TRUE(test::throws_error([&] { generate(m, {1, 2}, g); }, {"another model"}));
  ModelConfig c = m.config();
  c.vocab_size = 512;
  ModelOptions o;
  o.max_context = 32;
  Model wider(c, random_weights(c, kCPU, DType::F32), o);
  g.speculative.draft = &wider;
  EXPECT_TRUE(test::throws_error([&] { generate(m, {1, 2}, g); }, {"vocabulary (512 tokens) differs"}));
  EXPECT_EQ(m.position(), 0);
}

// Stop ids and a callback that ends generation cut a verify step's tokens where they say.
TEST(Speculative, StopsWhereTheCallbackOrAStopIdSays) {
  Model m = load("qwen3-tiny", kCPU, DType::F32, 128);
  const std::vector<int64_t> prompt{10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10, 20};
  const std::vector<int64_t> plain = run(m, prompt, 40, kGreedy, 0);
  GenerateOptions g;
  g.max_new_tokens = 40;
  g.sampling = kGreedy;
  g.speculative.lookup = 3;
  g.speculative.num_draft = 8;
  g.stop_ids = {plain[20]};
  size_t first = 0;
  while (plain[first] != plain[20]) ++first;
  EXPECT_EQ(generate(m, prompt, g), std::vector<int64_t>(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(first + 1)));
  g.stop_ids.clear();
  int seen = 0;
  g.on_token = [&](int64_t) { return ++seen < 13; };
  EXPECT_EQ(generate(m, prompt, g), std::vector<int64_t>(plain.begin(), plain.begin() + 13));
}

}  // namespace
}  // namespace kiln::llm
