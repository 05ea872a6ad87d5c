// config.json / generation_config.json → ModelConfig. The file is untrusted input: every field is checked
// for type and range, and a setting that changes the computation in a way kiln does not implement is an
// error naming it (never a silent default).
#include "kiln/llm/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::llm {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen3Moe: return "qwen3_moe";
    default: return "llama";
  }
}

const char* rope_type_name(RopeConfig::Type t) {
  switch (t) {
    case RopeConfig::Type::Linear: return "linear";
    case RopeConfig::Type::Llama3: return "llama3";
    case RopeConfig::Type::Yarn: return "yarn";
    default: return "default";
  }
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

namespace {

// JSON nesting a config never needs; deeper input is rejected before it can exhaust anything.
constexpr int kMaxDepth = 32;

json parse_json(const std::string& text, const std::string& source) {
  json::parser_callback_t depth_guard = [&](int depth, json::parse_event_t, json&) {
    KILN_CHECK(depth <= kMaxDepth, source, ": JSON nested deeper than ", kMaxDepth, " levels");
    return true;
  };
  json j;
  try {
    j = json::parse(text, depth_guard);
  } catch (const json::exception& e) {
    throw Error(str(source, ": not valid JSON (", e.what(), ")"));
  }
  KILN_CHECK(j.is_object(), source, ": the top level must be a JSON object, got ", j.type_name());
  return j;
}

// Typed field access with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }
  std::string name(const char* key) const { return prefix_ + key; }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt, int64_t lo = 0,
                  int64_t hi = int64_t{1} << 40) const {
    if (!has(key)) {
      KILN_CHECK(fallback.has_value(), source_, ": required field \"", name(key), "\" is missing");
      return *fallback;
    }
    const json& v = j_.at(key);
    int64_t r = 0;
    if (v.is_number_integer()) r = v.get<int64_t>();
    else if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(hi)) r = static_cast<int64_t>(v.get<uint64_t>());
    else if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e15)
      r = static_cast<int64_t>(v.get<double>());
    else throw Error(str(source_, ": field \"", name(key), "\" must be an integer, got ", v.dump()));
    KILN_CHECK(r >= lo && r <= hi, source_, ": field \"", name(key), "\" = ", r, " is out of range [", lo, ", ", hi, "]");
    return r;
  }

  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!has(key)) {
      KILN_CHECK(fallback.has_value(), source_, ": required field \"", name(key), "\" is missing");
      return *fallback;
    }
    const json& v = j_.at(key);
    KILN_CHECK(v.is_number(), source_, ": field \"", name(key), "\" must be a number, got ", v.dump());
    const double d = v.get<double>();
    KILN_CHECK(std::isfinite(d), source_, ": field \"", name(key), "\" must be finite, got ", v.dump());
    return d;
  }

  std::optional<double> optional_number(const char* key) const {
    if (!has(key)) return std::nullopt;
    return number(key);
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    KILN_CHECK(v.is_boolean(), source_, ": field \"", name(key), "\" must be true or false, got ", v.dump());
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& fallback = "") const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    KILN_CHECK(v.is_string(), source_, ": field \"", name(key), "\" must be a string, got ", v.dump());
    return v.get<std::string>();
  }

  // An integer or a list of integers (eos_token_id).
  std::vector<int64_t> int_list(const char* key, int64_t hi = int64_t{1} << 40) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    auto one = [&](const json& e) {
      KILN_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() <= hi, source_, ": field \"",
                 name(key), "\" must hold non-negative integers, got ", e.dump());
      return e.get<int64_t>();
    };
    if (v.is_array()) {
      KILN_CHECK(v.size() <= 4096, source_, ": field \"", name(key), "\" has too many entries (", v.size(), ")");
      for (const json& e : v) out.push_back(one(e));
    } else {
      out.push_back(one(v));
    }
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
  std::string prefix_;
};

[[noreturn]] void unsupported(const std::string& source, const std::string& field, const std::string& value,
                              const std::string& why) {
  throw Error(str(source, ": \"", field, "\" = ", value, " is not supported: ", why));
}

