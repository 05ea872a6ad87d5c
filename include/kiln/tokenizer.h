// Hugging Face tokenizer.json: byte-level BPE (Qwen2/Qwen3, Llama 3, GPT-2 style), encoding and decoding
// exactly as the `tokenizers` library does. The file is untrusted input: anything malformed or unsupported
// is a kiln::Error naming the field, never a crash or a silent default.
//
// Supported: normalizer null / NFC / NFD / NFKC / NFKD / Sequence of them; pre_tokenizer Split (String or
// Regex pattern, any behaviour, invert) / ByteLevel (add_prefix_space, use_regex) / Sequence of them; model
// BPE (merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token, fuse_unk, byte_fallback);
// added tokens (lstrip, rstrip, single_word, normalized, special); post_processor null / ByteLevel /
// TemplateProcessing / BertProcessing / RobertaProcessing / Sequence of them; decoder null / ByteLevel /
// Sequence of ByteLevel.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json). Errors name the file and the field at fault.
  static Tokenizer from_file(const std::string& path);
  // Reads DIR/tokenizer.json of a Hugging Face model directory, or the tokenizer of a GGUF file (DIR ending in
  // .gguf; see kiln/gguf.h).
  static Tokenizer from_model_dir(const std::string& dir);
  // Parses tokenizer.json text; `origin` names it in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (UTF-8; invalid UTF-8 is an error naming the byte offset). add_special_tokens adds
  // what the post_processor adds (e.g. Llama 3's <|begin_of_text|>), as tokenizers' encode(text, True).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids` as tokenizers' decode(ids, skip_special_tokens): bytes that are not valid UTF-8 become
  // U+FFFD as Rust's String::from_utf8_lossy does; ids in no vocabulary are skipped, as tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the model vocabulary and the added tokens.
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
