// kiln generate / logits / bench (models) / check: the engine's command line.
#include "llm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/gguf.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/llm/generate.h"
#include "kiln/llm/model.h"
#include "kiln/runtime.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

std::optional<Tokenizer> model_tokenizer(const std::string& model) {
  if (model.empty()) return std::nullopt;
  if (is_gguf_file(model)) {
    const GgufFile f = GgufFile::open(model);
    if (!f.metadata().count("tokenizer.ggml.model")) return std::nullopt;
    return Tokenizer::from_json(gguf_tokenizer_json(f), model);
  }
  if (!std::filesystem::exists(model + "/tokenizer.json")) return std::nullopt;
  return Tokenizer::from_model_dir(model);
}


namespace {

using llm::Model;
using llm::ModelConfig;
using llm::ModelOptions;

Device parse_device(const std::string& s) {
  if (s == "auto") return cuda_device_count() > 0 ? Device(DeviceType::CUDA, 0) : kCPU;
  if (s == "cpu") return kCPU;
  if (s == "cuda") return Device(DeviceType::CUDA, 0);
  if (s.rfind("cuda:", 0) == 0) return Device(DeviceType::CUDA, std::stoi(s.substr(5)));
  throw Error(str("--device must be cpu, cuda, cuda:N or auto, got \"", s, "\""));
}

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == item.size() && v >= 0, "token ids must be non-negative integers separated by commas, got \"",
               item, "\"");
    ids.push_back(v);
  }
  return ids;
}

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024)); }

void check_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (is_gguf_file(dir)) return;  // a GGUF file: its header is checked when it is opened
  KILN_CHECK(fs::is_directory(dir), "model directory \"", dir, "\" does not exist (or is not a directory)");
  KILN_CHECK(fs::exists(fs::path(dir) / "config.json"), "\"", dir, "\" has no config.json: not a Hugging Face model directory");
}

// The model from -m DIR or --preset NAME (random weights), with a progress bar for checkpoints.
Model open_model(const LlmOptions& o, Device dev, int64_t ctx) {
  ModelOptions mo;
  mo.device = dev;
  mo.max_context = ctx;
  mo.use_graph = !o.no_graph;
  mo.quant = o.quant;
  if (!o.dtype.empty()) mo.dtype = o.dtype == "f32" ? DType::F32 : o.dtype == "f16" ? DType::F16 : DType::BF16;
  if (!o.preset.empty()) {
    const ModelConfig c = llm::preset_config(o.preset);
    const DType dt = mo.dtype.value_or(dev.is_cuda() ? DType::BF16 : DType::F32);
    std::cerr << "kiln: preset " << o.preset << ": random weights (no checkpoint), " << dtype_name(dt) << "\n";
    return Model(c, llm::random_weights(c, dev, dt, 1), mo);
  }
  KILN_CHECK(!o.model.empty(), "give a model directory (-m DIR) or a preset (--preset NAME)");
  check_model_dir(o.model);
  int last = -1;
  auto progress = [&](int64_t done, int64_t total) {
    // done counts bytes as placed (after any dtype conversion), total as stored: clamp.
    const int pct = total > 0 ? static_cast<int>(std::min<int64_t>(100, 100 * done / total)) : 100;
    if (pct == last || total < (int64_t{256} << 20)) return;  // a bar only for checkpoints worth watching
    last = pct;
    const int bar = pct / 4;
    std::cerr << "\rloading [" << std::string(static_cast<size_t>(bar), '#') << std::string(static_cast<size_t>(25 - bar), ' ')
              << "] " << pct << "% " << gib(done) << std::flush;
  };
  Model m = llm::load_model(o.model, mo, progress);
  std::cerr << "\n";
  return m;
}

// A chat prompt: one user turn in the checkpoint's chat format (kiln/chat.h).
std::string apply_chat(const std::string& dir, const std::string& prompt) {
  const ChatMessage turn{"user", prompt};
  return ChatTemplate::from_model_dir(dir).render(std::span(&turn, 1));
}

