// Models from GGUF files (llama.cpp's format): the config from the file's metadata, the weights under their
// Hugging Face names, dequantised to f32 as they are read (the loader then converts them to the model's dtype).
// The tensor names and the row order of Llama's q and k weights follow llama.cpp's converter
// (convert_hf_to_gguf.py), which this undoes.
#include "kiln/llm/gguf_model.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/ops.h"

namespace kiln::llm {

namespace {

using json = nlohmann::json;

const GgufValue* find(const GgufFile& f, const std::string& key) {
  const auto it = f.metadata().find(key);
  return it == f.metadata().end() ? nullptr : &it->second;
}

int64_t get_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = find(f, key);
  KILN_CHECK(v != nullptr, f.path(), ": the metadata has no ", key);
  return v->as_int();
}

std::optional<int64_t> opt_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = find(f, key);
  return v ? std::optional<int64_t>(v->as_int()) : std::nullopt;
}

std::optional<double> opt_double(const GgufFile& f, const std::string& key) {
  const GgufValue* v = find(f, key);
  return v ? std::optional<double>(v->as_double()) : std::nullopt;
}

std::string arch_of(const GgufFile& f) {
  const GgufValue* a = find(f, "general.architecture");
  KILN_CHECK(a && a->type == GgufValue::Type::String, f.path(), ": general.architecture is absent or not a string");
  return a->as_string();
}

// HF name -> GGUF name for one layer's tensors (suffix after "model.layers.N.").
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
};

// An expert's weight in GGUF is a slice of one stacked tensor [E, rows, cols].
const std::pair<const char*, const char*> kExpertNames[] = {
    {"gate_proj.weight", "ffn_gate_exps.weight"},
    {"up_proj.weight", "ffn_up_exps.weight"},
    {"down_proj.weight", "ffn_down_exps.weight"},
};

