// config.json parsing: real published configs and variants (tests/data/configs, written by
// scripts/make_config_reference.py), RoPE frequencies against transformers' own rotary modules, and
// strictness: every setting kiln does not implement is an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "kiln/llm/config.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

std::string data(const std::string& name) {
  std::ifstream in(std::string(KILN_TEST_DATA_DIR) + "/configs/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json data_json(const std::string& name) { return nlohmann::json::parse(data(name)); }

ModelConfig parse_json(const nlohmann::json& j) { return parse_config(j.dump(), "test config.json"); }

// The error message of parsing `j` (empty when it parses).
std::string error_of(const nlohmann::json& j) {
  try {
    parse_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Qwen3DenseFields) {
  const ModelConfig c = parse_config(data("qwen3-0.6b.json"));
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != 1024 / 16
  EXPECT_EQ(c.q_size(), 2048);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::Default);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.fp8.has_value());
  for (int64_t w : c.sliding_window) EXPECT_EQ(w, 0);  // use_sliding_window false
}

TEST(Config, Qwen3MoeFields) {
  const ModelConfig c = parse_config(data("qwen3-30b-a3b.json"));
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FALSE(c.tie_word_embeddings);
  for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_TRUE(c.is_moe_layer(l)) << l;
}

TEST(Config, MoeLayerChoiceFollowsSparseStepAndMlpOnlyLayers) {
  const ModelConfig c = parse_config(data("qwen3-moe-sparse-step.json"));
  EXPECT_FALSE(c.norm_topk_prob);
  // transformers: sparse when layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0.
  const std::vector<bool> want = {false, true, false, false, false, true};
  for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.is_moe_layer(l), want[static_cast<size_t>(l)]) << l;
}

TEST(Config, LlamaAndMistral) {
  const ModelConfig l = parse_config(data("llama-3.1-8b.json"));
  EXPECT_EQ(l.arch, Arch::Llama);
  EXPECT_FALSE(l.qk_norm);
  EXPECT_EQ(l.head_dim, 128);
  EXPECT_EQ(l.rope.type, RopeConfig::Type::Llama3);
  EXPECT_DOUBLE_EQ(l.rope.factor, 8.0);
  EXPECT_EQ(l.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(l.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  const ModelConfig m = parse_config(data("mistral-7b-v0.3.json"));
  EXPECT_EQ(m.arch, Arch::Llama);
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  for (int64_t w : m.sliding_window) EXPECT_EQ(w, 0);  // sliding_window null
  EXPECT_EQ(parse_config(data("llama-head-dim.json")).head_dim, 96);
}

TEST(Config, Fp8BlockQuantisation) {
  const ModelConfig c = parse_config(data("qwen3-8b-fp8.json"));
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->block_n, 128);
  EXPECT_EQ(c.fp8->block_k, 128);
  EXPECT_EQ(c.fp8->modules_to_not_convert, std::vector<std::string>{"lm_head"});
}

TEST(Config, RopeFrequenciesMatchTransformers) {
  const nlohmann::json ref = data_json("rope_reference.json");
  int checked = 0;
  for (const auto& [name, r] : ref.at("configs").items()) {
    SCOPED_TRACE(name);
    const ModelConfig c = parse_config(data(name + ".json"), name);
    EXPECT_EQ(rope_type_name(c.rope.type), r.at("rope_type").get<std::string>());
    const RopeFrequencies f = rope_frequencies(c);
    const auto want = r.at("inv_freq").get<std::vector<double>>();
    ASSERT_EQ(f.inv_freq.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      // powf rounds to within an ulp or so of torch's pow: 4 f32 ulps of slack.
      EXPECT_NEAR(f.inv_freq[j], want[j], 4.8e-7 * std::fabs(want[j])) << "j = " << j;
    }
    EXPECT_NEAR(f.attention_scaling, r.at("attention_scaling").get<double>(), 1e-6);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(Config, RopeParametersFormAndYarn) {
  const ModelConfig c = parse_config(data("qwen3-rope-parameters.json"));
  EXPECT_DOUBLE_EQ(c.rope.theta, 5e6);
  const ModelConfig y = parse_config(data("qwen3-yarn.json"));
  EXPECT_EQ(y.rope.type, RopeConfig::Type::Yarn);
  EXPECT_DOUBLE_EQ(y.rope.factor, 4.0);
  EXPECT_GT(rope_frequencies(y).attention_scaling, 1.0f);
}

TEST(Config, GenerationConfigOverridesTokenIds) {
  ModelConfig c = parse_config(data("qwen3-0.6b.json"));
  apply_generation_config(c, R"({"bos_token_id": 1, "eos_token_id": [151645, 151643], "do_sample": true,
                                 "temperature": 0.6, "top_k": 20})");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
}

TEST(Config, LoadsFromDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << data("llama-3.1-8b.json");
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 7})";
  const ModelConfig c = load_config(dir.string());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{7});
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(test::throws_error([&] { load_config(dir.string()); }, {"config.json"}));
}

