// Models from GGUF files (llama.cpp's format): the config from the file's metadata, the weights under their
// Hugging Face names, dequantised to f32 as they are read (the loader then converts them to the model's dtype).
// The tensor names and the row order of Llama's q and k weights follow llama.cpp's converter
// (convert_hf_to_gguf.py), which this undoes.
#include "kiln/llm/gguf_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/io.h"
#include "kiln/nn.h"
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

// Llama's q/k rows between Hugging Face's order and llama.cpp's (its RoPE pairs adjacent dims), per head:
// [heads, 2, half] -> [heads, half, 2] (to_gguf, convert_hf_to_gguf's permute) or back. `what` names the tensor
// in errors.
Tensor llama_head_rows(const Tensor& t, int64_t heads, bool to_gguf, const std::string& what) {
  const int64_t rows = t.size(0);
  KILN_CHECK(heads > 0 && rows % (2 * heads) == 0, what, " has ", rows, " rows, not a multiple of 2 x ", heads, " heads");
  Shape split = to_gguf ? Shape{heads, 2, rows / heads / 2} : Shape{heads, rows / heads / 2, 2};
  for (int64_t d = 1; d < t.dim(); ++d) split.push_back(t.size(d));
  return t.reshape(split).transpose(1, 2).contiguous().reshape(t.sizes());
}

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
    Tensor t;
    if (it->second.expert >= 0) {  // only this expert's slice of the stacked tensor is converted
      const auto [rows, bytes] = expert_rows(it->second);
      const GgufTensorInfo& info = f_.info(it->second.gguf);
      t = empty({info.shape[1], info.shape[2]}, DType::F32);
      gguf_dequantize(info.type, f_.raw(it->second.gguf).narrow(0, it->second.expert * rows, rows).data<const uint8_t>(),
                      static_cast<uint64_t>(t.numel()), t.data<float>());
    } else {
      t = f_.get(it->second.gguf, DType::F32);
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
    const auto [rows, bytes] = expert_rows(it->second);
    return {Shape(info.shape.begin() + 1, info.shape.end()), DType::F32, rows * bytes};
  }

  std::optional<BlockTensor> blocks(const std::string& name) const override {
    const auto it = map_.find(name);
    if (it == map_.end()) return std::nullopt;
    const GgufTensorInfo& info = f_.info(it->second.gguf);
    constexpr uint32_t kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
    const char* format = info.type == kQ8_0   ? "q8_0"
                         : info.type == kQ4_0 ? "q4_0"
                         : info.type == kQ4_K ? "q4_k"
                         : info.type == kQ5_K ? "q5_k"
                         : info.type == kQ6_K ? "q6_k"
                                              : nullptr;
    if (!format) return std::nullopt;
    if (it->second.expert >= 0) {  // the expert's rows of the stacked tensor
      const auto [rows, bytes] = expert_rows(it->second);
      return BlockTensor{format, f_.raw(it->second.gguf).narrow(0, it->second.expert * rows, rows)};
    }
    if (info.shape.size() != 2) return std::nullopt;
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

  // An expert's slice of its stacked tensor [E, rows, cols]: {rows, stored bytes per row}.
  std::pair<int64_t, int64_t> expert_rows(const Entry& e) const {
    const GgufTensorInfo& info = f_.info(e.gguf);
    KILN_CHECK(info.shape.size() == 3 && info.shape[0] == c_.num_experts, f_.path(), ": ", e.gguf, " is ",
               shape_str(info.shape), "; expected [", c_.num_experts, ", rows, cols]");
    const int64_t rows = info.shape[1];
    return {rows, static_cast<int64_t>(info.nbytes) / (c_.num_experts * std::max<int64_t>(rows, 1))};
  }

  Tensor unpermute(const Tensor& t, int64_t heads, const std::string& name) const {
    return llama_head_rows(t, heads, false, f_.path() + ": " + name);
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

int64_t gguf_weight_bytes(const GgufFile& f, DType dtype, Device /*device: every kept format has kernels on both*/) {
  constexpr uint32_t kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
  int64_t n = 0;
  for (const GgufTensorInfo& t : f.header().tensors) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    const bool kept_type = t.type == kQ8_0 || t.type == kQ4_0 || t.type == kQ4_K || t.type == kQ5_K || t.type == kQ6_K;
    const bool kept = kept_type && t.shape.size() >= 2 && t.name != "token_embd.weight";
    n += kept ? static_cast<int64_t>(t.nbytes) : e * static_cast<int64_t>(itemsize(dtype));
  }
  return n;
}

}  // namespace kiln::llm

