// Chat prompts (kiln/chat.h): template families from tokenizer_config.json / chat_template.jinja, the
// rendered layouts, and OpenAI message lists, valid and malformed.
#include "kiln/chat.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;

// Qwen3's template opening and Llama 3.1's, shortened: kiln reads only the special tokens they write.
const char* kQwenTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
const char* kLlamaTemplate =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}";

TEST(ChatTemplate, RecognisesTheFamilyFromTokenizerConfig) {
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(json{{"chat_template", kQwenTemplate}}.dump(), "t").format(),
            ChatTemplate::Format::ChatML);
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(json{{"chat_template", kLlamaTemplate}}.dump(), "t").format(),
            ChatTemplate::Format::Llama3);
  const json listed = {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "x"}},
                                                      {{"name", "default"}, {"template", kLlamaTemplate}}})}};
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(listed.dump(), "t").format(), ChatTemplate::Format::Llama3);
}

TEST(ChatTemplate, RendersChatMLAsQwen) {
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Why?"}};
  EXPECT_EQ(ChatTemplate(ChatTemplate::Format::ChatML).render(m),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate(ChatTemplate::Format::ChatML).render(std::vector<ChatMessage>{{"user", "x"}}, false),
            "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, RendersLlama3WithBosAndTrimmedContent) {
  const std::vector<ChatMessage> m = {{"user", "  Hi there \n"}};
  EXPECT_EQ(ChatTemplate(ChatTemplate::Format::Llama3).render(m),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ModelDirPrefersChatTemplateJinja) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln-chat-" + std::to_string(test::rng()()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << json{{"chat_template", kQwenTemplate}}.dump();
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.string()).format(), ChatTemplate::Format::ChatML);
  std::ofstream(dir / "chat_template.jinja") << kLlamaTemplate;
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.string()).format(), ChatTemplate::Format::Llama3);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(test::throws_error([&] { ChatTemplate::from_model_dir(dir.string()); }, {"tokenizer_config.json"}));
}

TEST(ChatTemplate, BadConfigsAreErrorsNamingTheField) {
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config("{}", "tc.json"); }, {"tc.json", "no chat_template"}));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config("[1]", "tc.json"); }, {"expected a JSON object"}));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config("{\"chat_template\": 3}", "tc.json"); },
                                 {"must be a string or a list"}));
  EXPECT_TRUE(test::throws_error(
      [] { ChatTemplate::from_tokenizer_config(R"({"chat_template": [{"name": "rag", "template": "x"}]})", "tc.json"); },
      {"no template named 'default'"}));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config(R"({"chat_template": "{{ messages }}"})", "tc.json"); },
                                 {"of no family kiln renders"}));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config(R"({"chat_template": "a", "chat_template": "b"})", "tc.json"); },
                                 {"tc.json"}));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate::from_tokenizer_config("{\"chat_template\": \"\xff\"}", "tc.json"); },
                                 {"tc.json"}));
}

TEST(ChatMessages, ParsesOpenAiMessages) {
  const auto m = parse_chat_messages(R"([{"role": "developer", "content": "Rules."},
      {"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text", "text": "parts"}], "name": "u"},
      {"role": "assistant", "content": null}])");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[0].content, "Rules.");
  EXPECT_EQ(m[1].content, "Two parts");
  EXPECT_EQ(m[2].role, "assistant");
  EXPECT_EQ(m[2].content, "");
}

TEST(ChatMessages, MalformedMessagesAreErrorsNamingTheMessage) {
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages("{}"); }, {"expected a list of messages"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages("[3]"); }, {"messages[0]", "expected an object"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages(R"([{"content": "x"}])"); }, {"messages[0]", "'role'"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages(R"([{"role": "tool", "content": "x"}])"); },
                                 {"role 'tool' is not supported"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages(R"([{"role": "user"}])"); }, {"missing field 'content'"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages(R"([{"role": "user", "content": null}])"); },
                                 {"content must be a string"}));
  EXPECT_TRUE(test::throws_error(
      [] { parse_chat_messages(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])"); },
      {"messages[0].content[0]", "only parts of type 'text'"}));
  EXPECT_TRUE(test::throws_error([] { parse_chat_messages("[" + std::string(100, '[') + std::string(100, ']') + "]"); },
                                 {"nested deeper"}));
}

TEST(ChatTemplate, RenderRejectsMisplacedSystemAndEmptyLists) {
  const ChatTemplate t(ChatTemplate::Format::ChatML);
  EXPECT_TRUE(test::throws_error([&] { t.render(std::vector<ChatMessage>{}); }, {"no messages"}));
  EXPECT_TRUE(test::throws_error([&] { t.render(std::vector<ChatMessage>{{"user", "a"}, {"system", "b"}}); },
                                 {"message 1", "only the first"}));
  EXPECT_TRUE(test::throws_error([&] { t.render(std::vector<ChatMessage>{{"robot", "a"}}); }, {"role 'robot'"}));
}

}  // namespace
}  // namespace kiln
