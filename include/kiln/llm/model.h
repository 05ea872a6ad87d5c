// The LLM engine: a decoder-only transformer (Qwen3, Qwen3-MoE, Llama) computed with kiln's ops, exactly
// as transformers computes it, on the CPU or one CUDA device, with a preallocated KV cache.
//
// Prefill runs the prompt through matrix products and causal attention; decode runs one token through the
// matrix-vector, grouped-expert and split-KV attention kernels. On CUDA the whole decode step (all layers,
// logits and sampling) is captured once as a graph: its inputs (the token, its position, the cache length)
// live in device buffers the step itself advances, so every replay is the next token and the host only reads
// the sampled id back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/llm/config.h"
#include "kiln/llm/weights.h"
#include "kiln/nn.h"
#include "kiln/runtime.h"

namespace kiln::llm {

struct ModelOptions {
  Device device = kCPU;
  // Activation and weight dtype (FP8 weights stay FP8). Default: bf16 on CUDA, f32 on the CPU.
  std::optional<DType> dtype;
  int64_t max_context = 4096;  // KV cache length (prompt + generated tokens)
  bool use_graph = true;       // CUDA: capture the decode step as a graph
  // "q8_0": the linear layers' float weights (lm_head included; K a multiple of 32) quantised to Q8_0 when the
  // model is made; "q4_0" / "q4_k": the layers' to Q4_0 / Q4_K (a layer whose K is not a multiple of 256: Q8_0),
  // lm_head to Q8_0 (docs/quantization.md); "": as loaded.
  std::string quant;
};

// Per-layer hidden states of one forward pass (for `kiln check`): the residual stream after each layer and
// the final logits, as f32 CPU tensors [T, H] / [T, V].
struct Trace {
  std::vector<Tensor> hidden;
  Tensor logits;
};

struct KVPool;  // a paged cache's pools and block allocator (src/llm/kv_cache.h)

// A sequence decoded together with others (kiln serve): its positions live in blocks of a paged KV cache
// (KVCache), taken as it grows and given back when it is destroyed. prefill(seq, ids) appends a prompt to it;
// step(seqs, tokens) runs one token of each of several sequences through the model at once (the matrix products
// read every weight once for all of them; one attention launch per layer reads every sequence's blocks through
// a block table; on CUDA the step is a captured graph per padded batch size). Move-only; it belongs to the model
// whose cache made it.
struct Sequence {
  int64_t position = 0;     // tokens in its cache
  int64_t max_context = 0;  // the most it may hold

  Sequence();
  ~Sequence();
  Sequence(Sequence&&) noexcept;
  Sequence& operator=(Sequence&&) noexcept;
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Internals (src/llm/kv_cache.cpp): the pool, the blocks held in position order, the tokens in the cache.
  std::shared_ptr<KVPool> pool;
  std::vector<int32_t> blocks;
  std::vector<int64_t> tokens;
};

// A paged KV cache shared by sequences: per layer, K and V pools of num_blocks() blocks of block_size()
// positions ([NB, S, Hkv, D]: kiln::paged_kv_append_ and paged_decode_attention read and write them). A block
// that a sequence has filled stays, once no sequence holds it, in a prefix cache: a new sequence whose prompt
// begins with the same tokens takes those blocks (reuse_prefix) instead of running their tokens again. Blocks
// are exact matches (the same tokens after the same earlier blocks), never approximate. A block no sequence
// holds is handed out again when needed, cached ones after free ones, least recently released first. A handle:
// copies share one cache. Not thread-safe (one engine thread drives it).
class KVCache {
 public:
  KVCache() = default;
  int64_t block_size() const;
  int64_t num_blocks() const;
  int64_t free_blocks() const;    // not held by any sequence (cached prefix blocks included)
  int64_t cached_blocks() const;  // held by no sequence, and holding a cached prefix
  int64_t bytes() const;          // of the pools, all layers

  // A new, empty sequence that may hold up to max_context tokens (blocks are taken as it grows).
  Sequence new_sequence(int64_t max_context) const;
  // For an empty sequence of this cache: takes the cached blocks that hold the longest whole-block prefix of
  // `prompt`, leaving at least its last token to run (its logits give the first new token). Returns the tokens
  // reused (seq.position after it).
  int64_t reuse_prefix(Sequence& seq, const std::vector<int64_t>& prompt) const;
  // Forgets every cached prefix (after a failed step, say, when the contents of blocks are in doubt).
  void clear_prefixes() const;