// ---- writing ---------------------------------------------------------------------------------------------------

namespace kiln::llm {

namespace {

using KV = std::vector<std::pair<std::string, GgufValue>>;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kBF16 = 30;

GgufValue u32(int64_t v) { return {GgufValue::Type::U32, static_cast<uint64_t>(v)}; }
GgufValue f32(double v) { return {GgufValue::Type::F32, v}; }
GgufValue text(std::string s) { return {GgufValue::Type::String, std::move(s)}; }
GgufValue flag(bool b) { return {GgufValue::Type::Bool, b}; }
GgufValue array(std::vector<GgufValue> a) { return {GgufValue::Type::Array, std::move(a)}; }

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// A float tensor's bytes as ggml type `type` (block types: blocks along the last dim).
std::vector<uint8_t> encode(const Tensor& t, uint32_t type) {
  if (type == kF32) return bytes_of(t.to(DType::F32));
  if (type == kF16) return bytes_of(t.to(DType::F16));
  if (type == kBF16) return bytes_of(t.to(DType::BF16));
  const Tensor w = t.to(DType::F32).reshape({-1, t.size(-1)});
  if (type == kQ4_K) return bytes_of(quantize_q4_k(w).blocks);
  // Q8_0 / Q4_0: per block of 32, the f16 scale then the codes (ggml's block_q8_0: 34 bytes, block_q4_0: 18).
  Tensor values, scales;
  if (type == kQ8_0) {
    const Q8Weight q = quantize_q8_0(w);
    values = q.values.contiguous(), scales = q.scales.contiguous();
  } else {
    const Q4Weight q = quantize_q4_0(w);
    values = q.values.contiguous(), scales = q.scales.contiguous();
  }
  const int64_t blocks = scales.numel(), qb = values.numel() / std::max<int64_t>(blocks, 1);
  std::vector<uint8_t> out(static_cast<size_t>(blocks * (2 + qb)));
  const auto* v = static_cast<const uint8_t*>(values.data_ptr());
  const auto* d = static_cast<const uint8_t*>(scales.data_ptr());
  for (int64_t b = 0; b < blocks; ++b) {
    std::memcpy(out.data() + b * (2 + qb), d + 2 * b, 2);
    std::memcpy(out.data() + b * (2 + qb) + 2, v + b * qb, static_cast<size_t>(qb));
  }
  return out;
}

// The tokenizer.json and chat template of `dir` as tokenizer.* metadata (llama.cpp's byte-level BPE keys),
// padded to the embedding's rows with unused "[PAD<id>]" tokens as llama.cpp's converter pads them. Nothing
// when the directory has no tokenizer.json.
void add_tokenizer(const std::string& dir, const ModelConfig& c, KV& kv) {
  namespace fs = std::filesystem;
  const fs::path tp = fs::path(dir) / "tokenizer.json";
  if (!fs::is_regular_file(tp)) return;
  json t;
  {
    std::ifstream is(tp);
    t = json::parse(is, nullptr, false);
  }
  const std::string src = tp.string();
  KILN_CHECK(t.is_object() && t.contains("model") && t["model"].value("type", "") == "BPE", src,
             ": only byte-level BPE tokenizers can be written to GGUF");
  // The pre-tokenizer: a Split by one of the regexes GGUF names, then ByteLevel; or ByteLevel with its own regex.
  std::string regex;
  const json& pre = t.value("pre_tokenizer", json());
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const json& p : pre.value("pretokenizers", json::array()))
      if (p.value("type", "") == "Split" && p.contains("pattern") && p["pattern"].contains("Regex"))
        regex = p["pattern"]["Regex"].get<std::string>();
  }
  std::optional<std::string> pre_name = gguf_pre_tokenizer_name(regex);
  if (regex.empty() && pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true))
    pre_name = "gpt-2";
  KILN_CHECK(pre_name.has_value(), src, ": the pre-tokenizer is not one that GGUF names (qwen2, llama-bpe, gpt-2)");
  const json& norm = t.value("normalizer", json());
  const bool nfc = norm.is_object() && norm.value("type", "") == "NFC";
  KILN_CHECK(nfc == (*pre_name == "qwen2") && (nfc || norm.is_null()), src, ": the normalizer ", norm.dump(),
             " does not go with the pre-tokenizer ", *pre_name, " in GGUF (qwen2: NFC; others: none)");

  std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (token, ggml token type)
  for (const auto& [tok, id] : t["model"]["vocab"].items()) by_id[id.get<int64_t>()] = {tok, 1};
  for (const json& a : t.value("added_tokens", json::array()))
    by_id[a["id"].get<int64_t>()] = {a["content"].get<std::string>(), a.value("special", false) ? 3 : 4};
  KILN_CHECK(!by_id.empty() && by_id.begin()->first >= 0 && by_id.rbegin()->first < c.vocab_size, src,
             ": token ids must lie in [0, vocab_size = ", c.vocab_size, ")");
  std::vector<GgufValue> tokens, types, merges;
  for (int64_t i = 0; i < c.vocab_size; ++i) {
    const auto it = by_id.find(i);
    tokens.push_back(text(it != by_id.end() ? it->second.first : "[PAD" + std::to_string(i) + "]"));
    types.push_back({GgufValue::Type::I32, int64_t{it != by_id.end() ? it->second.second : 5}});  // 5: unused
  }
  for (const json& m : t["model"].value("merges", json::array()))
    merges.push_back(text(m.is_string() ? m.get<std::string>() : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>()));
  kv.emplace_back("tokenizer.ggml.model", text("gpt2"));
  kv.emplace_back("tokenizer.ggml.pre", text(*pre_name));
  kv.emplace_back("tokenizer.ggml.tokens", array(std::move(tokens)));
  kv.emplace_back("tokenizer.ggml.token_type", array(std::move(types)));
  kv.emplace_back("tokenizer.ggml.merges", array(std::move(merges)));
  // add_bos_token: tokenizer_config.json's when it says, else whether the post-processor puts a special token
  // before the text (Llama 3's TemplateProcessing, alone or inside a Sequence of processors).
  auto template_adds_bos = [](const json& p) {
    return p.is_object() && p.value("type", "") == "TemplateProcessing" && !p.value("single", json::array()).empty() &&
           p["single"][0].contains("SpecialToken");
  };
  const json& post = t.value("post_processor", json());
  bool add_bos = template_adds_bos(post);
  if (post.is_object() && post.value("type", "") == "Sequence")
    for (const json& p : post.value("processors", json::array())) add_bos = add_bos || template_adds_bos(p);
  if (std::ifstream cfg(fs::path(dir) / "tokenizer_config.json"); cfg) {
    const json tc = json::parse(cfg, nullptr, false);
    if (tc.is_object() && tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
      add_bos = tc["add_bos_token"].get<bool>();
  }
  kv.emplace_back("tokenizer.ggml.add_bos_token", flag(add_bos));
  std::string tmpl;
  if (std::ifstream is(fs::path(dir) / "chat_template.jinja"); is) {
    tmpl.assign(std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>());
  } else if (std::ifstream cfg(fs::path(dir) / "tokenizer_config.json"); cfg) {
    const json tc = json::parse(cfg, nullptr, false);
    if (tc.is_object() && tc.contains("chat_template") && tc["chat_template"].is_string())
      tmpl = tc["chat_template"].get<std::string>();
  }
  if (!tmpl.empty()) kv.emplace_back("tokenizer.chat_template", text(tmpl));
}

}  // namespace

