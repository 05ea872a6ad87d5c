#pragma once

#include <string>

namespace CLI {
class App;
}

namespace kiln::cli {
int run_info(bool memory);
int run_demo(const std::string& device, int repeats);

struct BenchOpsOptions {
  std::string json;             // write the results here too (empty: only print)
  std::string filter;           // regex (ECMAScript, searched) on the case names; empty: every case
  int repeats = 200;            // timed batches (eager) and replays (graph) per case
  std::string device = "cuda:0";
  bool list = false;            // print the cases (name, bytes, copy bytes, max copies) and exit
};
int run_bench_ops(const BenchOpsOptions& options);
int run_inspect(const std::string& path, bool read, const std::string& device);
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
