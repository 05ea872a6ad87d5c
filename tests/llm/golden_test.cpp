// The engine against transformers on the reference checkpoints (tests/data/models, written by
// scripts/make_reference_models.py): the f32 logits of every prompt position and the greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/io.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/model.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

const std::vector<std::string> kModels = {"qwen3-tiny", "qwen3-tiny-bf16-sharded", "qwen3-moe-tiny",
                                          "qwen3-moe-tiny-step2", "llama-tiny", "qwen3-tiny-fp8"};

std::string dir_of(const std::string& name) { return std::string(KILN_TEST_DATA_DIR) + "/models/" + name; }

struct Reference {
  std::vector<int64_t> prompt, greedy;
  std::vector<double> gaps;  // top-2 logit gap of the reference at each greedy step
  double hf_bf16_error = 0;  // transformers' own bf16 run against the f32 reference (0: not measured)
  Tensor logits;  // [T, V] f32
};

Reference reference(const std::string& name) {
  Reference r;
  std::ifstream in(dir_of(name) + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  r.prompt = j.at("prompt_ids").get<std::vector<int64_t>>();
  r.greedy = j.at("greedy_ids").get<std::vector<int64_t>>();
  r.gaps = j.at("top2_gaps").get<std::vector<double>>();
  if (j.contains("transformers_bf16_rel_error") && !j.at("transformers_bf16_rel_error").is_null())
    r.hf_bf16_error = j.at("transformers_bf16_rel_error").get<double>();
  r.logits = SafetensorsFile::open(dir_of(name) + "/reference.safetensors").get("logits").clone();
  return r;
}

// ||a - b|| / ||b|| over the whole tensor.
double rel_norm_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to(kCPU).to_vector<float>(), y = b.to_vector<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    den += static_cast<double>(y[i]) * y[i];
  }
  return std::sqrt(num / den);
}

std::vector<int64_t> greedy(Model& m, const std::vector<int64_t>& prompt, int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0;
  return generate(m, prompt, o);
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, CpuF32MatchesTransformers) {
  const Reference ref = reference(GetParam());
  ModelOptions o;
  o.max_context = 64;
  Model m = load_model(dir_of(GetParam()), o);
  const Tensor logits = m.prefill(ref.prompt, true);
  ASSERT_EQ(logits.sizes(), ref.logits.sizes());
  EXPECT_LT(rel_norm_error(logits, ref.logits), 1e-4);
  EXPECT_EQ(greedy(m, ref.prompt, static_cast<int64_t>(ref.greedy.size())), ref.greedy);
}

