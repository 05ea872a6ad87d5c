// `kiln init-model`: a small random Qwen3 checkpoint on disk (tools/kiln/init_model.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::cli {

struct InitModelOptions {
  std::string dir, tokenizer;
  int64_t layers = 4, hidden = 256;
  uint64_t seed = 0;
};
int run_init_model(const InitModelOptions& options);

}  // namespace kiln::cli
