// Models from GGUF files (llama.cpp's format): llama, qwen3 and qwen3moe architectures, any tensor type
// kiln/gguf.h reads. load_model (kiln/llm/model.h) takes a .gguf path where it takes a model directory; the
// weights are dequantised while loading (to f32, then the model's dtype), so a quantised file runs at the
// speed and memory of its dequantised model.
#pragma once

#include <memory>

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
// Elements of all the file's tensors (for the memory check before loading).
int64_t gguf_weight_elements(const GgufFile& f);

}  // namespace kiln::llm