TEST_P(Golden, CudaBf16MatchesTransformers) {
  KILN_REQUIRE_CUDA();
  const Reference ref = reference(GetParam());
  ModelOptions o;
  o.device = Device(DeviceType::CUDA, 0);
  o.max_context = 64;
  Model m = load_model(dir_of(GetParam()), o);
  const Tensor logits = m.prefill(ref.prompt, true);
  // 2e-2 (the bound), or 1.5x what transformers itself reaches in bf16 on this checkpoint where that
  // is more: on the MoE checkpoints transformers' bf16 run is 2.0-2.2e-2 from its f32 reference (routing
  // amplifies bf16 rounding), and kiln's CPU in bf16 measured the same (2.05e-2, 2.12e-2).
  const double tol = std::max(2e-2, 1.5 * ref.hf_bf16_error);
  EXPECT_LT(rel_norm_error(logits, ref.logits), tol) << "transformers bf16: " << ref.hf_bf16_error;
  const auto got = greedy(m, ref.prompt, static_cast<int64_t>(ref.greedy.size()));
  // bf16 may resolve a near-tie differently: the tokens must agree up to the first step where the reference's
  // top-2 gap is below bf16's resolution of these logits (about 0.05 at their magnitude); diverging anywhere
  // else is a real difference. (qwen3-moe-tiny has such a tie at its first step: gap 0.0087.)
  size_t same = 0;
  while (same < got.size() && same < ref.greedy.size() && got[same] == ref.greedy[same]) ++same;
  if (same < ref.greedy.size()) {
    ASSERT_LT(same, ref.gaps.size());
    EXPECT_LT(ref.gaps[same], 0.05) << "greedy tokens diverge at step " << same << " where the reference's top-2 gap is "
                                    << ref.gaps[same] << ": not a near-tie";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::ValuesIn(kModels), [](const auto& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-' || c == '.') c = '_';
  return s;
});

// kiln's perplexity of the reference prompt equals the one transformers' f32 logits give (reference.safetensors).
TEST_P(Golden, PerplexityEqualsTheReferenceLogits) {
  const Reference ref = reference(GetParam());
  ModelOptions o;
  o.max_context = 64;
  o.dtype = DType::F32;
  Model m = load_model(dir_of(GetParam()), o);
  const int64_t T = static_cast<int64_t>(ref.prompt.size());
  const Tensor lp = log_softmax(ref.logits.narrow(0, 0, T - 1).to(DType::F64), -1);
  double nll = 0;
  for (int64_t t = 0; t + 1 < T; ++t) nll -= lp[t][ref.prompt[static_cast<size_t>(t + 1)]].item<double>();
  const Perplexity p = perplexity(m, ref.prompt, T);
  EXPECT_EQ(p.predicted, T - 1);
  EXPECT_NEAR(p.value(), std::exp(nll / double(T - 1)), 1e-4 * std::exp(nll / double(T - 1)));
  // Windows: two halves score T - 2 tokens.
  EXPECT_EQ(perplexity(m, ref.prompt, (T + 1) / 2).predicted, T - 2);
  EXPECT_TRUE(test::throws_error([&] { perplexity(m, ref.prompt, 1); }, {"window must be in [2, 64]"}));
}

// Sequences decoded together (Model::step over several sequences, as kiln serve runs them) give each its
// solo tokens: prompts of different lengths, joining and leaving the batch at different steps; greedy and
// seeded sampling (each sequence with its own generator, as generate() uses it).
class Batched : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Batched, SequencesDecodedTogetherEqualTheirSoloRuns) {
  const auto& [name, cuda] = GetParam();
  if (cuda) KILN_REQUIRE_CUDA();
  ModelOptions o;
  o.max_context = 64;
  o.device = cuda ? cuda_device() : kCPU;
  o.dtype = DType::F32;  // on CUDA too: solo decode (one-row kernels, graphs) and batched products round alike
  Model m = load_model(dir_of(name), o);
  const int64_t V = m.config().vocab_size;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7 % V, 11 % V, 13 % V, 17 % V, 19 % V, 23 % V, 29 % V, 31 % V, 37 % V, 41 % V},
                                                     {5 % V}, {9 % V, 8 % V, 7 % V, 6 % V}};
  const int64_t n = 12;
  for (const double temperature : {0.0, 0.8}) {
    SCOPED_TRACE(temperature);
    const SamplingParams params{temperature, 0, 1.0, 0.0};
    std::vector<std::vector<int64_t>> solo;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateOptions g;
      g.max_new_tokens = n;
      g.sampling = params;
      g.seed = 100 + i;
      solo.push_back(generate(m, prompts[i], g));
    }
    // Sequence i joins after i steps of the others and leaves after n tokens; all four share one paged cache
    // of blocks of 16 positions (their positions cross a block boundary).
    const KVCache cache = m.new_kv_cache(8);
    std::vector<Sequence> seqs;
    for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(cache.new_sequence(64));
    std::vector<Generator> gens;
    for (size_t i = 0; i < prompts.size(); ++i) gens.emplace_back(100 + i);
    std::vector<std::vector<int64_t>> got(prompts.size());
    for (int64_t round = 0; round < n + static_cast<int64_t>(prompts.size()); ++round) {
      if (round < static_cast<int64_t>(prompts.size())) {
        const size_t i = static_cast<size_t>(round);
        got[i].push_back(m.sample_first(m.prefill(seqs[i], prompts[i]), params, &gens[i]));
      }
      std::vector<Sequence*> active;
      std::vector<int64_t> tokens;
      std::vector<size_t> which;
      for (size_t i = 0; i < prompts.size(); ++i)
        if (!got[i].empty() && static_cast<int64_t>(got[i].size()) < n) {
          active.push_back(&seqs[i]);
          tokens.push_back(got[i].back());
          which.push_back(i);
        }
      if (active.empty()) continue;
      const Tensor logits = m.step(active, tokens);
      ASSERT_EQ(logits.sizes(), (Shape{static_cast<int64_t>(active.size()), V}));
      for (size_t r = 0; r < which.size(); ++r)
        got[which[r]].push_back(sample(logits.select(0, static_cast<int64_t>(r)), params, &gens[which[r]]).item<int64_t>());
    }
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], solo[i]) << "sequence " << i;
  }
  // On CUDA the batched steps ran as captured graphs: 1, 2 and 3 sequences (padded to 4) and 4.
  if (cuda) EXPECT_EQ(m.step_graph_sizes(), (std::vector<int64_t>{1, 2, 4}));
  else EXPECT_TRUE(m.step_graph_sizes().empty());
  // A sequence never holds more than its context; a token outside the vocabulary is refused.
  Sequence small = m.new_sequence(4);
  EXPECT_TRUE(test::throws_error([&] { m.prefill(small, {1, 2, 3, 4, 5}); }, {"context of 4"}));
  m.prefill(small, {1, 2, 3, 4});
  Sequence* one = &small;
  EXPECT_TRUE(test::throws_error([&] { m.step({one}, {1}); }, {"is full"}));
  Sequence other = m.new_sequence(8);
  EXPECT_TRUE(test::throws_error([&] { m.step({&other}, {V}); }, {"outside the vocabulary"}));
  EXPECT_TRUE(test::throws_error([&] { m.step({&other, &other}, {1, 2}); }, {"is also sequence 0"}));
  EXPECT_TRUE(test::throws_error([&] { m.step({&small, &other}, {1, 2}); }, {"is full"}));
  Sequence third = m.new_sequence(8);
  m.prefill(third, {1});
  EXPECT_TRUE(test::throws_error([&] { m.step({&other, &third}, {1, 2}); }, {"another cache"}));
}