TEST(Config, UnsupportedSettingsAreErrorsNamingTheField) {
  const nlohmann::json base = data_json("qwen3-0.6b.json");
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"architectures", {"GPT2LMHeadModel"}, "GPT2LMHeadModel"},
      {"hidden_act", "gelu", "hidden_act"},
      {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}, "rope_scaling.rope_type"},
      {"rope_scaling", {{"rope_type", "longrope"}}, "longrope"},
      // A negative beta has no YaRN correction range (its inverse frequencies would be NaN; found by fuzzing).
      {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", -16}, {"beta_slow", 2}}, "beta_fast and beta_slow > 0"},
      {"quantization_config", {{"quant_method", "kiln"}, {"format", "q5_k"}}, "quantization_config.format"},
      {"quantization_config", {{"quant_method", "awq"}}, "quant_method"},
      {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}}, "fmt"},
      {"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"weight_block_size", {128, 128}}}, "activation_scheme"},
      {"quantization_config", {{"quant_method", "fp8"}}, "weight_block_size"},
      {"final_logit_softcapping", 30.0, "final_logit_softcapping"},
      {"num_experts", 8, "num_experts"},
      {"layer_types", std::vector<std::string>(28, "chunked_attention"), "layer_types[0]"},
      {"hidden_size", "1024", "hidden_size"},
      {"hidden_size", -5, "hidden_size"},
      {"num_key_value_heads", 3, "multiple"},
      {"rms_norm_eps", 0, "rms_norm_eps"},
      {"partial_rotary_factor", 1.5, "partial_rotary_factor"},
      {"eos_token_id", {1, "x"}, "eos_token_id"},
  };
  for (const Case& k : cases) {
    nlohmann::json j = base;
    j[k.field] = k.value;
    const std::string msg = error_of(j);
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.field << " = " << k.value.dump() << ": '" << msg << "'";
    EXPECT_NE(msg.find("test config.json"), std::string::npos) << msg;
  }
  nlohmann::json missing = base;
  missing.erase("hidden_size");
  EXPECT_NE(error_of(missing).find("\"hidden_size\" is missing"), std::string::npos);
  nlohmann::json moe = data_json("qwen3-30b-a3b.json");
  moe.erase("num_experts_per_tok");
  EXPECT_NE(error_of(moe).find("num_experts_per_tok"), std::string::npos);
}

TEST(Config, HeadDimDefaultsAsTransformers) {
  nlohmann::json q = data_json("qwen3-0.6b.json");
  q.erase("head_dim");
  EXPECT_EQ(parse_json(q).head_dim, 128);  // Qwen3Config: head_dim = 128
  nlohmann::json m = data_json("qwen3-30b-a3b.json");
  m.erase("head_dim");
  EXPECT_EQ(parse_json(m).head_dim, 2048 / 32);  // Qwen3-MoE: hidden_size / heads
}

TEST(Config, HarmlessFieldsAreIgnored) {
  nlohmann::json j = data_json("qwen3-0.6b.json");
  j["some_future_field"] = {{"a", 1}};
  j["attention_dropout"] = 0.1;  // training only
  j["use_cache"] = false;
  EXPECT_EQ(parse_json(j).hidden_size, 1024);
}

TEST(Config, SlidingWindowLayers) {
  nlohmann::json j = data_json("qwen3-0.6b.json");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 20;
  const ModelConfig c = parse_json(j);
  for (int64_t l = 0; l < c.num_layers; ++l) EXPECT_EQ(c.sliding_window[static_cast<size_t>(l)], l >= 20 ? 4096 : 0);
  nlohmann::json m = data_json("mistral-7b-v0.3.json");
  m["sliding_window"] = 4096;
  for (int64_t w : parse_json(m).sliding_window) EXPECT_EQ(w, 4096);
}

TEST(Config, HostileInputIsAnError) {
  EXPECT_TRUE(test::throws_error([] { parse_config("{", "x.json"); }, {"x.json: not valid JSON"}));
  EXPECT_TRUE(test::throws_error([] { parse_config("[1, 2]", "x.json"); }, {"object"}));
  EXPECT_TRUE(test::throws_error([] { parse_config(std::string(100000, '[') + std::string(100000, ']'), "x.json"); },
                                 {"nested deeper"}));
  EXPECT_TRUE(test::throws_error([] { parse_config("\xff\xfe{}", "x.json"); }, {"x.json"}));
  EXPECT_TRUE(test::throws_error([] { parse_config("", "x.json"); }, {"x.json"}));
}

}  // namespace
}  // namespace kiln::llm
