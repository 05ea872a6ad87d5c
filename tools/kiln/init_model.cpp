// `kiln init-model DIR`: a small Qwen3 checkpoint with random weights, written as Hugging Face lays one out
// (config.json, generation_config.json, model.safetensors through kiln's writer, and a tokenizer.json when
// one is given), for the demo and for trying the engine without a download. The weights are random: the
// text it generates is noise.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "init_model.h"
#include "kiln/io.h"
#include "kiln/llm/weights.h"
#include "kiln/ops.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

int run_init_model(const InitModelOptions& o) {
  namespace fs = std::filesystem;
  KILN_CHECK(o.layers >= 1 && o.layers <= 64 && o.hidden >= 64 && o.hidden % 64 == 0 && o.hidden <= 8192,
             "init-model: --layers must be in [1, 64] and --hidden a multiple of 64 in [64, 8192]");
  int64_t vocab = 1024, eos = 2, bos = 1;
  std::optional<Tokenizer> tok;
  if (!o.tokenizer.empty()) {
    tok = Tokenizer::from_file(o.tokenizer);
    vocab = tok->vocab_size();
    if (auto id = tok->token_to_id("<|im_end|>")) eos = *id;
    else if (auto id2 = tok->token_to_id("<|endoftext|>")) eos = *id2;
    if (auto id = tok->token_to_id("<|endoftext|>")) bos = *id;
  }
  fs::create_directories(o.dir);
  const int64_t heads = o.hidden / 64, kv = std::max<int64_t>(1, heads / 2);
  nlohmann::json cfg = {{"architectures", {"Qwen3ForCausalLM"}},
                        {"model_type", "qwen3"},
                        {"hidden_size", o.hidden},
                        {"intermediate_size", 3 * o.hidden},
                        {"num_hidden_layers", o.layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv},
                        {"head_dim", 64},
                        {"rms_norm_eps", 1e-6},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", 4096},
                        {"rope_theta", 1000000.0},
                        {"tie_word_embeddings", true},
                        {"torch_dtype", "bfloat16"},
                        {"bos_token_id", bos},
                        {"eos_token_id", eos}};
  std::ofstream(fs::path(o.dir) / "config.json") << cfg.dump(2) << "\n";
  std::ofstream(fs::path(o.dir) / "generation_config.json")
      << nlohmann::json{{"bos_token_id", bos}, {"eos_token_id", eos}}.dump(2) << "\n";
  const llm::ModelConfig c = llm::parse_config(cfg.dump(), (fs::path(o.dir) / "config.json").string());
  Generator gen(o.seed);
  NamedTensors tensors;
  for (const auto& [name, shape] : llm::expected_tensors(c)) {
    Tensor t = empty(shape, DType::F32);
    const bool norm = name.find("norm") != std::string::npos;
    normal_(t, norm ? 1.0 : 0.0, norm ? 0.05 : 0.05, &gen);
    tensors.emplace_back(name, t.to(DType::BF16));
  }
  save_safetensors((fs::path(o.dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  if (tok) {
    fs::copy_file(o.tokenizer, fs::path(o.dir) / "tokenizer.json", fs::copy_options::overwrite_existing);
    // The chat template's form (kiln applies the Qwen and Llama 3 forms by substitution).
    if (tok->token_to_id("<|im_start|>"))
      std::ofstream(fs::path(o.dir) / "tokenizer_config.json")
          << nlohmann::json{{"chat_template", "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                                              "{{ message['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"}}
                 .dump(2)
          << "\n";
  }
  std::cerr << "init-model: wrote a random Qwen3 checkpoint (" << o.layers << " layers, hidden " << o.hidden
            << ", vocab " << vocab << ") to " << o.dir << "\n";
  return 0;
}

}  // namespace kiln::cli
