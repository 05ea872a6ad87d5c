// Fuzz target: the safetensors header parser and loader, and the sharded index parser.
// Beyond "no crash, no out-of-bounds access": anything the parser accepts is fully readable through tensor
// views, and can be written back and parsed again to the same entries.
#include <cstring>
#include <memory>
#include <string_view>

#include "fuzz.h"
#include "kiln/io.h"

int kiln_fuzz_safetensors(const uint8_t* data, size_t size) {
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
    KILN_FUZZ_CHECK(h.tensors.size() == f.entries().size() && h.metadata == f.metadata());
    for (const auto& e : h.tensors) {
      const auto& o = f.entry(e.name);
      KILN_FUZZ_CHECK(o.dtype == e.dtype && o.shape == e.shape && o.nbytes() == e.nbytes());
    }
    if (sum == 1) return 0;  // keeps the reads from being optimised away
  } catch (const kiln::Error&) {
  }
  try {
    for (const auto& [name, shard] : kiln::parse_safetensors_index(
             std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-index")) {
      KILN_FUZZ_CHECK(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_safetensors(data, size); }
#endif
