// Loads a Hugging Face checkpoint and generates from token ids (or text, when it has a tokenizer).
//   generate MODEL_DIR [PROMPT]
#include <kiln/llm/generate.h>
#include <kiln/llm/model.h>
#include <kiln/tokenizer.h>

#include <filesystem>
#include <iostream>

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 2) {
    std::cerr << "usage: generate MODEL_DIR [PROMPT]\n";
    return 2;
  }
  try {
    const std::string dir = argv[1];
    llm::ModelOptions options;  // the CPU, f32
    options.max_context = 256;
    llm::Model model = llm::load_model(dir, options);
    std::vector<int64_t> prompt = {1, 2, 3, 4};
    std::optional<Tokenizer> tok;
    if (std::filesystem::exists(dir + "/tokenizer.json")) {
      tok = Tokenizer::from_model_dir(dir);
      const auto ids = tok->encode(argc > 2 ? argv[2] : "The kiln is hot");
      prompt.assign(ids.begin(), ids.end());
    }
    llm::GenerateOptions g;
    g.max_new_tokens = 8;
    g.sampling.temperature = 0;  // greedy
    const std::vector<int64_t> out = llm::generate(model, prompt, g);
    for (int64_t t : out) std::cout << t << " ";
    std::cout << "\n";
    if (tok) std::cout << tok->decode(std::vector<int32_t>(out.begin(), out.end())) << "\n";
    return out.size() == 8 ? 0 : 1;
  } catch (const Error& e) {
    std::cerr << "generate: " << e.what() << "\n";
    return 1;
  }
}
