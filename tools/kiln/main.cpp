// The kiln command line.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
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

  kiln::cli::TokenizerArgs tokenize_args, detokenize_args;
  auto* tokenize = kiln::cli::add_tokenize(app, tokenize_args);
  auto* detokenize = kiln::cli::add_detokenize(app, detokenize_args);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) return kiln::cli::run_info(memory);
    if (*demo) return kiln::cli::run_demo(device, repeats);
    if (*tokenize) return kiln::cli::run_tokenize(tokenize_args);
    if (*detokenize) return kiln::cli::run_detokenize(detokenize_args);
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