void print_memory(Device dev) {
  if (!dev.is_cuda()) return;
  const MemoryStats m = memory_stats(dev);
  std::cerr << "peak memory: tensors " << gib(m.allocated_peak) << ", allocator reserved " << gib(m.reserved_peak)
            << ", driver " << gib(m.driver_used_peak) << "\n";
}

std::vector<int64_t> prompt_ids(const LlmOptions& o, const Tokenizer* tok) {
  if (!o.prompt_ids.empty()) return parse_ids(o.prompt_ids);
  KILN_CHECK(tok != nullptr, "-p TEXT needs a tokenizer (a model directory with tokenizer.json); give --prompt-ids with a preset");
  const std::string text = o.chat ? apply_chat(o.model, o.prompt) : o.prompt;
  const auto ids32 = tok->encode(text, !o.chat);
  return std::vector<int64_t>(ids32.begin(), ids32.end());
}

int run_generate(const LlmOptions& o) {
  const Device dev = parse_device(o.device);
  std::optional<Tokenizer> tok;
  tok = model_tokenizer(o.model);
  const std::vector<int64_t> prompt = prompt_ids(o, tok ? &*tok : nullptr);
  KILN_CHECK(!prompt.empty(), "the prompt is empty");
  const int64_t ctx = o.ctx > 0 ? o.ctx : static_cast<int64_t>(prompt.size()) + o.n;
  Model m = open_model(o, dev, ctx);
  llm::GenerateOptions g;
  g.max_new_tokens = o.n;
  g.sampling = SamplingParams{o.temp, o.top_k, o.top_p, o.min_p};
  g.seed = o.seed;
  if (!o.ignore_eos) g.stop_ids = m.config().eos_token_ids;
  std::optional<Model> draft;
  if (!o.draft.empty()) {
    KILN_CHECK(o.lookup == 0, "give --lookup or --draft, not both");
    LlmOptions od = o;
    od.model = o.draft;
    od.preset.clear();
    draft.emplace(open_model(od, dev, ctx));
    g.speculative.draft = &*draft;
  }
  g.speculative.lookup = o.lookup;
  g.speculative.num_draft = o.num_draft;
  std::vector<int64_t> generated;
  std::string printed;
  g.on_token = [&](int64_t t) {
    generated.push_back(t);
    if (o.ids_only || !tok) return true;
    // Print what the decoded text gained, holding back an incomplete UTF-8 sequence (shown as U+FFFD).
    const std::vector<int32_t> ids32(generated.begin(), generated.end());
    const std::string text = tok->decode(ids32, true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::cout << text.substr(printed.size()) << std::flush;
      printed = text;
    }
    return true;
  };
  // A plain text prompt is printed first, so that the continuation reads on from it.
  if (!o.ids_only && tok && !o.chat && o.prompt_ids.empty()) std::cout << o.prompt << std::flush;
  llm::GenerateStats st;
  llm::generate(m, prompt, g, &st);
  if (o.ids_only || !tok) std::cout << join_ids(generated) << "\n";
  else std::cout << "\n";
  std::cerr << fmt::format("prompt: {} tokens, {:.1f} t/s; generated: {} tokens, {:.1f} t/s ({})\n", st.prompt_tokens,
                           st.prefill_tps(), st.generated, st.decode_tps(), dev.str());
  if (g.speculative.enabled())
    std::cerr << fmt::format("speculative ({}): {} verify steps, {} of {} drafts accepted ({:.0f}%), {:.2f} tokens per step\n",
                             draft ? "draft model " + o.draft : fmt::format("lookup {}", o.lookup), st.verify_steps,
                             st.accepted, st.drafted, 100 * st.acceptance(),
                             st.verify_steps > 0 ? static_cast<double>(st.accepted + st.verify_steps) / st.verify_steps : 0.0);
  print_memory(dev);
  return 0;
}

