// config.json: the supported architectures as Hugging Face writes them, and refusals that name the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kiln/io.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
using test::throws_error;

// Qwen3-0.6B's config.json.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Qwen3-30B-A3B's config.json (with an FP8 quantization_config as in the -FP8 release).
const char* kQwen3Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}})";

// Llama-3.1-8B's config.json.
const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})";

// Mistral-7B-v0.1's config.json.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

ModelConfig parse(const std::string& text, std::optional<std::string> gen = std::nullopt) {
  return parse_model_config(text, "config.json", gen ? std::optional<std::string_view>(*gen) : std::nullopt);
}
// kQwen3 with one field set (or removed, when `value` is null... use erase for that).
std::string with(const char* base, const std::string& key, const json& value) {
  json j = json::parse(base);
  j[key] = value;
  return j.dump();
}
std::string without(const char* base, const std::string& key) {
  json j = json::parse(base);
  j.erase(key);
  return j.dump();
}

TEST(ModelConfig, Qwen3) {
  const ModelConfig c = parse(kQwen3);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != hidden / heads = 64
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.rope.type, RopeType::Default);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.sliding_layers, std::vector<bool>(28, false));
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{151643}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(c.dtype, DType::BF16);
  EXPECT_FALSE(c.fp8.has_value());
  EXPECT_FALSE(c.is_moe_layer(0));
  // Qwen3Config's head_dim default is 128, not hidden_size / heads.
  EXPECT_EQ(parse(without(kQwen3, "head_dim")).head_dim, 128);
}

TEST(ModelConfig, Qwen3MoeWithFp8) {
  const ModelConfig c = parse(kQwen3Moe);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) EXPECT_TRUE(c.is_moe_layer(l));
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->block_rows, 128);
  EXPECT_EQ(c.fp8->block_cols, 128);
  // mlp_only_layers and decoder_sparse_step pick the dense layers, as transformers does.
  json j = json::parse(kQwen3Moe);
  j["mlp_only_layers"] = {0, 5};
  j["decoder_sparse_step"] = 2;
  j["norm_topk_prob"] = false;
  j["num_experts"] = nullptr;
  j["num_local_experts"] = 64;
  const ModelConfig d = parse(j.dump());
  EXPECT_FALSE(d.norm_topk_prob);
  EXPECT_EQ(d.num_experts, 64);
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < 8; ++l)
    if (d.is_moe_layer(l)) moe.push_back(l);
  EXPECT_EQ(moe, (std::vector<int64_t>{1, 3, 7}));
  EXPECT_TRUE(throws_error([&] { d.is_moe_layer(48); }, {"layer 48"}));
}

TEST(ModelConfig, LlamaWithLlama3Rope) {
  const ModelConfig c = parse(kLlama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope.type, RopeType::Llama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  // Llama reads no sliding-window settings.
  EXPECT_FALSE(parse(with(kLlama, "sliding_window", 4096)).sliding_window.has_value());
}

TEST(ModelConfig, MistralSlidingWindowOnEveryLayer) {
  const ModelConfig c = parse(kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers, std::vector<bool>(32, true));
  EXPECT_EQ(c.head_dim, 128);
  const ModelConfig d = parse(with(kMistral, "sliding_window", nullptr));
  EXPECT_FALSE(d.sliding_window.has_value());
  EXPECT_EQ(d.sliding_layers, std::vector<bool>(32, false));
}

TEST(ModelConfig, Qwen3SlidingWindowLayers) {
  json j = json::parse(kQwen3);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 20;
  const ModelConfig c = parse(j.dump());
  EXPECT_EQ(c.sliding_window, 4096);
  for (int64_t l = 0; l < 28; ++l) EXPECT_EQ(c.is_sliding_layer(l), l >= 20) << l;
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(throws_error([&] { parse(j.dump()); }, {"\"sliding_window\"", "required"}));
  // Explicit layer_types (newer transformers) win.
  json k = json::parse(kQwen3);
  k["num_hidden_layers"] = 3;
  k["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  k["sliding_window"] = 128;
  EXPECT_EQ(parse(k.dump()).sliding_layers, (std::vector<bool>{false, true, false}));
  k["layer_types"] = {"full_attention", "chunked_attention", "full_attention"};
  EXPECT_TRUE(throws_error([&] { parse(k.dump()); }, {"layer_types", "chunked_attention"}));
  k["layer_types"] = {"full_attention"};
  EXPECT_TRUE(throws_error([&] { parse(k.dump()); }, {"layer_types", "3 layers"}));
}

TEST(ModelConfig, RopeForms) {
  // yarn in rope_scaling, original_max_position_embeddings defaulting to max_position_embeddings.
  const ModelConfig y = parse(with(kQwen3, "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}));
  EXPECT_EQ(y.rope.type, RopeType::Yarn);
  EXPECT_DOUBLE_EQ(y.rope.factor, 4.0);
  EXPECT_EQ(y.rope.original_max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(y.rope.beta_fast, 32.0);
  EXPECT_FALSE(y.rope.attention_factor.has_value());
  // The legacy "type" key, linear scaling.
  const ModelConfig l = parse(with(kLlama, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}));
  EXPECT_EQ(l.rope.type, RopeType::Linear);
  EXPECT_DOUBLE_EQ(l.rope.factor, 2.0);
  // rope_parameters (transformers 5) carries rope_theta itself.
  json j = json::parse(without(kLlama, "rope_scaling"));
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  const ModelConfig p = parse(j.dump());
  EXPECT_EQ(p.rope.type, RopeType::Llama3);
  EXPECT_DOUBLE_EQ(p.rope.theta, 500000.0);
  EXPECT_EQ(p.rope.original_max_position_embeddings, 8192);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_DOUBLE_EQ(parse(j.dump()).rope.theta, 1e6);
  j["rope_theta"] = 10000.0;
  EXPECT_TRUE(throws_error([&] { parse(j.dump()); }, {"rope_parameters.rope_theta", "contradicts"}));
  // Refusals.
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}})); },
                           {"config.json", "rope_scaling.rope_type", "'dynamic'"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "rope_scaling", {{"rope_type", "longrope"}})); },
                           {"'longrope'", "not supported"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "rope_scaling", {{"rope_type", "linear"}})); },
                           {"rope_scaling.factor", "required"}));
  EXPECT_TRUE(throws_error([&] {
    parse(with(kQwen3, "rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}, {"mrope_section", {1, 2}}}));
  }, {"rope_scaling.mrope_section"}));
  EXPECT_TRUE(throws_error([&] {
    parse(with(kLlama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}}));
  }, {"rope_scaling.high_freq_factor", "required"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "partial_rotary_factor", 0.5)); }, {"partial_rotary_factor"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "rope_theta", "big")); }, {"\"rope_theta\"", "number"}));
}

