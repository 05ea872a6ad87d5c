// Text generation over a Model: prefill the prompt, then decode token by token until max_new_tokens or a
// stop id; tokens are handed to a callback as they are sampled (streaming).
#pragma once

#include <cmath>
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

// Perplexity of `ids` under the model: the text cut into consecutive windows of `window` tokens (the last may
// be shorter), each run from an empty cache; every token but a window's first is predicted from the ones
// before it in its window. exp(mean negative log-likelihood), summed in double.
struct Perplexity {
  double nll_sum = 0;       // nats
  int64_t predicted = 0;    // tokens scored
  double value() const { return predicted > 0 ? std::exp(nll_sum / static_cast<double>(predicted)) : 0.0; }
};
Perplexity perplexity(Model& model, const std::vector<int64_t>& ids, int64_t window);

}  // namespace kiln::llm
