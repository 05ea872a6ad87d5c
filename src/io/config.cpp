// config.json for the architectures kiln runs. The rule for fields: kiln reads every field that the
// Hugging Face class of the architecture reads in its forward pass, with the same defaults, and refuses
// values it does not implement, naming the field. Fields that class never reads (another model family's
// knobs, training settings) cannot change what transformers computes, so they are ignored here too.
#include <algorithm>
#include <filesystem>
#include <set>

#include "io/json_strict.h"
#include "kiln/io.h"

namespace kiln {

namespace {

using json = nlohmann::json;

enum class Arch { Qwen3, Qwen3Moe, Llama, Mistral };

struct ArchInfo {
  const char* name;
  const char* model_type;
  Arch arch;
  int64_t default_max_positions;
};
constexpr ArchInfo kArchs[] = {
    {"Qwen3ForCausalLM", "qwen3", Arch::Qwen3, 32768},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Arch::Qwen3Moe, 32768},
    {"LlamaForCausalLM", "llama", Arch::Llama, 2048},
    {"MistralForCausalLM", "mistral", Arch::Mistral, 131072},
};

// Typed access to one JSON object with errors naming the file and the field path.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw Error(str("config '", source_, "': field \"", prefix_, key, "\": ", msg));
  }
  // Absent and null are the same: transformers reads both as "not set".
  const json* find(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  std::optional<int64_t> opt_int(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail(key, str("value ", v->dump(), " is too large"));
      return static_cast<int64_t>(v->get<uint64_t>());
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    fail(key, str("must be an integer, found ", v->dump().substr(0, 60)));
  }
  int64_t req_int(const std::string& key) const {
    auto v = opt_int(key);
    if (!v) fail(key, "is required");
    return *v;
  }
  int64_t positive(const std::string& key, std::optional<int64_t> dflt = std::nullopt) const {
    auto v = opt_int(key);
    if (!v && !dflt) fail(key, "is required");
    const int64_t x = v.value_or(dflt.value_or(0));
    if (x <= 0) fail(key, str("must be positive, found ", x));
    return x;
  }
  std::optional<double> opt_double(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(key, str("must be a number, found ", v->dump().substr(0, 60)));
    return v->get<double>();
  }
  double num(const std::string& key, double dflt) const { return opt_double(key).value_or(dflt); }
  double req_num(const std::string& key) const {
    auto v = opt_double(key);
    if (!v) fail(key, "is required");
    return *v;
  }
  bool flag(const std::string& key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(key, str("must be true or false, found ", v->dump().substr(0, 60)));
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, str("must be a string, found ", v->dump().substr(0, 60)));
    return v->get<std::string>();
  }
  // An integer or a list of integers (token ids).
  std::optional<std::vector<int64_t>> opt_ids(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    std::vector<int64_t> out;
    auto one = [&](const json& x) {
      if (!x.is_number_integer() || (!x.is_number_unsigned() && x.get<int64_t>() < 0) ||
          (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
        fail(key, str("token ids must be non-negative integers, found ", x.dump().substr(0, 60)));
      out.push_back(x.get<int64_t>());
    };
    if (v->is_array()) {
      for (const json& x : *v) one(x);
    } else {
      one(*v);
    }
    return out;
  }
  const json& j() const { return j_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& j_;
  std::string source_, prefix_;
};

RopeConfig parse_rope(const Fields& top, const json& dict, const std::string& where, double theta,
                      int64_t max_positions) {
  if (!dict.is_object()) top.fail(where, str("must be an object, found ", dict.dump().substr(0, 60)));
  const Fields f(dict, top.source(), where + ".");
  RopeConfig r;
  r.theta = theta;
  auto type = f.opt_string("rope_type");
  const auto legacy = f.opt_string("type");
  if (type && legacy && *type != *legacy)
    f.fail("type", str("'", *legacy, "' contradicts rope_type '", *type, "'"));
  if (!type) type = legacy;
  const std::string t = type.value_or("default");
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (t == "default") {
    r.type = RopeType::Default;
  } else if (t == "linear") {
    r.type = RopeType::Linear;
    r.factor = f.req_num("factor");
    allowed.insert("factor");
  } else if (t == "llama3") {
    r.type = RopeType::Llama3;
    r.factor = f.req_num("factor");
    r.low_freq_factor = f.req_num("low_freq_factor");
    r.high_freq_factor = f.req_num("high_freq_factor");
    r.original_max_position_embeddings = f.positive("original_max_position_embeddings");
    if (!(r.high_freq_factor > r.low_freq_factor))
      f.fail("high_freq_factor", str("must exceed low_freq_factor (", r.low_freq_factor, "), found ",
                                     r.high_freq_factor));
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (t == "yarn") {
    r.type = RopeType::Yarn;
    r.factor = f.req_num("factor");
    r.original_max_position_embeddings = f.positive("original_max_position_embeddings", max_positions);
    r.beta_fast = f.num("beta_fast", 32.0);
    r.beta_slow = f.num("beta_slow", 1.0);
    r.mscale = f.opt_double("mscale");
    r.mscale_all_dim = f.opt_double("mscale_all_dim");
    r.attention_factor = f.opt_double("attention_factor");
    r.truncate = f.flag("truncate", true);
    allowed.insert({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                    "mscale_all_dim", "attention_factor", "truncate"});
  } else {
    f.fail("rope_type", str("'", t, "' is not supported (supported: default, linear, llama3, yarn)"));
  }
  if (r.type != RopeType::Default && !(r.factor > 0)) f.fail("factor", str("must be positive, found ", r.factor));
  if (f.has("partial_rotary_factor") && f.num("partial_rotary_factor", 1.0) != 1.0)
    f.fail("partial_rotary_factor", "partial rotary embeddings are not supported (only 1.0)");
  for (auto it = dict.begin(); it != dict.end(); ++it)
    if (!allowed.count(it.key()) && !it->is_null())
      f.fail(it.key(), str("is not supported with rope_type '", t, "' (it would change the rotary embedding)"));
  return r;
}

Fp8QuantConfig parse_quant(const Fields& top) {
  const json& q = *top.find("quantization_config");
  if (!q.is_object()) top.fail("quantization_config", "must be an object");
  const Fields f(q, top.source(), "quantization_config.");
  const std::string method = f.opt_string("quant_method").value_or("");
  if (method != "fp8")
    f.fail("quant_method", str("'", method, "' is not supported (supported: fp8 with fmt e4m3 and weight_block_size)"));
  const std::string fmt = f.opt_string("fmt").value_or("e4m3");
  if (fmt != "e4m3") f.fail("fmt", str("'", fmt, "' is not supported (only e4m3)"));
  const std::string act = f.opt_string("activation_scheme").value_or("dynamic");
  if (act != "dynamic") f.fail("activation_scheme", str("'", act, "' is not supported (only dynamic)"));
  if (f.flag("dequantize", false)) f.fail("dequantize", "dequantizing on load is not supported");
  Fp8QuantConfig c;
  const json* bs = f.find("weight_block_size");
  if (!bs) f.fail("weight_block_size", "is required (per-tensor FP8 scales are not supported)");
  if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer() ||
      (*bs)[0].get<int64_t>() <= 0 || (*bs)[1].get<int64_t>() <= 0)
    f.fail("weight_block_size", str("must be two positive integers, found ", bs->dump().substr(0, 60)));
  c.block_rows = (*bs)[0].get<int64_t>();
  c.block_cols = (*bs)[1].get<int64_t>();
  if (const json* m = f.find("modules_to_not_convert")) {
    if (!m->is_array()) f.fail("modules_to_not_convert", "must be a list of strings");
    for (const json& s : *m) {
      if (!s.is_string()) f.fail("modules_to_not_convert", "must be a list of strings");
      c.modules_to_not_convert.push_back(s.get<std::string>());
    }
  }
  const std::set<std::string> allowed = {"quant_method", "fmt", "activation_scheme", "dequantize",
                                         "weight_block_size", "modules_to_not_convert"};
  for (auto it = q.begin(); it != q.end(); ++it)
    if (!allowed.count(it.key()) && !it->is_null()) f.fail(it.key(), "is not supported");
  return c;
}

DType parse_torch_dtype(const Fields& f, const std::string& key) {
  const std::string s = *f.opt_string(key);
  if (s == "bfloat16") return DType::BF16;
  if (s == "float16") return DType::F16;
  if (s == "float32") return DType::F32;
  f.fail(key, str("'", s, "' is not a dtype kiln computes in (bfloat16, float16, float32)"));
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  KILN_CHECK(layer >= 0 && layer < num_hidden_layers, "ModelConfig::is_moe_layer: layer ", layer, " out of [0, ",
             num_hidden_layers, ")");
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(std::string_view config_json, const std::string& source,
                               std::optional<std::string_view> generation_config_json) {
  const json j = io::parse_json_strict(config_json, source, 32);
  KILN_CHECK(j.is_object(), "config '", source, "': not a JSON object");
  const Fields f(j, source);
  ModelConfig c;

  // Architecture.
  const json* archs = f.find("architectures");
  if (!archs || !archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
    f.fail("architectures", "must be a list of one architecture name");
  c.architecture = (*archs)[0].get<std::string>();
  const ArchInfo* info = nullptr;
  for (const ArchInfo& a : kArchs)
    if (c.architecture == a.name) info = &a;
  if (!info)
    f.fail("architectures", str("'", c.architecture, "' is not supported (supported: Qwen3ForCausalLM, ",
                                "Qwen3MoeForCausalLM, LlamaForCausalLM, MistralForCausalLM)"));
  c.model_type = f.opt_string("model_type").value_or(info->model_type);
  if (c.model_type != info->model_type)
    f.fail("model_type", str("'", c.model_type, "' does not match architecture ", c.architecture, " (expected '",
                             info->model_type, "')"));
  const Arch arch = info->arch;
  const bool qwen = arch == Arch::Qwen3 || arch == Arch::Qwen3Moe;

  // Sizes.
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", str(c.num_key_value_heads, " does not divide num_attention_heads ",
                                      c.num_attention_heads));
  if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim");
  } else if (qwen) {
    c.head_dim = 128;  // Qwen3Config's default, not hidden_size / heads
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      f.fail("head_dim", str("is absent and hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ",
                             c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.positive("max_position_embeddings", info->default_max_positions);
  c.rms_norm_eps = f.num("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.fail("rms_norm_eps", str("must be positive, found ", c.rms_norm_eps));
  c.tie_word_embeddings = f.flag("tie_word_embeddings", false);
  c.attention_bias = f.flag("attention_bias", false);
  c.qk_norm = qwen;
  const std::string act = f.opt_string("hidden_act").value_or("silu");
  if (act != "silu" && act != "swish") f.fail("hidden_act", str("'", act, "' is not supported (only silu)"));
  if (arch == Arch::Llama && f.flag("mlp_bias", false)) f.fail("mlp_bias", "biases in the MLP are not supported");
  if (f.has("partial_rotary_factor") && f.num("partial_rotary_factor", 1.0) != 1.0)
    f.fail("partial_rotary_factor", "partial rotary embeddings are not supported (only 1.0)");

  // Rotary embedding: rope_parameters (newer transformers) or rope_theta + rope_scaling.
  const double theta = f.num("rope_theta", 10000.0);
  if (const json* rp = f.find("rope_parameters")) {
    if (rp->is_object() && !rp->contains("rope_type") && !rp->contains("type") &&
        (rp->contains("full_attention") || rp->contains("sliding_attention")))
      f.fail("rope_parameters", "per-layer-type rotary parameters are not supported");
    const double t = rp->is_object() ? Fields(*rp, source, "rope_parameters.").num("rope_theta", theta) : theta;
    if (f.has("rope_theta") && t != theta)
      f.fail("rope_parameters.rope_theta", str(t, " contradicts rope_theta ", theta));
    c.rope = parse_rope(f, *rp, "rope_parameters", t, c.max_position_embeddings);
    if (f.has("rope_scaling")) {
      const RopeConfig other = parse_rope(f, *f.find("rope_scaling"), "rope_scaling", t, c.max_position_embeddings);
      if (other.type != c.rope.type || other.factor != c.rope.factor)
        f.fail("rope_scaling", "contradicts rope_parameters");
    }
  } else if (const json* rs = f.find("rope_scaling")) {
    c.rope = parse_rope(f, *rs, "rope_scaling", theta, c.max_position_embeddings);
  } else {
    c.rope.theta = theta;
  }
  if (!(c.rope.theta > 0)) f.fail("rope_theta", str("must be positive, found ", c.rope.theta));

  // Mixture of experts.
  const bool has_experts_field = f.has("num_experts") || f.has("num_local_experts");
  if (arch == Arch::Qwen3Moe) {
    const auto a = f.opt_int("num_experts"), b = f.opt_int("num_local_experts");
    if (a && b && *a != *b) f.fail("num_local_experts", str(*b, " contradicts num_experts ", *a));
    c.num_experts = a ? f.positive("num_experts") : b ? f.positive("num_local_experts") : 128;
    c.num_experts_per_tok = f.positive("num_experts_per_tok", 8);
    if (c.num_experts_per_tok > c.num_experts)
      f.fail("num_experts_per_tok", str(c.num_experts_per_tok, " exceeds num_experts ", c.num_experts));
    c.moe_intermediate_size = f.positive("moe_intermediate_size", 768);
    c.decoder_sparse_step = f.positive("decoder_sparse_step", 1);
    c.norm_topk_prob = f.flag("norm_topk_prob", false);
    if (const json* m = f.find("mlp_only_layers")) {
      if (!m->is_array()) f.fail("mlp_only_layers", "must be a list of layer indices");
      for (const json& x : *m) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_hidden_layers)
          f.fail("mlp_only_layers", str("entry ", x.dump().substr(0, 40), " is not a layer index in [0, ",
                                        c.num_hidden_layers, ")"));
        c.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
    if (f.opt_int("shared_expert_intermediate_size").value_or(0) != 0)
      f.fail("shared_expert_intermediate_size", "shared experts are not supported");
  } else if (has_experts_field &&
             std::max(f.opt_int("num_experts").value_or(0), f.opt_int("num_local_experts").value_or(0)) > 0) {
    f.fail(f.has("num_experts") ? "num_experts" : "num_local_experts",
           str(c.architecture, " has no experts; a mixture-of-experts checkpoint needs its own architecture"));
  }
  bool any_dense = c.num_experts == 0;
  for (int64_t l = 0; l < c.num_hidden_layers && !any_dense; ++l) any_dense = !c.is_moe_layer(l);
  c.intermediate_size = any_dense ? f.positive("intermediate_size") : f.opt_int("intermediate_size").value_or(0);

  // Sliding-window attention.
  c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (arch != Arch::Llama) {  // LlamaForCausalLM reads no window settings
    if (const json* lt = f.find("layer_types")) {
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
        f.fail("layer_types", str("must list one type for each of the ", c.num_hidden_layers, " layers"));
      for (size_t i = 0; i < lt->size(); ++i) {
        const json& t = (*lt)[i];
        if (t == "sliding_attention") c.sliding_layers[i] = true;
        else if (t != "full_attention")
          f.fail("layer_types", str("entry ", i, " is ", t.dump().substr(0, 40),
                                    " (supported: full_attention, sliding_attention)"));
      }
    } else if (qwen) {
      if (f.flag("use_sliding_window", false)) {
        const int64_t from = f.opt_int("max_window_layers").value_or(28);
        for (int64_t l = std::max<int64_t>(from, 0); l < c.num_hidden_layers; ++l) c.sliding_layers[l] = true;
      }
    } else if (f.has("sliding_window")) {  // Mistral: every layer
      c.sliding_layers.assign(c.sliding_layers.size(), true);
    }
    if (std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) != c.sliding_layers.end())
      c.sliding_window = f.positive("sliding_window");
  }

  // Token ids (generation_config.json takes precedence) and dtype.
  c.bos_token_ids = f.opt_ids("bos_token_id").value_or(std::vector<int64_t>{});
  c.eos_token_ids = f.opt_ids("eos_token_id").value_or(std::vector<int64_t>{});
  if (auto p = f.opt_ids("pad_token_id"); p && !p->empty()) c.pad_token_id = p->front();
  if (generation_config_json) {
    const std::string gsource = source + " (generation_config.json)";
    const json g = io::parse_json_strict(*generation_config_json, gsource, 32);
    KILN_CHECK(g.is_object(), "config '", gsource, "': not a JSON object");
    const Fields gf(g, gsource);
    if (auto v = gf.opt_ids("bos_token_id")) c.bos_token_ids = *v;
    if (auto v = gf.opt_ids("eos_token_id")) c.eos_token_ids = *v;
    if (auto v = gf.opt_ids("pad_token_id"); v && !v->empty()) c.pad_token_id = v->front();
  }
  if (f.has("dtype")) c.dtype = parse_torch_dtype(f, "dtype");
  else if (f.has("torch_dtype")) c.dtype = parse_torch_dtype(f, "torch_dtype");

  if (f.has("quantization_config")) c.fp8 = parse_quant(f);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  const std::string cfg = (d / "config.json").string();
  const std::string text = io::read_text_file(cfg, 16u << 20);
  const fs::path gen = d / "generation_config.json";
  std::error_code ec;
  if (fs::exists(gen, ec)) {
    const std::string gtext = io::read_text_file(gen.string(), 16u << 20);
    return parse_model_config(text, cfg, gtext);
  }
  return parse_model_config(text, cfg);
}

}  // namespace kiln