class GgufWeightSource : public WeightSource {
 public:
  GgufWeightSource(GgufFile f, const ModelConfig& c) : f_(std::move(f)), c_(c) {
    add("model.embed_tokens.weight", "token_embd.weight");
    add("model.norm.weight", "output_norm.weight");
    add("lm_head.weight", "output.weight");
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string hf = "model.layers." + std::to_string(i) + ".", gg = "blk." + std::to_string(i) + ".";
      for (const auto& [h, g] : kLayerNames) add(hf + h, gg + g);
      for (const auto& [h, g] : kExpertNames)
        if (f_.contains(gg + g))
          for (int64_t e = 0; e < c.num_experts; ++e)
            map_.emplace(hf + "mlp.experts." + std::to_string(e) + "." + h, Entry{gg + g, e});
    }
    // Tensors of the file that map to no name: reported by the loader as unexpected, by their GGUF names.
    std::set<std::string> used;
    for (const auto& [h, e] : map_) used.insert(e.gguf);
    used.insert("rope_freqs.weight");  // part of the config (gguf_model_config)
    for (const GgufTensorInfo& t : f_.header().tensors)
      if (!used.count(t.name)) map_.emplace(t.name, Entry{t.name, -1});
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [h, e] : map_) out.push_back(h);
    return out;
  }
  bool contains(const std::string& name) const override { return map_.count(name) != 0; }
  std::string describe() const override { return f_.path(); }

  Tensor get(const std::string& name) const override {
    const auto it = map_.find(name);
    KILN_CHECK(it != map_.end(), f_.path(), ": no tensor for \"", name, "\"");
    Tensor t = f_.get(it->second.gguf, DType::F32);
    if (it->second.expert >= 0) {
      KILN_CHECK(t.dim() == 3 && t.size(0) == c_.num_experts, f_.path(), ": ", it->second.gguf, " is ", t.meta(),
                 "; expected [", c_.num_experts, ", rows, cols]");
      t = t.select(0, it->second.expert).contiguous();
    }
    // llama.cpp's converter reorders Llama's q and k rows per head (its RoPE pairs adjacent dims): back to the
    // Hugging Face order.
    if (c_.arch == Arch::Llama && t.dim() >= 1) {
      const bool q = name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.q_proj.bias");
      const bool k = name.ends_with("self_attn.k_proj.weight") || name.ends_with("self_attn.k_proj.bias");
      if (q || k) t = unpermute(t, q ? c_.num_heads : c_.num_kv_heads, name);
    }
    return t;
  }

  // get()'s shape (an expert's slice of its stacked tensor) and dtype (f32), from the header alone.
  Meta meta(const std::string& name) const override {
    const auto it = map_.find(name);
    KILN_CHECK(it != map_.end(), f_.path(), ": no tensor for \"", name, "\"");
    const GgufTensorInfo& info = f_.info(it->second.gguf);
    if (it->second.expert < 0) return {info.shape, DType::F32, static_cast<int64_t>(info.nbytes)};
    KILN_CHECK(info.shape.size() == 3 && info.shape[0] == c_.num_experts, f_.path(), ": ", it->second.gguf, " is ",
               shape_str(info.shape), "; expected [", c_.num_experts, ", rows, cols]");
    return {Shape(info.shape.begin() + 1, info.shape.end()), DType::F32,
            static_cast<int64_t>(info.nbytes) / c_.num_experts};
  }

  std::optional<BlockTensor> blocks(const std::string& name) const override {
    const auto it = map_.find(name);
    if (it == map_.end() || it->second.expert >= 0) return std::nullopt;
    const GgufTensorInfo& info = f_.info(it->second.gguf);
    constexpr uint32_t kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12;
    const char* format = info.type == kQ8_0 ? "q8_0" : info.type == kQ4_0 ? "q4_0" : info.type == kQ4_K ? "q4_k" : nullptr;
    if (!format || info.shape.size() != 2) return std::nullopt;
    Tensor t = f_.raw(it->second.gguf);
    // Llama's q and k rows back to the Hugging Face order: whole rows of blocks move.
    if (c_.arch == Arch::Llama) {
      const bool q = name.ends_with("self_attn.q_proj.weight"), k = name.ends_with("self_attn.k_proj.weight");
      if (q || k) t = unpermute(t, q ? c_.num_heads : c_.num_kv_heads, name);
    }
    return BlockTensor{format, t};
  }

 private:
  struct Entry {
    std::string gguf;
    int64_t expert = -1;
  };

  void add(const std::string& hf, const std::string& gguf) {
    if (f_.contains(gguf)) map_.emplace(hf, Entry{gguf, -1});
  }

  // The inverse of convert_hf_to_gguf's permute: rows [heads, half, 2] -> [heads, 2, half].
  Tensor unpermute(const Tensor& t, int64_t heads, const std::string& name) const {
    const int64_t rows = t.size(0);
    KILN_CHECK(heads > 0 && rows % (2 * heads) == 0, f_.path(), ": ", name, " has ", rows, " rows, not a multiple of 2 x ",
               heads, " heads");
    Shape split = {heads, rows / heads / 2, 2};
    for (int64_t d = 1; d < t.dim(); ++d) split.push_back(t.size(d));
    return t.reshape(split).transpose(1, 2).contiguous().reshape(t.sizes());
  }

  GgufFile f_;
  ModelConfig c_;
  std::map<std::string, Entry> map_;
};

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string arch = arch_of(f);
  std::string architecture;
  if (arch == "llama") architecture = "LlamaForCausalLM";
  else if (arch == "qwen3") architecture = "Qwen3ForCausalLM";
  else if (arch == "qwen3moe") architecture = "Qwen3MoeForCausalLM";
  else
    throw Error(str(f.path(), ": the architecture \"", arch, "\" is not one kiln runs from GGUF (llama, qwen3, qwen3moe)"));
  const std::string p = arch + ".";
  json c;
  c["architectures"] = json::array({architecture});
  c["model_type"] = arch == "qwen3moe" ? "qwen3_moe" : arch;
  c["hidden_size"] = get_int(f, p + "embedding_length");
  c["num_hidden_layers"] = get_int(f, p + "block_count");
  c["num_attention_heads"] = get_int(f, p + "attention.head_count");
  c["num_key_value_heads"] = opt_int(f, p + "attention.head_count_kv").value_or(c["num_attention_heads"].get<int64_t>());
  if (auto hd = opt_int(f, p + "attention.key_length")) c["head_dim"] = *hd;
  c["max_position_embeddings"] = opt_int(f, p + "context_length").value_or(4096);
  c["rms_norm_eps"] = opt_double(f, p + "attention.layer_norm_rms_epsilon").value_or(1e-6);
  c["rope_theta"] = opt_double(f, p + "rope.freq_base").value_or(10000.0);
  if (const GgufValue* st = find(f, p + "rope.scaling.type"); st && st->type == GgufValue::Type::String &&
                                                               st->as_string() != "none") {
    const std::string type = st->as_string();
    KILN_CHECK(type == "linear" || type == "yarn", f.path(), ": RoPE scaling \"", type, "\" from GGUF is not supported");
    json rs = {{"rope_type", type}, {"factor", opt_double(f, p + "rope.scaling.factor").value_or(1.0)}};
    if (auto o = opt_int(f, p + "rope.scaling.original_context_length")) rs["original_max_position_embeddings"] = *o;
    c["rope_scaling"] = rs;
  }
  const int64_t ff = opt_int(f, p + "feed_forward_length").value_or(0);
  c["intermediate_size"] = ff;
  if (arch == "qwen3moe") {
    c["num_experts"] = get_int(f, p + "expert_count");
    c["num_experts_per_tok"] = get_int(f, p + "expert_used_count");
    c["moe_intermediate_size"] = get_int(f, p + "expert_feed_forward_length");
    c["decoder_sparse_step"] = 1;
    const GgufValue* norm = find(f, p + "expert_weights_norm");
    c["norm_topk_prob"] = norm && norm->type == GgufValue::Type::Bool ? std::get<bool>(norm->value) : true;
    // Layers without a router are dense (transformers' mlp_only_layers; GGUF has no key for it).
    json dense = json::array();
    for (int64_t i = 0; i < c["num_hidden_layers"].get<int64_t>(); ++i)
      if (!f.contains("blk." + std::to_string(i) + ".ffn_gate_inp.weight")) dense.push_back(i);
    c["mlp_only_layers"] = dense;
    if (ff == 0) c["intermediate_size"] = c["moe_intermediate_size"];
  }
  // The vocabulary: the embedding's rows.
  KILN_CHECK(f.contains("token_embd.weight"), f.path(), ": no token_embd.weight tensor");
  const GgufTensorInfo& emb = f.info("token_embd.weight");
  KILN_CHECK(emb.shape.size() == 2, f.path(), ": token_embd.weight must be 2-d");
  c["vocab_size"] = emb.shape[0];
  c["tie_word_embeddings"] = !f.contains("output.weight");
  c["attention_bias"] = f.contains("blk.0.attn_q.bias");
  if (auto bos = opt_int(f, "tokenizer.ggml.bos_token_id")) c["bos_token_id"] = *bos;
  json eos = json::array();
  if (auto e = opt_int(f, "tokenizer.ggml.eos_token_id")) eos.push_back(*e);
  if (auto e = opt_int(f, "tokenizer.ggml.eot_token_id"); e && (eos.empty() || eos[0] != *e)) eos.push_back(*e);
  if (!eos.empty()) c["eos_token_id"] = eos;
  ModelConfig config = parse_config(c.dump(), f.path() + " (metadata)");
  // rope_freqs: per-frequency divisors (how llama.cpp's converter stores Llama 3's RoPE scaling).
  if (f.contains("rope_freqs.weight")) {
    const Tensor r = f.get("rope_freqs.weight", DType::F32).contiguous();
    KILN_CHECK(r.dim() == 1 && r.numel() == config.rotary_dim() / 2, f.path(), ": rope_freqs.weight is ", r.meta(),
               "; expected [", config.rotary_dim() / 2, "]");
    const float* p = r.data<float>();
    for (int64_t j = 0; j < r.numel(); ++j) {
      KILN_CHECK(std::isfinite(p[j]) && p[j] > 0, f.path(), ": rope_freqs.weight[", j, "] = ", p[j], " is not a positive factor");
      config.rope.freq_factors.push_back(p[j]);
    }
  }
  return config;
}

std::unique_ptr<WeightSource> gguf_weight_source(GgufFile f, const ModelConfig& config) {
  return std::make_unique<GgufWeightSource>(std::move(f), config);
}

int64_t gguf_weight_elements(const GgufFile& f) {
  int64_t n = 0;
  for (const GgufTensorInfo& t : f.header().tensors) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

}  // namespace kiln::llm
