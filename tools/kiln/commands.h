#pragma once

#include <cstdint>
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
int run_quantize(const std::string& in, const std::string& out, const std::string& type);
// bench_vae.cpp
struct BenchVaeOptions {
  std::string preset = "small";  // wan (81 frames of 720p) or small
  std::string device = "auto";
  std::string dtype = "f32";
  int64_t frames = 0;            // latent frames (0: the preset's)
  int64_t tile = 0;              // latent tile edge (0: the preset's)
  uint64_t seed = 1;
  bool check = true;             // on CUDA: PSNR of the first tile against the CPU
  int64_t check_frames = 2;      // latent frames of that comparison
  std::string json;
};
int run_bench_vae(const BenchVaeOptions& options);
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
