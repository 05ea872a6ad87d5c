// Text generation over a Model: prefill the prompt, then decode token by token until max_new_tokens or a
// stop id; tokens are handed to a callback as they are sampled (streaming).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/llm/model.h"

namespace kiln::llm {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;  // temperature 0: greedy
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;           // generation ends after one of these is sampled (it is returned)
  // Called with every generated token, in order; returning false ends generation after that token.
  std::function<bool(int64_t)> on_token;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated = 0;
  double prefill_seconds = 0;  // the prompt through the model and the first token sampled
  double decode_seconds = 0;   // the remaining generated tokens
  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 && generated > 1 ? (generated - 1) / decode_seconds : 0; }
};

// Generates after `prompt` (the model's cache is reset first). Returns the generated ids.
std::vector<int64_t> generate(Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& options,
                              GenerateStats* stats = nullptr);

}  // namespace kiln::llm