int run_perplexity(const LlmOptions& o) {
  const Device dev = parse_device(o.device);
  KILN_CHECK(!o.model.empty(), "kiln perplexity needs a model directory (-m DIR) with a tokenizer");
  KILN_CHECK(!o.file.empty(), "kiln perplexity needs --file TEXT_FILE");
  std::ifstream in(o.file, std::ios::binary);
  KILN_CHECK(in.good(), "perplexity: cannot read \"", o.file, "\"");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Tokenizer tok = Tokenizer::from_model_dir(o.model);
  const auto ids32 = tok.encode(text, true);
  const std::vector<int64_t> ids(ids32.begin(), ids32.end());
  KILN_CHECK(ids.size() >= 2, "perplexity: the file has ", ids.size(), " tokens; at least 2 are needed");
  const int64_t window = o.ctx > 0 ? o.ctx : 512;
  Model m = open_model(o, dev, window);
  const auto t0 = std::chrono::steady_clock::now();
  const llm::Perplexity p = llm::perplexity(m, ids, window);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("perplexity: {:.4f} ({} tokens scored in windows of {}; {} tokens in the file; {:.1f} s)\n",
                           p.value(), p.predicted, window, ids.size(), s);
  if (!o.json.empty())
    std::ofstream(o.json) << nlohmann::json{{"perplexity", p.value()}, {"nll_sum", p.nll_sum}, {"predicted", p.predicted},
                                            {"window", window}, {"tokens", ids.size()}}
                                 .dump(1)
                          << "\n";
  if (!o.reference.empty()) {
    // The same file scored elsewhere (scripts/train_tiny.py stores transformers' figure with its model): the two
    // must agree to 3 significant digits.
    std::ifstream rf(o.reference);
    KILN_CHECK(rf.good(), "perplexity: cannot read the reference \"", o.reference, "\"");
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(rf);
    } catch (const std::exception& e) {
      throw Error(str("perplexity: the reference \"", o.reference, "\" is not JSON: ", e.what()));
    }
    KILN_CHECK(r.is_object() && r.contains("perplexity") && r["perplexity"].is_number(), "perplexity: the reference \"",
               o.reference, "\" has no number \"perplexity\"");
    const double ref = r["perplexity"].get<double>();
    const auto digits3 = [](double v) { return fmt::format("{:.3g}", v); };
    const bool agree = digits3(ref) == digits3(p.value());
    const std::string by = r.contains("computed_by") && r["computed_by"].is_string() ? r["computed_by"].get<std::string>()
                                                                                      : o.reference;
    std::cout << fmt::format("reference:  {:.4f}, computed by {}; to 3 significant digits {} {} {}\n", ref, by, digits3(p.value()),
                             agree ? "=" : "!=", digits3(ref));
    if (r.contains("predicted") && r["predicted"].is_number_integer() && r["predicted"].get<int64_t>() != p.predicted)
      std::cout << fmt::format("note: the reference scored {} tokens, kiln {}\n", r["predicted"].get<int64_t>(),
                               p.predicted);
    if (!agree) return 1;
  }
  return 0;
}

int run_logits(const LlmOptions& o) {
  const Device dev = parse_device(o.device);
  KILN_CHECK(!o.prompt_ids.empty(), "kiln logits needs --prompt-ids");
  KILN_CHECK(!o.out.empty(), "kiln logits needs --out FILE.json");
  const std::vector<int64_t> prompt = parse_ids(o.prompt_ids);
  KILN_CHECK(!prompt.empty(), "the prompt is empty");
  Model m = open_model(o, dev, static_cast<int64_t>(prompt.size()));
  const Tensor logits = m.prefill(prompt, true).to(kCPU);
  nlohmann::json j;
  j["prompt_ids"] = prompt;
  j["logits"] = nlohmann::json::array();
  const int64_t V = logits.size(1);
  const auto v = logits.contiguous().to_vector<float>();
  for (int64_t t = 0; t < logits.size(0); ++t)
    j["logits"].push_back(std::vector<float>(v.begin() + t * V, v.begin() + (t + 1) * V));
  std::ofstream(o.out) << j.dump();
  std::cerr << "wrote " << logits.size(0) << " x " << V << " logits to " << o.out << "\n";
  return 0;
}

