// The engine's commands: kiln generate, logits, check, and `kiln bench -m DIR | --preset NAME`.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "kiln/llm/model.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

struct LlmOptions {
  std::string model, preset, device = "auto", dtype, quant;
  bool no_graph = false;
  std::string prompt, prompt_ids, out, json, file;
  std::string reference;  // kiln perplexity: another implementation's result (JSON with "perplexity") to compare with
  int64_t n = 128, ctx = 0, top_k = 20, pp = 512, tg = 128;
  int repeats = 3;
  double temp = 0.7, top_p = 0.95, min_p = 0.0;
  uint64_t seed = 0;
  bool ids_only = false, chat = false, ignore_eos = false;
  // Speculative decoding (kiln generate): prompt lookup's n-gram, or a draft model's directory; drafts per step.
  int64_t lookup = 0, num_draft = 4;
  std::string draft;
  // kiln bench: decode after prompts of these lengths; verify steps of k + 1 positions for these k.
  std::string contexts, verify;
  CLI::App *generate = nullptr, *logits = nullptr, *check = nullptr, *bench = nullptr, *perplexity = nullptr;
};

// Registers generate, logits and check on `app`, and the model benchmark's options on `bench`.
void add_llm_commands(CLI::App& app, CLI::App& bench, LlmOptions& options);
// Runs the command that was given, if it is one of these.
std::optional<int> run_llm_commands(const LlmOptions& options);
// --device's value (cpu, cuda, cuda:N, auto) as a Device.
Device device_of(const std::string& s);
// The model of -m DIR or --preset NAME (random weights) on `dev`, with a KV cache of `ctx` tokens.
llm::Model open_model_for(const LlmOptions& options, Device dev, int64_t ctx);
// The tokenizer of a model directory (its tokenizer.json) or GGUF file, when it has one.
std::optional<Tokenizer> model_tokenizer(const std::string& model);

}  // namespace kiln::cli
