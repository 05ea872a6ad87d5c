// A model's configuration as Hugging Face writes it (config.json, generation_config.json), reduced to the
// fields that change the forward pass of the architectures kiln runs. Parsing is strict: a field that would
// change the computation in a way kiln does not implement is an error naming the field; fields that do not
// affect inference (training-only settings, bookkeeping) are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::llm {

enum class Arch { Qwen3, Qwen3Moe, Llama };
const char* arch_name(Arch a);

// Rotary embedding as transformers' ROPE_INIT_FUNCTIONS define it, from either rope_theta + rope_scaling
// (older files) or rope_parameters (newer transformers).
struct RopeConfig {
  enum class Type { Default, Linear, Llama3, Yarn };
  Type type = Type::Default;
  double theta = 10000.0;
  double factor = 1.0;                       // linear, llama3, yarn
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn (0: max_position_embeddings)
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  std::optional<double> mscale, mscale_all_dim, attention_factor;  // yarn
  bool truncate = true;                      // yarn: round the correction range (transformers' default)
  double partial_rotary_factor = 1.0;
  // Per-frequency divisors applied after the type's rule (GGUF's rope_freqs tensor, which is how llama.cpp's
  // files carry Llama 3's scaling): inv_freq[j] /= freq_factors[j]. Empty: none.
  std::vector<float> freq_factors;
};
const char* rope_type_name(RopeConfig::Type t);

// Weights stored as float8_e4m3fn with one f32 scale per block (weight_scale_inv), as DeepSeek-V3 and the
// Qwen3 FP8 checkpoints do. Activations are quantised on the fly (activation_scheme "dynamic").
struct Fp8Config {
  int64_t block_n = 128, block_k = 128;
  std::vector<std::string> modules_to_not_convert;
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string architecture;  // as written, e.g. "Qwen3ForCausalLM"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // explicit head_dim, else hidden_size / num_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // per-head RMSNorm of q and k before RoPE (Qwen3)
  RopeConfig rope;
  std::string dtype;     // torch_dtype / dtype as written ("bfloat16", ...); empty when absent

  // Sliding-window attention: per layer, the window (0 = full attention).
  std::vector<int64_t> sliding_window;

  // Mixture of experts (Qwen3-MoE). num_experts == 0: dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Layer `layer` uses the sparse MoE block (else the dense MLP of intermediate_size), as transformers
  // decides: not in mlp_only_layers, num_experts > 0 and (layer + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t layer) const;

  std::optional<Fp8Config> fp8;
  // A checkpoint `kiln quantize` wrote (quantization_config {"quant_method": "kiln", "format": ...}): "q8_0" or
  // "q4_0". Its layers' linear weights are stored packed with f16 block scales (docs/quantization.md); "": none.
  std::string block_quant;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;

  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  int64_t rotary_dim() const;
};

// Parses config.json text; `source` names the file in errors. Throws kiln::Error.
ModelConfig parse_config(const std::string& json_text, const std::string& source = "config.json");
// Merges generation_config.json (bos/eos/pad ids; eos may be a list) into `config`.
void apply_generation_config(ModelConfig& config, const std::string& json_text,
                             const std::string& source = "generation_config.json");
// Reads DIR/config.json and, when present, DIR/generation_config.json.
ModelConfig load_config(const std::string& model_dir);

// RoPE frequencies as transformers computes them: inv_freq[j] for j < rotary_dim / 2 (in double, to be
// rounded to f32 by the caller, as transformers computes in f32 from an int64 arange — see config.cpp) and the
// attention scaling applied to cos and sin (YaRN's mscale; 1 otherwise).
struct RopeFrequencies {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
RopeFrequencies rope_frequencies(const ModelConfig& config);

}  // namespace kiln::llm
