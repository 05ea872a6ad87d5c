// `kiln serve`: an OpenAI-compatible HTTP server (tools/kiln/serve.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "llm.h"

namespace kiln::cli {

struct ServeOptions {
  std::string host = "127.0.0.1";  // loopback unless asked
  int port = 8080;
  int64_t ctx = 4096;              // the KV cache: prompt + generated tokens of one request
  std::string api_key;             // when set, every endpoint but /health wants "Authorization: Bearer KEY"
  int64_t max_batch = 8;           // sequences decoded together
  int64_t kv_tokens = 0;           // positions of the paged KV cache the requests share (0: max_batch x ctx)
  int64_t prefill_chunk = 512;     // prompt tokens run between two decode steps of the batch
  int64_t max_queue = 64;          // requests waiting beyond these get a 429
  size_t max_body = 1 << 20;       // bytes of a request body (413 above)
};

int run_serve(const ServeOptions& options, const LlmOptions& model_options);

}  // namespace kiln::cli