std::map<std::string, int64_t> write_gguf_model(const std::string& dir, const std::string& path, const std::string& type) {
  const std::map<std::string, std::pair<uint32_t, int64_t>> kTypes = {
      {"f32", {kF32, 0}}, {"f16", {kF16, 1}}, {"bf16", {kBF16, 32}}, {"q8_0", {kQ8_0, 7}}, {"q4_0", {kQ4_0, 2}}, {"q4_k", {kQ4_K, 14}}};
  const auto tt = kTypes.find(type);
  KILN_CHECK(tt != kTypes.end(), "gguf: type must be f32, f16, bf16, q8_0, q4_0 or q4_k, got '", type, "'");
  const uint32_t base = tt->second.first;
  const bool quantized = base == kQ8_0 || base == kQ4_0 || base == kQ4_K;
  const ModelConfig c = load_config(dir);
  KILN_CHECK(!c.fp8 && c.block_quant.empty(), dir, ": an FP8 or block-quantized checkpoint; start from its f32, f16 or bf16 one");
  const std::string arch = c.arch == Arch::Qwen3 ? "qwen3" : c.arch == Arch::Qwen3Moe ? "qwen3moe" : "llama";
  KILN_CHECK(c.rope.partial_rotary_factor == 1.0, dir, ": partial rotary embeddings are not written to GGUF");
  KILN_CHECK(!c.mlp_bias, dir, ": MLP biases are not written to GGUF");
  for (int64_t w : c.sliding_window) KILN_CHECK(w == 0, dir, ": sliding-window attention is not written to GGUF");
  const RopeConfig& r = c.rope;
  KILN_CHECK(r.type != RopeConfig::Type::Yarn || (r.beta_fast == 32.0 && r.beta_slow == 1.0 && !r.mscale &&
                                                  !r.mscale_all_dim && !r.attention_factor && r.truncate),
             dir, ": YaRN with non-default parameters has no GGUF keys");

  KV kv;
  kv.emplace_back("general.architecture", text(arch));
  kv.emplace_back("general.name", text(std::filesystem::path(dir).filename().string()));
  kv.emplace_back("general.file_type", u32(tt->second.second));
  kv.emplace_back("general.quantization_version", u32(2));
  const std::string p = arch + ".";
  kv.emplace_back(p + "context_length", u32(c.max_position_embeddings));
  kv.emplace_back(p + "embedding_length", u32(c.hidden_size));
  kv.emplace_back(p + "block_count", u32(c.num_layers));
  kv.emplace_back(p + "feed_forward_length", u32(c.intermediate_size));
  kv.emplace_back(p + "attention.head_count", u32(c.num_heads));
  kv.emplace_back(p + "attention.head_count_kv", u32(c.num_kv_heads));
  kv.emplace_back(p + "attention.key_length", u32(c.head_dim));
  kv.emplace_back(p + "attention.value_length", u32(c.head_dim));
  kv.emplace_back(p + "rope.dimension_count", u32(c.rotary_dim()));
  kv.emplace_back(p + "rope.freq_base", f32(r.theta));
  kv.emplace_back(p + "attention.layer_norm_rms_epsilon", f32(c.rms_norm_eps));
  if (c.num_experts > 0) {
    kv.emplace_back(p + "expert_count", u32(c.num_experts));
    kv.emplace_back(p + "expert_used_count", u32(c.num_experts_per_tok));
    kv.emplace_back(p + "expert_feed_forward_length", u32(c.moe_intermediate_size));
    kv.emplace_back(p + "expert_weights_norm", flag(c.norm_topk_prob));
  }
  if (r.type == RopeConfig::Type::Linear || r.type == RopeConfig::Type::Yarn) {
    kv.emplace_back(p + "rope.scaling.type", text(r.type == RopeConfig::Type::Linear ? "linear" : "yarn"));
    kv.emplace_back(p + "rope.scaling.factor", f32(r.factor));
    if (r.original_max_position_embeddings > 0)
      kv.emplace_back(p + "rope.scaling.original_context_length", u32(r.original_max_position_embeddings));
  }
  add_tokenizer(dir, c, kv);
  // The special ids (with or without a tokenizer: the config's bos / eos, which the reader takes back). Of a list
  // of end ids the first is eos and the last eot (Llama 3.1's [end_of_text, eom, eot]: eom is not kept).
  if (c.bos_token_id) kv.emplace_back("tokenizer.ggml.bos_token_id", u32(*c.bos_token_id));
  if (!c.eos_token_ids.empty()) kv.emplace_back("tokenizer.ggml.eos_token_id", u32(c.eos_token_ids[0]));
  if (c.eos_token_ids.size() > 1) kv.emplace_back("tokenizer.ggml.eot_token_id", u32(c.eos_token_ids.back()));
  if (c.pad_token_id) kv.emplace_back("tokenizer.ggml.padding_token_id", u32(*c.pad_token_id));

  const auto ck = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  // Every tensor the config implies, with its shape, before anything is written (a missing lm_head would read
  // back as tied; an embedding of other rows than vocab_size would not match the padded token list).
  for (const auto& [name, shape] : expected_tensors(c))
    KILN_CHECK(ck->contains(name) && ck->entry(name).shape == shape, dir, ": ", name,
               ck->contains(name) ? str(" is ", shape_str(ck->entry(name).shape), "; the config implies ", shape_str(shape))
                                  : std::string(" is missing"));
  std::set<std::string> used;
  std::vector<GgufTensorToWrite> tensors;
  // A matrix's type: the format where its K allows (q4_k: Q8_0 where K % 256 != 0), else f16.
  auto matrix_type = [](uint32_t want, int64_t k) {
    if (want == kQ4_K && k % 256 != 0) want = kQ8_0;
    if ((want == kQ8_0 || want == kQ4_0) && k % 32 != 0) return kF16;
    return want;
  };
  auto add = [&](const std::string& hf, const std::string& gg, bool layer_linear) {
    if (!ck->contains(hf)) return;
    used.insert(hf);
    const Shape shape = ck->entry(hf).shape;
    uint32_t ty = kF32;
    if (shape.size() >= 2) ty = !quantized ? base : matrix_type(layer_linear ? base : kQ8_0, shape.back());
    if (gg.find("ffn_gate_inp") != std::string::npos) ty = kF32;  // the router
    const bool q = c.arch == Arch::Llama && hf.find("self_attn.q_proj.") != std::string::npos;
    const bool k = c.arch == Arch::Llama && hf.find("self_attn.k_proj.") != std::string::npos;
    const int64_t heads = q ? c.num_heads : c.num_kv_heads;
    tensors.push_back({gg, shape, ty, [ck, hf, ty, q, k, heads] {
                         Tensor t = ck->get(hf).to(DType::F32);
                         if (q || k) t = llama_head_rows(t, heads, true, hf);
                         return encode(t, ty);
                       }});
  };
  add("model.embed_tokens.weight", "token_embd.weight", false);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".", gg = "blk." + std::to_string(i) + ".";
    for (const auto& [h, g] : kLayerNames) add(hf + h, gg + g, is_block_quantized_weight(hf + h));
    if (!c.is_moe_layer(i)) continue;
    for (const auto& [h, g] : kExpertNames) {
      const std::string first = hf + "mlp.experts.0." + h;
      KILN_CHECK(ck->contains(first), dir, ": no ", first);
      Shape shape = ck->entry(first).shape;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string n = hf + "mlp.experts." + std::to_string(e) + "." + h;
        KILN_CHECK(ck->contains(n) && ck->entry(n).shape == shape, dir, ": ", n, " is absent or not shaped as ", first);
        used.insert(n);
      }
      shape.insert(shape.begin(), c.num_experts);
      const uint32_t ty = !quantized ? base : matrix_type(base, shape.back());
      const std::string prefix = hf + "mlp.experts.", suffix = h;
      const int64_t E = c.num_experts;
      tensors.push_back({gg + g, shape, ty, [ck, prefix, suffix, E, ty] {
                           std::vector<Tensor> parts;
                           for (int64_t e = 0; e < E; ++e)
                             parts.push_back(ck->get(prefix + std::to_string(e) + "." + suffix).to(DType::F32).unsqueeze(0));
                           return encode(cat(parts, 0), ty);
                         }});
    }
  }
  add("model.norm.weight", "output_norm.weight", false);
  if (c.tie_word_embeddings) used.insert("lm_head.weight");
  else add("lm_head.weight", "output.weight", false);
  // Llama 3's RoPE scaling as llama.cpp stores it: per-frequency divisors of the unscaled frequencies.
  if (r.type == RopeConfig::Type::Llama3) {
    ModelConfig plain = c;
    plain.rope.type = RopeConfig::Type::Default;
    const std::vector<float> scaled = rope_frequencies(c).inv_freq, unscaled = rope_frequencies(plain).inv_freq;
    std::vector<float> factors(scaled.size());
    for (size_t j = 0; j < scaled.size(); ++j) factors[j] = unscaled[j] / scaled[j];
    tensors.push_back({"rope_freqs.weight", Shape{static_cast<int64_t>(factors.size())}, kF32, [factors] {
                         std::vector<uint8_t> b(factors.size() * 4);
                         std::memcpy(b.data(), factors.data(), b.size());
                         return b;
                       }});
  }
  for (const std::string& n : ck->names())
    KILN_CHECK(used.count(n) || n.ends_with("rotary_emb.inv_freq"), dir, ": the tensor ", n,
               " has no place in a GGUF file of a ", arch, " model");
  write_gguf(path, kv, tensors);
  std::map<std::string, int64_t> counts;
  for (const GgufTensorToWrite& t : tensors) ++counts[gguf_type_name(t.type)];
  return counts;
}

}  // namespace kiln::llm
