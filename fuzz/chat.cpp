// Fuzz target: chat prompts (kiln/chat.h). The input is read both as tokenizer_config.json text (its
// chat_template) and as an OpenAI messages array; accepted messages render in both chat formats, every
// message's content appearing in the prompt.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz.h"
#include "kiln/chat.h"
#include "kiln/error.h"

int kiln_fuzz_chat(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)kiln::ChatTemplate::from_tokenizer_config(text, "fuzz-tokenizer_config.json");
  } catch (const kiln::Error&) {
  }
  try {
    (void)kiln::ChatTemplate::from_template_text(text, "fuzz-chat_template.jinja");
  } catch (const kiln::Error&) {
  }
  std::vector<kiln::ChatMessage> messages;
  try {
    messages = kiln::parse_chat_messages(text, "fuzz-messages");
  } catch (const kiln::Error&) {
    return 0;
  }
  for (auto format : {kiln::ChatTemplate::Format::ChatML, kiln::ChatTemplate::Format::Llama3}) {
    try {
      const std::string prompt = kiln::ChatTemplate(format).render(messages, true);
      for (const auto& m : messages) {
        if (format == kiln::ChatTemplate::Format::ChatML) KILN_FUZZ_CHECK(prompt.find(m.content) != std::string::npos);
      }
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_chat(data, size); }
#endif
