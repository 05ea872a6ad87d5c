// `kiln quantize IN OUT --type q8_0|q4_0|q4_k`: a Hugging Face checkpoint directory rewritten as a GGUF file
// (OUT ending in .gguf: llm::write_gguf_model; also --type f32|f16|bf16), or as a directory with its layers'
// linear weights in a block format (docs/quantization.md): each such weight's packed values under its own name
// and (q8_0, q4_0) its f16 scales under name + "_scales", everything else as stored, config.json with
// quantization_config {"quant_method": "kiln", "format": TYPE}, and the tokenizer, generation config and chat
// template files copied. `kiln generate -m OUT` and load_model read it without a float copy
// of those weights.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "kiln/io.h"
#include "kiln/llm/gguf_model.h"
#include "kiln/llm/config.h"
#include "kiln/llm/weights.h"
#include "kiln/nn.h"
#include "kiln/ops.h"

namespace kiln::cli {

int run_quantize(const std::string& in, const std::string& out, const std::string& type) {
  namespace fs = std::filesystem;
  KILN_CHECK(fs::is_directory(in), "quantize: ", in, " is not a checkpoint directory");
  if (out.size() > 5 && out.compare(out.size() - 5, 5, ".gguf") == 0) {
    // A GGUF file in llama.cpp's layout (llm::write_gguf_model).
    const std::map<std::string, int64_t> counts = llm::write_gguf_model(in, out, type);
    std::cout << "kiln quantize: " << out << ": " << fs::file_size(out) / (1 << 20) << " MiB; tensors";
    for (const auto& [t, n] : counts) std::cout << " " << t << " x " << n;
    std::cout << "\n";
    return 0;
  }
  KILN_CHECK(type == "q8_0" || type == "q4_0" || type == "q4_k", "quantize: --type must be q8_0, q4_0 or q4_k for a ",
             "checkpoint directory (f32, f16 and bf16 are for .gguf files), got '", type, "'");
  const llm::ModelConfig config = llm::load_config(in);
  KILN_CHECK(!config.fp8 && config.block_quant.empty(), "quantize: ", in,
             " is already quantized; start from its f32, f16 or bf16 checkpoint");
  KILN_CHECK(fs::weakly_canonical(in) != fs::weakly_canonical(out), "quantize: OUT must not be IN");
  const Checkpoint ck = Checkpoint::open(in);
  NamedTensors tensors;
  int64_t packed = 0, kept = 0;
  for (const std::string& name : ck.names()) {
    const Tensor t = ck.get(name);
    if (!llm::is_block_quantized_weight(name)) {
      tensors.emplace_back(name, t);
      kept += static_cast<int64_t>(t.nbytes());
      continue;
    }
    const int64_t block = type == "q4_k" ? 256 : 32;
    KILN_CHECK(t.dim() == 2 && t.size(1) % block == 0, "quantize: ", name, " ", t.meta(), " cannot be stored in blocks of ",
               block, " along K", type == "q4_k" ? " (q4_k needs every layer's K a multiple of 256: use q4_0 or q8_0)" : "");
    if (type == "q4_k") {
      const Q4KWeight q = quantize_q4_k(t);
      packed += static_cast<int64_t>(q.blocks.nbytes());
      tensors.emplace_back(name, q.blocks);
      continue;
    }
    Tensor values, scales;
    if (type == "q4_0") {
      const Q4Weight q = quantize_q4_0(t);
      values = q.values, scales = q.scales;
    } else {
      const Q8Weight q = quantize_q8_0(t);
      values = q.values, scales = q.scales;
    }
    packed += static_cast<int64_t>(values.nbytes() + scales.nbytes());
    tensors.emplace_back(name, values);
    tensors.emplace_back(name + "_scales", scales);
  }
  fs::create_directories(out);
  // The files a model directory's loader and tokenizer read (not a model card or results of the float model).
  for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
                        "tokenizer.model"})
    if (fs::is_regular_file(fs::path(in) / f))
      fs::copy_file(fs::path(in) / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
  nlohmann::json cfg;
  {
    std::ifstream is(fs::path(in) / "config.json");
    cfg = nlohmann::json::parse(is);
  }
  cfg["quantization_config"] = {{"quant_method", "kiln"}, {"format", type}};
  save_safetensors((fs::path(out) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  {
    std::ofstream os(fs::path(out) / "config.json");
    os << cfg.dump(2) << "\n";
    KILN_CHECK(os.good(), "quantize: could not write ", (fs::path(out) / "config.json").string());
  }
  std::cout << "kiln quantize: " << out << ": " << type << " linear weights " << packed / (1 << 20) << " MiB, other tensors "
            << kept / (1 << 20) << " MiB\n";
  return 0;
}

}  // namespace kiln::cli