  std::shared_ptr<KVPool> pool;  // internals
};

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, const ModelOptions& options);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Device device() const { return options_.device; }
  DType dtype() const { return dtype_; }
  int64_t max_context() const { return options_.max_context; }
  int64_t position() const { return position_; }  // tokens in the cache

  // Clears the cache (the next prefill starts at position 0).
  void reset();

  // Runs `ids` (appended after the tokens already in the cache) and returns the f32 logits: of every new
  // position [T, V] when all_logits, else of the last one [V]. trace (optional) records hidden states.
  Tensor prefill(const std::vector<int64_t>& ids, bool all_logits = false, Trace* trace = nullptr);

  // Samples the next token from `logits` [V] (as prefill returns them) on the model's device.
  int64_t sample_first(const Tensor& logits, const SamplingParams& params, Generator* gen);

  // One decode step: feeds `token` (at position()) and returns the f32 logits [V] of the next position, on
  // the model's device. On CUDA with graphs, the first call after a prefill captures the step and later calls
  // replay it (the returned tensor is the graph's output buffer: valid until the next step).
  Tensor step(int64_t token);
  // step() then sample: the next token.
  int64_t decode(int64_t token, const SamplingParams& params, Generator* gen);
  // Up to n decode steps from `token` (sampled, not yet in the cache): each new token goes to on_token,
  // and decoding stops after n tokens or when on_token returns false. Returns the number of tokens made.
  // On CUDA with graphs, the step, its logits and its draw are one replay, and the next replay is enqueued
  // before the host reads the token back, so the GPU runs step after step without waiting for the host.
  // The draws are the Generator's stream (seed, offset), which advances by one per token returned.
  int64_t decode_n(int64_t token, int64_t n, const SamplingParams& params, Generator* gen,
                   const std::function<bool(int64_t)>& on_token);

  // Speculative decoding's verify step: runs `tokens` (the last sampled token and the drafts after it) at
  // position() and returns the f32 logits of each of them [T, V] on the model's device; the cache advances by T.
  // The same computation as a prefill that continues the cache (attention against the cache, bottom-right
  // causal). On CUDA with graphs, each T <= 16 is a captured graph whose inputs are written before each
  // replay (the logits are its buffer: valid until the next verify of the same T).
  Tensor verify(const std::vector<int64_t>& tokens);
  // Forgets the cache from `position` (<= position()) on: the next token fed goes there (after a verify, the
  // positions of the rejected drafts).
  void rewind(int64_t position);

  // A paged KV cache of num_blocks blocks of block_size positions (a power of two >= 16) for sequences of this
  // model, allocated on its device.
  KVCache new_kv_cache(int64_t num_blocks, int64_t block_size = 16) const;
  // A new, empty sequence with a paged cache of its own, large enough for max_context tokens.
  Sequence new_sequence(int64_t max_context) const;
  // Appends `ids` to the sequence's cache; returns the f32 logits [V] of the last new position.
  Tensor prefill(Sequence& seq, const std::vector<int64_t>& ids);
  // One token of each sequence (tokens[i] at seqs[i]->position); returns the f32 logits [B, V] of the next
  // positions. The sequences must be distinct and share one cache. A cache with too few blocks left throws
  // before anything runs (a sequence may keep a block it took). On CUDA with graphs, for a cache made by
  // new_kv_cache and at most 64 sequences, the step is a captured graph and the logits are its output buffer:
  // valid until the next step.
  Tensor step(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& tokens);

  // The batch sizes whose step(seqs, tokens) runs as a captured CUDA graph (padded sizes: 1, 2, 4, 8, 16, then
  // multiples of 16 up to 64, each captured when first needed); empty on the CPU or without graphs.
  std::vector<int64_t> step_graph_sizes() const;

  // Bytes of weights read per decoded token (the dense weights, plus top_k of E experts for MoE layers).
  int64_t bytes_per_token() const;

  struct State;  // the KV cache, RoPE tables and decode-step buffers (src/llm/model.cpp)

 private:
  Tensor forward(const Tensor& ids, int64_t start, bool all_logits, Trace* trace);
  Tensor forward_decode_step();
  void build_decode_buffers();
  bool graphs_enabled() const;
  void write_step_inputs(int64_t token, uint64_t rng_offset);
  bool ensure_graph(const SamplingParams& params, uint64_t seed);
  void check_decode(int64_t token, int64_t n) const;
  void quantize_linears(const std::string& format);
  void check_sequence(const Sequence& seq, const char* op, int64_t i, int64_t n) const;
  std::optional<Tensor> step_graph(KVPool& pool, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& tokens);

  ModelConfig config_;
  ModelWeights weights_;
  ModelOptions options_;
  DType dtype_;
  int64_t position_ = 0;
  std::unique_ptr<State> s_;
};

// Loads DIR (config.json, generation_config.json, safetensors), or a GGUF file (a path ending in .gguf; see
// kiln/llm/gguf_model.h), onto options.device.
Model load_model(const std::string& dir, const ModelOptions& options,
                 const std::function<void(int64_t, int64_t)>& progress = nullptr);

// Random weights at the real shapes of a known model (no download): qwen3-30b-a3b, qwen3-8b, qwen3-0.6b,
// llama-3-8b, each optionally with "-fp8" (block-quantised FP8 weights). Throws for an unknown name,
// listing the known ones.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();
// Weights drawn on the device directly (N(0, 0.02), norms near 1), in `dtype`, FP8 when the config says so.
ModelWeights random_weights(const ModelConfig& config, Device device, DType dtype, uint64_t seed = 0);

}  // namespace kiln::llm
