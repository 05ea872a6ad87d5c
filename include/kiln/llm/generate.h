// Text generation over a Model: prefill the prompt, then decode token by token until max_new_tokens or a
// stop id; tokens are handed to a callback as they are sampled (streaming).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/llm/model.h"

namespace kiln::llm {

// Speculative decoding: a drafter proposes up to num_draft tokens after the last one, the model runs the last
// token and the drafts in one verify step (Model::verify), keeps the longest run of drafts it agrees with and
// adds one token of its own, so each step makes 1 to num_draft + 1 tokens. Exact: greedy output is the model's
// plain greedy output; sampled output has the model's distribution (a draft x drawn from the drafter's q is
// kept with probability min(1, p(x) / q(x)); a rejected one is replaced by a draw from max(0, p - q)
// renormalised, where p and q are the distributions sample() draws from: Leviathan et al., 2023), though not
// the same tokens as plain sampling with the same seed. Where the drafter has nothing to propose, the step is a
// plain decode step.
struct SpeculativeOptions {
  // Prompt lookup: the drafts are the tokens that followed the latest earlier occurrence of the context's last
  // n tokens, for the largest n <= lookup that occurs (q puts all its mass on the draft). 0: off.
  int64_t lookup = 0;
  // A draft model with the same vocabulary (a smaller checkpoint sharing the tokenizer) decodes the drafts; its
  // cache follows the accepted tokens. Null: off. At most one of lookup and draft.
  Model* draft = nullptr;
  int64_t num_draft = 4;  // tokens proposed per step, 1..15
  bool enabled() const { return lookup > 0 || draft != nullptr; }
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;  // temperature 0: greedy
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;           // generation ends after one of these is sampled (it is returned)
  // Called with every generated token, in order; returning false ends generation after that token.
  std::function<bool(int64_t)> on_token;
  SpeculativeOptions speculative;  // off by default
};

struct GenerateStats {
  int64_t prompt_tokens = 0, generated = 0;
  double prefill_seconds = 0;  // the prompt through the model and the first token sampled
  double decode_seconds = 0;   // the remaining generated tokens
  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 && generated > 1 ? (generated - 1) / decode_seconds : 0; }
  // Speculative decoding: verify steps run, drafts proposed and drafts accepted (plain steps are not counted).
  int64_t verify_steps = 0, drafted = 0, accepted = 0;
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0; }
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
