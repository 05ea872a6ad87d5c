// The kiln command line.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "init_model.h"
#include "llm.h"
#include "kiln/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: tensor runtime and LLM engine for NVIDIA GPUs and the CPU"};
  app.require_subcommand(1);

  auto* info = app.add_subcommand("info", "Print the build, the devices and what was compiled in");
  bool memory = false;
  info->add_flag("--memory", memory, "Also print the memory figures of each device");

  auto* demo = app.add_subcommand("demo", "Run a short operator demo and timing on a device");
  std::string device = "auto";
  int repeats = 20;
  demo->add_option("--device", device, "cpu, cuda, cuda:N or auto (the best available)");
  demo->add_option("--repeats", repeats, "Timed repeats per operator")->check(CLI::Range(1, 100000));

  auto* bench = app.add_subcommand("bench", "Model decode benchmark (-m DIR | --preset NAME), or `bench ops`");
  bench->require_subcommand(0, 1);
  auto* bench_ops = bench->add_subcommand("ops", "Time the decode operators on a GPU, eager and graph-replayed");
  kiln::cli::BenchOpsOptions bench_opts;
  bench_ops->add_option("--json", bench_opts.json, "Also write the results as JSON to this file");
  bench_ops->add_option("--filter", bench_opts.filter, "Only the cases whose name matches this regex");
  bench_ops->add_option("--repeats", bench_opts.repeats, "Timed batches and graph replays per case (median)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  bench_ops->add_option("--device", bench_opts.device, "cuda or cuda:N")->capture_default_str();
  bench_ops->add_flag("--list", bench_opts.list, "Print the cases (name, bytes, copy bytes, max copies) and exit");
  auto* bench_vae = bench->add_subcommand("vae", "Decode a video latent with a tiled causal 3-D convolutional VAE decoder");
  kiln::cli::BenchVaeOptions vae_opts;
  bench_vae->add_option("--preset", vae_opts.preset, "wan (81 frames of 1280 x 720) or small")->capture_default_str();
  bench_vae->add_option("--device", vae_opts.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  bench_vae->add_option("--dtype", vae_opts.dtype, "f32, bf16 or f16")->capture_default_str();
  bench_vae->add_option("--frames", vae_opts.frames, "Latent frames (default: the preset's)")->check(CLI::Range(1, 100000));
  bench_vae->add_option("--tile", vae_opts.tile, "Latent tile edge (default: the preset's)")->check(CLI::Range(1, 100000));
  bench_vae->add_option("--seed", vae_opts.seed, "Seed of the weights and the latent")->capture_default_str();
  bench_vae->add_flag("!--no-check", vae_opts.check, "On CUDA: skip the PSNR against the CPU");
  bench_vae->add_option("--json", vae_opts.json, "Also write the results as JSON to this file");
  auto* inspect = app.add_subcommand("inspect", "List the tensors of a safetensors file, index or checkpoint directory");
  std::string inspect_path, inspect_device;
  bool inspect_read = false;
  inspect->add_option("path", inspect_path, "model.safetensors, model.safetensors.index.json or a directory")
      ->required();
  inspect->add_flag("--read", inspect_read, "Also read every tensor and report the loading rate");
  inspect->add_option("--device", inspect_device, "With --read: load to this device (cuda, cuda:N) instead");
  kiln::cli::TokenizerArgs tokenize_args, detokenize_args;
  auto* tokenize = kiln::cli::add_tokenize(app, tokenize_args);
  auto* detokenize = kiln::cli::add_detokenize(app, detokenize_args);

  auto* init_model = app.add_subcommand("init-model", "Write a small Qwen3 checkpoint with random weights (for trying the engine)");
  kiln::cli::InitModelOptions init_opts;
  init_model->add_option("dir", init_opts.dir, "Directory to write")->required();
  init_model->add_option("--tokenizer", init_opts.tokenizer, "A tokenizer.json to ship with it (sets the vocabulary)");
  init_model->add_option("--layers", init_opts.layers, "Decoder layers")->capture_default_str();
  init_model->add_option("--hidden", init_opts.hidden, "Hidden size (a multiple of 64; head_dim is 64)")->capture_default_str();
  init_model->add_option("--seed", init_opts.seed, "Seed of the random weights")->capture_default_str();

  kiln::cli::LlmOptions llm;
  kiln::cli::add_llm_commands(app, *bench, llm);

  CLI11_PARSE(app, argc, argv);
  try {
    if (auto rc = kiln::cli::run_llm_commands(llm)) return *rc;
    if (*init_model) return kiln::cli::run_init_model(init_opts);
    if (*info) return kiln::cli::run_info(memory);
    if (*demo) return kiln::cli::run_demo(device, repeats);
    if (*bench_ops) return kiln::cli::run_bench_ops(bench_opts);
    if (*bench_vae) return kiln::cli::run_bench_vae(vae_opts);
    if (*inspect) return kiln::cli::run_inspect(inspect_path, inspect_read, inspect_device);
    if (*tokenize) return kiln::cli::run_tokenize(tokenize_args);
    if (*detokenize) return kiln::cli::run_detokenize(detokenize_args);
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
