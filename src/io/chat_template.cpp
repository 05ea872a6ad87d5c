// Chat templates by family and OpenAI message lists (include/kiln/chat.h).
#include "kiln/chat.h"

#include <filesystem>

#include "io/json_strict.h"
#include "kiln/error.h"
#include "kiln/gguf.h"

namespace kiln {

using nlohmann::json;

namespace {

// tokenizer_config.json files carry the added tokens' table: a few MB at most in real checkpoints.
constexpr size_t kMaxConfigBytes = size_t{64} << 20;
constexpr size_t kMaxTemplateBytes = size_t{4} << 20;

// Jinja's trim (Python's str.strip) on the ASCII whitespace the Llama 3 template's contents carry.
std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

std::string json_kind(const json& j) { return j.type_name(); }

}  // namespace

const char* ChatTemplate::format_name() const { return format_ == Format::ChatML ? "chatml" : "llama3"; }

ChatTemplate ChatTemplate::from_template_text(std::string_view text, const std::string& origin) {
  if (text.find("<|im_start|>") != std::string_view::npos) return ChatTemplate(Format::ChatML);
  if (text.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate(Format::Llama3);
  throw Error(str(origin, ": the chat template is of no family kiln renders (ChatML with <|im_start|>, as Qwen's, "
                  "or Llama 3's with <|start_header_id|>)"));
}

ChatTemplate ChatTemplate::from_tokenizer_config(std::string_view text, const std::string& origin) {
  const json j = io::parse_json_strict(text, origin);
  KILN_CHECK(j.is_object(), origin, ": expected a JSON object, got ", json_kind(j));
  const auto it = j.find("chat_template");
  KILN_CHECK(it != j.end() && !it->is_null(), origin, ": no chat_template field (the checkpoint has no chat format)");
  if (it->is_string()) return from_template_text(it->get_ref<const std::string&>(), origin + ": chat_template");
  KILN_CHECK(it->is_array(), origin, ": chat_template must be a string or a list of {name, template}, got ",
             json_kind(*it));
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = str(origin, ": chat_template[", i, "]");
    KILN_CHECK(e.is_object(), where, ": expected an object, got ", json_kind(e));
    const auto name = e.find("name"), tmpl = e.find("template");
    KILN_CHECK(name != e.end() && name->is_string(), where, ": missing string field 'name'");
    KILN_CHECK(tmpl != e.end() && tmpl->is_string(), where, ": missing string field 'template'");
    if (name->get_ref<const std::string&>() == "default")
      return from_template_text(tmpl->get_ref<const std::string&>(), where);
  }
  throw Error(str(origin, ": chat_template lists no template named 'default'"));
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  if (is_gguf_file(dir)) {
    const std::optional<std::string> t = gguf_chat_template(GgufFile::open(dir));
    KILN_CHECK(t.has_value(), dir, ": the GGUF file has no tokenizer.chat_template");
    return from_template_text(*t, dir + " (tokenizer.chat_template)");
  }
  const std::string jinja = dir + "/chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::is_regular_file(jinja, ec)) return from_template_text(io::read_text_file(jinja, kMaxTemplateBytes), jinja);
  const std::string cfg = dir + "/tokenizer_config.json";
  return from_tokenizer_config(io::read_text_file(cfg, kMaxConfigBytes), cfg);
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  KILN_CHECK(!messages.empty(), "chat template: no messages");
  std::string out;
  if (format_ == Format::Llama3) out += "<|begin_of_text|>";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    KILN_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat template: message ", i,
               " has role '", m.role, "' (expected system, user or assistant)");
    KILN_CHECK(m.role != "system" || i == 0, "chat template: message ", i,
               " is a system message; only the first message may be one");
    if (format_ == Format::ChatML) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
      out += trim(m.content);
      out += "<|eot_id|>";
    }
  }
  if (add_generation_prompt)
    out += format_ == Format::ChatML ? "<|im_start|>assistant\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::vector<ChatMessage> parse_chat_messages(std::string_view text, const std::string& origin) {
  const json j = io::parse_json_strict(text, origin);
  KILN_CHECK(j.is_array(), origin, ": expected a list of messages, got ", json_kind(j));
  std::vector<ChatMessage> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const json& m = j[i];
    const std::string where = str(origin, "[", i, "]");
    KILN_CHECK(m.is_object(), where, ": expected an object, got ", json_kind(m));
    const auto role = m.find("role");
    KILN_CHECK(role != m.end() && role->is_string(), where, ": missing string field 'role'");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    // OpenAI's "developer" role is its newer name for the system message.
    if (msg.role == "developer") msg.role = "system";
    KILN_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant", where, ": role '", msg.role,
               "' is not supported (system, developer, user or assistant)");
    const auto content = m.find("content");
    KILN_CHECK(content != m.end(), where, ": missing field 'content'");
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pw = str(where, ".content[", k, "]");
        KILN_CHECK(part.is_object(), pw, ": expected an object, got ", json_kind(part));
        const auto type = part.find("type"), t = part.find("text");
        KILN_CHECK(type != part.end() && type->is_string() && type->get_ref<const std::string&>() == "text", pw,
                   ": only parts of type 'text' are supported");
        KILN_CHECK(t != part.end() && t->is_string(), pw, ": missing string field 'text'");
        msg.content += t->get_ref<const std::string&>();
      }
    } else {
      KILN_CHECK(content->is_null() && msg.role == "assistant", where,
                 ": content must be a string or a list of text parts, got ", json_kind(*content));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace kiln
