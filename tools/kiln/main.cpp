// The kiln command line.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "init_model.h"
#include "llm.h"
#if KILN_HAVE_SERVE
#include "bench_serve.h"
#include "serve.h"
#endif
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
  auto* inspect = app.add_subcommand(
      "inspect", "List the tensors of a safetensors file, index or checkpoint directory, or of a GGUF file");
  std::string inspect_path, inspect_device;
  bool inspect_read = false;
  inspect->add_option("path", inspect_path, "model.safetensors, model.safetensors.index.json, a directory or a .gguf file")
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

  auto* quantize = app.add_subcommand(
      "quantize", "Rewrite a checkpoint with its layers' linear weights in Q8_0, Q4_0 or Q4_K, as a checkpoint "
                  "directory or a GGUF file (docs/quantization.md)");
  std::string quantize_in, quantize_out, quantize_type = "q8_0";
  quantize->add_option("in", quantize_in, "The checkpoint directory (f32, f16 or bf16 weights)")->required();
  quantize->add_option("out", quantize_out, "The directory to write, or a file name ending in .gguf")->required();
  quantize->add_option("--type", quantize_type, "q8_0, q4_0 or q4_k (a .gguf file also f32, f16 or bf16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8_0", "q4_0", "q4_k", "f32", "f16", "bf16"}));

  kiln::cli::LlmOptions llm;
  kiln::cli::add_llm_commands(app, *bench, llm);
#if KILN_HAVE_SERVE
  auto* serve = app.add_subcommand("serve", "An OpenAI-compatible HTTP server over a model (-m DIR | --preset NAME)");
  kiln::cli::LlmOptions serve_model;
  kiln::cli::ServeOptions serve_opts;
  serve->add_option("-m,--model", serve_model.model, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)");
  serve->add_option("--preset", serve_model.preset, "Random weights at the shapes of a known model (token-id prompts only)");
  serve->add_option("--device", serve_model.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  serve->add_option("--dtype", serve_model.dtype, "bf16, f16 or f32 (default: bf16 on CUDA, f32 on the CPU)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  serve->add_flag("--no-graph", serve_model.no_graph, "Do not capture the decode step as a CUDA graph");
  serve->add_option("--host", serve_opts.host, "Address to listen on (loopback by default)")->capture_default_str();
  serve->add_option("--port", serve_opts.port, "Port")->capture_default_str()->check(CLI::Range(0, 65535));
  serve->add_option("--ctx", serve_opts.ctx, "Context (KV cache) of a request, prompt and output")
      ->capture_default_str()->check(CLI::Range(int64_t{2}, int64_t{1} << 22));
  serve->add_option("--api-key", serve_opts.api_key, "Require 'Authorization: Bearer KEY' (use it when not on loopback)");
  serve->add_option("--max-batch", serve_opts.max_batch, "Requests decoded together")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1024}));
  serve->add_option("--kv-tokens", serve_opts.kv_tokens,
                    "Positions of the paged KV cache all requests share (default: --max-batch x --ctx)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 28));
  serve->add_option("--prefill-chunk", serve_opts.prefill_chunk, "Prompt tokens run between two decode steps of the batch")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  serve->add_option("--max-queue", serve_opts.max_queue, "Requests that may wait for a place in the batch (beyond the free places; 0: none wait); more get 429")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  serve->add_option("--max-body", serve_opts.max_body, "Largest request body in bytes (413 above)")->capture_default_str();
  auto* bench_serve = bench->add_subcommand("serve", "Load an OpenAI-compatible server: output t/s, TTFT and ITL per concurrency");
  kiln::cli::BenchServeOptions bs_opts;
  bench_serve->add_option("--url", bs_opts.url, "The server (http://HOST:PORT)")->capture_default_str();
  bench_serve->add_option("--concurrency", bs_opts.concurrency, "Concurrent streams per level")->delimiter(',')
      ->capture_default_str();
  bench_serve->add_option("-p,--prompt", bs_opts.prompt, "Prompt tokens")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  bench_serve->add_option("-n,--output", bs_opts.output, "Output tokens per request")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  bench_serve->add_option("--requests", bs_opts.requests_per_stream, "Requests per stream")->capture_default_str()
      ->check(CLI::Range(1, 100000));
  bench_serve->add_option("--vocab", bs_opts.vocab, "Prompt ids are drawn below this")->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  bench_serve->add_option("--api-key", bs_opts.api_key, "Bearer key for the server");
  bench_serve->add_option("--json", bs_opts.json, "Also write the results as JSON to this file");
#endif

  CLI11_PARSE(app, argc, argv);
  try {
    if (auto rc = kiln::cli::run_llm_commands(llm)) return *rc;
    if (*init_model) return kiln::cli::run_init_model(init_opts);
    if (*quantize) return kiln::cli::run_quantize(quantize_in, quantize_out, quantize_type);
#if KILN_HAVE_SERVE
    if (*serve) {
      if (serve_opts.host != "127.0.0.1" && serve_opts.host != "localhost" && serve_opts.host != "::1" &&
          serve_opts.api_key.empty())
        std::cerr << "kiln serve: warning: listening on " << serve_opts.host << " without --api-key: anyone who reaches "
                  << "this address can use the model\n";
      return kiln::cli::run_serve(serve_opts, serve_model);
    }
#endif
    if (*info) return kiln::cli::run_info(memory);
    if (*demo) return kiln::cli::run_demo(device, repeats);
    if (*bench_ops) return kiln::cli::run_bench_ops(bench_opts);
    if (*bench_vae) return kiln::cli::run_bench_vae(vae_opts);
#if KILN_HAVE_SERVE
    if (*bench_serve) return kiln::cli::run_bench_serve(bs_opts);
#endif
    if (*inspect) return kiln::cli::run_inspect(inspect_path, inspect_read, inspect_device);
    if (*tokenize) return kiln::cli::run_tokenize(tokenize_args);
    if (*detokenize) return kiln::cli::run_detokenize(detokenize_args);
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