// rope_scaling (older files) or rope_parameters (newer transformers). Both hold rope_type (older files
// also "type"); rope_parameters also holds rope_theta.
void parse_rope(const Fields& top, ModelConfig& c) {
  RopeConfig& r = c.rope;
  r.theta = top.number("rope_theta", 10000.0);
  r.partial_rotary_factor = top.number("partial_rotary_factor", 1.0);
  const char* key = top.has("rope_parameters") ? "rope_parameters" : top.has("rope_scaling") ? "rope_scaling" : nullptr;
  if (key) {
    const json& rp = top.at(key);
    KILN_CHECK(rp.is_object(), top.source(), ": \"", key, "\" must be an object, got ", rp.dump());
    // transformers also allows rope_parameters keyed by layer type ({"full_attention": {...}, ...}).
    KILN_CHECK(!rp.contains("full_attention") && !rp.contains("sliding_attention"), top.source(), ": \"", key,
               "\" per layer type is not supported (every layer must share one RoPE)");
    const Fields f(rp, top.source(), std::string(key) + ".");
    std::string type = f.string("rope_type", f.string("type", "default"));
    if (f.has("rope_theta")) r.theta = f.number("rope_theta");
    if (f.has("partial_rotary_factor")) r.partial_rotary_factor = f.number("partial_rotary_factor");
    if (type == "default") {
      r.type = RopeConfig::Type::Default;
    } else if (type == "linear") {
      r.type = RopeConfig::Type::Linear;
      r.factor = f.number("factor");
    } else if (type == "llama3") {
      r.type = RopeConfig::Type::Llama3;
      r.factor = f.number("factor");
      r.low_freq_factor = f.number("low_freq_factor");
      r.high_freq_factor = f.number("high_freq_factor");
      r.original_max_position_embeddings = f.integer("original_max_position_embeddings", std::nullopt, 1);
      KILN_CHECK(r.high_freq_factor != r.low_freq_factor, top.source(), ": \"", key,
                 "\" llama3 needs high_freq_factor != low_freq_factor");
    } else if (type == "yarn") {
      r.type = RopeConfig::Type::Yarn;
      // Without factor, transformers uses max_position_embeddings / original_max_position_embeddings.
      r.factor = f.number("factor", 0.0);
      r.original_max_position_embeddings = f.integer("original_max_position_embeddings", 0, 0);
      r.beta_fast = f.number("beta_fast", 32.0);
      r.beta_slow = f.number("beta_slow", 1.0);
      // The correction range takes log(original / (2 pi beta)): a beta <= 0 has none.
      KILN_CHECK(r.beta_fast > 0 && r.beta_slow > 0, top.source(), ": \"", key,
                 "\" yarn needs beta_fast and beta_slow > 0, got ", r.beta_fast, " and ", r.beta_slow);
      r.mscale = f.optional_number("mscale");
      r.mscale_all_dim = f.optional_number("mscale_all_dim");
      r.attention_factor = f.optional_number("attention_factor");
      r.truncate = f.boolean("truncate", true);
    } else {
      // dynamic NTK rescales with the running sequence length and longrope switches factor sets: both change
      // the computation in ways the engine does not implement.
      unsupported(top.source(), std::string(key) + ".rope_type", "\"" + type + "\"",
                  "kiln implements default, linear, llama3 and yarn");
    }
    if (r.type == RopeConfig::Type::Yarn && r.factor == 0.0) {
      // transformers gives a top-level original_max_position_embeddings priority over the dict's.
      const int64_t orig = top.has("original_max_position_embeddings")
                               ? top.integer("original_max_position_embeddings", std::nullopt, 1)
                               : r.original_max_position_embeddings;
      KILN_CHECK(orig > 0, top.source(), ": \"", key, "\" yarn needs factor or original_max_position_embeddings");
      r.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(orig);
    }
    if ((r.type == RopeConfig::Type::Yarn || r.type == RopeConfig::Type::Llama3) && top.has("original_max_position_embeddings"))
      r.original_max_position_embeddings = top.integer("original_max_position_embeddings", std::nullopt, 1);
    KILN_CHECK(r.factor > 0, top.source(), ": \"", key, ".factor\" must be positive, got ", r.factor);
  }
  KILN_CHECK(r.theta > 1.0, top.source(), ": rope_theta must be > 1, got ", r.theta);
  KILN_CHECK(r.partial_rotary_factor > 0 && r.partial_rotary_factor <= 1, top.source(),
             ": partial_rotary_factor must be in (0, 1], got ", r.partial_rotary_factor);
}