struct Stat {
  double mean = 0, sd = 0;
};
Stat stat_of(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double acc = 0;
  for (double x : v) acc += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(acc / static_cast<double>(v.size() - 1)) : 0;
  return s;
}

// The device's copy bandwidth: (read + write bytes) / median time of copying a buffer (1 GiB on CUDA, 256 MiB
// on the CPU), in GB/s (1e9). Decode cannot read its weights faster: bytes per token / this is its floor.
double copy_gbps(Device dev) {
  using clock = std::chrono::steady_clock;
  const int64_t n = dev.is_cuda() ? int64_t{1} << 28 : int64_t{1} << 26;  // f32
  Tensor src = empty({n}, DType::F32, dev), dst = empty({n}, DType::F32, dev);
  uniform_(src, -1.0, 1.0);
  dst.copy_(src);
  if (dev.is_cuda()) synchronize(dev);
  std::vector<double> s;
  for (int i = 0; i < 10; ++i) {
    const auto a = clock::now();
    dst.copy_(src);
    if (dev.is_cuda()) synchronize(dev);
    s.push_back(std::chrono::duration<double>(clock::now() - a).count());
  }
  std::nth_element(s.begin(), s.begin() + 5, s.end());
  return 2.0 * static_cast<double>(src.nbytes()) / s[5] / 1e9;
}

std::vector<int64_t> parse_list(const std::string& s, const char* what, int64_t lo, int64_t hi) {
  std::vector<int64_t> v = parse_ids(s);
  for (int64_t x : v) KILN_CHECK(x >= lo && x <= hi, what, " must be in [", lo, ", ", hi, "], got ", x);
  return v;
}

