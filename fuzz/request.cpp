// Fuzz target: `kiln serve`'s request bodies (tools/kiln/serve_request.h). The input is one body for both
// generation endpoints, against a served model with Qwen2's tokenizer (tests/data/tokenizers), the ChatML
// template and a context of 256: every rejection is a 400 or a 404, and every accepted request is one the engine
// can run (a prompt of valid ids that leaves room for its tokens, sampling settings in range, at most 4 stop
// strings, none empty).
#include <cmath>
#include <string>

#include "fuzz.h"
#include "kiln/error.h"
#include "serve_request.h"

namespace {

using kiln::cli::GenerationRequest;
using kiln::cli::ServedModel;

struct Served {
  kiln::Tokenizer tok = kiln::Tokenizer::from_file(std::string(KILN_FUZZ_TOKENIZER_DIR) + "/qwen2.json");
  kiln::ChatTemplate chat{kiln::ChatTemplate::Format::ChatML};
  ServedModel model;
  Served() {
    model.id = "fuzz-model";
    model.vocab_size = tok.vocab_size();
    model.max_context = 256;
    model.eos_token_ids = {0};
    model.tokenizer = &tok;
    model.chat = &chat;
  }
};

void check(const GenerationRequest& r, const ServedModel& m) {
  const auto n = static_cast<int64_t>(r.prompt.size());
  KILN_FUZZ_CHECK(n >= 1 && n < m.max_context);
  for (int64_t id : r.prompt) KILN_FUZZ_CHECK(id >= 0 && id < m.vocab_size);
  KILN_FUZZ_CHECK(r.options.max_new_tokens >= 1 && n + r.options.max_new_tokens <= m.max_context);
  const auto& s = r.options.sampling;
  KILN_FUZZ_CHECK(std::isfinite(s.temperature) && s.temperature >= 0 && s.temperature <= 100);
  KILN_FUZZ_CHECK(s.top_p >= 0 && s.top_p <= 1 && s.min_p >= 0 && s.min_p <= 1 && s.top_k >= 0);
  KILN_FUZZ_CHECK(r.stop.size() <= 4);
  for (const auto& x : r.stop) KILN_FUZZ_CHECK(!x.empty());
  KILN_FUZZ_CHECK(r.top_logprobs >= -1 && r.top_logprobs <= 20);
}

}  // namespace

int kiln_fuzz_request(const uint8_t* data, size_t size) {
  static const Served served;  // loaded once: a missing or broken tokenizer file throws here and stops the run
  const std::string body(reinterpret_cast<const char*>(data), size);
  kiln::cli::json j;
  try {
    j = kiln::cli::parse_body(body);
  } catch (const kiln::cli::HttpError& e) {
    KILN_FUZZ_CHECK(e.status == 400);
    return 0;
  }
  for (bool chat : {false, true}) {
    try {
      check(chat ? kiln::cli::chat_request(j, served.model) : kiln::cli::completion_request(j, served.model), served.model);
    } catch (const kiln::cli::HttpError& e) {
      KILN_FUZZ_CHECK(e.status == 400 || e.status == 404);
    } catch (const kiln::Error&) {
      // the server answers these 400 too (tools/kiln/serve.cpp)
    }
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_request(data, size); }
#endif
