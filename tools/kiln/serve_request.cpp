// kiln serve's request validation (serve_request.h).
#include "serve_request.h"

#include <cmath>
#include <cstdint>

#include "kiln/error.h"

namespace kiln::cli {

HttpError bad_request(std::string message, std::string param) {
  return {400, std::move(message), std::move(param), "invalid_request_error"};
}

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond a double (e.g. 1e999): a 400 either way, not a 500.
    throw bad_request(str("the body is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw bad_request("the body must be a JSON object");
  return j;
}

std::optional<double> number(const json& j, const char* key, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) throw bad_request(str("'", key, "' must be a number"), key);
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) throw bad_request(str("'", key, "' must be in [", lo, ", ", hi, "], got ", v), key);
  return v;
}

std::optional<int64_t> integer(const json& j, const char* key, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number_integer() && !j[key].is_number_unsigned())
    throw bad_request(str("'", key, "' must be an integer"), key);
  const int64_t v = j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : j[key].get<int64_t>();
  if (v < lo || v > hi) throw bad_request(str("'", key, "' must be in [", lo, ", ", hi, "], got ", v), key);
  return v;
}

bool boolean(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw bad_request(str("'", key, "' must be a boolean"), key);
  return j[key].get<bool>();
}

namespace {

void check_model_name(const json& j, const std::string& id) {
  if (!j.contains("model") || j["model"].is_null()) return;
  if (!j["model"].is_string()) throw bad_request("'model' must be a string", "model");
  const std::string m = j["model"].get<std::string>();
  if (!m.empty() && m != id)
    throw HttpError{404, str("the model '", m, "' does not exist; this server serves '", id, "'"), "model",
                    "invalid_request_error"};
}

// A prompt's ids: text (tokenized) or an array of token ids.
std::vector<int64_t> prompt_ids(const json& p, const ServedModel& m, const char* field) {
  std::vector<int64_t> ids;
  if (p.is_string()) {
    if (!m.tokenizer) throw bad_request("this model has no tokenizer: give the prompt as token ids", field);
    try {
      for (int32_t t : m.tokenizer->encode(p.get<std::string>(), true)) ids.push_back(t);
    } catch (const Error& err) {
      throw bad_request(str("'", field, "': ", err.what()), field);
    }
  } else if (p.is_array()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.vocab_size)
        throw bad_request(str("'", field, "' must be a string or an array of token ids in [0, ", m.vocab_size, ")"), field);
      ids.push_back(t.get<int64_t>());
    }
  } else {
    throw bad_request(str("'", field, "' must be a string or an array of token ids"), field);
  }
  if (ids.empty()) throw bad_request(str("'", field, "' is empty"), field);
  return ids;
}

// The fields both endpoints share, for a prompt already turned into ids.
GenerationRequest generation(const json& j, std::vector<int64_t> prompt, const ServedModel& m, bool chat) {
  GenerationRequest r;
  if (j.contains("n") && !j["n"].is_null() && integer(j, "n", 1, 1) != 1) throw bad_request("only n = 1 is supported", "n");
  // logprobs: chat takes a boolean and top_logprobs (0..20); completions an integer (0..5), OpenAI's forms.
  if (chat) {
    const bool want = boolean(j, "logprobs", false);
    const std::optional<int64_t> top = integer(j, "top_logprobs", 0, 20);
    if (top && !want) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.top_logprobs = want ? top.value_or(0) : -1;
  } else {
    r.top_logprobs = integer(j, "logprobs", 0, 5).value_or(-1);
  }
  const int64_t ctx = m.max_context, room = ctx - static_cast<int64_t>(prompt.size());
  if (room < 1)
    throw bad_request(str("the prompt has ", prompt.size(), " tokens; the context holds ", ctx), chat ? "messages" : "prompt");
  const char* len_key = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const std::optional<int64_t> max_tokens = integer(j, len_key, 1, INT64_MAX);
  if (max_tokens && *max_tokens > room)
    throw bad_request(str("'", len_key, "' (", *max_tokens, ") exceeds the room the context leaves after the prompt (", ctx,
                          " - ", prompt.size(), " = ", room, ")"),
                      len_key);
  r.options.max_new_tokens = max_tokens.value_or(chat ? room : std::min<int64_t>(16, room));
  r.options.sampling.temperature = number(j, "temperature", 0, 100).value_or(1.0);
  r.options.sampling.top_p = number(j, "top_p", 0, 1).value_or(1.0);
  r.options.sampling.top_k = integer(j, "top_k", 0, INT32_MAX).value_or(0);
  r.options.sampling.min_p = number(j, "min_p", 0, 1).value_or(0.0);
  r.options.seed = static_cast<uint64_t>(integer(j, "seed", INT64_MIN, INT64_MAX).value_or(0));
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) r.stop.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 4) {
      for (const json& x : s) {
        if (!x.is_string()) throw bad_request("'stop' must be a string or an array of up to 4 strings", "stop");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or an array of up to 4 strings", "stop");
    }
    for (const auto& x : r.stop)
      if (x.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (!boolean(j, "ignore_eos", false)) r.options.stop_ids = m.eos_token_ids;
  r.prompt = std::move(prompt);
  r.stream = boolean(j, "stream", false);
  r.include_usage = j.contains("stream_options") && j["stream_options"].is_object() &&
                    boolean(j["stream_options"], "include_usage", false);
  return r;
}

}  // namespace

GenerationRequest completion_request(const json& j, const ServedModel& m) {
  check_model_name(j, m.id);
  if (!j.contains("prompt")) throw bad_request("'prompt' is required", "prompt");
  return generation(j, prompt_ids(j["prompt"], m, "prompt"), m, false);
}

GenerationRequest chat_request(const json& j, const ServedModel& m) {
  check_model_name(j, m.id);
  if (!m.chat) throw bad_request("this model has no chat template: use /v1/completions");
  if (!j.contains("messages")) throw bad_request("'messages' is required", "messages");
  std::vector<ChatMessage> messages;
  try {
    messages = parse_chat_messages(j["messages"].dump());
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  if (messages.empty()) throw bad_request("'messages' is empty", "messages");
  std::string text;
  try {
    text = m.chat->render(messages);
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  if (!m.tokenizer) throw bad_request("this model has no tokenizer");
  std::vector<int64_t> ids;
  for (int32_t t : m.tokenizer->encode(text, false)) ids.push_back(t);
  if (ids.empty()) throw bad_request("the conversation renders to no tokens", "messages");
  return generation(j, std::move(ids), m, true);
}

}  // namespace kiln::cli