int run_bench_model(const LlmOptions& o) {
  const Device dev = parse_device(o.device);
  const std::vector<int64_t> contexts = parse_list(o.contexts, "--contexts", 1, int64_t{1} << 21);
  const std::vector<int64_t> verify_k = parse_list(o.verify, "--verify", 1, 15);
  int64_t longest = o.pp;
  for (int64_t c : contexts) longest = std::max(longest, c);
  // Room for the warm-up too (the prompt and 4 decode steps), and for verify steps after the prompt.
  const int64_t ctx = std::max<int64_t>(o.ctx, longest + std::max<int64_t>(o.tg, 16) + 1);
  Model m = open_model(o, dev, ctx);
  const ModelConfig& c = m.config();
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int64_t> tok(0, c.vocab_size - 1);
  std::vector<int64_t> prompt(static_cast<size_t>(o.pp));
  for (auto& t : prompt) t = tok(rng);
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const SamplingParams greedy{0.0, 0, 1.0, 0.0};
  Generator gen(1);
  std::vector<double> pp_tps, tg_tps;
  // Warm-up: one prefill and a few decode steps (allocations, cuBLAS algorithm choice, the graph capture).
  m.reset();
  int64_t t0 = m.sample_first(m.prefill(prompt), greedy, &gen);
  for (int i = 0; i < 4; ++i) t0 = m.decode(t0, greedy, &gen);
  if (dev.is_cuda()) reset_peak_memory_stats(dev);
  for (int r = 0; r < o.repeats; ++r) {
    m.reset();
    if (dev.is_cuda()) synchronize(dev);
    auto a = clock::now();
    int64_t t = m.sample_first(m.prefill(prompt), greedy, &gen);
    pp_tps.push_back(static_cast<double>(o.pp) / secs(a, clock::now()));
    a = clock::now();
    m.decode_n(t, o.tg, greedy, &gen, [](int64_t) { return true; });
    tg_tps.push_back(static_cast<double>(o.tg) / secs(a, clock::now()));
  }
  int64_t params = 0, bytes = 0;
  auto add = [&](const Tensor& t) {
    if (!t.defined()) return;
    params += t.numel();
    bytes += static_cast<int64_t>(t.nbytes());
  };
  const auto& w = m.weights();
  add(w.embed);
  add(w.final_norm);
  auto add_linear = [&](const llm::Linear& l) {
    params += l.out_features() * l.in_features();
    bytes += l.nbytes();
  };
  if (!c.tie_word_embeddings) add_linear(w.lm_head);
  for (const auto& L : w.layers) {
    for (const llm::Linear* l : {&L.attn.qkv, &L.attn.o}) add_linear(*l);
    add(L.input_norm);
    add(L.post_norm);
    add(L.attn.q_norm);
    add(L.attn.k_norm);
    if (L.mlp) for (const llm::Linear* l : {&L.mlp->gate_up, &L.mlp->down}) add_linear(*l);
    if (L.moe) {
      add(L.moe->router);
      add(L.moe->gate_up);
      add(L.moe->down);
      if (L.moe->blocks)
        for (const BlockWeight* b : {&L.moe->blocks->gate_up, &L.moe->blocks->down}) add_linear(llm::Linear::of(*b));
    }
  }
  // Decode after longer prompts (--contexts): random tokens, one run each.
  std::vector<double> ctx_tps;
  for (int64_t c : contexts) {
    std::vector<int64_t> long_prompt(static_cast<size_t>(c));
    for (auto& t : long_prompt) t = tok(rng);
    m.reset();
    int64_t t = m.sample_first(m.prefill(long_prompt), greedy, &gen);
    if (dev.is_cuda()) synchronize(dev);
    const auto a = clock::now();
    m.decode_n(t, o.tg, greedy, &gen, [](int64_t) { return true; });
    ctx_tps.push_back(static_cast<double>(o.tg) / secs(a, clock::now()));
  }
  // Verify steps of k + 1 positions after the prompt (speculative decoding), against one decode step there.
  struct VerifyTime {
    int64_t k;
    double ms, ratio;
  };
  std::vector<VerifyTime> verify_times;
  if (!verify_k.empty()) {
    m.reset();
    const int64_t t = m.sample_first(m.prefill(prompt), greedy, &gen);
    const int64_t at = m.position();
    const int reps = 20;
    auto time_ms = [&](const std::function<void()>& f) {
      f();  // warm-up (on CUDA: the capture)
      m.rewind(at);
      std::vector<double> v;
      for (int r = 0; r < reps; ++r) {
        if (dev.is_cuda()) synchronize(dev);
        const auto a = clock::now();
        f();
        if (dev.is_cuda()) synchronize(dev);
        v.push_back(1e3 * secs(a, clock::now()));
        m.rewind(at);
      }
      std::nth_element(v.begin(), v.begin() + reps / 2, v.end());
      return v[static_cast<size_t>(reps / 2)];
    };
    const double step_ms = time_ms([&] { (void)m.decode(t, greedy, &gen); });
    for (int64_t k : verify_k) {
      std::vector<int64_t> tokens(static_cast<size_t>(k + 1));
      for (auto& x : tokens) x = tok(rng);
      const double ms = time_ms([&] { (void)argmax(m.verify(tokens), 1).to(kCPU); });
      verify_times.push_back({k, ms, ms / step_ms});
    }
    verify_times.insert(verify_times.begin(), {0, step_ms, 1.0});
  }
  const double copy = copy_gbps(dev);
  const double floor_tps = copy * 1e9 / static_cast<double>(m.bytes_per_token());
  const std::string name = !o.preset.empty() ? o.preset : std::filesystem::path(o.model).filename().string();
  const Stat pp = stat_of(pp_tps), tg = stat_of(tg_tps);
  const double bw = tg.mean * static_cast<double>(m.bytes_per_token()) / 1e9;
  std::cout << "| model | size | params | device | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: |\n";
  const std::string size = gib(bytes), prm = fmt::format("{:.2f} B", static_cast<double>(params) / 1e9);
  std::cout << fmt::format("| {} | {} | {} | {} | pp{} | {:.2f} ± {:.2f} |\n", name, size, prm, dev.str(), o.pp, pp.mean, pp.sd);
  std::cout << fmt::format("| {} | {} | {} | {} | tg{} | {:.2f} ± {:.2f} |\n", name, size, prm, dev.str(), o.tg, tg.mean, tg.sd);
  for (size_t i = 0; i < contexts.size(); ++i)
    std::cout << fmt::format("| {} | {} | {} | {} | tg{} @ d{} | {:.2f} |\n", name, size, prm, dev.str(), o.tg,
                             contexts[i], ctx_tps[i]);
  std::cout << fmt::format("decode reads {:.2f} GB of weights per token: {:.0f} GB/s at the tg rate; copy bandwidth "
                           "{:.0f} GB/s, so the floor is {:.1f} tok/s and tg{} is {:.1f}% of it\n",
                           static_cast<double>(m.bytes_per_token()) / 1e9, bw, copy, floor_tps, o.tg,
                           100 * tg.mean / floor_tps);
  for (const VerifyTime& v : verify_times)
    std::cout << (v.k == 0 ? fmt::format("decode step after pp{}: {:.3f} ms\n", o.pp, v.ms)
                           : fmt::format("verify step of {} positions: {:.3f} ms = {:.2f}x the decode step\n", v.k + 1,
                                         v.ms, v.ratio));
  MemoryStats ms;
  if (dev.is_cuda()) {
    ms = memory_stats(dev);
    std::cout << "peak memory: tensors " << gib(ms.allocated_peak) << ", allocator reserved " << gib(ms.reserved_peak)
              << ", driver " << gib(ms.driver_used_peak) << "\n";
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"model", name},         {"device", dev.str()},         {"params", params},
                        {"bytes", bytes},        {"pp", o.pp},                  {"tg", o.tg},
                        {"repeats", o.repeats},  {"pp_tps", pp_tps},            {"tg_tps", tg_tps},
                        {"pp_mean", pp.mean},    {"tg_mean", tg.mean},          {"bytes_per_token", m.bytes_per_token()},
                        {"decode_gbps", bw},     {"ctx", ctx},                  {"copy_gbps", copy},
                        {"floor_tps", floor_tps},  {"contexts", contexts},      {"context_tg_tps", ctx_tps},
                        {"peak_allocated", ms.allocated_peak}, {"peak_reserved", ms.reserved_peak},
                        {"peak_driver", ms.driver_used_peak}};
    for (const VerifyTime& v : verify_times)
      j["verify"].push_back({{"positions", v.k + 1}, {"ms", v.ms}, {"ratio_to_step", v.ratio}});
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return 0;
}

