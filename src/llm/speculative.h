// Speculative decoding's loop (kiln/llm/generate.h: SpeculativeOptions), used by generate().
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/llm/generate.h"

namespace kiln::llm {

// Decodes up to n tokens after `token` (sampled, not yet in the model's cache; `context` holds the prompt and
// every token generated so far, `token` last) with the drafter of `spec`. Each new token goes to emit, which
// returns false to stop. Returns the number of tokens emitted; counts the verify steps, drafts and acceptances
// in `stats`.
int64_t decode_speculative(Model& model, std::vector<int64_t> context, int64_t token, int64_t n,
                           const SamplingParams& params, Generator& gen, const SpeculativeOptions& spec,
                           const std::function<bool(int64_t)>& emit, GenerateStats& stats);

// Throws for options decode_speculative refuses (num_draft outside [1, 15], both drafters, a draft model
// with another vocabulary).
void check_speculative(const Model& model, const SpeculativeOptions& spec);

// Prompt lookup: up to k tokens that followed the latest earlier occurrence of the last n tokens of `context`,
// for the largest n <= max_ngram with one; empty when none occurs.
std::vector<int64_t> lookup_drafts(const std::vector<int64_t>& context, int64_t max_ngram, int64_t k);

}  // namespace kiln::llm
