#pragma once

#include <string>

namespace CLI {
class App;
}

namespace kiln::cli {
int run_info(bool memory);
int run_demo(const std::string& device, int repeats);

// tokenize.cpp
struct TokenizerArgs {
  std::string model_dir, tokenizer_file, text;
  bool no_special = false, skip_special = false;
};
CLI::App* add_tokenize(CLI::App& app, TokenizerArgs& args);
CLI::App* add_detokenize(CLI::App& app, TokenizerArgs& args);
int run_tokenize(const TokenizerArgs& args);
int run_detokenize(const TokenizerArgs& args);
}  // namespace kiln::cli