TEST(ModelConfig, GenerationConfigTakesPrecedenceForTokenIds) {
  const ModelConfig c = parse(kQwen3, std::string(R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643],
                                                     "pad_token_id": 151643, "temperature": 0.6, "top_k": 20})"));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(c.pad_token_id, 151643);
  EXPECT_TRUE(throws_error([&] { parse(kQwen3, std::string(R"({"eos_token_id": -1})")); },
                           {"generation_config.json", "eos_token_id"}));
  EXPECT_TRUE(throws_error([&] { parse(kQwen3, std::string(R"({"eos_token_id": 1, "eos_token_id": 2})")); },
                           {"generation_config.json", "duplicate key"}));
}

TEST(ModelConfig, Fp8Refusals) {
  auto q = [](const json& qc) { return with(kQwen3Moe, "quantization_config", qc); };
  const json good = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                     {"weight_block_size", {128, 128}}};
  EXPECT_TRUE(parse(q(good)).fp8.has_value());
  json bad = good;
  bad["quant_method"] = "awq";
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"quantization_config.quant_method", "'awq'"}));
  bad = good;
  bad["fmt"] = "e5m2";
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"quantization_config.fmt", "e5m2"}));
  bad = good;
  bad["activation_scheme"] = "static";
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"quantization_config.activation_scheme"}));
  bad = good;
  bad.erase("weight_block_size");
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"weight_block_size", "per-tensor"}));
  bad = good;
  bad["weight_block_size"] = {128, 0};
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"weight_block_size", "two positive"}));
  bad = good;
  bad["ignored_layers"] = {"lm_head"};
  EXPECT_TRUE(throws_error([&] { parse(q(bad)); }, {"quantization_config.ignored_layers"}));
}

TEST(ModelConfig, RefusalsNameTheField) {
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "architectures", {"GemmaForCausalLM"})); },
                           {"config.json", "\"architectures\"", "GemmaForCausalLM"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "architectures", {"A", "B"})); }, {"architectures"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "model_type", "llama")); }, {"model_type", "qwen3"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "hidden_act", "gelu")); }, {"hidden_act", "gelu"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kLlama, "mlp_bias", true)); }, {"mlp_bias"}));
  EXPECT_TRUE(throws_error([&] { parse(without(kQwen3, "hidden_size")); }, {"\"hidden_size\"", "required"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "hidden_size", 1024.5)); }, {"\"hidden_size\"", "integer"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "num_hidden_layers", 0)); }, {"num_hidden_layers", "positive"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "num_key_value_heads", 3)); }, {"num_key_value_heads", "divide"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "tie_word_embeddings", 1)); }, {"tie_word_embeddings"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "rms_norm_eps", -1)); }, {"rms_norm_eps"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "num_experts", 8)); }, {"num_experts", "no experts"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3, "torch_dtype", "float64")); }, {"torch_dtype", "float64"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3Moe, "num_experts_per_tok", 200)); }, {"num_experts_per_tok"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3Moe, "mlp_only_layers", {48})); }, {"mlp_only_layers", "48"}));
  EXPECT_TRUE(throws_error([&] { parse(with(kQwen3Moe, "shared_expert_intermediate_size", 5632)); },
                           {"shared_expert_intermediate_size"}));
  EXPECT_TRUE(throws_error([&] { parse(without(kLlama, "intermediate_size")); }, {"intermediate_size"}));
  // A MoE model whose layers are all sparse needs no intermediate_size.
  EXPECT_EQ(parse(without(kQwen3Moe, "intermediate_size")).intermediate_size, 0);
  // Strict JSON: duplicates, depth, not an object.
  EXPECT_TRUE(throws_error([&] { parse(R"({"hidden_size": 1, "hidden_size": 2})"); }, {"duplicate key \"hidden_size\""}));
  EXPECT_TRUE(throws_error([&] { parse(std::string(100000, '[')); }, {"deeper than"}));
  EXPECT_TRUE(throws_error([&] { parse("[]"); }, {"not a JSON object"}));
  // Unknown harmless fields are ignored.
  EXPECT_EQ(parse(with(kQwen3, "some_future_training_knob", {{"a", 1}})).hidden_size, 1024);
}

}  // namespace
}  // namespace kiln
