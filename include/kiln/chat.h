// Chat prompts: a checkpoint's chat template and OpenAI-style message lists. Both come from outside
// (tokenizer_config.json or chat_template.jinja in a model directory, a request body) and are untrusted:
// anything malformed is a kiln::Error naming the file or field, never a crash.
//
// kiln does not interpret Jinja. It recognises the template's family by the special tokens the template
// writes and renders that family's layout:
//   ChatML (Qwen2, Qwen2.5, Qwen3):  <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//   Llama 3:  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
// A template's extras (a default system prompt, tool definitions, Qwen3's empty think block when thinking
// is off) are not reproduced.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;  // UTF-8 text
};

class ChatTemplate {
 public:
  enum class Format { ChatML, Llama3 };

  explicit ChatTemplate(Format format) : format_(format) {}

  // The template of a model directory: DIR/chat_template.jinja when present (where recent transformers
  // versions save it), else the chat_template field of DIR/tokenizer_config.json; for a GGUF file, its
  // tokenizer.chat_template.
  static ChatTemplate from_model_dir(const std::string& dir);
  // The chat_template field of tokenizer_config.json text: a string, or a list of {"name", "template"}
  // objects (the one named "default" is used). `origin` names the file in errors.
  static ChatTemplate from_tokenizer_config(std::string_view json, const std::string& origin);
  // A template's text (Jinja source), recognised by its special tokens.
  static ChatTemplate from_template_text(std::string_view text, const std::string& origin);

  Format format() const { return format_; }
  const char* format_name() const;

  // The prompt for `messages`, ending with the assistant's header when add_generation_prompt is set.
  // Roles are system, user or assistant; a system message may come first only.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt = true) const;

 private:
  Format format_;
};

// An OpenAI chat "messages" array: [{"role": "...", "content": "..." | [{"type": "text", "text": "..."}]}].
// Content given as parts is joined; parts of another type, unknown roles and missing fields are errors
// naming the message.
std::vector<ChatMessage> parse_chat_messages(std::string_view json, const std::string& origin = "messages");

}  // namespace kiln
