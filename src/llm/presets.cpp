// Presets: the configs of well-known checkpoints with random weights made on the device, so decode speed
// can be measured at real shapes without downloading anything. The weights are random: text generated with
// them is noise.
#include <map>

#include "kiln/error.h"
#include "kiln/llm/model.h"

namespace kiln::llm {

namespace {

// config.json as the model's authors publish it (the fields kiln reads).
const std::map<std::string, std::string>& preset_json() {
  static const std::map<std::string, std::string> m = {
      {"qwen3-0.6b", R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151645})"},
      {"qwen3-8b", R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151645})"},
      {"qwen3-30b-a3b", R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "rms_norm_eps": 1e-6, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": false,
        "bos_token_id": 151643, "eos_token_id": 151645})"},
      {"llama-3-8b", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
        "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001})"},
  };
  return m;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& [k, v] : preset_json()) {
    out.push_back(k);
    out.push_back(k + "-fp8");
  }
  return out;
}

ModelConfig preset_config(const std::string& name) {
  const bool fp8 = name.size() > 4 && name.compare(name.size() - 4, 4, "-fp8") == 0;
  const std::string base = fp8 ? name.substr(0, name.size() - 4) : name;
  const auto it = preset_json().find(base);
  if (it == preset_json().end()) {
    std::string known;
    for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(str("unknown preset \"", name, "\"; known presets: ", known));
  }
  ModelConfig c = parse_config(it->second, "preset " + base);
  if (fp8) c.fp8 = Fp8Config{128, 128, {"lm_head"}};
  return c;
}

namespace {

class RandomWeights {
 public:
  RandomWeights(const ModelConfig& c, Device d, DType dt, uint64_t seed) : c_(c), d_(d), dt_(dt), gen_(seed) {}

  Tensor normal(const Shape& s, double std, double mean = 0.0) {
    Tensor t = empty(s, dt_, d_);
    normal_(t, mean, std, &gen_);
    return t;
  }

  // A linear weight [n, k]: plain, or FP8 with block scales when the config is FP8 and the module converts.
  Linear linear(int64_t n, int64_t k, bool fp8) {
    Linear l;
    if (fp8 && c_.fp8) {
      const int64_t bn = c_.fp8->block_n, bk = c_.fp8->block_k;
      // Values spread over the e4m3 range, scales that bring them back to ~N(0, 0.02).
      Tensor v = empty({n, k}, DType::F32, d_);
      normal_(v, 0.0, 64.0, &gen_);
      Tensor s = empty({(n + bn - 1) / bn, (k + bk - 1) / bk}, DType::F32, d_);
      uniform_(s, 0.02 / 64 * 0.9, 0.02 / 64 * 1.1, &gen_);
      l.fp8 = Fp8Weight{v.to(DType::F8E4M3), s, ScaleRecipe::BlockWise, bn, bk};
    } else {
      l.weight = normal({n, k}, 0.02);
    }
    return l;
  }

  ModelWeights build() {
    const ModelConfig& c = c_;
    const int64_t H = c.hidden_size;
    ModelWeights w;
    w.embed = normal({c.vocab_size, H}, 0.02);
    w.final_norm = normal({H}, 0.05, 1.0);
    if (c.tie_word_embeddings) w.lm_head.weight = w.embed;
    else w.lm_head = linear(c.vocab_size, H, false);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights L;
      L.input_norm = normal({H}, 0.05, 1.0);
      L.post_norm = normal({H}, 0.05, 1.0);
      L.attn.qkv = linear(c.q_size() + 2 * c.kv_size(), H, true);
      L.attn.o = linear(H, c.q_size(), true);
      if (c.qk_norm) {
        L.attn.q_norm = normal({c.head_dim}, 0.05, 1.0);
        L.attn.k_norm = normal({c.head_dim}, 0.05, 1.0);
      }
      if (c.is_moe_layer(i)) {
        MoeWeights m;
        const int64_t E = c.num_experts, I = c.moe_intermediate_size;
        m.router = normal({E, H}, 0.02);
        if (c.fp8) {  // FP8 experts with block scales, as FP8 checkpoints store them
          auto fp8_stack = [&](int64_t rows, int64_t k, Tensor& values, std::optional<Tensor>& scales) {
            const int64_t bn = c.fp8->block_n, bk = c.fp8->block_k;
            Tensor v = empty({E, rows, k}, DType::F32, d_);
            normal_(v, 0.0, 64.0, &gen_);
            values = v.to(DType::F8E4M3);
            scales = empty({E, (rows + bn - 1) / bn, (k + bk - 1) / bk}, DType::F32, d_);
            uniform_(*scales, 0.02 / 64 * 0.9, 0.02 / 64 * 1.1, &gen_);
          };
          fp8_stack(2 * I, H, m.gate_up, m.gate_up_scales);
          fp8_stack(H, I, m.down, m.down_scales);
        } else {
          m.gate_up = normal({E, 2 * I, H}, 0.02);
          m.down = normal({E, H, I}, 0.02);
        }
        L.moe = std::move(m);
      } else {
        L.mlp = MlpWeights{linear(2 * c.intermediate_size, H, true), linear(H, c.intermediate_size, true)};
      }
      w.layers.push_back(std::move(L));
    }
    return w;
  }

 private:
  const ModelConfig& c_;
  Device d_;
  DType dt_;
  Generator gen_;
};

}  // namespace

ModelWeights random_weights(const ModelConfig& config, Device device, DType dtype, uint64_t seed) {
  return RandomWeights(config, device, dtype, seed).build();
}

}  // namespace kiln::llm
