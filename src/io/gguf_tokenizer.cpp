// The tokenizer of a GGUF file, as the tokenizer.json transformers would hold for it: llama.cpp's
// converters store a byte-level BPE tokenizer as tokenizer.ggml.{model = "gpt2", pre, tokens, token_type,
// merges, bos/eos ids, add_bos_token}; the pre-tokenizer's regex follows from `pre` (the names llama.cpp gives
// the regexes of the model families kiln runs). The text goes through Tokenizer::from_json, so every check of
// that parser applies.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "kiln/gguf.h"

namespace kiln {

namespace {

using json = nlohmann::json;

const GgufValue* find(const GgufFile& f, const std::string& key) {
  const auto it = f.metadata().find(key);
  return it == f.metadata().end() ? nullptr : &it->second;
}

// The split regex of each pre-tokenizer name (llama.cpp's llama-vocab names).
std::optional<std::string> pre_regex(const std::string& pre) {
  if (pre == "qwen2" || pre == "deepseek-r1-qwen")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre == "gpt-2" || pre == "gpt2" || pre == "default")
    return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return std::nullopt;
}

}  // namespace

std::string gguf_tokenizer_json(const GgufFile& f) {
  const std::string& src = f.path();
  const GgufValue* model = find(f, "tokenizer.ggml.model");
  KILN_CHECK(model != nullptr, src, ": no tokenizer (tokenizer.ggml.model is absent)");
  KILN_CHECK(model->type == GgufValue::Type::String && model->as_string() == "gpt2", src, ": tokenizer.ggml.model is \"",
             model->type == GgufValue::Type::String ? model->as_string() : std::string("not a string"),
             "\"; kiln reads byte-level BPE tokenizers (\"gpt2\") from GGUF files");
  const GgufValue* tokens = find(f, "tokenizer.ggml.tokens");
  const GgufValue* merges = find(f, "tokenizer.ggml.merges");
  KILN_CHECK(tokens && tokens->type == GgufValue::Type::Array, src, ": tokenizer.ggml.tokens is absent or not an array");
  KILN_CHECK(merges && merges->type == GgufValue::Type::Array, src, ": tokenizer.ggml.merges is absent or not an array");
  const GgufValue* types = find(f, "tokenizer.ggml.token_type");
  const std::vector<GgufValue>& toks = tokens->as_array();
  KILN_CHECK(!types || (types->type == GgufValue::Type::Array && types->as_array().size() == toks.size()), src,
             ": tokenizer.ggml.token_type must be an array as long as tokenizer.ggml.tokens (", toks.size(), ")");
  std::string pre = "default";
  if (const GgufValue* p = find(f, "tokenizer.ggml.pre")) {
    KILN_CHECK(p->type == GgufValue::Type::String, src, ": tokenizer.ggml.pre must be a string");
    pre = p->as_string();
  }
  const std::optional<std::string> regex = pre_regex(pre);
  KILN_CHECK(regex.has_value(), src, ": the pre-tokenizer \"", pre,
             "\" is not one kiln knows (qwen2, llama-bpe, gpt-2 / default)");

  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < toks.size(); ++i) {
    KILN_CHECK(toks[i].type == GgufValue::Type::String, src, ": tokenizer.ggml.tokens[", i, "] is not a string");
    const std::string& t = toks[i].as_string();
    const int64_t type = types ? types->as_array()[i].as_int() : 1;
    // 3: control, 4: user-defined (ggml's token types): matched whole in the text, as added tokens.
    if (type == 3 || type == 4)
      added.push_back({{"id", i}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type == 4}, {"special", type == 3}});
    vocab[t] = i;
  }
  json merge_list = json::array();
  for (size_t i = 0; i < merges->as_array().size(); ++i) {
    const GgufValue& m = merges->as_array()[i];
    KILN_CHECK(m.type == GgufValue::Type::String, src, ": tokenizer.ggml.merges[", i, "] is not a string");
    merge_list.push_back(m.as_string());
  }
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json tj = {{"version", "1.0"},
             {"truncation", nullptr},
             {"padding", nullptr},
             {"added_tokens", added},
             {"normalizer", pre == "qwen2" ? json{{"type", "NFC"}} : json(nullptr)},
             {"pre_tokenizer",
              {{"type", "Sequence"},
               {"pretokenizers",
                json::array({{{"type", "Split"}, {"pattern", {{"Regex", *regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                             byte_level})}}},
             {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
             {"model",
              {{"type", "BPE"},
               {"dropout", nullptr},
               {"unk_token", nullptr},
               {"continuing_subword_prefix", nullptr},
               {"end_of_word_suffix", nullptr},
               {"fuse_unk", false},
               {"byte_fallback", false},
               {"ignore_merges", pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe"},
               {"vocab", vocab},
               {"merges", merge_list}}}};
  // add_bos_token: the BOS token before every encoded text (TemplateProcessing, as Llama 3's tokenizer.json).
  const GgufValue* add_bos = find(f, "tokenizer.ggml.add_bos_token");
  const GgufValue* bos = find(f, "tokenizer.ggml.bos_token_id");
  if (add_bos && add_bos->type == GgufValue::Type::Bool && std::get<bool>(add_bos->value) && bos) {
    const int64_t id = bos->as_int();
    KILN_CHECK(id >= 0 && id < static_cast<int64_t>(toks.size()), src, ": tokenizer.ggml.bos_token_id ", id,
               " is outside the vocabulary");
    const std::string& b = toks[static_cast<size_t>(id)].as_string();
    tj["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{b, {{"id", b}, {"ids", json::array({id})}, {"tokens", json::array({b})}}}}}};
  } else {
    tj["post_processor"] = nullptr;
  }
  try {
    return tj.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    throw Error(str(src, ": a token or merge of the tokenizer is not valid UTF-8"));
  }
}

std::optional<std::string> gguf_pre_tokenizer_name(const std::string& regex) {
  for (const char* name : {"qwen2", "llama-bpe", "gpt-2"})
    if (pre_regex(name) == regex) return std::string(name);
  return std::nullopt;
}

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 && std::filesystem::is_regular_file(path, ec);
}

std::optional<std::string> gguf_chat_template(const GgufFile& f) {
  const GgufValue* t = find(f, "tokenizer.chat_template");
  if (!t) return std::nullopt;
  KILN_CHECK(t->type == GgufValue::Type::String, f.path(), ": tokenizer.chat_template must be a string");
  return t->as_string();
}

}  // namespace kiln