void parse_fp8(const Fields& top, ModelConfig& c) {
  if (!top.has("quantization_config")) return;
  const json& q = top.at("quantization_config");
  KILN_CHECK(q.is_object(), top.source(), ": \"quantization_config\" must be an object");
  const Fields f(q, top.source(), "quantization_config.");
  const std::string method = f.string("quant_method");
  if (method == "kiln") {  // `kiln quantize`'s block formats
    const std::string format = f.string("format");
    if (format != "q8_0" && format != "q4_0" && format != "q4_k")
      unsupported(top.source(), "quantization_config.format", "\"" + format + "\"", "kiln writes q8_0, q4_0 and q4_k");
    c.block_quant = format;
    return;
  }
  if (method != "fp8")
    unsupported(top.source(), "quantization_config.quant_method", "\"" + method + "\"",
                "kiln reads fp8 checkpoints and its own q8_0 / q4_0 / q4_k ones only");
  const std::string fmt = f.string("fmt", "e4m3");
  if (fmt != "e4m3") unsupported(top.source(), "quantization_config.fmt", "\"" + fmt + "\"", "kiln reads e4m3 weights");
  const std::string scheme = f.string("activation_scheme", "dynamic");
  if (scheme != "dynamic")
    unsupported(top.source(), "quantization_config.activation_scheme", "\"" + scheme + "\"",
                "only dynamic activation scales are implemented");
  Fp8Config fp8;
  if (f.has("weight_block_size")) {
    const json& b = f.at("weight_block_size");
    KILN_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                   b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0 && b[0].get<int64_t>() <= 65536 &&
                   b[1].get<int64_t>() <= 65536,
               top.source(), ": \"quantization_config.weight_block_size\" must be [n, k] positive, got ", b.dump());
    fp8.block_n = b[0].get<int64_t>();
    fp8.block_k = b[1].get<int64_t>();
  } else {
    unsupported(top.source(), "quantization_config.weight_block_size", "absent",
                "kiln reads block-quantised fp8 weights (weight_block_size [n, k])");
  }
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    if (!f.has(key)) continue;
    const json& m = f.at(key);
    KILN_CHECK(m.is_array(), top.source(), ": \"quantization_config.", key, "\" must be a list of names");
    for (const json& e : m) {
      KILN_CHECK(e.is_string(), top.source(), ": \"quantization_config.", key, "\" must be a list of names");
      fp8.modules_to_not_convert.push_back(e.get<std::string>());
    }
  }
  c.fp8 = std::move(fp8);
}