double psnr(const Tensor& a, const Tensor& ref) {
  const auto x = a.to_vector<float>(), r = ref.to_vector<float>();
  double mse = 0, peak = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mse += (static_cast<double>(x[i]) - r[i]) * (static_cast<double>(x[i]) - r[i]);
    peak = std::max(peak, std::fabs(static_cast<double>(r[i])));
  }
  mse /= std::max<size_t>(x.size(), 1);
  return mse == 0 ? INFINITY : 10 * std::log10(peak * peak / mse);
}

double max_abs(const Tensor& a, const Tensor& ref) {
  const auto x = a.to_vector<float>(), r = ref.to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(x[i]) - r[i]));
  return m;
}

int run_check(const LlmOptions& o) {
  const Device gpu = parse_device(o.device == "auto" ? "cuda" : o.device);
  KILN_CHECK(gpu.is_cuda(), "kiln check compares a CUDA run with the CPU: --device must be cuda or cuda:N");
  std::optional<Tokenizer> tok;
  tok = model_tokenizer(o.model);
  std::vector<int64_t> prompt;
  if (o.prompt_ids.empty() && o.prompt.empty()) prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  else prompt = prompt_ids(o, tok ? &*tok : nullptr);
  const int64_t ctx = static_cast<int64_t>(prompt.size());
  llm::Trace tc, tg;
  {
    LlmOptions oc = o;
    oc.dtype = "f32";
    Model cpu = open_model(oc, kCPU, ctx);
    cpu.prefill(prompt, true, &tc);
  }
  Model g = open_model(o, gpu, ctx);
  g.prefill(prompt, true, &tg);
  std::cout << fmt::format("{} tokens; CUDA ({}) against the CPU (f32)\n", prompt.size(), dtype_name(g.dtype()));
  std::cout << "| layer | max abs error | PSNR dB |\n| ---: | ---: | ---: |\n";
  for (size_t i = 0; i < tc.hidden.size(); ++i)
    std::cout << fmt::format("| {} | {:.4g} | {:.1f} |\n", i, max_abs(tg.hidden[i], tc.hidden[i]), psnr(tg.hidden[i], tc.hidden[i]));
  std::cout << fmt::format("| logits | {:.4g} | {:.1f} |\n", max_abs(tg.logits, tc.logits), psnr(tg.logits, tc.logits));
  // Greedy tokens of each position agree?
  const Tensor ac = argmax(tc.logits, 1), ag = argmax(tg.logits, 1);
  const auto vc = ac.to_vector<int64_t>(), vg = ag.to_vector<int64_t>();
  int64_t same = 0;
  for (size_t i = 0; i < vc.size(); ++i) same += vc[i] == vg[i];
  std::cout << fmt::format("argmax agrees at {} of {} positions\n", same, vc.size());
  return 0;
}

}  // namespace

