// `kiln inspect`: the tensors of a safetensors file or checkpoint (and its config.json); with --read, a
// loading measurement.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "commands.h"
#include "kiln/gguf.h"
#include "kiln/io.h"
#include "kiln/llm/gguf_model.h"
#include "kiln/llm/config.h"
#include "kiln/runtime.h"

namespace kiln::cli {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads every byte of the CPU views (8-byte words summed; the tail bytewise).
uint64_t sum_views(const Checkpoint& c) {
  uint64_t sum = 0;
  for (const auto& f : c.files())
    for (const auto& e : f.entries()) {
      const Tensor t = f.get(e.name);
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      const size_t n = t.nbytes(), words = n / 8;
      uint64_t w;
      for (size_t i = 0; i < words; ++i) {
        std::memcpy(&w, p + 8 * i, 8);
        sum += w;
      }
      for (size_t i = words * 8; i < n; ++i) sum += p[i];
    }
  return sum;
}
}  // namespace

// A GGUF file: its metadata (long arrays summarised), tensor table and the model config kiln reads from it.
int inspect_gguf(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  const GgufFile f = GgufFile::open(path);
  const double open_s = seconds_since(t0);
  const GgufHeader& h = f.header();
  std::printf("GGUF version %u, alignment %llu, %zu metadata keys, %zu tensors; opened and validated in %.3f ms\n",
              h.version, static_cast<unsigned long long>(h.alignment), h.metadata.size(), h.tensors.size(), open_s * 1e3);
  for (const auto& [k, v] : h.metadata) {
    std::string value;
    switch (v.type) {
      case GgufValue::Type::String: value = "\"" + v.as_string().substr(0, 80) + (v.as_string().size() > 80 ? "...\"" : "\""); break;
      case GgufValue::Type::Array: value = str("[", v.as_array().size(), " values]"); break;
      case GgufValue::Type::F32:
      case GgufValue::Type::F64: value = str(v.as_double()); break;
      case GgufValue::Type::Bool: value = std::get<bool>(v.value) ? "true" : "false"; break;
      default:
        value = std::holds_alternative<uint64_t>(v.value) ? str(std::get<uint64_t>(v.value)) : str(std::get<int64_t>(v.value));
    }
    std::printf("metadata %s = %s\n", k.c_str(), value.c_str());
  }
  uint64_t total = 0;
  for (const GgufTensorInfo& t : h.tensors) {
    std::printf("%-40s %-8s %-24s %12llu bytes\n", t.name.c_str(), gguf_type_name(t.type).c_str(), shape_str(t.shape).c_str(),
                static_cast<unsigned long long>(t.nbytes));
    total += t.nbytes;
  }
  std::printf("%zu tensors, %llu bytes\n", h.tensors.size(), static_cast<unsigned long long>(total));
  try {
    const llm::ModelConfig m = llm::gguf_model_config(f);
    std::printf("config: %s, %lld layers, hidden %lld, heads %lld/%lld x %lld, vocab %lld, experts %lld (top %lld)\n",
                m.architecture.c_str(), static_cast<long long>(m.num_layers), static_cast<long long>(m.hidden_size),
                static_cast<long long>(m.num_heads), static_cast<long long>(m.num_kv_heads),
                static_cast<long long>(m.head_dim), static_cast<long long>(m.vocab_size),
                static_cast<long long>(m.num_experts), static_cast<long long>(m.num_experts_per_tok));
  } catch (const Error& e) {
    std::printf("not a model kiln runs: %s\n", e.what());
  }
  return 0;
}

int run_inspect(const std::string& path, bool read, const std::string& device) {
  if (is_gguf_file(path)) return inspect_gguf(path);
  const auto t0 = std::chrono::steady_clock::now();
  const Checkpoint c = Checkpoint::open(path);
  const double open_s = seconds_since(t0);
  uint64_t total = 0;
  for (const std::string& name : c.names()) {
    const SafetensorsEntry& e = c.entry(name);
    std::printf("%-60s %-8s %-24s %12llu bytes\n", name.c_str(), safetensors_dtype_name(e.dtype),
                shape_str(e.shape).c_str(), static_cast<unsigned long long>(e.nbytes()));
    total += e.nbytes();
  }
  std::printf("%zu tensors, %llu bytes in %zu file(s); opened and validated in %.3f ms\n", c.size(),
              static_cast<unsigned long long>(total), c.files().size(), open_s * 1e3);
  for (const auto& f : c.files())
    for (const auto& [k, v] : f.metadata()) std::printf("metadata %s: %s = %s\n", f.path().c_str(), k.c_str(), v.c_str());
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / "config.json", ec)) {
    const kiln::llm::ModelConfig m = kiln::llm::load_config(path);
    std::printf("config: %s, %lld layers, hidden %lld, heads %lld/%lld x %lld, vocab %lld, experts %lld (top %lld)%s\n",
                m.architecture.c_str(), static_cast<long long>(m.num_layers),
                static_cast<long long>(m.hidden_size), static_cast<long long>(m.num_heads),
                static_cast<long long>(m.num_kv_heads), static_cast<long long>(m.head_dim),
                static_cast<long long>(m.vocab_size), static_cast<long long>(m.num_experts),
                static_cast<long long>(m.num_experts_per_tok), m.fp8 ? ", fp8 block weights" : "");
  }
  if (!read) return 0;

  const double mb = static_cast<double>(total) / 1e6;
  if (device.empty() || device == "cpu") {
    for (int pass = 1; pass <= 2; ++pass) {
      // Pass 1 maps each page on first touch (page faults over the page cache); pass 2 reads mapped pages.
      const Checkpoint fresh = pass == 1 ? Checkpoint::open(path) : c;
      const auto t1 = std::chrono::steady_clock::now();
      const uint64_t sum = sum_views(pass == 1 ? fresh : c);
      const double s = seconds_since(t1);
      std::printf("read pass %d (%s): %.1f MB in %.3f s = %.0f MB/s (checksum %016llx)\n", pass,
                  pass == 1 ? "fresh mapping" : "mapped", mb, s, mb / s, static_cast<unsigned long long>(sum));
      if (pass == 1) sum_views(c);  // fault the long-lived mapping in for pass 2
    }
  } else {
    const Device d = Device::parse(device);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<Tensor> keep;
    for (const std::string& name : c.names()) keep.push_back(c.get(name, d));
    if (d.is_cuda()) synchronize(d);
    const double s = seconds_since(t1);
    std::printf("load to %s: %.1f MB in %.3f s = %.0f MB/s\n", d.str().c_str(), mb, s, mb / s);
  }
  return 0;
}

}  // namespace kiln::cli