// Sliding windows: Qwen3 (use_sliding_window, sliding_window, max_window_layers: layers >= max_window_layers
// use the window, as transformers builds layer_types), Mistral (sliding_window on every layer), or an
// explicit layer_types list.
void parse_sliding_window(const Fields& f, ModelConfig& c) {
  c.sliding_window.assign(static_cast<size_t>(c.num_layers), 0);
  const int64_t window = f.has("sliding_window") ? f.integer("sliding_window", std::nullopt, 1) : 0;
  if (f.has("layer_types")) {
    const json& lt = f.at("layer_types");
    KILN_CHECK(lt.is_array() && static_cast<int64_t>(lt.size()) == c.num_layers, f.source(),
               ": \"layer_types\" must list one type per layer (", c.num_layers, ")");
    for (size_t i = 0; i < lt.size(); ++i) {
      KILN_CHECK(lt[i].is_string(), f.source(), ": \"layer_types\" entries must be strings");
      const std::string t = lt[i].get<std::string>();
      if (t == "sliding_attention") {
        KILN_CHECK(window > 0, f.source(), ": layer ", i, " is sliding_attention but \"sliding_window\" is not set");
        c.sliding_window[i] = window;
      } else if (t != "full_attention") {
        unsupported(f.source(), str("layer_types[", i, "]"), "\"" + t + "\"",
                    "kiln implements full_attention and sliding_attention");
      }
    }
    return;
  }
  if (window == 0) return;
  if (c.arch == Arch::Llama) {
    // MistralForCausalLM: every layer.
    if (c.architecture == "MistralForCausalLM") std::fill(c.sliding_window.begin(), c.sliding_window.end(), window);
    return;
  }
  if (!f.boolean("use_sliding_window", false)) return;
  const int64_t from = f.integer("max_window_layers", c.num_layers, 0);
  for (int64_t i = from; i < c.num_layers; ++i) c.sliding_window[static_cast<size_t>(i)] = window;
}

}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  const Fields f(j, source);
  ModelConfig c;

  KILN_CHECK(f.has("architectures") && j.at("architectures").is_array() && j.at("architectures").size() == 1 &&
                 j.at("architectures")[0].is_string(),
             source, ": \"architectures\" must be a list with one architecture name");
  c.architecture = j.at("architectures")[0].get<std::string>();
  if (c.architecture == "Qwen3ForCausalLM") c.arch = Arch::Qwen3;
  else if (c.architecture == "Qwen3MoeForCausalLM") c.arch = Arch::Qwen3Moe;
  else if (c.architecture == "LlamaForCausalLM" || c.architecture == "MistralForCausalLM") c.arch = Arch::Llama;
  else
    unsupported(source, "architectures", "[\"" + c.architecture + "\"]",
                "kiln runs Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM and MistralForCausalLM");
  c.qk_norm = c.arch != Arch::Llama;

  constexpr int64_t kMaxDim = int64_t{1} << 20;
  c.hidden_size = f.integer("hidden_size", std::nullopt, 1, kMaxDim);
  c.num_layers = f.integer("num_hidden_layers", std::nullopt, 1, 4096);
  c.num_heads = f.integer("num_attention_heads", std::nullopt, 1, 65536);
  c.num_kv_heads = f.integer("num_key_value_heads", c.num_heads, 1, 65536);
  KILN_CHECK(c.num_heads % c.num_kv_heads == 0, source, ": num_attention_heads (", c.num_heads,
             ") must be a multiple of num_key_value_heads (", c.num_kv_heads, ")");
  if (f.has("head_dim")) {
    c.head_dim = f.integer("head_dim", std::nullopt, 1, 4096);
  } else if (c.arch == Arch::Qwen3) {
    c.head_dim = 128;  // Qwen3Config's default (Qwen3-MoE and Llama derive it from hidden_size / heads)
  } else {
    KILN_CHECK(c.hidden_size % c.num_heads == 0, source, ": hidden_size (", c.hidden_size,
               ") is not a multiple of num_attention_heads (", c.num_heads, ") and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.vocab_size = f.integer("vocab_size", std::nullopt, 1, int64_t{1} << 24);
  c.max_position_embeddings = f.integer("max_position_embeddings", 2048, 1, int64_t{1} << 24);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  KILN_CHECK(c.rms_norm_eps > 0 && c.rms_norm_eps < 1, source, ": rms_norm_eps must be in (0, 1), got ", c.rms_norm_eps);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_bias = f.boolean("attention_bias", false);
  c.mlp_bias = f.boolean("mlp_bias", false);
  c.dtype = f.string("torch_dtype", f.string("dtype"));

  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") unsupported(source, "hidden_act", "\"" + act + "\"", "the gated MLP is implemented with silu");

  if (c.arch == Arch::Qwen3Moe) {
    c.intermediate_size = f.integer("intermediate_size", 0, 0, kMaxDim);
    c.num_experts = f.integer("num_experts", f.has("num_local_experts") ? f.integer("num_local_experts", 0, 1, 65536) : std::optional<int64_t>{}, 1, 65536);
    c.num_experts_per_tok = f.integer("num_experts_per_tok", std::nullopt, 1, c.num_experts);
    c.moe_intermediate_size = f.integer("moe_intermediate_size", std::nullopt, 1, kMaxDim);
    c.norm_topk_prob = f.boolean("norm_topk_prob", false);
    c.decoder_sparse_step = f.integer("decoder_sparse_step", 1, 1, c.num_layers);
    if (f.has("mlp_only_layers")) {
      const json& m = f.at("mlp_only_layers");
      KILN_CHECK(m.is_array(), source, ": \"mlp_only_layers\" must be a list of layer indices");
      for (const json& e : m) {
        KILN_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < c.num_layers, source,
                   ": \"mlp_only_layers\" entries must be layer indices in [0, ", c.num_layers, "), got ", e.dump());
        c.mlp_only_layers.push_back(e.get<int64_t>());
      }
    }
    if (f.has("shared_expert_intermediate_size") && f.integer("shared_expert_intermediate_size", 0) > 0)
      unsupported(source, "shared_expert_intermediate_size", std::to_string(f.integer("shared_expert_intermediate_size", 0)),
                  "Qwen3-MoE has no shared expert");
    bool dense_layer = false;
    for (int64_t l = 0; l < c.num_layers; ++l) dense_layer |= !c.is_moe_layer(l);
    KILN_CHECK(!dense_layer || c.intermediate_size > 0, source,
               ": some layers use the dense MLP (mlp_only_layers / decoder_sparse_step) but intermediate_size is missing");
  } else {
    c.intermediate_size = f.integer("intermediate_size", std::nullopt, 1, kMaxDim);
    for (const char* key : {"num_experts", "num_local_experts"})
      if (f.has(key) && f.integer(key, 0) > 0)
        unsupported(source, key, std::to_string(f.integer(key, 0)), c.architecture + " is a dense architecture");
  }

  parse_rope(f, c);
  KILN_CHECK(c.rotary_dim() >= 2 && c.rotary_dim() % 2 == 0 && c.rotary_dim() <= c.head_dim, source,
             ": the rotary dimension (head_dim ", c.head_dim, " x partial_rotary_factor ", c.rope.partial_rotary_factor,
             ") must be even and positive");
  parse_fp8(f, c);
  parse_sliding_window(f, c);

  // Settings of other families that would change the computation if present.
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping", "logits_scaling", "embedding_multiplier",
                          "residual_multiplier", "attention_multiplier", "logit_scale", "use_qk_norm"}) {
    if (!f.has(key)) continue;
    const json& v = f.at(key);
    if (v.is_boolean() && !v.get<bool>()) continue;
    unsupported(source, key, v.dump(), c.architecture + " as kiln implements it has no such setting");
  }

  if (f.has("bos_token_id")) c.bos_token_id = f.integer("bos_token_id", std::nullopt, 0, c.vocab_size - 1 + (int64_t{1} << 20));
  c.eos_token_ids = f.int_list("eos_token_id");
  if (f.has("pad_token_id")) c.pad_token_id = f.integer("pad_token_id", std::nullopt, 0);
  return c;
}