Device device_of(const std::string& s) { return parse_device(s); }

llm::Model open_model_for(const LlmOptions& o, Device dev, int64_t ctx) { return open_model(o, dev, ctx); }

void add_llm_commands(CLI::App& app, CLI::App& bench, LlmOptions& o) {
  auto model_opts = [&](CLI::App* c) {
    c->add_option("-m,--model", o.model, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)");
    c->add_option("--preset", o.preset, "Random weights at the shapes of a known model (see kiln bench --help)");
    c->add_option("--device", o.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
    c->add_option("--dtype", o.dtype, "Activations and weights: bf16, f16 or f32 (default: bf16 on CUDA, f32 on the CPU)")
        ->check(CLI::IsMember({"bf16", "f16", "f32"}));
    c->add_option("--quant", o.quant,
                  "Quantise the linear layers' weights when loading: q8_0, q4_0, q4_k (docs/quantization.md)")
        ->check(CLI::IsMember({"q8_0", "q4_0", "q4_k"}));
    c->add_flag("--no-graph", o.no_graph, "Do not capture the decode step as a CUDA graph");
  };
  o.generate = app.add_subcommand("generate", "Generate text with a model");
  model_opts(o.generate);
  o.generate->add_option("-p,--prompt", o.prompt, "The prompt text");
  o.generate->add_option("--prompt-ids", o.prompt_ids, "The prompt as token ids: 1,2,3");
  o.generate->add_option("-n", o.n, "Tokens to generate")->capture_default_str()->check(CLI::Range(0, 1 << 22));
  o.generate->add_option("--temp", o.temp, "Temperature (0: greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  o.generate->add_option("--top-k", o.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  o.generate->add_option("--top-p", o.top_p, "Nucleus: keep the smallest set of probability >= p (1: off)")->capture_default_str();
  o.generate->add_option("--min-p", o.min_p, "Drop tokens below min_p x the top probability (0: off)")->capture_default_str();
  o.generate->add_option("--seed", o.seed, "Sampling seed")->capture_default_str();
  o.generate->add_option("--ctx", o.ctx, "KV cache length (default: prompt + n)");
  o.generate->add_flag("--ids", o.ids_only, "Print only the generated ids on stdout (statistics on stderr)");
  o.generate->add_flag("--chat", o.chat, "Apply the checkpoint's chat template (Qwen and Llama 3 forms)");
  o.generate->add_flag("--ignore-eos", o.ignore_eos, "Do not stop at the end-of-sequence ids");
  o.generate->add_option("--lookup", o.lookup,
                         "Speculative decoding with prompt lookup: draft the tokens that followed the latest earlier "
                         "occurrence of the last N tokens (N down to 1)")
      ->check(CLI::Range(0, 64));
  o.generate->add_option("--draft", o.draft,
                         "Speculative decoding with a draft model (a smaller checkpoint with the same tokenizer)");
  o.generate->add_option("--num-draft", o.num_draft, "Speculative decoding: tokens drafted per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 15));

  o.logits = app.add_subcommand("logits", "Write the f32 logits of every prompt position as JSON");
  model_opts(o.logits);
  o.logits->add_option("--prompt-ids", o.prompt_ids, "The prompt as token ids: 1,2,3")->required();
  o.logits->add_option("--out", o.out, "Output JSON file")->required();

  o.perplexity = app.add_subcommand("perplexity", "Perplexity of a text file under a model (windows of --ctx tokens)");
  model_opts(o.perplexity);
  o.perplexity->add_option("--file", o.file, "The text (UTF-8)")->required();
  o.perplexity->add_option("--ctx", o.ctx, "Window length in tokens (default 512)");
  o.perplexity->add_option("--json", o.json, "Also write the result as JSON to this file");
  o.perplexity->add_option("--reference", o.reference,
                           "A JSON file with another implementation's \"perplexity\" for the same file and --ctx: print "
                           "both; exit 1 unless they agree to 3 significant digits");
  o.check = app.add_subcommand("check", "Run a prompt on CUDA and on the CPU and compare every layer");
  model_opts(o.check);
  o.check->add_option("-p,--prompt", o.prompt, "The prompt text");
  o.check->add_option("--prompt-ids", o.prompt_ids, "The prompt as token ids (default 1..8)");

  // `kiln bench -m DIR | --preset NAME` (the subcommand `kiln bench ops` is the operator benchmark).
  model_opts(&bench);
  bench.add_option("-p", o.pp, "Prompt tokens of the prefill test")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  bench.add_option("-n", o.tg, "Tokens of the decode test")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  bench.add_option("-r", o.repeats, "Repetitions")->capture_default_str()->check(CLI::Range(1, 1000));
  bench.add_option("--ctx", o.ctx, "KV cache length (default: p + n)");
  bench.add_option("--json", o.json, "Also write the results as JSON");
  bench.add_option("--contexts", o.contexts, "Also decode -n tokens after prompts of these lengths: 512,8192,32768");
  bench.add_option("--verify", o.verify,
                   "Also time speculative decoding's verify step of k + 1 positions for these k (after the prompt), "
                   "against one decode step: 4,8");
  o.bench = &bench;
}

std::optional<int> run_llm_commands(const LlmOptions& o) {
  if (o.generate && *o.generate) return run_generate(o);
  if (o.logits && *o.logits) return run_logits(o);
  if (o.perplexity && *o.perplexity) return run_perplexity(o);
  if (o.check && *o.check) return run_check(o);
  if (o.bench && *o.bench && o.bench->get_subcommands().empty()) return run_bench_model(o);
  return std::nullopt;
}

}  // namespace kiln::cli
