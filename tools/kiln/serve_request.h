// The validation of `kiln serve`'s request bodies (tools/kiln/serve.cpp), apart from the server and the model so
// that a fuzz target (fuzz/request.cpp) reaches it: JSON parsed strictly, every field's type and range checked,
// errors in OpenAI's shape (a 400 naming the field, 404 for an unknown model).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/chat.h"
#include "kiln/llm/generate.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

using json = nlohmann::json;

struct HttpError {
  int status;
  std::string message, param, type;
};
HttpError bad_request(std::string message, std::string param = "");

// The body as a JSON object (else a 400).
json parse_body(const std::string& body);
// An optional field of j: absent or null gives nullopt (or the fallback); a wrong type or a value outside [lo, hi]
// is a 400 naming it.
std::optional<double> number(const json& j, const char* key, double lo, double hi);
std::optional<int64_t> integer(const json& j, const char* key, int64_t lo, int64_t hi);
bool boolean(const json& j, const char* key, bool fallback);

// What validating a request needs of the model being served.
struct ServedModel {
  std::string id;
  int64_t vocab_size = 0, max_context = 0;
  std::vector<int64_t> eos_token_ids;
  const Tokenizer* tokenizer = nullptr;  // none: prompts as token ids only
  const ChatTemplate* chat = nullptr;    // none: no /v1/chat/completions
};

// A validated generation request: the prompt's ids (1 <= size < max_context, each id < vocab_size), sampling and
// length (1 <= max_new_tokens <= max_context - prompt size), stop strings (at most 4, none empty), logprobs (-1:
// none, else the alternatives per token) and the stream flags.
struct GenerationRequest {
  std::vector<int64_t> prompt;
  llm::GenerateOptions options;
  std::vector<std::string> stop;
  int64_t top_logprobs = -1;
  bool stream = false, include_usage = false;
};

// POST /v1/completions and /v1/chat/completions bodies.
GenerationRequest completion_request(const json& j, const ServedModel& m);
GenerationRequest chat_request(const json& j, const ServedModel& m);

}  // namespace kiln::cli