void apply_generation_config(ModelConfig& c, const std::string& text, const std::string& source) {
  const json j = parse_json(text, source);
  const Fields f(j, source);
  if (f.has("bos_token_id")) c.bos_token_id = f.integer("bos_token_id", std::nullopt, 0);
  if (f.has("eos_token_id")) c.eos_token_ids = f.int_list("eos_token_id");
  if (f.has("pad_token_id")) c.pad_token_id = f.integer("pad_token_id", std::nullopt, 0);
}

namespace {
std::optional<std::string> read_text(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    KILN_CHECK(!required, path, ": cannot open (", required ? "a model directory needs config.json" : "", ")");
    return std::nullopt;
  }
  in.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(in.tellg());
  KILN_CHECK(size >= 0 && size <= (int64_t{16} << 20), path, ": ", size, " bytes is too large for a config file (limit 16 MiB)");
  in.seekg(0);
  std::string s(static_cast<size_t>(size), '\0');
  in.read(s.data(), size);
  KILN_CHECK(in.gcount() == size, path, ": read failed");
  return s;
}
}  // namespace

ModelConfig load_config(const std::string& dir) {
  const std::string cfg = dir + "/config.json";
  ModelConfig c = parse_config(*read_text(cfg, true), cfg);
  const std::string gen = dir + "/generation_config.json";
  if (auto text = read_text(gen, false)) apply_generation_config(c, *text, gen);
  return c;
}