// The prefix cache: a prompt that begins with the blocks an earlier sequence filled takes them instead of
// running them, and decodes exactly as a solo run of the whole prompt; blocks go back when sequences end, and
// a full cache refuses a new block with a clear error, losing nothing.
class PagedCache : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(PagedCache, ReusedPrefixBlocksDecodeAsTheWholePrompt) {
  const auto& [name, cuda] = GetParam();
  if (cuda) KILN_REQUIRE_CUDA();
  ModelOptions o;
  o.max_context = 128;
  o.device = cuda ? cuda_device() : kCPU;
  o.dtype = DType::F32;
  Model m = load_model(dir_of(name), o);
  const int64_t V = m.config().vocab_size;
  std::vector<int64_t> system;
  for (int64_t i = 0; i < 40; ++i) system.push_back((7 * i + 3) % V);
  const int64_t n = 8;
  const SamplingParams greedy{0.0, 0, 1.0, 0.0};
  GenerateOptions g;
  g.max_new_tokens = n;
  g.sampling = greedy;
  const KVCache cache = m.new_kv_cache(12);
  EXPECT_EQ(cache.block_size(), 16);
  EXPECT_EQ(cache.free_blocks(), 12);
  // Greedy decoding of `prompt` in a sequence of the cache, after taking what the cache holds of it.
  auto run = [&](const std::vector<int64_t>& prompt, int64_t* reused) {
    Sequence seq = cache.new_sequence(128);
    *reused = cache.reuse_prefix(seq, prompt);
    const std::vector<int64_t> rest(prompt.begin() + *reused, prompt.end());
    std::vector<int64_t> out{m.sample_first(m.prefill(seq, rest), greedy, nullptr)};
    while (static_cast<int64_t>(out.size()) < n) {
      Sequence* one = &seq;
      out.push_back(sample(m.step({one}, {out.back()}).select(0, 0), greedy, nullptr).item<int64_t>());
    }
    return out;
  };
  int64_t reused = -1;
  EXPECT_EQ(run(system, &reused), generate(m, system, g));
  EXPECT_EQ(reused, 0);
  // Its 40 prompt and 7 decoded tokens filled two blocks, which stay cached after the sequence ends.
  EXPECT_EQ(cache.free_blocks(), 12);
  EXPECT_EQ(cache.cached_blocks(), 2);
  for (const std::vector<int64_t>& tail : {std::vector<int64_t>{5, 6, 7}, std::vector<int64_t>{9}}) {
    std::vector<int64_t> prompt = system;
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    EXPECT_EQ(run(prompt, &reused), generate(m, prompt, g));
    EXPECT_EQ(reused, 32);
  }
  // A prompt that differs inside the first block reuses nothing; one that is exactly two blocks long leaves
  // its last token to run.
  std::vector<int64_t> other = system;
  other[3] = (other[3] + 1) % V;
  EXPECT_EQ(run(other, &reused), generate(m, other, g));
  EXPECT_EQ(reused, 0);
  const std::vector<int64_t> two(system.begin(), system.begin() + 32);
  EXPECT_EQ(run(two, &reused), generate(m, two, g));
  EXPECT_EQ(reused, 16);
  // Sequences hold blocks until they end; a full cache refuses the next block and the sequence is unchanged.
  {
    std::vector<Sequence> held;
    for (int i = 0; i < 11; ++i) {
      held.push_back(cache.new_sequence(128));
      m.prefill(held.back(), {1 + i});
    }
    EXPECT_EQ(cache.free_blocks(), 1);
    Sequence last = cache.new_sequence(128);
    std::vector<int64_t> long_prompt(17, 2);
    EXPECT_TRUE(test::throws_error([&] { m.prefill(last, long_prompt); }, {"all 12 blocks", "held by sequences"}));
    EXPECT_EQ(last.position, 0);
  }
  EXPECT_EQ(cache.free_blocks(), 12);
  // After the evictions the full cache made, the first blocks were handed out again: nothing stale is reused.
  EXPECT_EQ(run(system, &reused), generate(m, system, g));
  cache.clear_prefixes();
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_TRUE(test::throws_error([&] { m.new_kv_cache(4, 24); }, {"power of two"}));
}

INSTANTIATE_TEST_SUITE_P(Models, PagedCache,
                         ::testing::Combine(::testing::Values("qwen3-tiny", "llama-tiny"), ::testing::Bool()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + (std::get<1>(info.param) ? "_cuda" : "_cpu");
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

INSTANTIATE_TEST_SUITE_P(Models, Batched,
                         ::testing::Combine(::testing::Values("qwen3-tiny", "qwen3-moe-tiny", "llama-tiny"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + (std::get<1>(info.param) ? "_cuda" : "_cpu");
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace kiln::llm
