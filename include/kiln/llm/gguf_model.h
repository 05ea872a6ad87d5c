// Models from GGUF files (llama.cpp's format): llama, qwen3 and qwen3moe architectures, any tensor type
// kiln/gguf.h reads. load_model (kiln/llm/model.h) takes a .gguf path where it takes a model directory; the
// weights are dequantised while loading (to f32, then the model's dtype), so a quantised file runs at the
// speed and memory of its dequantised model.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kiln/gguf.h"
#include "kiln/llm/config.h"
#include "kiln/llm/weights.h"

namespace kiln::llm {

// The model's config from the file's metadata ({arch}.block_count, .embedding_length, ...), checked as
// config.json is; bos/eos from the tokenizer's metadata.
ModelConfig gguf_model_config(const GgufFile& f);
// The file's tensors under their Hugging Face names (per-expert slices of the stacked expert tensors; Llama's
// q and k rows back in Hugging Face's order), dequantised to f32 when read.
std::unique_ptr<WeightSource> gguf_weight_source(GgufFile f, const ModelConfig& config);
// Bytes the file's tensors take once loaded on `device` with float weights in `dtype` (for the memory check
// before loading): the linear weights and experts kiln keeps in their blocks there at their stored size, the
// rest (the embedding included) converted to dtype.
int64_t gguf_weight_bytes(const GgufFile& f, DType dtype, Device device);

// Writes the Hugging Face checkpoint directory `dir` (f32, f16 or bf16 weights of a qwen3, qwen3moe or llama
// model) as the GGUF file `path`, in llama.cpp's names and layout (convert_hf_to_gguf.py's: Llama's q and k rows
// permuted, experts stacked per layer), with the config as {arch}.* metadata, the tokenizer.json and chat
// template as tokenizer.* metadata, and Llama 3's RoPE scaling as rope_freqs. `type`: f32, f16, bf16 (every
// matrix in that type), or q8_0, q4_0, q4_k: the layers' linear weights and MoE experts in that format (q4_k:
// Q8_0 where K is not a multiple of 256), the embedding and lm_head in Q8_0; norms, biases and the router in f32.
// Returns the tensors written per ggml type name.
std::map<std::string, int64_t> write_gguf_model(const std::string& dir, const std::string& path, const std::string& type);

}  // namespace kiln::llm