// As transformers' ROPE_INIT_FUNCTIONS, step by step in f32 where transformers computes in f32 tensors (the
// exponent arange(0, dim, 2) / dim, the power, the reciprocal and the llama3/yarn blends) and in double
// where it computes in Python floats (wavelength thresholds, correction range, mscale).
RopeFrequencies rope_frequencies(const ModelConfig& c) {
  const RopeConfig& r = c.rope;
  const int64_t dim = c.rotary_dim();
  const int64_t half = dim / 2;
  RopeFrequencies out;
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(dim);
    pos_freqs[static_cast<size_t>(j)] = std::pow(static_cast<float>(r.theta), e);
  }
  out.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) out.inv_freq[static_cast<size_t>(j)] = 1.0f / pos_freqs[static_cast<size_t>(j)];

  switch (r.type) {
    case RopeConfig::Type::Default: break;
    case RopeConfig::Type::Linear:
      for (float& v : out.inv_freq) v = v / static_cast<float>(r.factor);
      break;
    case RopeConfig::Type::Llama3: {
      const double old_ctx = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_ctx / r.low_freq_factor;
      const double high_wavelen = old_ctx / r.high_freq_factor;
      const float factor = static_cast<float>(r.factor);
      for (float& v : out.inv_freq) {
        const float wavelen = static_cast<float>(2 * M_PI) / v;
        const float llama = wavelen > static_cast<float>(low_wavelen) ? v / factor : v;
        const float smooth = (static_cast<float>(old_ctx) / wavelen - static_cast<float>(r.low_freq_factor)) /
                             static_cast<float>(r.high_freq_factor - r.low_freq_factor);
        const float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
        const bool medium = !(wavelen < static_cast<float>(high_wavelen)) && !(wavelen > static_cast<float>(low_wavelen));
        v = medium ? smoothed : llama;
      }
      break;
    }
    case RopeConfig::Type::Yarn: {
      const double factor = r.factor;
      const double original = static_cast<double>(r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                                                                           : c.max_position_embeddings);
      auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      double attention = 0;
      if (r.attention_factor) attention = *r.attention_factor;
      else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0)
        attention = get_mscale(factor, *r.mscale) / get_mscale(factor, *r.mscale_all_dim);
      else attention = get_mscale(factor, 1.0);
      auto correction_dim = [&](double rotations) {
        return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;
      for (int64_t j = 0; j < half; ++j) {
        const float pf = pos_freqs[static_cast<size_t>(j)];
        const float extrapolation = 1.0f / pf;
        const float interpolation = 1.0f / (static_cast<float>(factor) * pf);
        const float ramp = std::clamp((static_cast<float>(j) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
        const float extra_factor = 1.0f - ramp;
        out.inv_freq[static_cast<size_t>(j)] = interpolation * (1.0f - extra_factor) + extrapolation * extra_factor;
      }
      out.attention_scaling = static_cast<float>(attention);
      break;
    }
  }
  if (!r.freq_factors.empty()) {
    KILN_CHECK(static_cast<int64_t>(r.freq_factors.size()) == half, "rope: ", r.freq_factors.size(),
               " frequency factors for ", half, " frequencies");
    for (int64_t j = 0; j < half; ++j) out.inv_freq[static_cast<size_t>(j)] /= r.freq_factors[static_cast<size_t>(j)];
  }
  return out;
}

}  // namespace kiln::llm
