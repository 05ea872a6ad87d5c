// libFuzzer target: the safetensors header parser and loader, the sharded index parser and the config.json
// parser.
// Properties checked beyond "no crash, no out-of-bounds access": anything the parser accepts is fully
// readable through tensor views, and can be written back and parsed again to the same entries.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>

#include "kiln/io.h"
#include "kiln/llm/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy, so AddressSanitizer flags any read past the end.
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size ? size : 1]);
  if (size) std::memcpy(buf.get(), data, size);
  try {
    const kiln::SafetensorsFile f = kiln::SafetensorsFile::from_memory(buf.get(), size, buf, "fuzz");
    kiln::NamedTensors all;
    uint64_t sum = 0;
    for (const auto& e : f.entries()) {
      kiln::Tensor t = f.get(e.name);
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
      all.emplace_back(e.name, t);
    }
    const std::vector<uint8_t> again = kiln::serialize_safetensors(all, f.metadata());
    const kiln::SafetensorsHeader h = kiln::parse_safetensors_header(again.data(), again.size(), "fuzz-again");
    if (h.tensors.size() != f.entries().size() || h.metadata != f.metadata()) __builtin_trap();
    for (const auto& e : h.tensors) {
      const auto& o = f.entry(e.name);
      if (o.dtype != e.dtype || o.shape != e.shape || o.nbytes() != e.nbytes()) __builtin_trap();
    }
    if (sum == 1) return 0;  // keeps the reads from being optimised away
  } catch (const kiln::Error&) {
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    kiln::llm::ModelConfig c = kiln::llm::parse_config(std::string(text), "fuzz-config");
    kiln::llm::apply_generation_config(c, std::string(text), "fuzz-generation-config");
  } catch (const kiln::Error&) {
  }
  try {
    kiln::parse_safetensors_index(text, "fuzz-index");
  } catch (const kiln::Error&) {
  }
  return 0;
}
